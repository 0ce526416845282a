"""Tasks on a run, found by its id in the runs folder (no -H needed): status, logs, stop, fetch, tensorboard."""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path, PurePosixPath

from bootstrap import commands, launch, plots, progress, runs, state
from bootstrap.cluster import SYNC_QUIET_S, Cluster
from bootstrap.commands import SshOptions
from bootstrap.errors import KilnError, RemoteError, UsageError
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
    # an elastic torchrun run is done when its first agent is (its other agents may end before)
    elastic = record.mode == "torchrun" and len(record.finishing) < len(record.tasks)
    return launch.RunPlan(record.run_id, record.mode, record.names, launches, record.finishing, record.rank_hosts,
                          elastic=elastic)


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
    failure = failure_of(group, paths, plan, verdict)
    if failure or verdict.done:
        settle(record, group, paths, failure)
    summary = f"failed: {failure}" if failure else "done" if verdict.done else "running"
    print(f"run {plan.run_id}: {runs.status_line(summary, state.load_summary(plan.run_id))}")


def failure_of(group: Cluster, paths: launch.NodePaths, plan: launch.RunPlan, verdict: launch.Verdict) -> str | None:
    """What failed in the run, with the failed processes' last log lines (None: nothing failed)."""
    if not verdict.failed:
        return None
    logs = {task: tail_log(group, paths, plan, host, task) for host, task, code in verdict.failed if code}
    return launch.describe_failure(plan, verdict, logs=logs)


def settle(record: state.RunRecord, group: Cluster, paths: launch.NodePaths, failure: str | None) -> None:
    """A detached run seen ended gets, once, what a watched run gets at its end: what is left of it stopped (a
    parameter server, an elastic run's other agents), its nodes' folders collected, its ports released, and
    summary.json (its wall time up to its last process's exit) with its plots. A watched run's watch writes its
    own; `stop` holds the same lock, so the two never both write."""
    if record.watched:
        return
    with state.run_lock(record.run_id):
        if state.load_summary(record.run_id) is not None:
            return
        left, folder = wind_up(record, group, paths)
        ended = max((times.exited for times in runs.process_times(folder).values() if times.exited), default=None)
        if left:
            failure = f"{failure + '; ' if failure else ''}could not stop: {', '.join(left)}"
        data = runs.summary(record, status="failed" if failure else "ok", failure=failure, folder=folder,
                            wall=max(0.0, (ended or time.time()) - record.started))
        state.save_summary(record.run_id, data)
        plots.draw(folder)


def wind_up(record: state.RunRecord, group: Cluster, paths: launch.NodePaths) -> tuple[dict[str, str], Path]:
    """Stop what is left of a run, collect its nodes' folders and give back its ports: (what could not be
    stopped, the run folder)."""
    supervisor = Supervisor(group, plan_from_record(record), paths)
    left = supervisor.stop()
    folder = supervisor.collect()
    group.release_ports(record.run_id, paths.root)
    return left, folder


def settle_if_ended(record: state.RunRecord, group: Cluster, paths: launch.NodePaths) -> bool:
    """For logs, fetch and stop: settle a detached run that has ended, if no task has yet; whether it has ended
    and been settled (now or before). Best effort: a node that does not answer leaves it for later."""
    if record.watched:
        return False
    if state.load_summary(record.run_id) is not None:
        return True
    plan = plan_from_record(record)
    try:
        verdict = launch.judge(plan, Supervisor(group, plan, paths).states())
        if not (verdict.done or verdict.failed):
            return False
        settle(record, group, paths, failure_of(group, paths, plan, verdict))
    except KilnError:
        return False
    return True


def tail_log(group: Cluster, paths: launch.NodePaths, plan: launch.RunPlan, host: str, task: str) -> str:
    """The last lines of a process's log on its node (best effort: empty if the node does not answer)."""
    where = group.hosts[plan.names.index(host)]
    log = f"{paths.run(plan.run_id)}/{task}.log"
    try:
        return group.remote.run(where, ["tail", "-n", "200", log], timeout=30).stdout
    except KilnError:
        return ""


@cluster_task(help={**RUN_HELP, "host": "only this node (its hostname)", "follow": "keep printing new lines",
                    "lines": "how many last lines (default 50)"})
def logs(c, run_id=None, host=None, follow=False, lines=50):
    """Print (or follow) the logs of a run's processes, per host."""
    record, group, paths = reopen(c, run_id)
    settle_if_ended(record, group, paths)
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
    settle_if_ended(record, group, paths)  # a detached run that has ended is summed up as it ended, not as stopped
    with state.run_lock(record.run_id):  # a status settling the run at this moment finishes first
        ended = not record.watched and state.load_summary(record.run_id)
        if ended:  # a detached run that a status, logs or fetch saw end
            print(f"run {record.run_id} had already ended ({ended['status']}); nothing to stop; run folder: "
                  f"{state.run_folder(record.run_id)}")
            return
        left, folder = wind_up(record, group, paths)
        failure = "could not stop: " + ", ".join(left) if left else None
        state.save_summary(record.run_id, runs.summary(record, status="stopped", failure=failure, folder=folder,
                                                       wall=time.time() - record.started))
    print(f"stopped run {record.run_id}; run folder: {folder}")
    if left:
        raise RemoteError("stop", left)



