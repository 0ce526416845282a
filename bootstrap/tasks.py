"""Fabric tasks `cluster.*`: thin wrappers that parse, plan, then execute."""

from __future__ import annotations

import functools
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fabric import task
from invoke.exceptions import Exit

from bootstrap import commands, launch, mesh, runs, topology
from bootstrap import hosts as hostlists
from bootstrap.cluster import REMOTE_ROOT, Cluster, load_cluster_file
from bootstrap.commands import SshOptions
from bootstrap.errors import KilnError, RemoteError, UsageError
from bootstrap.hosts import Host
from bootstrap.supervisor import Supervisor

HOST_HELP = {
    "hostfile": "read hosts from FILE (`host [slots=N]` per line) instead of -H",
    "cluster": "the cluster's name; its key and pinned host keys live in ~/.kiln/clusters/NAME",
    "slots": "processes per host (default: 1 for -H, the hostfile's slots=N)",
    "python": "the Python on the nodes with TensorFlow and Horovod (default: this Python's path)",
    "fanout": "talk to at most this many hosts at once (default 64)",
    "accept_new_host_keys": "trust and record host keys seen for the first time (default: refuse unknown keys)",
    "dry_run": "print the plan and change nothing",
}


def cluster_task(**task_kwargs):
    """A task that runs once over all hosts (see bootstrap.executor) and turns
    kiln's errors into a message and exit code, without a traceback."""
    def decorate(function):
        @functools.wraps(function)
        def wrapper(c, *args, **kwargs):
            try:
                return function(c, *args, **kwargs)
            except KilnError as error:
                raise Exit(f"kiln: {error}", code=error.exit_code) from None

        made = task(**task_kwargs)(wrapper)
        made.kiln_cluster = True
        return made
    return decorate


def host_list(c, hostfile: str | None, slots: int | None, saved: dict | None = None) -> list[Host]:
    """Hosts from -H, from --hostfile, or from the cluster file of --cluster."""
    given = c.config.get("kiln_hosts")
    if given and hostfile:
        raise UsageError("give hosts either with -H or with --hostfile, not both")
    if hostfile:
        try:
            text = Path(hostfile).read_text()
        except OSError as error:
            raise UsageError(f"cannot read hostfile {hostfile}: {error.strerror}") from None
        found = hostlists.parse_hostfile(text, source=hostfile)
        return hostlists.with_slots(found, slots) if slots else found
    if given:
        return hostlists.with_slots(hostlists.parse_host_list(given), slots or 1)
    if saved:
        return hostlists.with_slots(saved["hosts"], slots) if slots else saved["hosts"]
    raise UsageError("no hosts: give them with -H h1,h2,..., --hostfile FILE, or --cluster NAME "
                     "of a cluster that cluster.mesh has set up")


def ssh_options(c, saved: dict | None = None) -> SshOptions:
    """Fabric's own flags (-S ssh config, -i identity, -t connect timeout), else the cluster file's."""
    config = c.config
    key = config.connect_kwargs.get("key_filename")
    if isinstance(key, (list, tuple)):
        key = key[0] if key else None
    ssh_config = config.get("ssh_config_path") or getattr(config, "_runtime_ssh_path", None)
    timeout = config.connect_kwargs.get("timeout") or config.timeouts.connect or 10
    recorded = (saved or {}).get("ssh", {})
    return SshOptions(config_file=ssh_config or recorded.get("config_file"), identity=key or recorded.get("identity"),
                      connect_timeout=int(timeout))


@dataclass
class Target:
    hosts: list[Host]
    name: str
    options: SshOptions
    python: str


def target(c, *, hostfile: str | None, cluster: str | None, slots: int | None, python: str | None) -> Target:
    """Parse what the user named: hosts, the cluster's name, ssh settings, the nodes' Python."""
    saved = load_cluster_file(mesh.validate_cluster_name(cluster)) if cluster else None
    hosts = host_list(c, hostfile, slots, saved)
    options = ssh_options(c, saved)
    name = cluster or mesh.default_cluster_name(hosts, options.config_file)
    return Target(hosts, name, options, python or (saved or {}).get("python") or sys.executable)


