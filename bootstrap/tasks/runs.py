"""Tasks on a run, found by its id in runs/ (no -H needed): status, logs, stop."""

from __future__ import annotations

import shlex
import subprocess
import threading
import time

from bootstrap import commands, launch, runs, state
from bootstrap.cluster import Cluster
from bootstrap.commands import SshOptions
from bootstrap.errors import RemoteError, UsageError
from bootstrap.supervisor import Supervisor
from bootstrap.tasks import cluster_task


def reopen(c, run_id: str | None, fanout: int = 64) -> tuple[state.RunRecord, Cluster, launch.NodePaths]:
    """A cluster session from a saved run record, so run tasks need no -H."""
    record = state.load_run(run_id)
    options = SshOptions(config_file=record.ssh.config_file, identity=record.ssh.identity,
                         connect_timeout=record.ssh.connect_timeout)
    group = Cluster.connect(record.cluster, record.hosts, options, python=record.python, fanout=fanout,
                            timeout=float(c.config.timeouts.command or 300))
    return record, group, launch.NodePaths(record.root)


def plan_from_record(record: state.RunRecord) -> launch.RunPlan:
    launches = tuple(launch.Launch(t.host_index, t.task, (), {}) for t in record.tasks)
    return launch.RunPlan(record.run_id, record.mode, record.names, launches, record.finishing, record.rank_hosts)


RUN_HELP = {"run_id": "the run (default: the newest in runs/)"}


@cluster_task(help=RUN_HELP)
def status(c, run_id=None):
    """Show each process of a run: running, exited (with its code) or lost."""
    record, group, paths = reopen(c, run_id)
    plan = plan_from_record(record)
    states = Supervisor(group, plan, paths).states()
    for item in plan.launches:
        seen = states.get(item.host, {}).get(item.task, {})
        detail = f" (exit {seen['code']})" if seen.get("state") == "exited" else ""
        print(f"{plan.names[item.host]:<20} {item.task:<12} {seen.get('state', '?')}{detail}")
    verdict = launch.judge(plan, states)
    summary = "failed: " + launch.describe_failure(plan, verdict) if verdict.failed else (
        "done" if verdict.done else "running")
    print(f"run {plan.run_id}: {summary}")


@cluster_task(help={**RUN_HELP, "host": "only this node (its hostname)", "follow": "keep printing new lines",
                    "lines": "how many last lines (default 50)"})
def logs(c, run_id=None, host=None, follow=False, lines=50):
    """Print (or follow) the logs of a run's processes, per host."""
    record, group, paths = reopen(c, run_id)
    plan = plan_from_record(record)
    chosen = [i for i, name in enumerate(plan.names) if host in (None, name)]
    if not chosen:
        raise UsageError(f"no host {host!r} in run {plan.run_id} (hosts: {', '.join(plan.names)})")
    run_dir = paths.run(plan.run_id)
    printer = threading.Lock()

    def show(index: int) -> None:
        files = [f"{run_dir}/{task}.log" for task in plan.tasks_on(index)]
        if not files:
            return
        argv = ["tail", "-n", str(lines), *(["-F"] if follow else []), *files]
        command = commands.ssh_argv(group.hosts[index], shlex.join(argv), group.remote.options)
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL) as process:
            for line in process.stdout:
                with printer:
                    print(f"[{plan.names[index]}] {line}", end="")

    threads = [threading.Thread(target=show, args=(i,), daemon=True) for i in chosen]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join(timeout=None if follow else float(c.config.timeouts.command or 300))
    except KeyboardInterrupt:
        pass


@cluster_task(help=RUN_HELP)
def stop(c, run_id=None):
    """Stop every process of a run on every host and collect what it left."""
    record, group, paths = reopen(c, run_id)
    supervisor = Supervisor(group, plan_from_record(record), paths)
    left = supervisor.stop()
    folder = supervisor.collect()
    failure = "could not stop: " + ", ".join(left) if left else None
    data = runs.summary(record, status="stopped", failure=failure, folder=folder, wall=time.time() - record.started)
    state.save_summary(record.run_id, data)
    print(f"stopped run {record.run_id}; run folder: {folder}")
    if left:
        raise RemoteError("stop", left)

