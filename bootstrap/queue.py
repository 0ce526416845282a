"""A kiln cluster's Slurm queue (I/O): its controller, and the nodes kiln's provisioner makes when jobs wait and
removes when they have been idle.

`up` makes the cluster with every node a slot (none made), then the controller: the cluster's MUNGE key (made
here, kept in the cluster's folder, readable by root alone), slurm.conf and gres.conf (bootstrap/slurm.py, one pure
function of the queue), the programs slurmctld runs to make and remove nodes (kiln's own resume, suspend and
resume-fail, bootstrap/programs.py), munged and slurmctld. The nodes a partition keeps up are resumed at once,
the rest when a job needs them.

`resume` is slurmctld's ResumeProgram: the provider makes the machines (`grow`), each one's Slurm name is given
its address (`scontrol update NodeAddr`), and over the cluster's pinned SSH each gets the MUNGE key (on stdin) and
the configuration and starts munged and slurmd (slurm.join_script). A node that cannot be made or joined is marked
down with the reason, and what was made for it is removed. `suspend` (the SuspendProgram) and `resume-fail`
remove the nodes' machines (`shrink`). One of these verbs runs at a time per cluster (a lock in its folder).

Where the controller runs: on the local provider, on this machine (slurmctld and munged as daemons; the nodes reach
it at the cluster's bridge); on a cloud, on a controller machine of the cluster's, where kiln ships itself and runs
this module (bootstrap/controller.py), and where each job's folder is carried to its nodes and back (job_start,
job_end: the nodes do not see its disk).

Who submits: the queue's configuration is this machine's, as a login node's /etc/slurm is (SHARED_ROOT/NAME:
slurm.conf and what kiln submit needs to know, readable by every user, no secret in it), so any user of this
machine submits with their own kiln (`kiln submit NAME`), their job running as them on the nodes, its folder theirs.
Making and removing the queue, and its programs, are root's who made it (the key, the controller's state).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bootstrap import providers, slurm, state
from bootstrap.commands import SshOptions, root_command, root_rsync, rsync_pull_argv, rsync_push_argv, ssh_argv
from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host, parse_host
from kiln.shield import shielded

PROGRAMS = ("resume", "suspend", "resume-fail", "lost")
# A node's Slurm files: slurm.conf, gres.conf, each daemon's spool and log. Not under /root: a job's user runs its
# batch script from slurmd's spool.
NODE_DIR = "/var/lib/kiln-slurm"
JOIN_TIMEOUT_S = 120
CARRY_TIMEOUT_S = 600  # rsync's own bound on a job's folder that stalls, to a node or back
# The settings slurmctld's programs keep from the operator's environment besides kiln's own: where each cloud's API
# is, where it is not the cloud's own (never a credential); a cloud's controller machine gets them too
SETTINGS = ("KILN_AWS_ENDPOINT_URL",)
SHARED_ROOT = Path("/run/kiln/queues")  # SHARED_ROOT/NAME: a queue's configuration, for every user of this machine
LOCK_TIMEOUT_S = 900  # a resume of many nodes holds the lock while it makes and joins them
TOOLS = ("slurmctld", "slurmd", "scontrol", "sinfo", "sbatch", "munged", "runuser")
KEY_BYTES = 1024  # as mungekey makes one
# A local node boots and goes in seconds (a cloud's: slurm.RESUME_TIMEOUT_S, SUSPEND_TIMEOUT_S); a node removed is
# resumed again only once its SuspendTimeout has passed (one asked for again before its suspend ran joins again).
LOCAL_RESUME_TIMEOUT_S = 300
LOCAL_SUSPEND_TIMEOUT_S = 10
# A local node's slurmd answers at once, or its machine is gone (a cloud's: slurm.SLURMD_TIMEOUT_S, REQUEUE_DELAY_S)
LOCAL_SLURMD_TIMEOUT_S = 30
LOCAL_REQUEUE_DELAY_S = 20


class QueueError(KilnError):
    """The queue's controller could not start, or a node could not be made or joined."""


@dataclass(frozen=True)
class Saved:
    """What kiln keeps of a queue (queue.json in its folder): the queue as slurm.conf says it, and which machine
    each Slurm node that is up is now (Slurm name -> {host, address})."""

    queue: slurm.Queue
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)