def open_cluster(c, goal: Target, *, fanout: int, accept_new_host_keys: bool = False) -> Cluster:
    return Cluster.connect(goal.name, goal.hosts, goal.options, python=goal.python, fanout=int(fanout),
                           timeout=float(c.config.timeouts.command or 300), accept_new=accept_new_host_keys)


def parse_ports(text: str) -> list[int]:
    try:
        ports = [int(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"--ports {text!r}: give comma-separated port numbers") from None
    if any(not 1 <= p <= 65535 for p in ports):
        raise UsageError(f"--ports {text!r}: ports run from 1 to 65535")
    return ports


def split_args(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:
        raise UsageError(f"--args {text!r}: {error}") from None


def print_changes(changed: dict[str, list[str]]) -> None:
    for host, files in changed.items():
        print(f"{host}: {'changed ' + ', '.join(files) if files else 'ok (nothing to change)'}")


@cluster_task(name="mesh", help=HOST_HELP)
def mesh_(c, hostfile=None, cluster=None, slots=0, python=None, fanout=64, accept_new_host_keys=False,
          dry_run=False):
    """Set up passwordless SSH between all nodes with a per-cluster key and pinned host keys."""
    goal = target(c, hostfile=hostfile, cluster=cluster, slots=slots, python=python)
    if dry_run:
        print(f"cluster {goal.name}: key {mesh.cluster_dir(goal.name)}/id_ed25519 (made if missing)")
        print("on every node: ~/.ssh/kiln/<cluster>/{id_ed25519,known_hosts,config}, an Include in ~/.ssh/config,")
        print("the key in ~/.ssh/authorized_keys, and every node's name in /etc/hosts")
        print("hosts: " + ", ".join(h.label for h in goal.hosts))
        return
    group = open_cluster(c, goal, fanout=fanout, accept_new_host_keys=accept_new_host_keys)
    group.require_facts("mesh")
    print_changes(group.apply_mesh())


@cluster_task(help={**HOST_HELP, "ports": "comma-separated ports that must be free on every node",
                    "probes": "how many nodes prove the mesh by logging in to the next (default 8, 0: none)"})
def check(c, hostfile=None, cluster=None, slots=0, python=None, fanout=64, ports="", probes=8,
          accept_new_host_keys=False, dry_run=False):
    """Preflight: reachability, unique and routable hostnames, same versions, free ports, the mesh."""
    goal = target(c, hostfile=hostfile, cluster=cluster, slots=slots, python=python)
    wanted_ports = parse_ports(ports)
    if dry_run:
        print(f"would check {len(goal.hosts)} host(s): " + ", ".join(h.label for h in goal.hosts))
        return
    group = open_cluster(c, goal, fanout=fanout, accept_new_host_keys=accept_new_host_keys)
    table, passed = group.preflight(ports=wanted_ports, probes=int(probes))
    print(table)
    if not passed:
        raise KilnError("preflight failed (see the table above)")


@cluster_task(help={**HOST_HELP, "source": "the folder to copy (default: this project)"})
def sync(c, hostfile=None, cluster=None, slots=0, python=None, fanout=64, source=None, accept_new_host_keys=False,
         dry_run=False):
    """Copy the training code to ~/kiln/code on every node."""
    goal = target(c, hostfile=hostfile, cluster=cluster, slots=slots, python=python)
    source = source or str(runs.PROJECT)
    where = f"~/{REMOTE_ROOT}/code on {len(goal.hosts)} host(s)"
    if dry_run:
        print(f"would mirror {Path(source).resolve()} to {where}: " + ", ".join(h.label for h in goal.hosts))
        return
    open_cluster(c, goal, fanout=fanout, accept_new_host_keys=accept_new_host_keys).sync(source, f"{REMOTE_ROOT}/code")
    print(f"synced {Path(source).resolve()} to {where}")


TRAIN_HELP = {
    **HOST_HELP,
    "mode": "horovod (one horovodrun over a hostfile) or tf-config (one process per role)",
    "ps": "tf-config: number of parameter servers (adds a chief as coordinator)",
    "chief": "tf-config: add a chief to a multi-worker run",
    "evaluator": "tf-config: add an evaluator beside the chief; it evaluates the model the chief saves",
    "mpi": "horovod: run over MPI instead of Gloo",
    "nic": "the network interface the nodes use between them (default: found)",
    "base_port": f"tf-config: first port for the processes on each host (default {topology.DEFAULT_BASE_PORT})",
    "args": "extra arguments for the trainer, e.g. '--epochs 3 --batch-size 64'",
    "run_id": "name the run (default: time stamp + random)",
    "detach": "start the run and return; follow it with cluster.status / cluster.logs",
    "timeout": "stop the run if it has not ended after this many seconds (default 3600)",
    "max_restarts": "when a process fails, restart the run from the chief's last checkpoint up to N times",
    "stall_factor": "stop a run whose steps stop moving for this many times the median time between logged "
                    "steps (default 20; 0: no watchdog)",
    "stall_minimum": "... and for at least this many seconds (default 60)",
}


@cluster_task(help=TRAIN_HELP)
def train(c, hostfile=None, cluster=None, slots=0, python=None, fanout=64, accept_new_host_keys=False,
          mode="horovod", ps=0, chief=False, evaluator=False, mpi=False, nic=None,
          base_port=topology.DEFAULT_BASE_PORT, args="", run_id=None, detach=False, timeout=3600, max_restarts=0,
          stall_factor=20.0, stall_minimum=60.0, dry_run=False):
    """Train across the hosts: mesh, preflight, sync, start every process, watch, collect."""
    launch.validate_mode(mode, ps=int(ps), evaluator=evaluator, mpi=mpi)
    goal = target(c, hostfile=hostfile, cluster=cluster, slots=slots, python=python)
    hosts = goal.hosts
    run_id = runs.validate_run_id(run_id) if run_id else runs.new_run_id()
    trainer_args = split_args(args)
    if dry_run:
        names = [h.address for h in hosts]
        plan = make_plan(mode, run_id, names, hosts, goal.python, launch.NodePaths(f"~/{REMOTE_ROOT}"),
                         trainer_args, nic or "(found at run time)", ps=int(ps), chief=chief, evaluator=evaluator,
                         mpi=mpi, base_port=int(base_port))
        print(launch.describe_plan(plan, hosts))
        return
    group = open_cluster(c, goal, fanout=fanout, accept_new_host_keys=accept_new_host_keys)
    nodes = group.require_facts("connect")
    group.apply_mesh()
    topo_ports = []
    if mode == "tf-config":
        probe = topology.plan_tf_config([n.name for n in nodes], [h.slots for h in hosts], ps=int(ps), chief=chief,
                                        evaluator=evaluator, base_port=int(base_port))
        topo_ports = sorted({p.port for p in probe.processes})
    table, passed = group.preflight(ports=topo_ports)
    if not passed:
        print(table)
        raise KilnError("preflight failed (see the table above); nothing was started")
    paths = launch.NodePaths(same_root(group))
    group.sync(str(runs.PROJECT), f"{REMOTE_ROOT}/code")
    names = [n.name for n in group.nodes]
    chosen_nic = nic or topology.common_interface({n.name: n.iface for n in group.nodes})
    plan = make_plan(mode, run_id, names, hosts, group.python, paths, trainer_args, chosen_nic, ps=int(ps),
                     chief=chief, evaluator=evaluator, mpi=mpi, base_port=int(base_port))
    record = save_record(group, plan, paths)
    supervisor = Supervisor(group, plan, paths, stall_factor=float(stall_factor), stall_minimum=float(stall_minimum))
    supervisor.start()
    print(f"run {run_id} started: {len(plan.launches)} process(es) on {len(hosts)} host(s)", flush=True)
    if detach:
        print(f"follow it with: fab cluster.status --run-id {run_id} / cluster.logs --run-id {run_id}")
        return
    try:
        supervisor.run(record, float(timeout), max_restarts=int(max_restarts))
    except KeyboardInterrupt:
        print(f"\ninterrupted: the run goes on; stop it with fab cluster.stop --run-id {run_id}")
        raise Exit(code=130) from None


def make_plan(mode, run_id, names, hosts, python, paths, trainer_args, nic, *, ps, chief, evaluator, mpi, base_port):
    slots = [h.slots for h in hosts]
    if mode == "horovod":
        return launch.plan_horovod(run_id, names, slots, python=python, paths=paths, trainer_args=trainer_args,
                                   nic=nic, mpi=mpi)
    topo = topology.plan_tf_config(names, slots, ps=ps, chief=chief, evaluator=evaluator, base_port=base_port)
    return launch.plan_tf_config(run_id, topo, python=python, paths=paths, trainer_args=trainer_args)


def same_root(group: Cluster) -> str:
    roots = {group.remote_root(h) for h in group.hosts}
    if len(roots) != 1:
        raise KilnError(f"nodes have different home folders ({', '.join(sorted(roots))}); "
                        "horovodrun needs the same path everywhere: use the same user on every node")
    return roots.pop()


def save_record(group: Cluster, plan: launch.RunPlan, paths: launch.NodePaths) -> dict:
    options = group.remote.options
    record = {
        "run_id": plan.run_id, "mode": plan.mode, "cluster": group.name, "python": group.python,
        "hosts": [h.endpoint() for h in group.hosts], "slots": [h.slots for h in group.hosts],
        "names": list(plan.names), "root": paths.root, "rank_hosts": list(plan.rank_hosts),
        "tasks": [{"host": plan.names[item.host], "host_index": item.host, "task": item.task}
                  for item in plan.launches],
        "finishing": list(plan.finishing),
        "ssh": {"config_file": options.config_file, "identity": options.identity,
                "connect_timeout": options.connect_timeout},
        "started": time.time(),
    }
    runs.save_json(runs.run_folder(plan.run_id) / "run.json", record)
    return record


def reopen(c, run_id: str | None, fanout: int = 64) -> tuple[dict, Cluster, launch.NodePaths]:
    """A cluster session from a saved run record, so run tasks need no -H."""
    record = runs.load_record(run_id)
    hosts = hostlists.parse_host_list(",".join(record["hosts"]))
    ssh = record["ssh"]
    options = SshOptions(config_file=ssh["config_file"], identity=ssh["identity"],
                         connect_timeout=ssh["connect_timeout"])
    group = Cluster.connect(record["cluster"], hosts, options, python=record["python"], fanout=fanout,
                            timeout=float(c.config.timeouts.command or 300))
    return record, group, launch.NodePaths(record["root"])


def plan_from_record(record: dict) -> launch.RunPlan:
    launches = tuple(launch.Launch(t["host_index"], t["task"], (), {}) for t in record["tasks"])
    return launch.RunPlan(record["run_id"], record["mode"], tuple(record["names"]), launches,
                          tuple(record["finishing"]), tuple(record["rank_hosts"]))


RUN_HELP = {"run_id": "the run (default: the newest in runs/)"}


@cluster_task(help=RUN_HELP)
def status(c, run_id=None):
    """Show each process of a run: running, exited (with its code) or lost."""
    record, group, paths = reopen(c, run_id)
    plan = plan_from_record(record)
    states = Supervisor(group, plan, paths).states()
    for item in plan.launches:
        state = states.get(item.host, {}).get(item.task, {})
        detail = f" (exit {state['code']})" if state.get("state") == "exited" else ""
        print(f"{plan.names[item.host]:<20} {item.task:<12} {state.get('state', '?')}{detail}")
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
    data = runs.summary(record, status="stopped", failure=failure, folder=folder,
                        wall=time.time() - record.get("started", time.time()))
    runs.save_json(folder / "summary.json", data)
    print(f"stopped run {record['run_id']}; run folder: {folder}")
    if left:
        raise RemoteError("stop", left)

