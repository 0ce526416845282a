"""A run's life on the nodes: start, watch, restart from the last checkpoint, stop, collect (I/O)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from bootstrap import commands, launch, plots, runs, state
from bootstrap.cluster import Cluster
from bootstrap.errors import KilnError, RemoteError, RunFailed
from bootstrap.hosts import Host
from bootstrap.launch import NodePaths, RunPlan, Verdict
from bootstrap.state import RunRecord
from bootstrap.timeline import Timeline, node_spans

CHIEF_TASKS = ("chief-0", "worker-0", "rank-0")


class Stalled(KilnError):
    """No step progress for too long; names the hosts to blame."""

    def __init__(self, message: str, hosts: list[str]):
        super().__init__(message)
        self.hosts = hosts


def record_run(group: Cluster, plan: RunPlan, paths: NodePaths) -> RunRecord:
    """Save the run's plan (run.json) so status, logs and stop find its processes again; the record."""
    options = group.remote.options
    record = RunRecord(
        run_id=plan.run_id, mode=plan.mode, cluster=group.name, python=group.python, hosts=tuple(group.hosts),
        names=plan.names, root=paths.root,
        tasks=tuple(state.TaskRecord(plan.names[item.host], item.host, item.task) for item in plan.launches),
        finishing=plan.finishing, rank_hosts=plan.rank_hosts,
        ssh=state.SshSettings(options.config_file, options.identity, options.connect_timeout))
    state.save_run(record)
    return record