def folder(name: str) -> Path:
    return state.cluster_dir(name) / "queue"


def exists(name: str) -> bool:
    return (folder(name) / "queue.json").is_file()


def shared(name: str) -> Path:
    return SHARED_ROOT / name


@dataclass(frozen=True)
class Public:
    """What any user of this machine needs to submit to the queue (SHARED_ROOT/NAME/queue.json): its partitions (the
    first the default) with their most nodes, slurmctld's SlurmdTimeout, the nodes' Slurm folder and Python."""

    partitions: tuple[tuple[str, int], ...]
    slurmd_timeout_s: int
    node_dir: str
    python: str | None = None
    docker: bool = True  # its nodes have a Docker engine of their own (a cloud image's; kiln queue up --docker)


def public(name: str) -> Public | None:
    """The queue as this machine shows it to its users; None where it has none of that name."""
    data = state.read_json(shared(name) / "queue.json")
    if not isinstance(data, dict) and exists(name):
        raise UsageError(f"queue {name} has no configuration in {shared(name)} (this machine restarted, or an older "
                         f"kiln made it): kiln down {name}, then kiln queue up {name} again")
    if not isinstance(data, dict):
        return None
    try:
        return Public(tuple((str(p), int(n)) for p, n in data["partitions"]), int(data["slurmd_timeout_s"]),
                      str(data["node_dir"]), data.get("python"), bool(data.get("docker", True)))
    except (KeyError, TypeError, ValueError) as error:
        raise KilnError(f"{shared(name) / 'queue.json'} is not a kiln queue's ({error}); root's kiln down {name} "
                        "removes the queue") from None


def publish(name: str, queue: slurm.Queue, python: str | None, docker: bool) -> None:
    """The queue's configuration (slurm.conf, gres.conf, mpi.conf, the epilog: one pure function of the queue) and its
    public record, where every user of this machine reads them: no secret is in them (the MUNGE key stays in the
    queue's folder, root's)."""
    folder_ = shared(name)
    folder_.mkdir(parents=True, exist_ok=True)
    for made in (SHARED_ROOT.parent, SHARED_ROOT, folder_):  # whatever root's umask made them
        made.chmod(0o755)
    record = Public(tuple((shape.name, shape.max_nodes) for shape in queue.shapes), queue.power.slurmd_timeout_s,
                    queue.node_dir, python, docker)
    files = {**slurm.conf_files(queue), "queue.json": json.dumps(asdict(record), indent=1) + "\n"}
    for file, text in files.items():
        state.write_atomic(folder_ / file, text, mode=0o644)  # readable before it is in place


def load(name: str) -> Saved:
    path = folder(name) / "queue.json"
    data = state.read_json(path)
    if data is None:
        raise UsageError(f"cluster {name} has no queue (kiln queue up {name} makes one)")
    try:
        raw = data["queue"]
        queue = slurm.Queue(**{**raw, "shapes": tuple(slurm.Shape(**s) for s in raw["shapes"]),
                               "power": slurm.Power(**raw["power"])})
        return Saved(queue, dict(data.get("nodes", {})))
    except (KeyError, TypeError) as error:
        raise KilnError(f"{path} is not a kiln queue file ({error}); kiln down {name} removes the cluster") from None


def save(name: str, saved: Saved) -> None:
    state.write_json(folder(name) / "queue.json", {"queue": asdict(saved.queue), "nodes": saved.nodes})


