"""argv builders: ssh, rsync, horovodrun, the trainer and detached launches (pure)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bootstrap.hosts import Host

SYNC_EXCLUDES = (".git/", ".venv/", "runs/", ".kiln/", "__pycache__/", "*.pyc", ".pytest_cache/", ".ruff_cache/")


@dataclass(frozen=True)
class SshOptions:
    """How every ssh and rsync call reaches the nodes.

    `known_hosts` are the pinned files (consulted besides the user's own);
    `accept_new_into` switches on trust-on-first-use, recording into that file.
    """

    config_file: str | None = None
    identity: str | None = None
    known_hosts: tuple[str, ...] = ()
    accept_new_into: str | None = None
    user_known_hosts: tuple[str, ...] = ()
    connect_timeout: int = 10
    control_path: str | None = None
    # how long a shared connection outlives its last session, in seconds; 0: it ends with its first session, a
    # master that does not fork (a node's agent: bootstrap.ssh.Agent)
    control_persist: int = 60


def ssh_option_args(options: SshOptions, *, forwards: bool = False) -> list[str]:
    """Options shared by every connection. Host keys are always checked; no forwarding unless `forwards`
    (the port forwards given on the command line, never the agent)."""
    args = []
    if options.config_file:
        args += ["-F", options.config_file]
    if options.identity:
        args += ["-i", options.identity, "-o", "IdentitiesOnly=yes"]
    args += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={options.connect_timeout}"]
    args += ["-o", "ForwardAgent=no"]
    args += ["-o", "ExitOnForwardFailure=yes"] if forwards else ["-o", "ClearAllForwardings=yes"]
    args += ["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR"]
    if options.known_hosts:
        args += ["-o", "GlobalKnownHostsFile=" + " ".join((*options.known_hosts, "/etc/ssh/ssh_known_hosts"))]
    if options.accept_new_into:
        files = (options.accept_new_into, *options.user_known_hosts)
        args += ["-o", "UserKnownHostsFile=" + " ".join(files), "-o", "StrictHostKeyChecking=accept-new"]
    else:
        args += ["-o", "StrictHostKeyChecking=yes"]
    if options.control_path:
        args += ["-o", "ControlMaster=auto", "-o", f"ControlPath={options.control_path}"]
        args += ["-o", f"ControlPersist={options.control_persist or 'no'}"]
    return args


def host_args(host: Host) -> list[str]:
    """`-l user -p port` where the host list gave them; ssh config fills the rest."""
    args = []
    if host.user:
        args += ["-l", host.user]
    if host.port:
        args += ["-p", str(host.port)]
    return args


def root_command(command: str, user: str | None) -> str:
    """`command` as root where the login is `user`'s: through sudo (no password asked) where that is not root."""
    return command if user in (None, "root") else f"sudo -n sh -c {shlex.quote(command)}"


def root_rsync(user: str | None) -> list[str]:
    """rsync's options that write (or read) as root at the other end where the login is `user`'s."""
    return [] if user in (None, "root") else ["--rsync-path=sudo -n rsync"]


def ssh_argv(host: Host, remote_command: str, options: SshOptions) -> list[str]:
    """Run one shell command string on `host`."""
    return ["ssh", *ssh_option_args(options), *host_args(host), "--", host.address, remote_command]


def forward_argv(host: Host, local_port: int, remote_port: int, remote_command: str, options: SshOptions) -> list[str]:
    """Run `remote_command` on `host` with 127.0.0.1:`local_port` here forwarded to its 127.0.0.1:`remote_port`
    (loopback at both ends: nothing is opened to the network)."""
    return ["ssh", *ssh_option_args(options, forwards=True), *host_args(host),
            "-L", f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}", "--", host.address, remote_command]


def tied_to_connection(command: str) -> str:
    """`command` as a remote shell runs it so that it ends with the connection: a helper reads the connection's
    stdin (kept open by the operator's side) and stops the command at its end, whatever ended the connection."""
    return (f"exec 3<&0; {command} </dev/null & pid=$!; "
            "(cat <&3 >/dev/null; kill $pid) >/dev/null 2>&1 & wait $pid")


def control_argv(host: Host, operation: str, options: SshOptions) -> list[str]:
    """`ssh -O check|exit` on the shared connection to `host`."""
    return ["ssh", *ssh_option_args(options), *host_args(host), "-O", operation, host.address]


def remote_command(argv: Sequence[str], *, timeout: float | None = None, cwd: str | None = None,
                   env: Mapping[str, str] | None = None) -> str:
    """The string that crosses SSH: optional `cd`, environment, and a remote-side
    timeout so a command outlives no dropped connection."""
    parts = list(argv)
    if env:
        parts = ["env", *(f"{key}={value}" for key, value in env.items()), *parts]
    if timeout:
        parts = ["timeout", "-k", "5", f"{timeout:g}", *parts]
    command = shlex.join(parts)
    return f"cd {shlex.quote(cwd)} && {command}" if cwd else command


def rsync_target(host: Host, path: str) -> str:
    address = f"[{host.address}]" if host.is_ipv6 else host.address
    return f"{address}:{path}"


def rsync_ssh_command(host: Host, options: SshOptions) -> str:
    return shlex.join(["ssh", *ssh_option_args(options), *host_args(host)])


def one_writer_rsync_path(dest_dir: str, wait: int) -> str:
    """The node's side of a mirror into `dest_dir`, run while it holds the folder's lock (`<dest_dir>.lock`,
    waiting at most `wait` seconds for it): two runs that sync into one folder at once take turns, where each
    one's --delete would remove the other's files in flight (rsync exit 23)."""
    folder = dest_dir.rstrip("/")
    parent = folder.rpartition("/")[0] or "."
    waited = (f"flock -w {wait} -E 75 {shlex.quote(folder + '.lock')} \"$@\"; code=$?; [ $code -ne 75 ] || "
              f"echo {shlex.quote(f'kiln: {folder} stayed locked by another sync for {wait}s')} >&2; exit $code")
    return f"mkdir -p {shlex.quote(parent)} && sh -c {shlex.quote(waited)} sh rsync"


# What an rsync adds for its progress (bytes so far and the share of the whole, the share of every file from the
# start: the file list is made first); Remote.rsync reads it.
RSYNC_PROGRESS = ("--info=progress2", "--no-inc-recursive")


def with_progress(argv: Sequence[str]) -> list[str]:
    """An rsync argv that reports its progress (RSYNC_PROGRESS)."""
    return [argv[0], *RSYNC_PROGRESS, *argv[1:]]


def rsync_push_argv(source_dir: str, host: Host, dest_dir: str, options: SshOptions,
                    excludes: Sequence[str] = SYNC_EXCLUDES, timeout: int = 60,
                    filters: Sequence[str] = (), one_writer: bool = True) -> list[str]:
    """Mirror `source_dir` to `dest_dir` on `host` (deleting what is gone here); `filters` are rsync filter rules
    (e.g. `:- .gitignore`, the per-folder ignore files). `one_writer`: under the folder's lock
    (one_writer_rsync_path), where other runs may sync into the same folder."""
    excluded = [f"--exclude={pattern}" for pattern in excludes] + [f"--filter={rule}" for rule in filters]
    locked = [f"--rsync-path={one_writer_rsync_path(dest_dir, timeout)}"] if one_writer else []
    return ["rsync", "-a", "--delete", f"--timeout={timeout}", "--mkpath", *locked, *excluded,
            "-e", rsync_ssh_command(host, options), source_dir.rstrip("/") + "/",
            rsync_target(host, dest_dir.rstrip("/") + "/")]


def rsync_push_folders_argv(folders: Sequence[str], host: Host, dest_dir: str, options: SshOptions,
                            timeout: int = 60) -> list[str]:
    """Mirror each of `folders` to `dest_dir/<its name>` on `host`, under the folder's lock
    (one_writer_rsync_path)."""
    return ["rsync", "-a", "--delete", f"--timeout={timeout}", "--mkpath",
            f"--rsync-path={one_writer_rsync_path(dest_dir, timeout)}", "--exclude=__pycache__/",
            "--exclude=*.pyc", "-e", rsync_ssh_command(host, options), *(f.rstrip("/") for f in folders),
            rsync_target(host, dest_dir.rstrip("/") + "/")]


def ignore_filters(has_kilnignore: bool) -> list[str]:
    """The project's ignore files, read in every folder: .kilnignore where the project has one, else .gitignore."""
    return [":- .kilnignore"] if has_kilnignore else [":- .gitignore"]


def rsync_pull_argv(host: Host, source_dir: str, dest_dir: str, options: SshOptions, timeout: int = 60,
                    excludes: Sequence[str] = ()) -> list[str]:
    """Copy `source_dir` from `host` into the local `dest_dir` (but what `excludes` leave out)."""
    return ["rsync", "-a", f"--timeout={timeout}", "--mkpath", *(f"--exclude={item}" for item in excludes),
            "-e", rsync_ssh_command(host, options),
            rsync_target(host, source_dir.rstrip("/") + "/"), dest_dir.rstrip("/") + "/"]


def rsync_fetch_argv(host: Host, path: str, dest_dir: str, options: SshOptions, timeout: int = 60) -> list[str]:
    """Copy the file or folder `path` from `host` into the local `dest_dir` (keeping what a broken copy got)."""
    return ["rsync", "-a", "--partial", f"--timeout={timeout}", "--mkpath", "-e", rsync_ssh_command(host, options),
            rsync_target(host, path.rstrip("/")), dest_dir.rstrip("/") + "/"]


def trainer_argv(python: str, strategy: str, *, run_dir: str, model_dir: str, extra: Sequence[str] = ()) -> list[str]:
    """The default entry point: kiln's reference trainer."""
    return [python, "-m", "trainer", "--strategy", strategy, "--run-dir", run_dir, "--model-dir", model_dir, *extra]


ELASTIC_COOLDOWN = (5, 300)  # seconds: horovodrun --blacklist-cooldown-range


# horovodrun --gloo-timeout-seconds. Gloo's 30 s default failed the run, or an elastic run's re-forming, when a rank
# was still importing TensorFlow on a busy or cold node (tens of seconds). It also bounds how long the ranks of a
# collective wait on a peer that vanished without closing its connections (a lost node): an elastic run goes on
# without that node only after it, so it stays short (300 s held an elastic run 5 minutes at each lost node).
GLOO_TIMEOUT_S = 60


def horovodrun_argv(horovodrun: Sequence[str], *, processes: int, hostfile: str, entry: Sequence[str],
                    nic: str | None, mpi: bool = False, output_dir: str | None = None,
                    start_timeout: int = 60, elastic: tuple[int, int] | None = None) -> list[str]:
    """One horovodrun (the argv that starts it) over a generated hostfile; Gloo unless `mpi`. With `elastic`
    (min, max processes), horovodrun's elastic mode: `hostfile` is then its host discovery script."""
    # Elastic: a host whose ranks failed is shut out for a cooldown (5 s doubling per failure, at most 300 s), not
    # for good, so a replacement under a lost node's name (or a node back on the network) can join again.
    hosts = ["--hostfile", hostfile] if elastic is None else [
        "--min-np", str(elastic[0]), "--max-np", str(elastic[1]), "--host-discovery-script", hostfile,
        "--blacklist-cooldown-range", *map(str, ELASTIC_COOLDOWN)]
    argv = [*horovodrun, "-np", str(processes), *hosts, "--mpi" if mpi else "--gloo",
            "--start-timeout", str(start_timeout)]
    if not mpi:
        argv += ["--gloo-timeout-seconds", str(GLOO_TIMEOUT_S)]
    if nic:
        argv += ["--network-interfaces", nic]
    if output_dir:
        argv += ["--output-filename", output_dir]
    return [*argv, *entry]


def detached_command(argv: Sequence[str], *, cwd: str, run_dir: str, task: str, env: Mapping[str, str]) -> str:
    """Start `argv` in its own session so it outlives the SSH connection.

    It leaves `<task>.pid` (its process group), `<task>.log` (appended to, so a
    restarted run keeps every attempt) and, when it ends, `<task>.exit` holding
    the exit status.
    """
    run = shlex.quote(run_dir)
    pid, log, status = (shlex.quote(f"{run_dir}/{task}.{suffix}") for suffix in ("pid", "log", "exit"))
    inner = (f"echo $$ > {pid}; cd {shlex.quote(cwd)} && "
             f"{remote_command(argv, env=env)} >> {log} 2>&1; "
             f"echo $? > {status}.tmp && mv {status}.tmp {status}")
    return f"mkdir -p {run} && {{ setsid sh -c {shlex.quote(inner)} < /dev/null > /dev/null 2>&1 & }}"