class Supervisor:
    """Everything kiln does to one run after its plan is made. With `stall_factor`,
    a watchdog stops a run whose logged steps stop moving for that many times the
    median time between steps (and at least `stall_minimum` seconds)."""

    def __init__(self, group: Cluster, plan: RunPlan, paths: NodePaths, *, interval: float = 1.0,
                 stall_factor: float = 0, stall_minimum: float = 60, timeline: Timeline | None = None):
        self.group, self.plan, self.paths, self.interval = group, plan, paths, interval
        self.timeline = timeline or Timeline()
        self.stall_factor, self.stall_minimum = stall_factor, stall_minimum
        self.run_dir = paths.run(plan.run_id)
        self.folder = state.run_folder(plan.run_id)

    def start(self) -> None:
        """Make the run folder on every node (clearing a previous attempt's pid and
        exit files), then start every process detached."""
        run_dir = shlex.quote(self.run_dir)
        prepare = f"mkdir -p {run_dir} && rm -f {run_dir}/*.pid {run_dir}/*.exit"
        self.group.remote.map_or_raise("prepare", self.group.hosts, lambda h: self.group.remote.check(h, prepare))
        by_host: dict[int, list[launch.Launch]] = {}
        for item in self.plan.launches:
            by_host.setdefault(item.host, []).append(item)

        def start(host: Host) -> None:
            items = by_host[self.group.hosts.index(host)]
            command = " && ".join(launch.launch_command(item, self.paths, self.plan.run_id) for item in items)
            self.group.remote.check(host, command, timeout=60)

        _, failures = self.group.remote.map([self.group.hosts[i] for i in by_host], start)
        if failures:
            self.stop()
            raise RemoteError("start", {h.label: r for h, r in failures.items()})

    def states(self) -> dict[int, dict[str, dict]]:
        """Each host's processes: running, exited (with the code) or lost."""
        hosts = self.group.hosts
        wanted = {i: self.plan.tasks_on(i) for i in range(len(hosts)) if self.plan.tasks_on(i)}

        def look(host: Host) -> dict:
            return self.group.remote.node(host, self.group.python, "status", self.run_dir,
                                          *wanted[hosts.index(host)], timeout=30)

        results = self.group.remote.map_or_raise("status", [hosts[i] for i in wanted], look)
        return {hosts.index(h): states for h, states in results.items()}

    def watch(self, timeout: float) -> Verdict:
        deadline = time.monotonic() + timeout
        steps, output = launch.Progress(), launch.Progress()
        while True:
            verdict = launch.judge(self.plan, self.states())
            if verdict.done:
                return verdict
            if self.stall_factor:
                self.check_progress(steps, output)
            if time.monotonic() > deadline:
                raise RunFailed(f"run {self.plan.run_id} made no end within {timeout:g}s; stopped")
            time.sleep(self.interval)

    def progress(self) -> dict[Host, dict]:
        """Every host's last logged steps and stopped processes of this run."""
        remote, python = self.group.remote, self.group.python
        return remote.map_or_raise("progress", self.group.hosts, lambda h: remote.node(
            h, python, "progress", self.plan.run_id, self.run_dir, timeout=30))

    def frozen_hosts(self) -> list[str]:
        """Hosts where a process of the run is stopped (best effort: empty if a host does not answer)."""
        try:
            seen = self.progress()
        except KilnError:
            return []
        names = dict(zip(self.group.hosts, self.plan.names, strict=True))
        return sorted(names[host] for host, found in seen.items() if found["stopped"])

    def check_progress(self, steps: launch.Progress, output: launch.Progress) -> None:
        """Raise Stalled when some process's logged step stopped moving, or when a process that logs no
        kiln metrics has printed nothing for `stall_minimum` seconds."""
        seen = self.progress()
        now = time.monotonic()
        names = dict(zip(self.group.hosts, self.plan.names, strict=True))
        steps.observe(now, {f"{task}@{names[host]}": row["step"]
                            for host, found in seen.items() for task, row in found["metrics"].items()})
        output.observe(now, launch.output_streams(self.plan, {names[host]: found for host, found in seen.items()}))
        late, limit = steps.stalled(now, factor=self.stall_factor, minimum=self.stall_minimum)
        quiet = output.silent(now, minimum=self.stall_minimum)
        if late or quiet:
            frozen = [names[host] for host, found in seen.items() if found["stopped"]]
            hosts = launch.blame(late + quiet, frozen)
            detail = " (a process there is stopped)" if frozen else ""
            what = [f"no step progress for over {limit:.0f}s from {', '.join(late)}"] if late else []
            what += [f"no output for over {self.stall_minimum:.0f}s from {', '.join(quiet)}"] if quiet else []
            raise Stalled(f"{'; '.join(what)}; stalled: {', '.join(hosts)}{detail}", hosts)

    def stop(self) -> dict[str, str]:
        """Stop every process of the run on every host; failures by host."""
        remote, python = self.group.remote, self.group.python
        _, failures = remote.map(self.group.hosts,
                                 lambda h: remote.node(h, python, "stop", self.plan.run_id, "5", timeout=60))
        return {h.label: r for h, r in failures.items()}

    def collect(self) -> Path:
        """Copy every node's run folder into runs/<id>/hosts/<node>/."""
        def pull(host: Host) -> None:
            name = self.plan.names[self.group.hosts.index(host)]
            argv = commands.rsync_pull_argv(host, self.run_dir, str(self.folder / "hosts" / name),
                                            self.group.remote.options)
            self.group.remote.rsync(host, argv)

        _, failures = self.group.remote.map(self.group.hosts, pull)
        for host, reason in failures.items():
            print(f"warning: could not collect from {host.label}: {reason}", file=sys.stderr)
        return self.folder

    def spread_checkpoint(self) -> None:
        """Give every node the chief's checkpoints (first node) before a restart,
        so every process resumes from the same step without shared storage."""
        source, others = self.group.hosts[0], self.group.hosts[1:]
        checkpoints = self.plan.checkpoint_dir or f"{self.run_dir}/checkpoints"
        local = self.folder / "checkpoints"
        options = self.group.remote.options
        present = self.group.remote.run(source, ["test", "-d", checkpoints], timeout=30).code == 0
        if not present:
            return
        self.group.remote.rsync(source, commands.rsync_pull_argv(source, checkpoints, str(local), options))
        self.group.remote.map_or_raise("spread checkpoints", others, lambda h: self.group.remote.rsync(
            h, commands.rsync_push_argv(str(local), h, checkpoints, options, excludes=())))

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

    def run(self, record: RunRecord, timeout: float, max_restarts: int = 0) -> dict:
        """Watch the run to its end, restarting it up to `max_restarts` times from
        the last checkpoint; stop, collect, and write summary.json."""
        started = time.monotonic()
        restarts, timeline = [], self.timeline
        while True:
            error, error_hosts = None, []
            try:
                with timeline.phase("watch"):
                    verdict = self.watch(timeout)
            except KilnError as failure:  # stalled, out of time, or a node stopped answering: stop the rest
                verdict, error, error_hosts = Verdict(True, ()), str(failure), getattr(failure, "hosts", [])
            watched = timeline.of("watch")[-1]["ended"]
            frozen = self.frozen_hosts() if verdict.failed else []
            with timeline.phase("stop"):
                left = self.stop()
            with timeline.phase("collect"):
                self.collect()
            timeline.spans += node_spans(runs.process_times(self.folder), watched, timeline.attempt)
            log = read_text(self.folder / "hosts" / self.plan.names[0] / f"{launch.HOROVOD_TASK}.log") \
                if verdict.failed else ""
            attempt = launch.judge_attempt(self.plan, verdict, horovod_log=log, error=error,
                                           error_hosts=error_hosts, frozen=frozen, left=list(left))
            if not launch.should_restart(attempt, len(restarts), max_restarts):
                break
            restarts.append({"attempt": len(restarts) + 1, "failure": attempt.failure,
                             "hosts": list(attempt.blamed), "at_step": self.chief_step()})
            print(f"restart {len(restarts)} of {max_restarts} after: {attempt.failure}", flush=True)
            timeline.attempt += 1
            with timeline.phase("restore"):
                self.spread_checkpoint()
            with timeline.phase("start"):
                self.start()
        failure = attempt.failure
        data = runs.summary(record, status="failed" if failure else "ok", failure=failure, folder=self.folder,
                            wall=time.monotonic() - started, restarts=restarts, phases=self.timeline.spans)
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