@contextlib.contextmanager
def locked(name: str, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Held by one resume, suspend or resume-fail of the cluster at a time (slurmctld may start them together), and
    by `stop_controller` while it removes the queue; the queue's file is read again under it (a queue removed
    meanwhile is refused, and nothing of it is written again)."""
    if not folder(name).is_dir():
        raise UsageError(f"cluster {name} has no queue (kiln queue up {name} makes one)")
    with open(folder(name) / ".lock", "a") as lock:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise QueueError(f"queue {name}: another resume or suspend held it for {timeout_s:g} s") from None
                time.sleep(0.2)
        if not exists(name):
            raise UsageError(f"cluster {name} has no queue (it was removed)")
        yield


def slurm_env(name: str) -> dict[str, str]:
    """What Slurm's client tools (sbatch, srun, squeue, sinfo, scontrol) need to reach the cluster's queue, for any
    user of this machine."""
    return {"SLURM_CONF": str(shared(name) / "slurm.conf")}


def slurm_tool(name: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """One of Slurm's client tools against the cluster's queue, bounded (past it, a QueueError naming the tool). A
    queue whose slurm.conf is gone (taken down) is said at once: Slurm's tools without one look for the controller
    in DNS, and wait out their timeout where no DNS answers."""
    env = slurm_env(name)
    if not Path(env["SLURM_CONF"]).is_file():
        raise QueueError(f"queue {name} is gone: no {env['SLURM_CONF']} (kiln queue up {name} makes a queue)")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env},
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise QueueError(f"queue {name}: {argv[0]} got no answer in {timeout:g} s (is its slurmctld up? kiln queue "
                         f"status {name})") from None


def scontrol(name: str, *args: str, timeout: float = 30) -> str:
    done = slurm_tool(name, "scontrol", *args, timeout=timeout)
    if done.returncode:
        raise QueueError(f"scontrol {' '.join(args)}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def kiln_argv() -> list[str]:
    """How slurmctld's programs start kiln: this Python, kiln's entry for them (bootstrap/programs.py)."""
    return [sys.executable, "-m", "bootstrap.programs"]


def program_env() -> dict[str, str]:
    """The settings kiln runs with here, which slurmctld's programs keep (slurmctld's own environment is not the
    operator's)."""
    kept = ("KILN_HOME", "KILN_RUNS", "HOME", "PATH", "PYTHONPATH", *SETTINGS)
    return {key: os.environ[key] for key in kept if os.environ.get(key)}


# ---------------------------------------------------------------- up and down


