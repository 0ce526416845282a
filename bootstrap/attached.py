"""A Slurm cluster kiln did not make, reached through its login node (I/O): `kiln queue attach NAME --login
USER@HOST` as SkyPilot and dstack reach one.

`attach` logs in once, through the user's own known_hosts or, with --accept-new-host-keys, trusting the login node's
key on this first contact: over that authenticated connection it reads the node's host keys (pinned in the cluster's
known_hosts, and every later call checks them), the user's home, Slurm's version, the partitions, and how long
slurmctld waits on a silent node. It makes nothing on the cluster. Later, kiln submit and the queue verbs run Slurm's
tools there as that user (a login shell, so the site's profile sets Slurm's environment), each call bounded; a job's
folder is under the user's folder on the cluster (its shared home), which kiln's rsync fills over the same pinned
SSH. `detach` (kiln down NAME) forgets the cluster here and leaves it, and its jobs, as they are.

How a job is written and what the verbs do is one code for both kinds of queue: bootstrap/jobs.py.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bootstrap import queue, state
from bootstrap.commands import SshOptions, ignore_filters, remote_command, rsync_pull_argv, rsync_push_argv, ssh_argv
from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host, parse_host
from bootstrap.providers import common
from bootstrap.slurm import Partition
from bootstrap.ssh import describe_failure
from kiln import hostkeys

LOGIN_FILE = state.LOGIN_FILE
PROBE_TIMEOUT_S = 60
RSYNC_TIMEOUT_S = 60  # rsync's own: a transfer that stalls this long ends
MISSING = 3  # read's exit where the file is not there
TIMED_OUT = 124  # timeout(1)'s exit: remote_command's bound on the node
# What attach asks the login node, as the user, in a login shell: a KEY=VALUE line each (pure parse: parse_probe)
PROBE = "\n".join([
    'echo "home=$HOME"',
    'echo "user=$(id -un)"',
    'echo "slurm=$(sinfo --version 2>&1)"',
    'command -v rsync >/dev/null && echo "rsync=yes"',
    "sinfo --noheader --format='partition=%P %D' 2>&1",
    "scontrol show config 2>/dev/null | sed -n 's/^SlurmdTimeout *= *\\([0-9]*\\).*/slurmd_timeout=\\1/p'",
    'for key in /etc/ssh/ssh_host_*_key.pub; do [ -f "$key" ] && echo "hostkey=$(cat "$key")"; done',
    "true",
])


class AttachedError(KilnError):
    """The login node could not be reached, or refused what kiln asked of it."""


@dataclass(frozen=True)
class Probed:
    """What the login node said (parse_probe)."""

    home: str
    user: str
    slurm: str
    rsync: bool
    partitions: tuple[Partition, ...]
    slurmd_timeout_s: int
    host_keys: tuple[str, ...]


def parse_probe(text: str, where: str) -> Probed:
    """PROBE's output as what it says; refused naming what the login node `where` lacks (pure)."""
    said: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            said.setdefault(key.strip(), []).append(value.strip())
    slurm = (said.get("slurm") or [""])[0]  # "slurm 23.11.4", Debian's "slurm-wlm 22.05.8"
    if not (slurm.startswith("slurm") and slurm.split()[-1][:1].isdigit()):
        raise UsageError(f"--login {where}: Slurm's tools do not run there as this user ({slurm or 'no answer'}): "
                         "is it a Slurm cluster's login node?")
    if not said.get("rsync"):
        raise UsageError(f"--login {where}: rsync is not installed there (kiln copies a job's folder with it)")
    counts: dict[str, int] = {}
    default = ""
    for line in said.get("partition", []):
        name, _, count = line.partition(" ")
        if not name or not count.strip().isdigit():
            continue
        if name.endswith("*"):
            name = default = name[:-1]
        counts[name] = counts.get(name, 0) + int(count)
    if not counts:
        raise UsageError(f"--login {where}: sinfo shows no partition there")
    order = sorted(counts, key=lambda name: name != default)  # the cluster's default first, then sinfo's order
    home = (said.get("home") or [""])[0]
    if not home.startswith("/"):
        raise UsageError(f"--login {where}: the user's home is not known there ({home or 'no HOME'})")
    keys = []
    for line in said.get("hostkey", []):
        try:
            keys.append(hostkeys.public_key(line))
        except ValueError:
            continue
    if not keys:
        raise UsageError(f"--login {where}: its host keys cannot be read (/etc/ssh/ssh_host_*_key.pub)")
    timeout = (said.get("slurmd_timeout") or [""])[0]
    return Probed(home, (said.get("user") or [""])[0], slurm.split()[-1], True,
                  tuple(Partition(name, counts[name]) for name in order),
                  int(timeout) if timeout.isdigit() else 300, tuple(keys))