def fetch_destination(folder, node: str, path: str):
    """Where a fetched path lands: under the node's folder of the run, by its path in the node's run folder
    (`model` → hosts/<node>/model), or under fetched/ for an absolute path."""
    pure = PurePosixPath(path)
    if ".." in pure.parts:
        raise UsageError(f"--path {path}: name a path in the run folder (or an absolute one), without ..")
    if pure.is_absolute():
        return folder / "hosts" / node / "fetched" / pure.relative_to("/").parent
    return folder / "hosts" / node / pure.parent


@cluster_task(help={**RUN_HELP, "path": "what to copy: a path in the run's folder on the nodes (e.g. model, "
                                        "checkpoints, output) or an absolute path",
                    "host": "only this node (its hostname; default: every node of the run)"})
def fetch(c, path, run_id=None, host=None):
    """Copy a file or folder from the nodes of a run into its run folder (resumable: run it again to finish)."""
    record, group, paths = reopen(c, run_id)
    chosen = [i for i, name in enumerate(record.names) if host in (None, name)]
    if not chosen:
        raise UsageError(f"no host {host!r} in run {record.run_id} (hosts: {', '.join(record.names)})")
    settle_if_ended(record, group, paths)
    folder = state.run_folder(record.run_id)
    source = path if PurePosixPath(path).is_absolute() else f"{paths.run(record.run_id)}/{path}"

    def pull(index: int, report: progress.Report) -> str | None:
        if group.remote.run(group.hosts[index], ["test", "-e", source]).code != 0:
            return None
        destination = fetch_destination(folder, record.names[index], path)
        argv = commands.rsync_fetch_argv(group.hosts[index], source, str(destination), group.remote.options)
        group.remote.rsync(group.hosts[index], commands.with_progress(argv),
                           progress=lambda done, total: report.update(record.names[index], done, total))
        return str(destination / PurePosixPath(source).name)

    with progress.Report(f"fetching {source}", [record.names[i] for i in chosen], quiet_s=SYNC_QUIET_S) as report:
        fetched, failures = group.remote.map([group.hosts[i] for i in chosen],
                                             lambda h: pull(group.hosts.index(h), report))
    for where in fetched.values():
        if where:
            print(f"fetched {where}")
    lacking = [record.names[i] for i in chosen if group.hosts[i] in fetched and fetched[group.hosts[i]] is None]
    if lacking:
        print(f"not on {', '.join(lacking)}: {source}")
    if failures:
        raise RemoteError(f"fetch {source}", {h.label: reason for h, reason in failures.items()})
    if not any(fetched.values()):
        raise KilnError(f"fetch: no node of run {record.run_id} has {source}")


@cluster_task(help={**RUN_HELP, "port": "the local port to open TensorBoard on (default 6006)",
                    "remote_port": "the port TensorBoard listens on, on the chief's loopback (default: a free one)"})
def tensorboard(c, run_id=None, port=6006, remote_port=0):
    """TensorBoard over a run's folder on its first node, at http://127.0.0.1:PORT here (an SSH forward from
    loopback to loopback: no port is opened to the network). Ctrl-C ends it."""
    record, group, paths = reopen(c, run_id)
    chief = group.hosts[0]
    remote_port = int(remote_port) or 16006 + int(time.time()) % 1000
    command = shlex.join([record.python, "-m", "tensorboard.main", "--logdir", paths.run(record.run_id),
                          "--host", "127.0.0.1", "--port", str(remote_port)])
    options = replace(group.remote.options, control_path=None)  # its own connection, ending with it
    argv = commands.forward_argv(chief, int(port), remote_port, commands.tied_to_connection(command), options)
    print(f"TensorBoard for run {record.run_id} ({record.names[0]}): http://127.0.0.1:{port}/  (Ctrl-C ends it)",
          flush=True)
    with subprocess.Popen(argv, stdin=subprocess.PIPE) as process:  # its stdin open: TensorBoard lives while it does
        try:
            code = process.wait()
        except KeyboardInterrupt:
            process.terminate()
            process.wait(timeout=10)
            return
    if code != 0:
        raise KilnError(f"tensorboard on {record.names[0]} ended with status {code} (is port {port} free here, "
                        f"and tensorboard installed beside {record.python}?)")