def up(name: str, provider: providers.Provider, shapes: Sequence[slurm.Shape], *, suspend_time_s: int,
       docker: bool = False) -> list[str]:
    """Make the cluster (every node a slot; with `docker`, each with its own Docker engine, as a cloud image's) and
    its controller on this machine (the local provider; a cloud's: bootstrap/controller.py); resume the nodes the
    partitions keep up. Any failure removes what was made."""
    if provider.kind != "local":
        raise UsageError(f"kiln queue up --provider {provider.kind}: its controller is a machine of the cluster's "
                         "(bootstrap/controller.py up)")
    missing = [tool for tool in TOOLS if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin")]
    if missing:
        raise UsageError(f"kiln queue up: {', '.join(missing)} not installed here (Debian: apt-get install "
                         "slurmctld slurmd slurm-client munge; make setup installs them)")
    queue_dir = folder(name)
    draft = slurm.check_queue(plan_queue(name, shapes, "controller", "0.0.0.0", queue_dir, suspend_time_s))
    count = sum(shape.max_nodes for shape in draft.shapes)
    made = provider.up(provider.request(name, count, {"start": 0, **({"docker": True} if docker else {})}, None))
    try:
        host, address = provider.controller(name)
        queue = plan_queue(name, shapes, host, address, queue_dir, suspend_time_s)
        start_controller(name, queue, docker=docker or provider.kind != "local")
        kept = [slurm.node_names(queue, shape)[index] for shape in queue.shapes for index in range(shape.min_nodes)]
        failed = [line for line in (resume(name, ",".join(kept), provider=provider) if kept else [])
                  if ": failed on " in line]
        if failed:  # the nodes a partition keeps up are part of what up promised
            raise QueueError(f"queue {name}: " + "; ".join(failed))
    except BaseException as error:
        left = undo_up(name, provider)
        said = "interrupted" if isinstance(error, KeyboardInterrupt) else str(error)
        if left:
            raise QueueError(f"queue {name}: could not come up ({said}); undoing it left {'; '.join(left)}: "
                             f"run kiln down {name}") from None
        if isinstance(error, KeyboardInterrupt):  # said, not Invoke's silent exit
            raise QueueError(f"queue {name}: interrupted; everything it had made was removed") from None
        raise
    partitions = ", ".join(f"{shape.name} ({shape.min_nodes} to {shape.max_nodes} node(s))"
                           for shape in queue.shapes)
    return [*made.lines, f"queue {name}: slurmctld on {host} ({address}:{queue.port}); partitions {partitions}; "
            f"an idle node is removed after {suspend_time_s} s",
            f"  submit (any user of this machine): kiln submit {name} -- CMD, or SLURM_CONF="
            f"{shared(name) / 'slurm.conf'} sbatch ... (eval \"$(kiln queue env {name})\")"]


def undo_up(name: str, provider: providers.Provider) -> list[str]:
    """Remove what a failed `up` made (the controller's daemons and files, the cluster's machines), a Ctrl-C told
    that it goes on and a second one stopping it; what is left, as phrases."""
    steps = [(f"its controller (slurmctld, munged, {folder(name)})", lambda: stop_controller(name)),
             (f"its cluster's machines ({provider.kind})", lambda: provider.down(name))]
    left: list[str] = []
    with shielded(f"undoing what queue up {name} made", f"leaves it for kiln down {name}"):
        done = 0
        try:
            for what, step in steps:
                try:
                    step()
                except Exception as error:  # noqa: BLE001 - each step's failure is named, the next still runs
                    left.append(f"{what}: {error}")
                done += 1
        except KeyboardInterrupt:  # the second Ctrl-C: this step and the rest are not undone
            left += [f"{what}: not undone (Ctrl-C)" for what, _ in steps[done:]]
    return left


def plan_queue(name: str, shapes: Sequence[slurm.Shape], host: str, address: str, queue_dir: Path,
               suspend_time_s: int, *, cloud: bool = False) -> slurm.Queue:
    """The queue whose slurmctld runs as `host` at `address`: on this machine (the local provider: a free port,
    a local node's times), or on a cloud's controller machine (Slurm's own port, a cloud machine's times)."""
    programs = [str(queue_dir / "bin" / verb) for verb in PROGRAMS]
    if cloud:  # its nodes do not see the controller's disk: each job's folder is carried there and back
        start, end = (str(queue_dir / "bin" / verb) for verb in slurm.JOB_PROGRAMS)
        power = slurm.Power(*programs, job_start=start, job_end=end, suspend_time_s=suspend_time_s)
    else:
        power = slurm.Power(*programs, suspend_time_s=suspend_time_s, resume_timeout_s=LOCAL_RESUME_TIMEOUT_S,
                            suspend_timeout_s=LOCAL_SUSPEND_TIMEOUT_S, slurmd_timeout_s=LOCAL_SLURMD_TIMEOUT_S,
                            requeue_delay_s=LOCAL_REQUEUE_DELAY_S)
    # slurmctld as root, processes tracked by their tree: a local node shares this machine's kernel (a cloud
    # machine's cgroups come with the image's slurm role next)
    return slurm.Queue(name, host, address, tuple(shapes), str(queue_dir / "ctl"), NODE_DIR,
                       slurm.Munge(name).socket, power, user="root", cgroups=False,
                       port=slurm.SLURMCTLD_PORT if cloud else free_port())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def start_controller(name: str, queue: slurm.Queue, docker: bool = True) -> None:
    """The cluster's MUNGE key (made once), its configuration (slurm.conf, gres.conf, mpi.conf) and programs in its
    folder; munged and slurmctld started; returns once slurmctld answers."""
    queue_dir = folder(name)
    (queue_dir / "bin").mkdir(parents=True, exist_ok=True)
    (queue_dir / "ctl").mkdir(exist_ok=True)
    queue_dir.chmod(0o700)
    key = queue_dir / "munge.key"
    if not key.exists():
        with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(secrets.token_bytes(KEY_BYTES))
    save(name, Saved(queue))
    record = state.load_cluster(name)
    publish(name, queue, record.python if record else None, docker)
    power = queue.power
    programs = zip((*PROGRAMS, *slurm.JOB_PROGRAMS),
                   (power.resume, power.suspend, power.resume_fail, power.lost, power.job_start, power.job_end),
                   strict=True)
    for verb, path in ((verb, path) for verb, path in programs if path):
        Path(path).write_text(slurm.program_text(kiln_argv(), verb, name, str(queue_dir / f"{verb}.log"),
                                                 program_env()))
        Path(path).chmod(0o700)
    munge = slurm.Munge(name)
    started = subprocess.run(["sh", "-ec", munge.start_script()], input=base64.b64encode(key.read_bytes()),
                             capture_output=True, timeout=60)
    if started.returncode:
        raise QueueError(f"queue {name}: munged did not start: {started.stderr.decode(errors='replace').strip()}")
    daemon = subprocess.run(["slurmctld", "-f", slurm_env(name)["SLURM_CONF"]], capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)
    if daemon.returncode:
        raise QueueError(f"queue {name}: slurmctld did not start: {daemon.stderr.strip() or log_tail(queue)}")
    deadline = time.monotonic() + 60
    while True:
        try:
            scontrol(name, "ping")
            break
        except (QueueError, subprocess.TimeoutExpired) as error:
            if time.monotonic() > deadline:
                raise QueueError(f"queue {name}: slurmctld does not answer: {error}; {log_tail(queue)}") from None
        time.sleep(0.3)
    # a node going down runs kiln's lost program (a trigger kept in slurmctld's state: set once)
    triggers = slurm_tool(name, "strigger", "--get", "--node")
    if power.lost not in triggers.stdout:
        done = slurm_tool(name, "strigger", "--set", "--node", "--down", "--flags=PERM", f"--program={power.lost}")
        if done.returncode:
            raise QueueError(f"queue {name}: strigger refused kiln's lost program: {done.stderr.strip()}")


def log_tail(queue: slurm.Queue) -> str:
    log = Path(queue.state_dir) / "slurmctld.log"
    lines = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
    return f"its log says: {lines[-1]}" if lines else "it wrote no log"


def stop_controller(name: str, wait_s: float = 30) -> bool:
    """Stop the cluster's slurmctld (it saves its state as it ends) and munged, and remove the queue's folder.
    Whether there was a queue."""
    queue_dir = folder(name)
    if not queue_dir.exists():
        shutil.rmtree(shared(name), ignore_errors=True)  # what another kiln home's left
        return False
    # it starts no resume or suspend from here on
    stop_daemon(queue_dir / "ctl" / "slurmctld.pid", "slurmctld", wait_s)
    with contextlib.suppress(UsageError), locked(name):  # one running ends first: what it makes is removed after
        (queue_dir / "queue.json").unlink()
    stop_daemon(Path(slurm.Munge(name).path("pid")), "munged", wait_s)
    for suffix in ("key", "socket", "socket.lock", "pid", "seed", "log"):
        Path(slurm.Munge(name).path(suffix)).unlink(missing_ok=True)
    shutil.rmtree(queue_dir, ignore_errors=True)
    shutil.rmtree(shared(name), ignore_errors=True)
    return True


def stop_daemon(pid_file: Path, daemon: str, wait_s: float) -> None:
    """SIGTERM to the `daemon` of a pid file, then wait until it is gone (SIGKILL after `wait_s`); only where the
    process of that pid is that daemon: a file left by one that died, or from before the machine restarted, names
    a pid another process may have now."""
    try:
        pid = int(pid_file.read_text().split()[0])
        if Path(f"/proc/{pid}/comm").read_text().strip() != daemon:
            return
        os.kill(pid, signal.SIGTERM)
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return
    deadline = time.monotonic() + wait_s
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.1)