def job_root(folder: str, home: str) -> str:
    """Where the user's jobs go on the cluster: `folder` as given, under the home where it is relative (pure)."""
    root = folder if folder.startswith("/") else f"{home.rstrip('/')}/{folder}"
    return root.rstrip("/") or "/"


@dataclass(frozen=True)
class Login:
    """A Slurm cluster's login node, as kiln keeps it (login.json in the cluster's folder)."""

    name: str
    login: str  # [user@]host[:port], as given
    folder: str  # where the user's jobs go on the cluster
    partitions: tuple[Partition, ...]
    slurmd_timeout_s: int
    python: str | None = "python3"
    ssh: state.SshSettings = field(default_factory=state.SshSettings)
    slurm: str = ""
    user: str = ""
    here: bool = False
    node_dir: str = ""  # the site's nodes' Slurm folder is the site's own
    docker: bool = False  # kiln runs no container there (a site has its own runtime)
    # The login node is the controller machine of a queue kiln made on a cloud (bootstrap/controller.py): kiln
    # down removes the cluster, where it forgets a site's
    controller: bool = False

    @property
    def host(self) -> Host:
        return parse_host(self.login)

    @property
    def options(self) -> SshOptions:
        """The login node's pinned host keys (never a first contact again), the user's ssh settings."""
        return SshOptions(config_file=self.ssh.config_file, identity=self.ssh.identity,
                          known_hosts=(str(state.known_hosts_path(self.name)),),
                          connect_timeout=self.ssh.connect_timeout)

    def call(self, command: str, timeout: float, *, text: bool = True) -> subprocess.CompletedProcess:
        """`command` on the login node, bounded here and there (remote_command's timeout ends it with the call)."""
        try:
            done = subprocess.run(ssh_argv(self.host, command, self.options), capture_output=True, text=text,
                                  timeout=timeout + self.ssh.connect_timeout + 10, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise AttachedError(f"queue {self.name}: login node {self.login} did not answer within "
                                f"{timeout:g} s") from None
        if done.returncode == 255:
            stderr = done.stderr if text else done.stderr.decode(errors="replace")
            raise AttachedError(f"queue {self.name}: login node {self.login}: {describe_failure(255, stderr)}")
        return done

    def tool(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        done = self.call(login_shell(remote_command(argv, timeout=timeout)), timeout)
        if done.returncode == TIMED_OUT:
            raise AttachedError(f"queue {self.name}: {argv[0]} on {self.login} did not finish within {timeout:g} s")
        return done

    def job_folder(self, run_id: str) -> str:
        return f"{self.folder}/{run_id}"

    def place(self, project: Path, staged: Path, folder: str) -> None:
        for argv in (rsync_push_argv(str(staged), self.host, folder, self.options, excludes=("/code/",),
                                     timeout=RSYNC_TIMEOUT_S, one_writer=False),
                     rsync_push_argv(str(project), self.host, f"{folder}/code", self.options,
                                     timeout=RSYNC_TIMEOUT_S, one_writer=False,
                                     filters=ignore_filters((project / ".kilnignore").is_file()))):
            done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if done.returncode:
                raise AttachedError(f"queue {self.name}: the job's files did not reach {self.login}:{folder}: "
                                    f"{describe_failure(done.returncode, done.stderr)}")

    def read(self, path: str, offset: int) -> bytes | None:
        command = f"[ -f {shlex.quote(path)} ] || exit {MISSING}; exec tail -c +{offset + 1} {shlex.quote(path)}"
        done = self.call(remote_command(["sh", "-c", command], timeout=60), 60, text=False)
        if done.returncode == MISSING:
            return None
        if done.returncode:
            raise AttachedError(f"queue {self.name}: {path} on {self.login}: "
                                f"{done.stderr.decode(errors='replace').strip() or f'exit {done.returncode}'}")
        return done.stdout

    def fetch(self, folder: str, into: Path) -> list[str]:
        argv = rsync_pull_argv(self.host, folder, str(into), self.options, timeout=RSYNC_TIMEOUT_S,
                               excludes=("/code/",))  # the job's own code folder, not an output's
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode:
            raise AttachedError(f"queue {self.name}: {self.login}:{folder} was not copied: "
                                f"{describe_failure(done.returncode, done.stderr)}")
        return [f"{self.login}:{folder} -> {into}"]


def login_shell(command: str) -> str:
    """`command` in the user's login shell on the node: where a site's profile puts Slurm on PATH and sets its
    configuration (SLURM_CONF, modules), as the user's own login finds them."""
    return f"bash -lc {shlex.quote(command)}"


def path(name: str) -> Path:
    return state.cluster_dir(name) / LOGIN_FILE


def exists(name: str) -> bool:
    return path(name).is_file()


def load(name: str) -> Login:
    data = state.read_json(path(name))
    if data is None:
        raise UsageError(f"cluster {name} has no queue (kiln queue attach {name} --login USER@HOST reaches one)")
    try:
        return Login(**{**data, "partitions": tuple(Partition(**p) for p in data["partitions"]),
                        "ssh": state.SshSettings(**data.get("ssh", {}))})
    except (KeyError, TypeError) as error:
        raise KilnError(f"{path(name)} is not kiln's file of a login node ({error}); kiln down {name} forgets "
                        "it") from None


def attach(name: str, login: str, ssh: state.SshSettings, *, accept_new: bool = False, folder: str = "kiln-jobs",
           python: str = "python3") -> list[str]:
    """Reach the Slurm cluster whose login node is `login`: pin its host keys and keep what kiln needs of it."""
    if not common.NAME.fullmatch(name or ""):
        raise UsageError(f"cluster name {name!r}: use 1-32 of a-z, 0-9 and -")
    if exists(name) or queue.exists(name) or state.load_cluster(name) is not None:
        raise UsageError(f"cluster {name} is already known here (kiln down {name} removes or forgets it)")
    if any(char.isspace() or char == "%" for char in folder) or not folder.strip("/"):
        raise UsageError(f"--folder {folder!r}: give a folder without spaces or '%' (Slurm takes its path bare)")
    host = parse_host(login, where="--login")
    first = state.known_hosts_path(name, first_contact=True)
    trial = Login(name, login, folder, (), 0, python, ssh)
    options = trial.options
    if accept_new:
        first.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        options = replace(options, accept_new_into=str(first),
                          user_known_hosts=(str(Path("~/.ssh/known_hosts").expanduser()),))
    try:
        done = subprocess.run(ssh_argv(host, login_shell(PROBE), options), capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise AttachedError(f"--login {login}: no answer within {PROBE_TIMEOUT_S} s") from None
    finally:
        first.unlink(missing_ok=True)
    if done.returncode:
        reason = describe_failure(done.returncode, done.stderr)
        raise AttachedError(f"--login {login}: {reason}" + (
            "" if accept_new or "host key" not in reason else
            " (kiln trusts the keys in your known_hosts; --accept-new-host-keys trusts the one it sees now)"))
    probed = parse_probe(done.stdout, login)
    made = Login(name, login, job_root(folder, probed.home), probed.partitions, probed.slurmd_timeout_s, python, ssh,
                 probed.slurm, probed.user)
    state.write_atomic(state.known_hosts_path(name),
                       "".join(hostkeys.known_hosts_lines([host.address], probed.host_keys, host.port)))
    try:  # the keys pinned open the node as every later call reaches it
        made.call("true", PROBE_TIMEOUT_S)
    except AttachedError as error:
        state.known_hosts_path(name).unlink(missing_ok=True)
        raise AttachedError(f"--login {login}: the node's host keys, pinned under {host.address}, do not open it as "
                            f"later calls reach it ({error}); give the node's own name or address, not an ssh "
                            "config alias") from None
    save(made)
    parts = ", ".join(f"{part.name} ({part.nodes} node{'s' if part.nodes != 1 else ''})" for part in made.partitions)
    return [f"queue {name}: Slurm {made.slurm} through {login} as {made.user}, its host keys pinned "
            f"({len(probed.host_keys)}); partitions {parts}; jobs' folders in {made.folder}",
            f"  submit: kiln submit {name} -- python train.py (from your project's folder)"]


def save(login: Login) -> None:
    data = asdict(login)
    del data["here"]
    state.write_json(path(login.name), data)


def refuse_taken(name: str) -> None:
    """Refuse to make a cluster under the name of an attached one (they would share its folder, its pins), or of a
    queue kiln made on a cloud."""
    if not (common.NAME.fullmatch(name or "") and exists(name)):
        return
    login = load(name)
    if login.controller:
        raise UsageError(f"cluster {name} is a queue kiln made, its controller {login.login} (kiln down {name} "
                         "removes it); give another name")
    raise UsageError(f"cluster {name} is a Slurm cluster reached through {login.login} (kiln down {name} forgets "
                     "it); give another name")


def detach(name: str) -> list[str]:
    """Forget the cluster here (its login, its pinned keys); nothing on it changes."""
    made = load(name)
    path(name).unlink()
    state.known_hosts_path(name).unlink(missing_ok=True)
    try:
        state.cluster_dir(name).rmdir()
    except OSError:
        pass  # other files of the user's (runs are elsewhere)
    return [f"queue {name}: forgotten here; the Slurm cluster of {made.login} and its jobs are left as they are"]
