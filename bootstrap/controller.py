"""A queue's controller machine on a cloud: kiln ships itself there and the queue runs on it (I/O at the edges; the
pure parts first).

`kiln queue up NAME --provider aws` makes the cluster with no node and its controller machine (the provider's
`make_controller`: its identity, its instance, its host keys pinned from the console); then, over that pinned SSH as
root, this module

1. asks the controller its Python, machine, host name and Slurm (`PROBE`);
2. ships kiln there, into CONTROLLER_ROOT: kiln's own packages and the pure-Python distributions its programs
   import to reach the cloud (`SDKS`, with what they require on the controller's Python), copied from the
   distributions kiln runs with here: the controller runs the very code and SDK versions the operator has, from
   nothing it fetches itself. A distribution with compiled parts is refused (it was built for this machine);
3. ships the cluster's folder (its cluster file as the controller reaches the nodes: the cluster's key, its pinned
   known_hosts; no credential: the controller's cloud calls use the identity its machine holds);
4. starts the queue there (`python3 -m bootstrap.controller start NAME`, run by `serve` below): the MUNGE key is
   made on the controller and leaves it only to join a node over the pinned mesh; slurm.conf is the queue's pure
   function, as on the local provider; slurmctld's programs are kiln's (bootstrap/programs.py), run there.

The login user's shell there has the queue's SLURM_CONF (a line in its ~/.profile), as a site's login node has its
cluster's: the queue verbs reach it as a login node (bootstrap/attached.py).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import bootstrap
import kiln
from bootstrap import attached, queue, slurm, state
from bootstrap.commands import SshOptions, root_command, root_rsync, rsync_push_argv, ssh_argv
from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host
from bootstrap.providers import common
from bootstrap.ssh import describe_failure
from kiln.shield import shielded

CONTROLLER_ROOT = "/root/kiln/controller"  # kiln's folder on root's machines, as on the nodes
LIB = f"{CONTROLLER_ROOT}/lib"  # kiln and the distributions it ships (PYTHONPATH)
HOME = f"{CONTROLLER_ROOT}/home"  # KILN_HOME there: the cluster's folder, its queue
JOBS = "kiln/jobs"  # the jobs' folders, under the login user's home there: each carried to its nodes and back
# The distributions kiln's programs import to reach each cloud (its official SDK), beside KILN_NEEDS
SDKS: dict[str, tuple[str, ...]] = {"aws": ("boto3",)}
KILN_NEEDS = ("rich",)  # what kiln's queue imports besides the standard library
PACKAGES = (bootstrap, kiln)  # kiln's own
PROBE_TIMEOUT_S = 60
SHIP_TIMEOUT_S = 300
START_TIMEOUT_S = 180
# What the controller says of itself (parse_probe): a KEY=VALUE line each
PROBE = "\n".join([
    "echo python=$(python3 -c 'import sys; print(\"%d.%d.%d\" % sys.version_info[:3])' 2>/dev/null)",
    "echo machine=$(uname -m)",
    "echo hostname=$(hostname)",
    "echo slurm=$(sinfo --version 2>&1)",
    'echo "home=$HOME"',
    "command -v rsync >/dev/null || echo missing=rsync",
    "for tool in slurmctld munged scontrol strigger; do command -v $tool >/dev/null || "
    "[ -x /usr/sbin/$tool ] || echo missing=$tool; done",
    "true",
])
MIN_PYTHON = (3, 11)


class ControllerError(KilnError):
    """The controller could not be reached, or kiln could not be shipped or started there."""


@dataclass(frozen=True)
class Probed:
    python: str  # 3.11.2
    machine: str  # x86_64
    hostname: str
    slurm: str = ""  # 22.05.8
    home: str = "/root"  # the login user's


def parse_probe(text: str, where: str) -> Probed:
    """PROBE's answer; refused naming what the controller `where` lacks (pure)."""
    said: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            said.setdefault(key.strip(), []).append(value.strip())
    python = (said.get("python") or [""])[0]
    parts = tuple(int(p) for p in python.split(".") if p.isdigit())
    if len(parts) < 2 or parts[:2] < MIN_PYTHON:
        raise ControllerError(f"the controller {where} has no python3 of {'.'.join(map(str, MIN_PYTHON))} or later "
                              f"({python or 'none'}): kiln's programs run there with it")
    if said.get("missing"):
        raise ControllerError(f"the controller {where} lacks {', '.join(said['missing'])}: is it a kiln image "
                              "(the slurm role)?")
    slurm = (said.get("slurm") or [""])[0].split()
    home = (said.get("home") or [""])[0]
    if not home.startswith("/") or any(char.isspace() or char == "%" for char in home):
        raise ControllerError(f"the controller {where}: its login user's home {home or '(none)'} cannot hold the "
                              "jobs' folders (Slurm takes their paths bare)")
    return Probed(python, (said.get("machine") or ["x86_64"])[0], (said.get("hostname") or [""])[0],
                  slurm[-1] if slurm else "", home.rstrip("/"))