# ---------------------------------------------------------------- slurmctld's programs


def resume(name: str, nodes: str, *, provider: providers.Provider | None = None) -> list[str]:
    """Make a machine for each Slurm node of the hostlist `nodes` and join it to the queue; a node that fails is
    marked down with the reason and its machine removed. A node whose machine kiln still holds (slurmctld powered it
    down and asks for it again before its suspend came: that suspend waited on this lock) joins again on that
    machine, its slurmd started anew (slurmctld waits for a boot newer than its ask); where that machine does not
    join (lost meanwhile), it is removed and a new one made. A line per node."""
    with locked(name):
        saved = load(name)
        wanted = slurm.expand(nodes)
        known = {n for shape in saved.queue.shapes for n in slurm.node_names(saved.queue, shape)}
        strange = [node for node in wanted if node not in known]
        if strange:
            raise UsageError(f"queue {name} has no node {', '.join(strange)}")
        if not wanted:
            return []
        chosen = provider or placed(name)
        options = ssh_options(name, state.load_cluster(name))
        held = [node for node in wanted if node in saved.nodes]
        lines = rejoin(name, saved, held, chosen, options) if held else []
        saved = load(name)  # without the machines that did not join again
        fresh = [node for node in wanted if node not in saved.nodes]
        return lines + (make_and_join(name, saved, fresh, chosen, options) if fresh else [])


