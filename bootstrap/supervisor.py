"""A run's life on the nodes: start, watch, restart from the last checkpoint, stop, collect (I/O)."""

from __future__ import annotations

import json
import math
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from bootstrap import commands, launch, plots, providers, runs, state, topology, watchdog
from bootstrap.cluster import Cluster
from bootstrap.container import HostRuntime, Runtime
from bootstrap.errors import KilnError, RemoteError, RunFailed
from bootstrap.hosts import Host
from bootstrap.launch import NodePaths, RunPlan, Verdict
from bootstrap.providers import Replacement
from bootstrap.ssh import HostFailure
from bootstrap.state import RunRecord
from bootstrap.timeline import Timeline, node_spans

CHIEF_TASKS = ("chief-0", "worker-0", "rank-0")
# Replaces lost hosts (the provider, the mesh, the sync) and returns what it did and the run's new plan.
Recover = Callable[[list[Host]], tuple[list["Replacement"], RunPlan]]


@dataclass(frozen=True)
class Move:
    """The supervisor's way out when a lost node cannot be replaced where the cluster is: `wanted(failure)` says
    whether the replacement's failure was for want of capacity there; `make(gone)` moves the whole cluster (`gone`:
    its machines that no longer answer) and gives (the new cluster, the run's new plan, where it came up)."""

    wanted: Callable[[KilnError], bool]
    make: Callable[[Sequence[Host]], tuple[Cluster, RunPlan, str]]
    # raises KilnError where the cluster cannot move at all (no other place to go), before anything is done
    possible: Callable[[], None] = lambda: None


class Interrupted(KilnError):
    """Spot interruption notices came for some nodes (their watchers stopped the run's processes there)."""

    def __init__(self, notices: dict[Host, dict]):
        self.notices = notices
        self.hosts = [host.label for host in notices]
        said = "; ".join(f"{host.label}: {notice.get('action')} at {notice.get('time')}"
                         for host, notice in notices.items())
        super().__init__(f"spot interruption notice ({said})")


@dataclass(frozen=True)
class Ended:
    """What an attempt came to once it was stopped and collected: the judged attempt, the hosts to replace, and
    when its end was seen."""

    attempt: launch.Attempt
    going: list[Host]
    detected: float


class Stalled(KilnError):
    """No step progress for too long; names the hosts to blame."""

    def __init__(self, message: str, hosts: list[str]):
        super().__init__(message)
        self.hosts = hosts


def record_run(group: Cluster, plan: RunPlan, paths: NodePaths, *, watched: bool = True) -> RunRecord:
    """Save the run's plan (run.json) so status, logs and stop find its processes again; the record. `watched`:
    whether kiln watches the run to its end (not with --detach)."""
    options = group.remote.options
    record = RunRecord(
        run_id=plan.run_id, mode=plan.mode, cluster=group.name, python=group.python, hosts=tuple(group.hosts),
        names=plan.names, root=paths.root,
        tasks=tuple(state.TaskRecord(plan.names[item.host], item.host, item.task) for item in plan.launches),
        finishing=plan.finishing, rank_hosts=plan.rank_hosts,
        ssh=state.SshSettings(options.config_file, options.identity, options.connect_timeout), watched=watched)
    state.save_run(record)
    return record


