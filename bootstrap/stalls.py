"""Whether a watched run still makes progress (I/O; the judging is watchdog.py's): every node's last logged steps,
its processes' output and the signs of their work, read each look; a run whose steps stop moving, or (where
asked) whose processes fall silent while their node shows no work, is stopped, naming the nodes to blame."""

from __future__ import annotations

import time
from collections.abc import Callable

from bootstrap import launch, watchdog
from bootstrap.errors import KilnError
from bootstrap.hosts import Host
from bootstrap.live import Live


class Stalled(KilnError):
    """No step progress for too long; names the hosts to blame."""

    def __init__(self, message: str, hosts: list[str]):
        super().__init__(message)
        self.hosts = hosts


class Stalls:
    """With `factor`, a run whose logged steps stop moving for that many times the median time between steps (and
    at least `minimum` seconds, or watchdog.STEP_FLOOR_S) is stalled; with `minimum`, also one whose processes
    print nothing for that long while their node shows no work; a step late while its node is busy only past
    `busy` seconds. `let_go`: what a node that does not answer becomes (an elastic run goes on without it)."""

    def __init__(self, live: Live, let_go: Callable[[dict[Host, str]], None], *, factor: float = 0,
                 minimum: float = 0, busy: float = watchdog.BUSY_LIMIT_S):
        self.live, self.let_go = live, let_go
        self.factor, self.minimum, self.busy = factor, minimum, busy
        self.gpu_wanted = False  # a logged step is half as late as its limit: the GPUs' signs are asked too
        self.steps, self.output, self.activity = watchdog.Progress(), watchdog.Progress(), watchdog.Activity()

    @property
    def on(self) -> bool:
        return bool(self.factor or self.minimum)

    def restart(self) -> None:
        """A new attempt (its own steps and output)."""
        self.steps, self.output, self.activity = watchdog.Progress(), watchdog.Progress(), watchdog.Activity()

    def progress(self, signs: bool = False, gpu: bool = False) -> dict[Host, dict]:
        """Every host's last logged steps and stopped processes of this run (with `signs`, its signs of work; with
        `gpu`, whether the GPUs its processes use are busy: two nvidia-smi calls). A run without containers says
        so: its nodes then find its processes without asking a Docker engine (a CLI call each look, on every
        node)."""
        live = self.live
        remote, python = live.group.remote, live.group.python
        flags = [*(["signs"] if signs else []), *(["gpu"] if gpu else []),
                 *([] if live.runtime.contained else ["bare"])]
        found, failures = remote.map(live.watched(), lambda h: remote.node(
            h, python, "progress", live.plan.run_id, live.run_dir, *flags, timeout=30))
        if failures:
            self.let_go(failures)
        return found

    def frozen_hosts(self) -> list[str]:
        """Hosts where a process of the run is stopped (best effort: empty if a host does not answer)."""
        try:
            seen = self.progress()
        except KilnError:
            return []
        return sorted(self.live.name(host) for host, found in seen.items() if found["stopped"])

    def check(self, done: set[str] = frozenset()) -> None:
        """Raise Stalled when some process's logged step stopped moving (with `factor`), or, when the operator
        asked (`minimum`), when a process that logs no kiln metrics has printed nothing for that long and its
        node's processes show no work either (watchdog: CPU time, a GPU busy, the heartbeat file). Processes that
        exited 0 (`done`) are not stalled; once one that must finish has, the others get launch.FINISH_GRACE_S at
        least: a worker of TensorFlow's MultiWorkerMirroredStrategy may wait a minute on the way out for the
        coordination service of a chief that left first."""
        live = self.live
        floor = self.minimum or watchdog.STEP_FLOOR_S
        minimum = max(floor, launch.FINISH_GRACE_S) if done & set(live.plan.finishing) else floor
        # late steps and silence are both judged by the signs of work; the GPUs' (nvidia-smi) are asked for the
        # silence watch, and once a step is half as late as its limit (so they are known when it is late)
        seen = self.progress(signs=True, gpu=bool(self.minimum) or self.gpu_wanted)
        now = time.monotonic()
        names = {host: live.name(host) for host in live.group.hosts}
        gone = {names[host] for host in live.gone}  # an elastic run's nodes that went: their streams stand still
        for host, found in seen.items():
            self.activity.observe(now, names[host], watchdog.Sign.from_answer(found.get("activity", {})))
        late, limit, quiet, spinning = [], minimum, [], []
        if self.factor:
            self.steps.observe(now, {f"{task}@{names[host]}": row["step"]
                                     for host, found in seen.items() for task, row in found["metrics"].items()})
            behind, limit = self.steps.stalled(now, factor=self.factor, minimum=minimum)
            late, spinning = watchdog.late_verdicts(behind, self.steps, self.activity, now, limit, self.busy)
            self.gpu_wanted = bool(self.steps.stalled(now, factor=self.factor / 2, minimum=minimum / 2)[0])
        if self.minimum:
            self.output.observe(now, watchdog.output_streams(live.plan, {names[host]: found
                                                                         for host, found in seen.items()}))
            quiet = watchdog.hung(self.output.silent(now, minimum=minimum), self.activity, now, minimum)
        late, quiet, spinning = ([s for s in streams if s.split("@", 1)[0] not in done
                                  and s.rsplit("@", 1)[1] not in gone] for streams in (late, quiet, spinning))
        if late or quiet or spinning:
            frozen = [names[host] for host, found in seen.items() if found["stopped"]]
            hosts = watchdog.blame(late + quiet + spinning, frozen)
            detail = " (a process there is stopped)" if frozen else ""
            what = watchdog.describe_stall(late, limit, quiet, minimum, spinning, self.busy)
            raise Stalled(f"{'; '.join(what)}; stalled: {', '.join(hosts)}{detail}", hosts)