def rejoin(name: str, saved: Saved, held: Sequence[str], chosen: providers.Provider,
           options: SshOptions) -> list[str]:
    """Join each of `held` (nodes whose machines kiln holds) again on its machine; one that does not is removed
    and taken out of the queue's record (resume makes it anew). Interrupted, those not yet joined are removed and
    marked down, as a new machine would be."""
    lines, record = [], dict(saved.nodes)
    unjoined = {node: parse_host(saved.nodes[node]["host"]) for node in held}
    try:
        for node, host in list(unjoined.items()):
            try:
                join(name, saved.queue, node, host, options)
            except (KilnError, OSError, subprocess.TimeoutExpired) as error:
                lines.append(f"{node}: {host.label} did not join again ({error}): it is removed, a new machine made")
                drop(name, saved, record, node, host, chosen)
            else:
                lines.append(f"{node}: {host.label} ({saved.nodes[node]['address']}), joined again")
            del unjoined[node]
    finally:
        if unjoined:
            forget_unjoined(name, saved, record, unjoined, chosen, [])
    return lines


def make_and_join(name: str, saved: Saved, fresh: Sequence[str], chosen: providers.Provider,
                  options: SshOptions) -> list[str]:
    """Make a machine for each of `fresh` and join it; a node that cannot be made or joined is marked down with the
    reason, and its machine removed."""
    try:
        added = chosen.grow(name, len(fresh))
    except (KilnError, OSError, subprocess.TimeoutExpired) as error:
        for node in fresh:
            mark_down(name, node, f"kiln could not make it: {error}")
        raise
    lines, record = [], dict(saved.nodes)
    unjoined = {node: made.host for node, made in zip(fresh, added, strict=False)}  # grow makes all, or none
    addresses = {node: made.address for node, made in zip(fresh, added, strict=False)}
    extra = [made.host for made in added[len(fresh):]]  # so none of these is ever the queue's
    # Every machine made is on record before a join can take long, so that one this program leaves behind
    # (slurmctld kills it outright 10 ms after its SIGTERM) is removed by its node's resume-fail or suspend.
    record.update({node: {"host": host.label, "address": addresses[node]} for node, host in unjoined.items()})
    try:
        save(name, replace(saved, nodes=record))
        for node in fresh[len(added):]:
            mark_down(name, node, "kiln made no machine for it")
        for node, host in list(unjoined.items()):
            address = addresses[node]
            try:
                scontrol(name, "update", f"NodeName={node}", f"NodeAddr={address}", f"NodeHostname={host.label}")
                join(name, saved.queue, node, host, options)
            except (KilnError, OSError, subprocess.TimeoutExpired) as error:
                mark_down(name, node, f"kiln could not join {host.label}: {error}")
                lines.append(f"{node}: failed on {host.label} ({address}): {error}")
                drop(name, saved, record, node, host, chosen)
            else:
                lines.append(f"{node}: {host.label} ({address})")
            del unjoined[node]
    finally:  # interrupted (a kill, an error of another kind): no machine the queue does not know
        if unjoined or extra:
            forget_unjoined(name, saved, record, unjoined, chosen, extra)
    return lines


def drop(name: str, saved: Saved, record: dict, node: str, host: Host, chosen: providers.Provider) -> None:
    """A node's machine that did not join: removed (best effort: gone already, or not the cluster's any more, it
    does not stop the other joins) and out of the queue's record."""
    with contextlib.suppress(Exception):
        chosen.shrink(name, [host])
    del record[node]
    save(name, replace(saved, nodes=record))


def forget_unjoined(name: str, saved: Saved, record: dict, unjoined: dict[str, Host], chosen: providers.Provider,
                    extra: Sequence[Host]) -> None:
    """A resume that ends before it joined `unjoined` (and made `extra`, never the queue's): their machines removed,
    the nodes marked down (not powering up with their jobs until ResumeTimeout) and out of the queue's record; a
    second kill does not cut it short."""
    with terms_held_off():
        with contextlib.suppress(Exception):
            chosen.shrink(name, [*unjoined.values(), *extra])
        for node in unjoined:
            with contextlib.suppress(Exception):
                mark_down(name, node, "kiln's resume ended before it joined the node's machine")
            record.pop(node, None)
        with contextlib.suppress(Exception):
            save(name, replace(saved, nodes=record))