class Supervisor:
    """Everything kiln does to one run after its plan is made. With `stall_factor`, a watchdog stops a run whose
    logged steps stop moving for that many times the median time between steps (and at least `stall_minimum`
    seconds, or watchdog.STEP_FLOOR_S); with `stall_minimum`, also one whose processes print nothing for that long
    while their node shows no work (bootstrap/watchdog.py)."""

    def __init__(self, group: Cluster, plan: RunPlan, paths: NodePaths, *, interval: float = 1.0,
                 stall_factor: float = 0, stall_minimum: float = 0, timeline: Timeline | None = None,
                 notice_watch: float = 3600, notice_source: str = "any", runtime: Runtime | None = None,
                 stall_busy: float = watchdog.BUSY_LIMIT_S):
        self.group, self.plan, self.paths, self.interval = group, plan, paths, interval
        self.runtime = runtime or HostRuntime()
        self.record: RunRecord | None = None
        self.notice_watch, self.notice_source = notice_watch, notice_source
        self.lost: list[Host] = []
        self.gone: list[Host] = []  # elastic runs: nodes lost while the run went on without them
        self.joiner: Recover | None = None  # elastic runs with --managed: replaces a node that went
        self.max_joins = 0
        self.joins: list[dict] = []  # each replacement that joined the elastic run
        self.timeline = timeline or Timeline()
        self.stall_factor, self.stall_minimum, self.stall_busy = stall_factor, stall_minimum, stall_busy
        self.gpu_wanted = False  # a logged step is half as late as its limit: the GPUs' signs are asked too
        self.run_dir = paths.run(plan.run_id)
        self.folder = state.run_folder(plan.run_id)
        self.released = False  # the run's port reservations went with the machines (a move that failed)

    def start(self) -> None:
        """On every node, in one command: make the run folder (clearing a previous attempt's pid and exit files),
        then start its processes detached."""
        taken = self.group.reserve_ports(self.plan.run_id, self.paths.root, self.plan.ports)  # ours, refreshed
        if taken:
            raise KilnError(f"run {self.plan.run_id} cannot start: {topology.describe_reserved(taken)}")
        run_dir = shlex.quote(self.run_dir)
        prepare = f"mkdir -p {run_dir} && rm -f {run_dir}/*.pid {run_dir}/*.exit {run_dir}/notice.json"
        _, failures = self.group.remote.map(self.group.hosts, lambda h: self.group.remote.check(
            h, f"{prepare} && {{ {self.start_command(self.plan, h)}; }}", timeout=60))
        if failures:
            self.stop()
            raise RemoteError("start", {h.label: r for h, r in failures.items()})

    def start_command(self, plan: RunPlan, host: Host) -> str:
        """The shell command that starts `host`'s processes of `plan` detached, then its interruption watcher (until
        they have exited; a node with none of its own watches until the run's timeout)."""
        items = [item for item in plan.launches if item.host == self.group.hosts.index(host)]
        watcher = launch.watcher_command(plan.run_id, self.group.python, self.paths, self.notice_watch,
                                         [item.task for item in items], self.notice_source)
        return " && ".join([*(self.runtime.launch_command(item, self.paths, plan.run_id) for item in items), watcher])

    def states(self) -> dict[int, dict[str, dict]]:
        """Each host's processes: running, exited (with the code) or lost."""
        hosts = self.group.hosts
        wanted = {i: self.plan.tasks_on(i) for i in range(len(hosts)) if self.plan.tasks_on(i)}

        def look(host: Host) -> dict:
            return self.group.remote.node(host, self.group.python, "status", self.run_dir,
                                          *wanted[hosts.index(host)], timeout=30)

        results = self.group.remote.map_or_raise("status", [hosts[i] for i in wanted], look)
        return {hosts.index(h): states for h, states in results.items()}

    def look(self, wait: float = 0.0) -> tuple[dict[int, dict[str, dict]], dict[Host, dict]]:
        """One question to every node (also those without processes of their own, whose loss or notice
        matters too): its processes' states, and the spot interruption notice its watcher wrote, if any. Each
        node answers when either changes there, or after `wait` seconds (shared out among the rounds of `fanout`
        nodes a look takes on a larger cluster, so that one look takes `wait` at most)."""
        hosts, remote, watched = self.group.hosts, self.group.remote, self.watched()
        wait /= math.ceil(len(watched) / remote.fanout) or 1
        answers, failures = remote.map(watched, lambda h: remote.node(
            h, self.group.python, "look", self.run_dir, f"{wait:g}", *self.plan.tasks_on(hosts.index(h)),
            timeout=30 + wait))
        if failures:
            self.let_go(failures)
        states = {hosts.index(h): answer["tasks"] for h, answer in answers.items() if answer["tasks"]}
        return states, {h: answer["notice"] for h, answer in answers.items() if answer["notice"]}

    def watched(self) -> list[Host]:
        return [host for host in self.group.hosts if host not in self.gone]

    def let_go(self, failures: dict[Host, str]) -> None:
        """In an elastic run, nodes that stopped answering (confirmed by a fresh connection), but the first
        where horovodrun runs, are let go: the run goes on without them. Otherwise, or for any other failure,
        the watch fails as always."""
        going = [host for host in failures if host != self.group.hosts[0]] if self.plan.elastic else []
        lost = self.group.remote.unreachable(going)
        if not lost or len(lost) != len(failures):
            raise RemoteError("status", {h.label: r for h, r in failures.items()})
        self.leave(lost, "stopped answering")

    def leave(self, hosts: list[Host], why: str) -> None:
        """The elastic run goes on without `hosts` (no longer watched); with --managed, replacements join it."""
        if not hosts:
            return
        for host in hosts:
            self.gone.append(host)
            self.group.remote.reset([host])
            print(f"{self.plan.names[self.group.hosts.index(host)]} ({host.label}) {why}: the elastic run goes on "
                  "without it", flush=True)
        if self.joiner:
            self.join(hosts)

    def join(self, going: list[Host]) -> None:
        """Replace nodes an elastic run lost through the provider (the mesh, the code, the runtime on the new
        machines), then name them in the run's host discovery script: horovodrun adds them to the live job at its
        next look (Horovod's blacklist cooldown lets a replacement under a lost node's name back in). A
        replacement that cannot be made is said and the run goes on without it."""
        labels = ", ".join(host.label for host in going)
        if len(self.joins) >= self.max_joins:
            print(f"all {self.max_joins} recoveries of --max-recoveries used: {labels} not replaced", flush=True)
            return
        print(f"recovery {len(self.joins) + 1} of {self.max_joins}: replacing {labels} to join the elastic run",
              flush=True)
        detected, before = time.time(), list(self.group.hosts)
        names = {host: self.plan.names[before.index(host)] for host in going}
        try:
            with self.timeline.phase("replace"):
                replaced, plan = self.joiner(going)
                fresh = [item.new for item in replaced]
                self.runtime.prepare(fresh, self.timeline)
                self.announce(plan, fresh)
        except KilnError as failure:
            self.gone += [host for host in self.group.hosts if host not in before]
            print(f"warning: recovery failed: {failure}; the elastic run goes on without {labels}", file=sys.stderr,
                  flush=True)
            return
        olds = {item.old for item in replaced}
        self.gone = [host for host in self.gone if host not in olds]
        self.plan, self.run_dir = plan, self.paths.run(plan.run_id)
        self.record = record_run(self.group, plan, self.paths)
        self.joins.append({"kind": "join", "lost": [names[h] for h in going], "detected_at": round(detected, 3),
                           "replaced": [{"old": r.old.label, "new": r.new.label} for r in replaced],
                           "joined_at": round(time.time(), 3)})
        print(f"{', '.join(r.new.label for r in replaced)} ready: the elastic run adds it at its next host "
              "discovery", flush=True)

    def announce(self, plan: RunPlan, fresh: list[Host]) -> None:
        """Start the `fresh` nodes' part of the run (a torchrun agent, which joins the rendezvous: the agents running
        restart their workers with it) and their interruption watchers; for horovodrun, then give the first node the
        plan's host discovery script (replaced whole, in one rename: horovodrun runs it every second)."""
        self.group.remote.map_or_raise("join", fresh, lambda h: self.group.remote.check(
            h, self.start_command(plan, h), timeout=60))
        if plan.mode == "torchrun":
            return
        first = self.group.hosts[0]
        for path, text in plan.launches[0].files.items():
            quoted = shlex.quote(path)
            self.group.remote.check(first, f"printf %s {shlex.quote(text)} > {quoted}.new && "
                                           f"mv -f {quoted}.new {quoted}", timeout=60)

    def watch(self, timeout: float) -> Verdict:
        deadline = time.monotonic() + timeout
        steps, output, activity = watchdog.Progress(), watchdog.Progress(), watchdog.Activity()
        while True:
            states, noticed = self.look(wait=self.interval)  # at once where something ended: no sleep
            if noticed and self.plan.elastic:  # the run goes on without noticed nodes, but the first
                first = self.group.hosts[0]
                self.leave([host for host in noticed if host != first], "has a spot interruption notice")
                noticed = {host: notice for host, notice in noticed.items() if host == first}
                # a torchrun agent there exits 1 on the notice's SIGTERM: that node's going is not a failure
                states = {index: found for index, found in states.items()
                          if self.group.hosts[index] not in self.gone}
            verdict = launch.judge(self.plan, states)
            if verdict.done and not verdict.failed:
                return verdict
            if noticed:  # before a failure: the notice's SIGTERM is what makes processes exit
                raise Interrupted(noticed)
            if verdict.done:
                return verdict
            if self.stall_factor or self.stall_minimum:
                self.check_progress(steps, output, activity, launch.exited_ok(self.plan, states))
            if time.monotonic() > deadline:
                raise RunFailed(f"run {self.plan.run_id} made no end within {timeout:g}s; stopped")

    def progress(self, signs: bool = False, gpu: bool = False) -> dict[Host, dict]:
        """Every host's last logged steps and stopped processes of this run (with `signs`, its signs of work; with
        `gpu`, whether the GPUs its processes use are busy: two nvidia-smi calls). A run without containers says
        so: its nodes then find its processes without asking a Docker engine (a CLI call each look, on every
        node)."""
        remote, python = self.group.remote, self.group.python
        flags = [*(["signs"] if signs else []), *(["gpu"] if gpu else []),
                 *([] if self.runtime.contained else ["bare"])]
        found, failures = remote.map(self.watched(), lambda h: remote.node(
            h, python, "progress", self.plan.run_id, self.run_dir, *flags, timeout=30))
        if failures:
            self.let_go(failures)
        return found

    def frozen_hosts(self) -> list[str]:
        """Hosts where a process of the run is stopped (best effort: empty if a host does not answer)."""
        try:
            seen = self.progress()
        except KilnError:
            return []
        names = dict(zip(self.group.hosts, self.plan.names, strict=True))
        return sorted(names[host] for host, found in seen.items() if found["stopped"])


    def check_progress(self, steps: watchdog.Progress, output: watchdog.Progress, activity: watchdog.Activity,
                       done: set[str] = frozenset()) -> None:
        """Raise Stalled when some process's logged step stopped moving (with `stall_factor`), or, when the
        operator asked (`stall_minimum`), when a process that logs no kiln metrics has printed nothing for that long
        and its node's processes show no work either (watchdog: CPU time, a GPU busy, the heartbeat file).
        Processes that exited 0 (`done`) are not stalled; once one that must finish has, the others get
        launch.FINISH_GRACE_S at least: a worker of TensorFlow's MultiWorkerMirroredStrategy may wait a minute on
        the way out for the coordination service of a chief that left first."""
        floor = self.stall_minimum or watchdog.STEP_FLOOR_S
        minimum = max(floor, launch.FINISH_GRACE_S) if done & set(self.plan.finishing) else floor
        # late steps and silence are both judged by the signs of work; the GPUs' (nvidia-smi) are asked for the
        # silence watch, and once a step is half as late as its limit (so they are known when it is late)
        seen = self.progress(signs=True, gpu=bool(self.stall_minimum) or self.gpu_wanted)
        now = time.monotonic()
        names = dict(zip(self.group.hosts, self.plan.names, strict=True))
        gone = {names[host] for host in self.gone}  # an elastic run's nodes that went: their streams stand still
        for host, found in seen.items():
            activity.observe(now, names[host], watchdog.Sign.from_answer(found.get("activity", {})))
        late, limit, quiet, spinning = [], minimum, [], []
        if self.stall_factor:
            steps.observe(now, {f"{task}@{names[host]}": row["step"]
                                for host, found in seen.items() for task, row in found["metrics"].items()})
            behind, limit = steps.stalled(now, factor=self.stall_factor, minimum=minimum)
            late, spinning = watchdog.late_verdicts(behind, steps, activity, now, limit, self.stall_busy)
            self.gpu_wanted = bool(steps.stalled(now, factor=self.stall_factor / 2, minimum=minimum / 2)[0])
        if self.stall_minimum:
            output.observe(now, watchdog.output_streams(self.plan, {names[host]: found
                                                                    for host, found in seen.items()}))
            quiet = watchdog.hung(output.silent(now, minimum=minimum), activity, now, minimum)
        late, quiet, spinning = ([s for s in streams if s.split("@", 1)[0] not in done
                                  and s.rsplit("@", 1)[1] not in gone] for streams in (late, quiet, spinning))
        if late or quiet or spinning:
            frozen = [names[host] for host, found in seen.items() if found["stopped"]]
            hosts = watchdog.blame(late + quiet + spinning, frozen)
            detail = " (a process there is stopped)" if frozen else ""
            what = watchdog.describe_stall(late, limit, quiet, minimum, spinning, self.stall_busy)
            raise Stalled(f"{'; '.join(what)}; stalled: {', '.join(hosts)}{detail}", hosts)

    def stop(self, skip: Sequence[Host] = (), patient: Mapping[Host, dict] = MappingProxyType({})) -> dict[str, str]:
        """Stop every process of the run on every host (but `skip`: gone) with SIGTERM, then SIGKILL after 5 s;
        on `patient` hosts (a spot notice came: their processes may be checkpointing) after the grace their
        notice leaves (its source's). Failures by host."""
        remote, python = self.group.remote, self.group.python

        def halt(host: Host) -> dict:
            grace = float(patient[host].get("grace_s", launch.NOTICE_GRACE)) if host in patient else 5
            stopped = remote.node(host, python, "stop", self.plan.run_id, str(grace), timeout=2 * grace + 120)
            if stopped.get("container"):
                raise HostFailure(f"could not remove the run's container: {stopped['container']}")
            return stopped

        staying = [h for h in self.group.hosts if h not in skip]
        _, failures = remote.map(staying, halt)
        try:  # the run's ports stay its own between attempts (node.py reserve: refreshed, they hold a while)
            answering = [h for h in staying if h not in failures]
            if answering:
                self.group.reserve_ports(self.plan.run_id, self.paths.root, self.plan.ports, answering)
        except KilnError:
            pass
        return {h.label: r for h, r in failures.items()}

    def collect(self, skip: Sequence[Host] = ()) -> Path:
        """Copy every node's run folder (but `skip`'s: gone) into runs/<id>/hosts/<node>/."""
        def pull(host: Host) -> None:
            name = self.plan.names[self.group.hosts.index(host)]
            argv = commands.rsync_pull_argv(host, self.run_dir, str(self.folder / "hosts" / name),
                                            self.group.remote.options)
            self.group.remote.rsync(host, argv)

        _, failures = self.group.remote.map([h for h in self.group.hosts if h not in skip], pull)
        for host, reason in failures.items():
            print(f"warning: could not collect from {host.label}: {reason}", file=sys.stderr)
        return self.folder

    def spread_checkpoint(self) -> None:
        """Give every node the chief's checkpoints (first node) before a restart, so every process resumes
        from the same step without shared storage. A chief that was replaced has none: the copy kept here from
        an earlier restart is given to every node instead, if there is one."""
        source, others = self.group.hosts[0], self.group.hosts[1:]
        checkpoints = self.plan.checkpoint_dir or f"{self.run_dir}/checkpoints"
        local = self.folder / "checkpoints"
        options = self.group.remote.options
        if not self.pull_checkpoints(source):
            if not local.is_dir():
                return
            others = self.group.hosts  # a new first node: every node gets the copy kept here
        self.group.remote.map_or_raise("spread checkpoints", others, lambda h: self.group.remote.rsync(
            h, commands.rsync_push_argv(str(local), h, checkpoints, options, excludes=(), one_writer=False)))

    def chief_step(self) -> int | None:
        """The last step the chief logged, from the collected metrics."""
        for task in CHIEF_TASKS:
            path = self.folder / "hosts" / self.plan.names[0] / f"metrics.{task}.jsonl"
            lines = read_text(path).strip().splitlines()
            if lines:
                try:
                    return int(json.loads(lines[-1])["step"])
                except (ValueError, KeyError):
                    return None
        return None

    def lost_hosts(self) -> list[Host]:
        """Hosts whose machine is gone: a fresh connection to them (not the shared one, which may hang on a
        dead peer) cannot be made."""
        return self.group.remote.unreachable(self.group.hosts)

    def keep_chief_checkpoints(self, going: Sequence[Host]) -> None:
        """Before the chief's machine is replaced, keep the checkpoints collected from it as the copy every node
        gets (spread_checkpoint); a chief lost without a word took its newest ones with it."""
        chief = self.group.hosts[0]
        if chief not in going:
            return
        collected = self.folder / "hosts" / self.plan.names[0] / "checkpoints"
        kept = self.folder / "checkpoints"
        if chief in self.lost or not collected.is_dir():
            where = "the copy kept here from an earlier restart" if kept.is_dir() else "the start"
            print(f"warning: the chief {chief.label} went with its newest checkpoints; resuming from {where} "
                  "(a --checkpoint-dir on shared storage, s3://..., survives a lost node)", file=sys.stderr)
            return
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(collected, kept)

    def end_attempt(self, timeout: float, recovering: bool) -> Ended:
        """Watch the attempt to its end, then stop what is left and collect every node's files: what it came to,
        with the hosts to replace (lost, or noticed by a spot notice) when `recovering`."""
        timeline = self.timeline
        error, error_hosts, noticed = None, [], {}
        try:
            with timeline.phase("watch"):
                verdict = self.watch(timeout)
        except KilnError as failure:  # stalled, out of time, or a node stopped answering: stop the rest
            verdict, error = Verdict(True, ()), str(failure)
            error_hosts = getattr(failure, "hosts", None) or sorted(getattr(failure, "failures", {}))
            noticed = getattr(failure, "notices", {})
        watched = timeline.of("watch")[-1]["ended"]
        detected = time.time()
        self.lost = self.lost_hosts() if recovering and (verdict.failed or error) else []
        going = [*self.lost, *(host for host in noticed if host not in self.lost)]  # to be replaced
        frozen = self.frozen_hosts() if verdict.failed and not going else []
        with timeline.phase("stop"):
            left = self.stop(skip=[*self.lost, *self.gone], patient=noticed)
        with timeline.phase("collect"):
            self.collect(skip=[*self.lost, *self.gone])
        timeline.spans += node_spans(runs.process_times(self.folder), watched, timeline.attempt)
        log = read_text(self.folder / "hosts" / self.plan.names[0] / f"{launch.HOROVOD_TASK}.log") \
            if verdict.failed else ""
        logs = {task: read_text(self.folder / "hosts" / host / f"{task}.log")[-20000:]
                for host, task, code in verdict.failed if code}
        attempt = launch.judge_attempt(self.plan, verdict, horovod_log=log, error=error, error_hosts=error_hosts,
                                       frozen=frozen, left=list(left), logs=logs)
        return Ended(attempt, going, detected)

    def replace_nodes(self, ended: Ended, recover: Recover, number: int, of: int,
                      entry: dict) -> KilnError | None:
        """Replace the attempt's lost and noticed hosts through `recover` (the `number`th of `of`), keeping the
        chief's checkpoints and each old machine's files apart; the run's new plan and record. The failure, if
        the replacement could not be made."""
        going = ended.going
        names = {h: self.plan.names[self.group.hosts.index(h)] for h in going}
        print(f"recovery {number} of {of}: replacing {', '.join(h.label for h in going)}", flush=True)
        self.keep_chief_checkpoints(going)
        self.keep_apart(names.values(), number)
        try:
            with self.timeline.phase("replace"):
                replaced, self.plan = recover(going)
        except KilnError as failure:
            return failure
        self.run_dir = self.paths.run(self.plan.run_id)
        self.record = record_run(self.group, self.plan, self.paths)
        entry.update(kind="recovery", lost=[names[h] for h in self.lost], detected_at=round(ended.detected, 3),
                     interrupted=[names[h] for h in going if h not in self.lost],
                     replaced=[{"old": r.old.label, "new": r.new.label} for r in replaced])
        return None

    def move_cluster(self, ended: Ended, move: Move, why: KilnError, number: int, of: int,
                     entry: dict) -> str | None:
        """Move the run to the whole cluster brought up again elsewhere (`move`), the `number`th recovery of `of`,
        as the lost nodes could not be replaced where it is (`why`): the first node's checkpoints are kept here
        first (the restart gives them to every new node); the failure, if the move could not be made."""
        names = {h: self.plan.names[self.group.hosts.index(h)] for h in ended.going}
        print(f"recovery {number} of {of}: no capacity to replace {', '.join(names.values())} where cluster "
              f"{self.group.name} is ({why}); bringing the whole cluster up again elsewhere, the run to resume from "
              "its last checkpoint", flush=True)
        try:
            move.possible()
        except KilnError as failure:
            return f"recovery failed: {why}; the cluster could not move: {failure}"
        try:
            self.keep_checkpoints()
        except KilnError as failure:  # the machines that hold them would go with the cluster
            return (f"recovery failed: {why}; the cluster was not moved, as the first node's checkpoints could not "
                    f"be kept here first ({failure}): it is left as it is")
        before = [h.label for h in self.group.hosts]
        lost = [name for h, name in names.items() if h in self.lost]
        interrupted = [name for h, name in names.items() if h not in self.lost]
        try:
            with self.timeline.phase("move"):
                group, plan, where = move.make(self.lost)
        except KilnError as failure:
            now = state.load_cluster(self.group.name)
            if now is None or [h.label for h in now.hosts] != before:
                self.released = True  # the old machines are gone: no ports to release there
            return f"recovery failed: {why}; the cluster could not move: {failure}"
        self.keep_apart(self.plan.names, number)  # every old machine's, after a move
        self.group, self.plan, self.lost, self.gone = group, plan, [], []
        self.runtime.moved(group)
        self.notice_source = providers.notice_source(state.load_cluster(group.name))
        self.run_dir = self.paths.run(plan.run_id)
        self.record = record_run(group, plan, self.paths)
        entry.update(kind="move", lost=lost, interrupted=interrupted, detected_at=round(ended.detected, 3),
                     moved_to=where,
                     replaced=[{"old": old, "new": new.label} for old, new in zip(before, group.hosts, strict=False)])
        print(f"cluster {group.name} is up again at {where}: {', '.join(h.label for h in group.hosts)}", flush=True)
        return None

    def keep_apart(self, names: Iterable[str], number: int) -> None:
        """The collected files of these nodes' machines moved to replaced/NAME-NUMBER, apart from their
        successors'."""
        for name in names:
            kept = self.folder / "hosts" / name
            if kept.is_dir():
                (self.folder / "replaced").mkdir(exist_ok=True)
                kept.rename(self.folder / "replaced" / f"{name}-{number}")

    def keep_checkpoints(self) -> None:
        """Before the whole cluster goes, the first node's checkpoints kept here, pulled from it where it still
        answers (else the copy kept from an earlier restart, or none: the run starts again)."""
        chief = self.group.hosts[0]
        if chief in self.lost or not self.pull_checkpoints(chief):
            where = "the copy kept here from an earlier restart" if (self.folder / "checkpoints").is_dir() else \
                "the start"
            print(f"warning: no checkpoints from {chief.label}; resuming from {where}", file=sys.stderr, flush=True)

    def pull_checkpoints(self, source: Host) -> bool:
        """The run's checkpoints on `source`, copied to the run folder here (checkpoints/); whether it had any."""
        checkpoints = self.plan.checkpoint_dir or f"{self.run_dir}/checkpoints"
        if self.group.remote.run(source, ["test", "-d", checkpoints], timeout=30).code != 0:
            return False
        self.group.remote.rsync(source, commands.rsync_pull_argv(source, checkpoints, str(self.folder / "checkpoints"),
                                                                 self.group.remote.options))
        return True

    def restart(self) -> None:
        """Start the next attempt from the last checkpoint: every node gets it, the runtime is made ready again
        (a fresh container, the image on a new node), and every process starts."""
        self.timeline.attempt += 1
        with self.timeline.phase("restore"):
            self.spread_checkpoint()
        self.runtime.prepare(self.group.hosts, self.timeline)
        with self.timeline.phase("start"):
            self.start()

    def run(self, record: RunRecord, timeout: float, max_restarts: int = 0, *,
            recover: Recover | None = None, max_recoveries: int = 0, move: Move | None = None) -> dict:
        """Watch the run to its end, restarting it up to `max_restarts` times from the last checkpoint; with
        `recover`, a node that stopped answering is replaced (up to `max_recoveries` times) and the run restarts
        on the new one from the last checkpoint, and with `move`, where no replacement can be had for want of
        capacity, on the whole cluster brought up again elsewhere; stop, collect, and write summary.json."""
        started = time.monotonic()
        self.record = record
        if self.plan.elastic:  # lost nodes are replaced while the run goes on, not by a restart
            self.joiner, self.max_joins, recover = recover, max_recoveries, None
        restarts: list[dict] = []
        recoveries = 0
        while True:
            ended = self.end_attempt(timeout, recover is not None)
            attempt, going_labels = ended.attempt, [h.label for h in ended.going]
            action = launch.next_action(attempt, lost=going_labels, restarts_done=len(restarts) - recoveries,
                                        max_restarts=max_restarts, recoveries_done=recoveries,
                                        max_recoveries=max_recoveries if recover else 0)
            if action == "finish":
                if ended.going and recover:
                    attempt = replace(attempt, failure=f"{attempt.failure}; lost: {', '.join(going_labels)}"
                                      + ("" if recoveries < max_recoveries else
                                         f" (all {max_recoveries} recoveries of --max-recoveries used)"))
                break
            entry = {"attempt": len(restarts) + 1, "failure": attempt.failure, "hosts": list(attempt.blamed),
                     "at_step": self.chief_step()}
            if action == "recover":
                recoveries += 1
                why = self.replace_nodes(ended, recover, recoveries, max_recoveries, entry)
                failed = f"recovery failed: {why}" if why else None
                if why and move and move.wanted(why):
                    failed = self.move_cluster(ended, move, why, recoveries, max_recoveries, entry)
                if failed:
                    attempt = replace(attempt, failure=f"{attempt.failure}; {failed}")
                    break
            else:
                entry["kind"] = "restart"
                print(f"restart {len(restarts) + 1 - recoveries} of {max_restarts} after: {attempt.failure}",
                      flush=True)
            restarts.append(entry)
            try:
                self.restart()
            except KilnError as failure:  # the image on a new node, its container, a start: end the run here
                self.stop()
                attempt = replace(attempt, failure=f"{attempt.failure}; the restart failed: {failure}")
                break
            if action == "recover":
                entry["restarted_at"] = round(time.time(), 3)
                entry["seconds_to_restart"] = round(entry["restarted_at"] - entry["detected_at"], 2)
        return self.finish(attempt.failure, restarts, time.monotonic() - started)

    def finish(self, failure: str | None, restarts: list[dict], wall: float) -> dict:
        """Release the run's ports, write summary.json and the plots, print the result, and fail where the run
        failed."""
        if not self.released:
            self.group.release_ports(self.plan.run_id, self.paths.root)
        data = runs.summary(self.record, status="failed" if failure else "ok", failure=failure, folder=self.folder,
                            wall=wall, restarts=[*restarts, *self.joins], phases=self.timeline.spans)
        state.save_summary(self.plan.run_id, data)
        plots.draw(self.folder)
        if self.plan.mode == "run":
            print(runs.format_rows(runs.process_rows(data), runs.PROCESS_COLUMNS))
        else:
            print(runs.format_rows([runs.result_row(data)]))
        print(f"run folder: {self.folder}")
        if failure:
            raise RunFailed(f"run {self.plan.run_id} failed: {failure}")
        return data


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
