"""Everything kiln does to one run after its plan is made (I/O): start its processes, watch them to their end
(watchdog: stalls.py; an elastic run's members: elastic.py), stop what is left, collect every node's folder,
restart from the last checkpoint (checkpoints.py), hand lost nodes to a managed run's recovery (recovery.py), and
write summary.json. What the run is now (its cluster, plan, folders) is live.py's, shared with those parts."""

from __future__ import annotations

import math
import shlex
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from bootstrap import checkpoints, launch, runs, topology, watchdog
from bootstrap.cluster import Cluster
from bootstrap.container import Runtime
from bootstrap.elastic import Membership
from bootstrap.errors import KilnError, RemoteError, RunFailed
from bootstrap.hosts import Host
from bootstrap.launch import NodePaths, RunPlan, Verdict
from bootstrap.live import Ended, Interrupted, Live, Recoverer
from bootstrap.stalls import Stalls
from bootstrap.timeline import Timeline, node_spans

if TYPE_CHECKING:
    from bootstrap.state import RunRecord

class Supervisor:
    """Everything kiln does to one run after its plan is made. With `stall_factor`, a watchdog stops a run whose
    logged steps stop moving for that many times the median time between steps (and at least `stall_minimum`
    seconds, or watchdog.STEP_FLOOR_S); with `stall_minimum`, also one whose processes print nothing for that long
    while their node shows no work (bootstrap/stalls.py)."""

    def __init__(self, group: Cluster, plan: RunPlan, paths: NodePaths, *, interval: float = 1.0,
                 stall_factor: float = 0, stall_minimum: float = 0, timeline: Timeline | None = None,
                 notice_watch: float = 3600, notice_source: str = "any", runtime: Runtime | None = None,
                 stall_busy: float = watchdog.BUSY_LIMIT_S):
        self.live = Live(group, plan, paths, runs.run_folder(plan.run_id), timeline=timeline or Timeline(),
                         notice_source=notice_source, **({"runtime": runtime} if runtime else {}))
        self.interval, self.notice_watch = interval, notice_watch
        self.members = Membership(self.live, self.start_command)
        self.stalls = Stalls(self.live, self.members.let_go, factor=stall_factor, minimum=stall_minimum,
                             busy=stall_busy)

    # the run as it is now (a replacement, a join or a move changes it)
    group = property(lambda self: self.live.group)
    plan = property(lambda self: self.live.plan)
    record = property(lambda self: self.live.record)
    released = property(lambda self: self.live.released)
    folder = property(lambda self: self.live.folder)
    stop = property(lambda self: self.live.stop)
    collect = property(lambda self: self.live.collect)

    def start(self) -> None:
        """On every node, in one command: make the run folder (clearing a previous attempt's pid and exit files),
        then start its processes detached."""
        live = self.live
        taken = live.group.reserve_ports(live.plan.run_id, live.paths.root, live.plan.ports)  # ours, refreshed
        if taken:
            raise KilnError(f"run {live.plan.run_id} cannot start: {topology.describe_reserved(taken)}")
        run_dir = shlex.quote(live.run_dir)
        prepare = f"mkdir -p {run_dir} && rm -f {run_dir}/*.pid {run_dir}/*.exit {run_dir}/notice.json"
        _, failures = live.group.remote.map(live.group.hosts, lambda h: live.group.remote.check(
            h, f"{prepare} && {{ {self.start_command(live.plan, h)}; }}", timeout=60))
        if failures:
            live.stop()
            raise RemoteError("start", {h.label: r for h, r in failures.items()})

    def start_command(self, plan: RunPlan, host: Host) -> str:
        """The shell command that starts `host`'s processes of `plan` detached, then its interruption watcher (until
        they have exited; a node with none of its own watches until the run's timeout)."""
        live = self.live
        items = [item for item in plan.launches if item.host == live.group.hosts.index(host)]
        watcher = launch.watcher_command(plan.run_id, live.group.python, live.paths, self.notice_watch,
                                         [item.task for item in items], live.notice_source)
        return " && ".join([*(live.runtime.launch_command(item, live.paths, plan.run_id) for item in items), watcher])

    def states(self) -> dict[int, dict[str, dict]]:
        """Each host's processes: running, exited (with the code) or lost."""
        live = self.live
        hosts = live.group.hosts
        wanted = {i: live.plan.tasks_on(i) for i in range(len(hosts)) if live.plan.tasks_on(i)}

        def look(host: Host) -> dict:
            return live.group.remote.node(host, live.group.python, "status", live.run_dir,
                                          *wanted[hosts.index(host)], timeout=30)

        results = live.group.remote.map_or_raise("status", [hosts[i] for i in wanted], look)
        return {hosts.index(h): states for h, states in results.items()}

    def look(self, wait: float = 0.0) -> tuple[dict[int, dict[str, dict]], dict[Host, dict]]:
        """One question to every node (also those without processes of their own, whose loss or notice
        matters too): its processes' states, and the spot interruption notice its watcher wrote, if any. Each
        node answers when either changes there, or after `wait` seconds (shared out among the rounds of `fanout`
        nodes a look takes on a larger cluster, so that one look takes `wait` at most)."""
        live = self.live
        hosts, remote, watched = live.group.hosts, live.group.remote, live.watched()
        wait /= math.ceil(len(watched) / remote.fanout) or 1
        answers, failures = remote.map(watched, lambda h: remote.node(
            h, live.group.python, "look", live.run_dir, f"{wait:g}", *live.plan.tasks_on(hosts.index(h)),
            timeout=30 + wait))
        if failures:
            self.members.let_go(failures)
        states = {hosts.index(h): answer["tasks"] for h, answer in answers.items() if answer["tasks"]}
        return states, {h: answer["notice"] for h, answer in answers.items() if answer["notice"]}

    def watch(self, timeout: float) -> Verdict:
        live = self.live
        deadline = time.monotonic() + timeout
        self.stalls.restart()
        while True:
            states, noticed = self.look(wait=self.interval)  # at once where something ended: no sleep
            if noticed and live.plan.elastic:  # the run goes on without noticed nodes, but the first
                first = live.group.hosts[0]
                self.members.leave([host for host in noticed if host != first], "has a spot interruption notice")
                noticed = {host: notice for host, notice in noticed.items() if host == first}
                # a torchrun agent there exits 1 on the notice's SIGTERM: that node's going is not a failure
                states = {index: found for index, found in states.items()
                          if live.group.hosts[index] not in live.gone}
            verdict = launch.judge(live.plan, states)
            if verdict.done and not verdict.failed:
                return verdict
            if noticed:  # before a failure: the notice's SIGTERM is what makes processes exit
                raise Interrupted(noticed)
            if verdict.done:
                return verdict
            if self.stalls.on:
                self.stalls.check(launch.exited_ok(live.plan, states))
            if time.monotonic() > deadline:
                raise RunFailed(f"run {live.plan.run_id} made no end within {timeout:g}s; stopped")

    def end_attempt(self, timeout: float, recovering: bool) -> Ended:
        """Watch the attempt to its end, then stop what is left and collect every node's files: what it came to,
        with the hosts to replace (lost, or noticed by a spot notice) when `recovering`."""
        live, timeline = self.live, self.live.timeline
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
        live.lost = live.group.remote.unreachable(live.group.hosts) if recovering and (verdict.failed or error) \
            else []
        going = [*live.lost, *(host for host in noticed if host not in live.lost)]  # to be replaced
        frozen = self.stalls.frozen_hosts() if verdict.failed and not going else []
        with timeline.phase("stop"):
            left = live.stop(skip=[*live.lost, *live.gone], patient=noticed)
        with timeline.phase("collect"):
            live.collect(skip=[*live.lost, *live.gone])
        timeline.spans += node_spans(runs.process_times(live.folder), watched, timeline.attempt)
        log, logs = runs.failed_logs(live.folder, live.plan.names[0], verdict.failed)
        attempt = launch.judge_attempt(live.plan, verdict, horovod_log=log, error=error, error_hosts=error_hosts,
                                       frozen=frozen, left=list(left), logs=logs)
        return Ended(attempt, going, detected)

    def restart(self) -> None:
        """Start the next attempt from the last checkpoint: every node gets it, the runtime is made ready again
        (a fresh container, the image on a new node), and every process starts."""
        live = self.live
        live.timeline.attempt += 1
        with live.timeline.phase("restore"):
            checkpoints.spread(live)
        live.runtime.prepare(live.group.hosts, live.timeline)
        with live.timeline.phase("start"):
            self.start()

    def run(self, record: RunRecord, timeout: float, max_restarts: int = 0, *,
            recovery: Recoverer | None = None, max_recoveries: int = 0) -> dict:
        """Watch the run to its end, restarting it up to `max_restarts` times from the last checkpoint; with
        `recovery` (a managed run), lost nodes are answered (replaced, or the cluster moved) up to `max_recoveries`
        times and the run restarts from the last checkpoint (an elastic run goes on, and the replacements join
        it); stop, collect, and write summary.json."""
        started = time.monotonic()
        self.live.record = record
        if self.live.plan.elastic and recovery:  # lost nodes are replaced while the run goes on, not by a restart
            self.members.joiner, self.members.max_joins, recovery = recovery.recover, max_recoveries, None
        restarts: list[dict] = []
        recoveries = 0
        while True:
            ended = self.end_attempt(timeout, recovery is not None)
            attempt, going_labels = ended.attempt, [h.label for h in ended.going]
            action = launch.next_action(attempt, lost=going_labels, restarts_done=len(restarts) - recoveries,
                                        max_restarts=max_restarts, recoveries_done=recoveries,
                                        max_recoveries=max_recoveries if recovery else 0)
            if action == "finish":
                if ended.going and recovery:
                    attempt = replace(attempt, failure=f"{attempt.failure}; lost: {', '.join(going_labels)}"
                                      + ("" if recoveries < max_recoveries else
                                         f" (all {max_recoveries} recoveries of --max-recoveries used)"))
                break
            entry = {"attempt": len(restarts) + 1, "failure": attempt.failure, "hosts": list(attempt.blamed),
                     "at_step": checkpoints.chief_step(self.live)}
            if action == "recover":
                recoveries += 1
                failed = recovery.answer(self.live, ended, recoveries, max_recoveries, entry)
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
                self.live.stop()
                attempt = replace(attempt, failure=f"{attempt.failure}; the restart failed: {failure}")
                break
            if action == "recover":
                entry["restarted_at"] = round(time.time(), 3)
                entry["seconds_to_restart"] = round(entry["restarted_at"] - entry["detected_at"], 2)
        return self.finish(attempt.failure, restarts, time.monotonic() - started)

    def finish(self, failure: str | None, restarts: list[dict], wall: float) -> dict:
        """Release the run's ports, then its end (runs.conclude: summary.json, the plots, the result printed;
        RunFailed where it failed)."""
        live = self.live
        if not live.released:
            live.group.release_ports(live.plan.run_id, live.paths.root)
        return runs.conclude(live.record, live.folder, failure=failure, restarts=[*restarts, *self.members.joins],
                             wall=wall, phases=live.timeline.spans)