@contextlib.contextmanager
def terms_held_off() -> Iterator[None]:
    """SIGTERM ignored for the block (in the main thread, where Python takes signals), then as it was."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def suspend(name: str, nodes: str, *, why: str = "suspended") -> list[str]:
    """Remove the machines of the Slurm nodes of the hostlist `nodes` (idle past SuspendTime, or failed to
    resume in time). A line per node."""
    with locked(name):
        saved = load(name)
        gone = [node for node in slurm.expand(nodes) if node in saved.nodes and not powered_up(name, node, why)]
        if gone:
            placed(name).shrink(name, [parse_host(saved.nodes[node]["host"]) for node in gone])
        save(name, replace(saved, nodes={k: v for k, v in saved.nodes.items() if k not in gone}))
        return [f"{node}: {why}, {saved.nodes[node]['host']} removed" for node in gone]


def lost(name: str, nodes: str) -> list[str]:
    """slurmctld's trigger on nodes going down: each that no longer answers (its machine lost, or preempted) is
    powered down by force, so its jobs go back in the queue and the suspend program removes what is left of its
    machine; a node kiln marked down itself (it could not be made) is left as it is. A line per node."""
    lines = []
    for node in slurm.expand(nodes):
        try:
            shown = scontrol(name, "show", "node", "--oneliner", node)
        except (KilnError, subprocess.TimeoutExpired) as error:
            lines.append(f"{node}: not read: {error}")
            continue
        if slurm.down_by_kiln(shown):  # powered down now, the reason why it is down would go, and a resume come
            lines.append(f"{node}: kiln marked it down (it could not be made or joined): left as it is")
            continue
        if not slurm.not_responding(shown):
            lines.append(f"{node}: down, but it answers: left as it is")
            continue
        try:
            scontrol(name, "update", f"NodeName={node}", "State=POWER_DOWN_FORCE", "Reason=kiln: lost (no answer)")
        except KilnError as error:  # the next node's still taken
            lines.append(f"{node}: lost, not powered down: {error}")
            continue
        lines.append(f"{node}: lost: powered down, its jobs back in the queue")
    return lines


def job_start(name: str, job: str, work_dir: str, nodes: str, poll_s: float = 1.0) -> list[str]:
    """slurmctld's prolog of a job on a cloud's queue (its working folder and nodes, as slurmctld gives them): once
    each of its nodes is up (slurmctld allocates powered-down
    nodes, then resumes them), the job's folder is copied to the same path there, over the cluster's pinned SSH
    (its nodes do not see the controller's disk). A failure requeues the job (slurmctld's own)."""
    place = slurm.job_place(work_dir, nodes)
    if place is None:
        return [f"job {job}: not kiln's: nothing to carry"]
    folder, nodes = place
    hosts = joined_hosts(name, slurm.expand(nodes), poll_s)
    options = ssh_options(name, state.load_cluster(name))
    for node, host in hosts.items():
        push = rsync_push_argv(folder, host, folder, options, excludes=(), timeout=CARRY_TIMEOUT_S, one_writer=False)
        push[1:1] = root_rsync(host.user)  # the job's own files, as they are here (its user's)
        carry(push, f"job {job}: its folder did not reach {node} ({host.label})")
    return [f"job {job}: {folder} copied to {', '.join(hosts)}"]


def job_end(name: str, job: str, work_dir: str, nodes: str) -> list[str]:
    """slurmctld's epilog of a job on a cloud's queue (as job_start's): what each of its nodes wrote in the job's
    folder (its code aside) comes back into the folder here, and the node's copy goes; a node that cannot be
    reached (lost) is named, and the others still come back."""
    place = slurm.job_place(work_dir, nodes)
    if place is None:
        return [f"job {job}: not kiln's: nothing to carry"]
    folder, nodes = place
    saved, options = load(name), ssh_options(name, state.load_cluster(name))
    lines = []
    for node in slurm.expand(nodes):
        if node not in saved.nodes:
            lines.append(f"job {job}: {node} has no machine any more: what it wrote is lost")
            continue
        host = parse_host(saved.nodes[node]["host"])
        try:
            pull = rsync_pull_argv(host, folder, folder, options, timeout=CARRY_TIMEOUT_S, excludes=("/code/",))
            pull[1:1] = ["--update", *root_rsync(host.user)]  # a file another node wrote anew stays
            carry(pull, f"job {job}: what {node} ({host.label}) wrote did not come back")
            subprocess.run(ssh_argv(host, root_command(f"rm -rf {shlex.quote(folder)}", host.user), options),
                           capture_output=True,
                           timeout=JOIN_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (QueueError, subprocess.TimeoutExpired) as error:
            lines.append(str(error))
            continue
        lines.append(f"job {job}: {node}'s files came back")
    return lines


def joined_hosts(name: str, nodes: Sequence[str], poll_s: float) -> dict[str, Host]:
    """The machine of each of `nodes` once slurmctld has it up (its resume joined it), within ResumeTimeout."""
    deadline = time.monotonic() + load(name).queue.power.resume_timeout_s
    waiting = list(nodes)
    while True:
        waiting = [node for node in waiting if not slurm.node_up(scontrol(name, "show", "node", "--oneliner", node))]
        saved = load(name)
        if not waiting and all(node in saved.nodes for node in nodes):
            return {node: parse_host(saved.nodes[node]["host"]) for node in nodes}
        if time.monotonic() > deadline:
            raise QueueError(f"{', '.join(waiting) or 'its nodes'} did not come up within ResumeTimeout")
        time.sleep(poll_s)


def carry(argv: list[str], failed: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CARRY_TIMEOUT_S + 60,
                          stdin=subprocess.DEVNULL)
    if done.returncode:
        said = done.stderr.strip().splitlines()
        raise QueueError(f"{failed}: {said[-1] if said else f'rsync exited {done.returncode}'}")


def powered_up(name: str, node: str, why: str) -> bool:
    """Whether slurmctld has the node up again (a resume came between its suspend and this): a suspend that waited
    for the lock then leaves it. A node that did not come up in time (resume-fail) is always removed."""
    if why != "suspended":
        return False
    try:
        shown = scontrol(name, "show", "node", node)
    except (KilnError, subprocess.TimeoutExpired):
        return False
    return "POWERING_DOWN" not in shown and "POWERED_DOWN" not in shown


def placed(name: str) -> providers.Provider:
    record = state.load_cluster(name)
    if record is None:
        raise UsageError(f"no cluster {name!r} in {state.kiln_home()}/clusters")
    return providers.for_cluster(record, name)


def ssh_options(name: str, record: state.ClusterRecord | None) -> SshOptions:
    pinned = state.known_hosts_path(name)
    settings = record.ssh if record else state.SshSettings()
    return SshOptions(config_file=settings.config_file, identity=settings.identity,
                      known_hosts=(str(pinned),) if pinned.is_file() else (),
                      connect_timeout=settings.connect_timeout)


def join(name: str, queue: slurm.Queue, node: str, host: Host, options: SshOptions) -> None:
    """Over the cluster's pinned SSH (never a first contact), as root: the MUNGE key on stdin, munged, the
    configuration and slurmd under the node's Slurm name."""
    key = (folder(name) / "munge.key").read_bytes()
    script = slurm.join_script(queue, node)
    done = subprocess.run(ssh_argv(host, root_command(script, host.user), options), input=base64.b64encode(key),
                          capture_output=True, timeout=JOIN_TIMEOUT_S, start_new_session=True)
    if done.returncode:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise QueueError(f"exit {done.returncode}: {said[-1] if said else 'no output'}")


def mark_down(name: str, node: str, reason: str) -> None:
    """Tell slurmctld the node is down and why (its jobs go back in the queue); best effort."""
    with contextlib.suppress(KilnError, subprocess.TimeoutExpired):
        scontrol(name, "update", f"NodeName={node}", "State=DOWN", f"Reason={reason[:200]}")


def env_lines(name: str) -> str:
    if public(name) is None:
        raise UsageError(f"cluster {name} has no queue (kiln queue up {name} makes one)")
    return "".join(f"export {key}={value}\n" for key, value in slurm_env(name).items())
