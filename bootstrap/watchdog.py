"""The watchdog's judgement (pure): which of a run's processes stopped moving, told from those that are busy.

Three things move while a run is healthy: the steps a program logs as kiln metrics, the output it prints, and the
work its processes do (CPU time, a GPU of theirs busy, a heartbeat file touched). A late step is judged by the
run's own pace (a factor of the median time between its steps) and by the same signs as silence: late with no sign
of work for as long, it is a stall at once; late while busy (an evaluation, a checkpoint written), only once it is
later than the busy limit (`--stall-busy`, 10 minutes by default, as torch.distributed's collective timeout):
a collective that hangs keeps its GPU (or a CPU poller) busy forever, and is then named as such. Output silence
alone never is a stall: a program busy for minutes between two lines (an epoch, a first XLA compile, a shuffle)
prints nothing and is healthy. Silence is a stall only when the operator asks (`--stall-minimum`), and then only
where the node's processes also show no sign of work for that long: a program asleep or blocked forever."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bootstrap import launch

STEP_FLOOR_S = 60.0  # a late logged step is a stall only after this long at least (unless --stall-minimum)
# How long a logged step may be late while its node shows work: torch.distributed's default collective timeout
# (its process groups' `timeout`, 10 minutes for NCCL), after which a hung collective would fail there too.
BUSY_LIMIT_S = 600.0
CPU_SIGN_RATE = 0.05  # the share of one core a node's processes of the run must use between two looks to show work
SIGNS = ("CPU time", "a GPU busy", "the heartbeat file")  # what counts as work, as the messages say it


@dataclass
class Progress:
    """When each stream's value (a logged step, or how much it printed) last moved, as seen from the operator."""

    changes: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    began: float | None = None  # the first look

    def observe(self, now: float, steps: Mapping[str, int]) -> None:
        """Note each stream's value; any change is a move (a step that goes back is a restart from a checkpoint,
        as an elastic run's workers make after a node went or came)."""
        if self.began is None:
            self.began = now
        for stream, step in steps.items():
            seen = self.changes.setdefault(stream, [])
            if not seen or step != seen[-1][1]:
                seen.append((now, step))

    def stalled(self, now: float, *, factor: float, minimum: float) -> tuple[list[str], float]:
        """Streams with no new step for `factor` times the median time between
        their steps (and at least `minimum` seconds); (streams, limit used). Until some stream has moved twice,
        the time each took from the first look to its first step stands in (start-up included, so the limit is
        longer, never shorter): a process frozen after its first few steps, all logged between two looks, is
        still found."""
        gaps = sorted(b[0] - a[0] for seen in self.changes.values() for a, b in zip(seen, seen[1:], strict=False))
        if not gaps and self.began is not None:
            gaps = sorted(seen[0][0] - self.began for seen in self.changes.values() if seen[0][0] > self.began)
        if not gaps:
            return [], minimum
        limit = max(minimum, factor * gaps[len(gaps) // 2])
        late = [stream for stream, seen in self.changes.items() if now - seen[-1][0] > limit]
        return sorted(late), limit

    def silent(self, now: float, *, minimum: float) -> list[str]:
        """Streams that have not moved for over `minimum` seconds since they were first seen."""
        return sorted(stream for stream, seen in self.changes.items() if now - seen[-1][0] > minimum)


@dataclass(frozen=True)
class Sign:
    """One look at a node's work: its run's processes' CPU seconds, whether a GPU is busy, and when the run's
    heartbeat file there was last touched (node.py progress's `activity`)."""

    cpu: float = 0.0
    gpu_busy: bool = False
    beat: float = 0.0

    @classmethod
    def from_answer(cls, answer: Mapping) -> Sign:
        return cls(float(answer.get("cpu", 0.0)), bool(answer.get("gpu_busy")), float(answer.get("beat", 0.0)))


@dataclass
class Activity:
    """When each node last showed work, from one look to the next: its run's processes using CPU_SIGN_RATE of a
    core at least (a rate, so an idle helper thread's trickle never adds up to work; a process that ended takes
    its CPU time out of the sum, which is then no sign either), a GPU busy, or its heartbeat file touched. A
    node's first look counts as a sign (the watch begins there)."""

    last: dict[str, float] = field(default_factory=dict)  # node -> when it last showed work
    seen: dict[str, tuple[float, Sign]] = field(default_factory=dict)  # node -> its previous look

    def observe(self, now: float, node: str, sign: Sign) -> None:
        before, self.seen[node] = self.seen.get(node), (now, sign)
        if before is None:
            self.last[node] = now
            return
        elapsed, spent = now - before[0], sign.cpu - before[1].cpu
        if sign.gpu_busy or sign.beat > before[1].beat or (elapsed > 0 and spent / elapsed >= CPU_SIGN_RATE):
            self.last[node] = now

    def idle(self, now: float, node: str) -> float:
        """Seconds since `node` last showed work (0 for a node not seen yet)."""
        return now - self.last[node] if node in self.last else 0.0


def late_verdicts(late: Sequence[str], steps: Progress, activity: Activity, now: float, limit: float,
                  busy_limit: float) -> tuple[list[str], list[str]]:
    """Of the streams whose step is late (`task@node`): (those whose node showed no work for over `limit` either:
    stalled, those late for over `busy_limit` whose node stays busy: a hung collective spins)."""
    idle = [stream for stream in late if activity.idle(now, stream.rsplit("@", 1)[1]) > limit]
    spinning = [stream for stream in late if stream not in idle
                and now - steps.changes[stream][-1][0] > max(limit, busy_limit)]
    return idle, spinning


def hung(quiet: Sequence[str], activity: Activity, now: float, minimum: float) -> list[str]:
    """The silent streams (`task@node`) whose node has shown no work either for over `minimum` seconds."""
    return [stream for stream in quiet if activity.idle(now, stream.rsplit("@", 1)[1]) > minimum]


def output_streams(plan: launch.RunPlan, found: Mapping[str, Mapping]) -> dict[str, int]:
    """How much each process that logs no kiln metrics has printed, as `task@host` streams (pure). Only the
    processes that must finish count (a parameter server waits in silence); a horovod rank counts on its own
    host (horovodrun keeps every rank's output on the first node), horovodrun itself only with no rank files.
    `found`: each node's progress answer, by node name."""
    if not plan.watch_output:
        return {}
    logged = {task for answer in found.values() for task in answer["metrics"]}
    streams = {}
    for host, answer in found.items():
        output = answer.get("output", {})
        has_ranks = any(name.startswith("rank-") for name in output)
        for name, size in output.items():
            if name in logged or (name == launch.HOROVOD_TASK and has_ranks):
                continue
            if name.startswith("rank-"):
                rank = int(name[len("rank-"):])
                where = plan.rank_hosts[rank] if rank < len(plan.rank_hosts) else host
            elif name in plan.finishing:
                where = host
            else:
                continue
            streams[f"{name}@{where}"] = size
    return streams


def blame(stalled: list[str], stopped_hosts: list[str]) -> list[str]:
    """The hosts to name for a stall: those with a stopped process, else those of
    the stalled streams (`task@host`)."""
    if stopped_hosts:
        return sorted(set(stopped_hosts))
    return sorted({stream.rsplit("@", 1)[1] for stream in stalled})


def describe_stall(late: Sequence[str], limit: float, quiet: Sequence[str], minimum: float,
                   spinning: Sequence[str] = (), busy_limit: float = BUSY_LIMIT_S) -> list[str]:
    """What stalled, as a person reads it."""
    what = [f"no step progress and no sign of work ({', '.join(SIGNS)}) for over {limit:.0f}s from "
            f"{', '.join(late)}"] if late else []
    if spinning:
        what.append(f"no step progress for over {max(limit, busy_limit):.0f}s from {', '.join(spinning)} while "
                    f"its processes stay busy (a collective that hangs keeps its GPU or CPU busy)")
    if quiet:
        what.append(f"no output and no sign of work ({', '.join(SIGNS)}) for over {minimum:.0f}s from "
                    f"{', '.join(quiet)}")
    return what