def marker_environment(python: str, machine: str) -> dict[str, str]:
    """The controller as the markers of a distribution's requirements see it (PEP 508): its Python, Linux."""
    major_minor = ".".join(python.split(".")[:2])
    return {"python_version": major_minor, "python_full_version": python, "sys_platform": "linux",
            "platform_system": "Linux", "os_name": "posix", "platform_machine": machine,
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def required(lines: Iterable[str] | None, environment: Mapping[str, str]) -> list[str]:
    """The distributions a distribution requires where its markers hold in `environment` (no extra asked), by
    their normalized names (pure)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    needed = []
    for line in lines or ():
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(dict(environment)):
            needed.append(canonicalize_name(requirement.name))
    return needed


def closure(roots: Sequence[str], requires: Callable[[str], Iterable[str] | None],
            environment: Mapping[str, str]) -> list[str]:
    """`roots` and every distribution they require, in turn, in `environment` (pure, given `requires`)."""
    from packaging.utils import canonicalize_name

    order: list[str] = []
    waiting = [canonicalize_name(root) for root in roots]
    while waiting:
        name = waiting.pop(0)
        if name in order:
            continue
        order.append(name)
        waiting += required(requires(name), environment)
    return order


def compiled(files: Iterable[str]) -> list[str]:
    """The files of a distribution built for one machine (extension modules): it cannot be shipped (pure)."""
    return [f for f in files if f.endswith((".so", ".pyd", ".dylib")) or ".so." in f]


def shipped(files: Iterable[str]) -> list[str]:
    """Of a distribution's files (relative to its site folder), those the controller imports or reads: not its
    scripts outside the folder, nor bytecode (pure)."""
    return [f for f in files if not f.startswith("..") and "__pycache__/" not in f and not f.endswith(".pyc")]


def controller_record(record: state.ClusterRecord, home: str) -> state.ClusterRecord:
    """The cluster file as the controller keeps it: its nodes reached with the cluster's key in its own folder
    there, none of the operator's ssh settings (pure)."""
    identity = f"{home}/clusters/{record.name}/id_ed25519"
    return replace(record, ssh=state.SshSettings(identity=identity, connect_timeout=record.ssh.connect_timeout))


def settings_of(environ: Mapping[str, str]) -> dict[str, str]:
    """The operator's settings the controller's programs keep (queue.SETTINGS that are set) (pure)."""
    return {key: environ[key] for key in queue.SETTINGS if environ.get(key)}


def serve_argv(verb: str, name: str) -> str:
    """The command that runs kiln's controller side there, as root, from what was shipped."""
    return (f"cd / && KILN_HOME={shlex.quote(HOME)} PYTHONPATH={shlex.quote(LIB)} "
            f"exec python3 -m bootstrap.controller {shlex.quote(verb)} {shlex.quote(name)}")


def with_profile_line(text: str, name: str, conf: str) -> str:
    """A login user's ~/.profile with the line that points Slurm's tools at the cluster's queue (one line, marked,
    in place of an earlier one of the cluster) (pure)."""
    mark = f"# kiln queue {name}"
    kept = [line for line in text.splitlines() if not line.endswith(mark)]
    return "\n".join([*kept, f"export SLURM_CONF={shlex.quote(conf)}  {mark}"]) + "\n"


# ---------------------------------------------------------------- here: the operator's side


def stage(kind: str, environment: Mapping[str, str], into: Path) -> list[str]:
    """Copy kiln's packages and the distributions its programs need for `kind`'s cloud into `into` (a site folder);
    the distributions, by name."""
    if kind not in SDKS:
        raise UsageError(f"kiln queue up --provider {kind}: a queue's controller machine runs on "
                         f"{', '.join(sorted(SDKS))} for now")
    for package in PACKAGES:
        source = Path(package.__file__).parent
        shutil.copytree(source, into / source.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    try:
        names = closure([*SDKS[kind], *KILN_NEEDS], importlib.metadata.requires, environment)
    except importlib.metadata.PackageNotFoundError as error:
        raise ControllerError(f"{error.args[0] if error.args else error}: not installed here, and the controller's "
                              f"Python needs it for {', '.join(SDKS[kind])}: pip install 'kiln[{kind}]'") from None
    for name in names:
        dist = importlib.metadata.distribution(name)
        if dist.files is None:
            raise ControllerError(f"{name} {dist.version} does not list its files (installed by a system package?): "
                                  f"kiln ships what a distribution's RECORD names; pip install it into kiln's "
                                  "environment")
        files = [str(f) for f in dist.files]
        built = compiled(files)
        if built:
            raise ControllerError(f"{name} {dist.version} has parts built for this machine ({built[0]}): kiln "
                                  "ships pure-Python distributions to a controller")
        for relative in shipped(files):
            source = Path(dist.locate_file(relative))
            if source.is_file():
                target = into / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
    return names


class Controller:
    """The queue controller of cluster `name`, reached as root at `host` over the cluster's pinned SSH."""

    def __init__(self, name: str, kind: str, host: Host, options: SshOptions):
        self.name, self.kind, self.host, self.options = name, kind, host, options

    def call(self, command: str, timeout: float, stdin: str | None = None, as_root: bool = True) -> str:
        """`command` there, as root (through sudo where the login is another user's) unless told, bounded."""
        if as_root:
            command = root_command(command, self.host.user)
        try:
            done = subprocess.run(ssh_argv(self.host, command, self.options), capture_output=True, text=True,
                                  timeout=timeout, input=stdin if stdin is not None else "")
        except subprocess.TimeoutExpired:
            raise ControllerError(f"queue {self.name}: the controller {self.host.address} did not answer within "
                                  f"{timeout:g} s") from None
        if done.returncode:
            said = done.stderr.strip().splitlines()
            last = next((line for line in reversed(said) if line.startswith("kiln: ")), said[-1] if said else "")
            raise ControllerError(f"queue {self.name}: on the controller {self.host.address}: "
                                  f"{last.removeprefix('kiln: ') or describe_failure(done.returncode, done.stderr)}")
        return done.stdout

    def probe(self) -> Probed:
        """What the controller has, asked as its login user (whose home holds the jobs' folders)."""
        return parse_probe(self.call(PROBE, PROBE_TIMEOUT_S, as_root=False), self.host.address)

    def ship(self, probed: Probed) -> list[str]:
        """kiln and its distributions into LIB, the cluster's folder into HOME (both mirrored: what is gone here
        goes there); the distributions shipped."""
        with tempfile.TemporaryDirectory(prefix="kiln-controller-") as scratch:
            lib, home = Path(scratch) / "lib", Path(scratch) / "home"
            lib.mkdir()
            names = stage(self.kind, marker_environment(probed.python, probed.machine), lib)
            folder = home / "clusters" / self.name
            shutil.copytree(state.cluster_dir(self.name), folder, ignore=shutil.ignore_patterns(
                "queue", "login.json", "*.lock", ".lock"))
            folder.chmod(0o700)
            record = state.load_cluster(self.name)
            if record is None:
                raise UsageError(f"no cluster {self.name!r} in {state.kiln_home()}/clusters")
            (folder / "cluster.json").write_text(json.dumps(state.cluster_json(controller_record(record, HOME)),
                                                            indent=1) + "\n")
            (folder / "id_ed25519").chmod(0o600)
            self.call(f"mkdir -p {shlex.quote(LIB)} {shlex.quote(HOME)} && chmod 700 {shlex.quote(CONTROLLER_ROOT)}",
                      PROBE_TIMEOUT_S)
            for source, target in ((lib, LIB), (home, HOME)):
                argv = rsync_push_argv(str(source), self.host, target, self.options, excludes=(),
                                       timeout=SHIP_TIMEOUT_S, one_writer=False)
                argv[1:1] = ["--chown=0:0", *root_rsync(self.host.user)]  # root's, not this machine's uid
                done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                      timeout=SHIP_TIMEOUT_S + 60)
                if done.returncode:
                    raise ControllerError(f"queue {self.name}: kiln did not reach the controller "
                                          f"{self.host.address}:{target}: "
                                          f"{describe_failure(done.returncode, done.stderr)}")
        return names

    def start(self, shapes: Sequence[slurm.Shape], suspend_time_s: int, settings: Mapping[str, str]) -> dict:
        """The queue started there (serve): what it says of itself."""
        asked = {"shapes": [asdict(shape) for shape in shapes], "suspend_time_s": suspend_time_s,
                 "settings": dict(settings), "login_user": self.host.user or "root"}
        kept = any(shape.min_nodes for shape in shapes)  # resumed there before it answers
        said = self.call(serve_argv("start", self.name), START_TIMEOUT_S + (slurm.RESUME_TIMEOUT_S if kept else 0),
                         stdin=json.dumps(asked))
        try:
            return json.loads(said.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise ControllerError(f"queue {self.name}: the controller said {said.strip()[-200:]!r}, not where its "
                                  "queue runs") from None


def up(name: str, provider, shapes: Sequence[slurm.Shape], *, suspend_time_s: int, docker: bool = False,
       options: Mapping[str, object] | None = None) -> list[str]:
    """Make a queue: on the local provider, its controller on this machine (queue.up); on a cloud, the cluster (no
    node: Slurm asks for each) and its controller machine, with kiln shipped there and the queue started on it, and
    what the queue verbs need to reach it as a login node kept here. Any failure (or a Ctrl-C) removes what was
    made: the cluster's down ends the controller first."""
    given = sorted(f"--{key.replace('_', '-')}" for key in options or {})
    if provider.kind == "local":
        if given:
            raise UsageError(f"{', '.join(given)}: options of a cloud's queue (the local provider's nodes are this "
                             "machine's)")
        return queue.up(name, provider, shapes, suspend_time_s=suspend_time_s, docker=docker)
    if docker:
        raise UsageError("--docker: a cloud's queue runs its nodes from its image, which has Docker already")
    options = options or {}
    if provider.kind not in SDKS:  # before anything is made
        raise UsageError(f"kiln queue up --provider {provider.kind}: a queue's controller machine runs on "
                         f"{', '.join(sorted(SDKS))} for now")
    queue_dir = queue.folder(name)  # the controller's, planned here only to be checked
    draft = slurm.check_queue(queue.plan_queue(name, shapes, "controller", "0.0.0.0", queue_dir, suspend_time_s,
                                               cloud=True))
    count = sum(shape.max_nodes for shape in draft.shapes)
    # a queue lives until kiln down: kiln sweep leaves it the longest a cluster may be kept unless told
    asked = {"ttl_hours": common.MAX_TTL_HOURS, **options, "start": 0}
    made = provider.up(provider.request(name, count, asked, None))
    try:
        host = provider.make_controller(name)
        record = state.load_cluster(name)
        there = Controller(name, provider.kind, host, queue.ssh_options(name, record))
        probed = there.probe()
        shipped = there.ship(probed)
        said = there.start(draft.shapes, suspend_time_s, settings_of(os.environ))
        login = attached.Login(name, f"{host.user or 'root'}@{host.address}", f"{probed.home}/{JOBS}",
                               tuple(slurm.Partition(shape.name, shape.max_nodes) for shape in draft.shapes),
                               int(said["slurmd_timeout_s"]), record.python, record.ssh, slurm=probed.slurm,
                               user=host.user or "root", node_dir=queue.NODE_DIR, docker=True, controller=True)
        attached.save(login)
    except BaseException as error:
        with shielded(f"undoing what queue up {name} made", f"leaves it for kiln down {name}"):
            try:
                provider.down(name)
                left = ""
            except KeyboardInterrupt:
                left = "not undone (Ctrl-C)"
            except Exception as undo_error:  # noqa: BLE001 - said with the error that started the undo
                left = str(undo_error)
        if left:
            why = "interrupted" if isinstance(error, KeyboardInterrupt) else str(error)
            raise ControllerError(f"queue {name}: could not come up ({why}); undoing it left {left}: run kiln "
                                  f"down {name}") from None
        if isinstance(error, KeyboardInterrupt):
            raise ControllerError(f"queue {name}: interrupted; everything it had made was removed") from None
        raise
    partitions = ", ".join(f"{shape.name} ({shape.min_nodes} to {shape.max_nodes} node(s))"
                           for shape in draft.shapes)
    return [*made.lines,
            f"queue {name}: slurmctld on its controller {said['host']} ({host.address}; the nodes reach it at "
            f"{said['address']}:{said['port']}), kiln and {', '.join(shipped)} shipped there; partitions "
            f"{partitions}; an idle node is removed after "
            f"{suspend_time_s} s",
            f"  its queue: kiln queue status {name}; its controller: ssh -i {record.ssh.identity} "
            f"-o UserKnownHostsFile={state.known_hosts_path(name)} {login.login}"]


# ---------------------------------------------------------------- there: the controller's side


def outward_address() -> str:
    """The address this machine's traffic leaves from (its default route's): the one the nodes reach it at. No
    packet is sent (a UDP socket's connect only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: routed by the default route, never answered
        return probe.getsockname()[0]


def point_login(user: str, name: str, conf: str) -> None:
    """The login user's ~/.profile points Slurm's tools at the queue (its login shell: kiln's queue verbs, the
    user's own ssh), the file the user's still."""
    entry = pwd.getpwnam(user)
    profile = Path(entry.pw_dir) / ".profile"
    if profile.is_symlink():  # root writes it: never where a link of the user's points
        raise ControllerError(f"{profile} is a link: kiln does not write through it (set SLURM_CONF={conf} there)")
    had = profile.is_file()
    text = with_profile_line(profile.read_text() if had else "", name, conf)
    # written in place: a login shell reads it whole at its start, and it may be a bind mount (a local node's)
    descriptor = os.open(profile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    if not had:
        os.chown(profile, entry.pw_uid, entry.pw_gid)


def serve(verb: str, name: str, asked: Mapping) -> dict:
    """kiln's side on the controller. `start`: the queue of `asked` (its shapes, SuspendTime, the operator's
    settings) planned for this machine (its host name, the address the nodes reach), then its MUNGE key (made here),
    configuration, programs, munged and slurmctld (queue.start_controller), and the login user's SLURM_CONF."""
    if verb != "start":
        raise UsageError(f"{verb}: the controller's verbs are: start")
    shapes = [slurm.Shape(**shape) for shape in asked["shapes"]]
    os.environ.update({key: str(value) for key, value in dict(asked.get("settings") or {}).items()
                       if key in queue.SETTINGS})
    planned = queue.plan_queue(name, shapes, socket.gethostname(), outward_address(), queue.folder(name),
                               int(asked["suspend_time_s"]), cloud=True)
    queue.start_controller(name, planned, docker=True)
    kept = [slurm.node_names(planned, shape)[index] for shape in planned.shapes for index in range(shape.min_nodes)]
    failed = [line for line in (queue.resume(name, ",".join(kept)) if kept else []) if ": failed on " in line]
    if failed:  # the nodes a partition keeps up are part of what up promised
        raise queue.QueueError(f"queue {name}: " + "; ".join(failed))
    conf = queue.slurm_env(name)["SLURM_CONF"]
    point_login(str(asked.get("login_user") or "root"), name, conf)
    return {"host": planned.controller, "address": planned.controller_address, "port": planned.port, "conf": conf,
            "slurmd_timeout_s": planned.power.slurmd_timeout_s}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("kiln: usage: python3 -m bootstrap.controller VERB CLUSTER (what to do on stdin, JSON)",
              file=sys.stderr)
        return 2
    try:
        print(json.dumps(serve(args[0], args[1], json.loads(sys.stdin.read() or "{}"))), flush=True)
    except KilnError as error:
        print(f"kiln: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
