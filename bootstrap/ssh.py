"""Remote execution over OpenSSH with one shared connection per node (I/O).

Every call goes through the system `ssh` with ControlMaster: the first call to a
node makes the one authenticated connection, later calls (ssh and rsync, in this
process and in the next `fab` within ControlPersist) ride on it. That keeps
OpenSSH's default key exchange and the user's ssh_config semantics. The first call
is most often the node's agent, whose ssh is the master itself (it does not fork to
the background, nor run its own session as a client of it: 3 s of CPU at 1000 nodes);
the agent's input, held ControlPersist seconds past kiln's exit, keeps it for the next.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import select
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from bootstrap import commands, timeline
from bootstrap import node as node_side
from bootstrap.commands import SshOptions
from bootstrap.errors import KilnError, RemoteError
from bootstrap.hosts import Host
from bootstrap.progress import RsyncBytes
from kiln import proc

T = TypeVar("T")
NODE_SCRIPT = (Path(__file__).parent / "node.py").read_text()
NODE_SOURCE = NODE_SCRIPT.encode()
NODE_DIGEST = hashlib.sha256(NODE_SOURCE).hexdigest()[:20]
# How a node's agent starts: `python -S -c AGENT_LOADER DIGEST SIZE serve LIFETIME`, node.py's source on its input
# ahead of the requests. The loader runs node.py compiled once per node and per Python, kept (the user's own, 0600)
# as ~/.cache/kiln/agent/DIGEST.TAG: compiling its thousand lines cost every command's agent 13-22 ms of a core, on
# each node, and on a local cluster all of them on this machine's cores. Not under ~/kiln: a run's container may
# write there, and what the agent runs must be out of its reach (the agent holds what the container never gets, the
# cluster's key). A file it cannot read (or a Python's of another version) is compiled again; one it cannot write
# costs only the compile; other versions' files go.
AGENT_CACHE = "~/.cache/kiln/agent"
AGENT_LOADER = f"CACHE = {AGENT_CACHE!r}\n" + """\
import marshal, os, sys
digest, size = sys.argv[1], int(sys.argv[2])
source = sys.stdin.buffer.read(size)
folder = os.path.expanduser(CACHE)
name = "%s.%s-%x" % (digest, sys.implementation.cache_tag, sys.hexversion)
try:
    with open(os.path.join(folder, name), "rb") as handle:
        code = marshal.loads(handle.read())
except Exception:
    code = compile(source, "node.py", "exec")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        for old in os.listdir(folder):
            if not old.startswith(digest):
                os.remove(os.path.join(folder, old))
        part = os.path.join(folder, "%s.%d" % (name, os.getpid()))
        with open(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
            marshal.dump(code, handle)
        os.replace(part, os.path.join(folder, name))
    except OSError:
        pass
sys.argv[1:] = sys.argv[3:]
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


def agent_command(python: str, lifetime: int) -> str:
    """The shell command that starts a node's agent (AGENT_LOADER), which reads node.py's source first."""
    return shlex.join([python, "-S", "-c", AGENT_LOADER, NODE_DIGEST, str(len(NODE_SOURCE)), "serve", str(lifetime)])


AS_ROOT = 'if [ "$(id -u)" = 0 ]; then exec "$@"; fi; exec sudo -n "$@"'  # sh -c AS_ROOT kiln ARGV: ARGV as root

_FAILURES = (
    (re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED"),
     "host key verification failed: the node's key is not the pinned one"),
    (re.compile(r"No [A-Z0-9]+ host key is known|host key for .* is not known", re.I),
     "host key unknown: pin it (ssh-keyscan after checking it) or pass --accept-new-host-keys"),
    (re.compile(r"Host key verification failed"), "host key verification failed"),
    (re.compile(r"Permission denied"), "authentication refused (wrong key or user)"),
    (re.compile(r"Connection timed out|timed out during banner|Operation timed out"),
     "unreachable: connection timed out"),
    (re.compile(r"Connection refused"), "unreachable: connection refused"),
    (re.compile(r"No route to host|Network is unreachable"), "unreachable: no route to host"),
    (re.compile(r"Could not resolve hostname|Name or service not known"), "unknown host name"),
)


RSYNC_VANISHED = 24  # rsync's "some files vanished before they could be transferred"
SILENT_END = "ssh failed: the connection ended with no reason given (the node went away or stopped answering)"


def is_unreachable(reason: str) -> bool:
    """Whether a failure reason (describe_failure's) says the host could not be reached at all."""
    return reason.startswith("unreachable: ")


# a connection the node ended before or after it was made: a machine going down while it answers (its sshd
# accepted, then was killed) ends one so, as does an sshd turning away more connections (MaxStartups)
_ENDED = re.compile(r"Connection closed by|Connection reset by peer|Broken pipe")


def probe_verdict(reason: str | None) -> str:
    """What one fresh connection says of a host (pure): "up" (it answered, or turned us away for a reason of
    its own), "lost" (it cannot be reached), or "unclear": the node ended the connection (ask again)."""
    if reason is None:
        return "up"
    if is_unreachable(reason):
        return "lost"
    return "unclear" if reason == SILENT_END or _ENDED.search(reason) else "up"


class HostFailure(KilnError):
    """One host failed one call; the message is the reason shown to the user."""


@dataclass(frozen=True)
class Result:
    host: Host
    code: int
    stdout: str
    stderr: str

    def reason(self) -> str:
        """Why the call failed, in one line: its last words on stderr, else on stdout, else its exit status."""
        for text in (self.stderr, self.stdout):
            if lines := [line.strip() for line in text.splitlines() if line.strip()]:
                return lines[-1][-200:]
        return f"exit {self.code} with no output"


def describe_failure(code: int, stderr: str) -> str:
    """A one-line reason for a failed ssh call."""
    for pattern, reason in _FAILURES:
        if pattern.search(stderr):
            return reason
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    if own := [line for line in lines if line.startswith("kiln: ")]:  # kiln's node-side words, before the tool's
        return own[-1].removeprefix("kiln: ")
    if code == 255 and not lines:  # LogLevel=ERROR keeps back ssh's own words for this (INFO level)
        return SILENT_END
    last = lines[-1] if lines else "no output"
    return f"exit {code}: {last}" if code != 255 else f"ssh failed: {last}"


def polled(descriptor: int, events: int, seconds: float) -> bool:
    """Whether `descriptor` is ready for `events` within `seconds`: poll(2), which takes any descriptor number
    (select(2) takes none above 1023, which a few hundred nodes' connections pass)."""
    poller = select.poll()
    poller.register(descriptor, events)
    return bool(poller.poll(max(0.0, seconds) * 1000))


def readable(descriptor: int, seconds: float) -> bool:
    """Whether `descriptor` has something to read (or hit its end) within `seconds`."""
    return polled(descriptor, select.POLLIN | select.POLLPRI, seconds)


def writable(descriptor: int, seconds: float) -> bool:
    """Whether `descriptor` takes more within `seconds` (or its reader is gone)."""
    return polled(descriptor, select.POLLOUT, seconds)


def default_control_dir() -> str:
    """A private folder for connection sockets (short path: sockets are limited to ~100 bytes)."""
    path = Path(tempfile.gettempdir()) / f"kiln-ssh-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_uid != os.getuid() or path.stat().st_mode & 0o077:
        raise RemoteError("setup", {str(path): "control socket folder is not private to this user"})
    return str(path)


class Agent:
    """One `node.py serve` process on a host, answering requests for the life of a
    task: one Python start per node per task instead of one per call."""

    LIFETIME = 86400  # a safety net only: the agent ends when this process closes its stdin

    def __init__(self, host: Host, python: str, options: SshOptions):
        self.host, self.python = host, python
        command = agent_command(python, self.LIFETIME)
        # in a session of its own: a Ctrl-C at the terminal reaches kiln alone, which decides (an undo or a stop
        # under kiln.shield goes on over these connections); the agent ends when kiln closes its input
        # its ssh is the node's shared connection where none is open yet: a master that does not persist (nor fork),
        # which the others ride on, kept past kiln's exit for the next command by its input held (close_agents)
        self.linger = options.control_persist
        self.process = subprocess.Popen(commands.ssh_argv(host, command, replace(options, control_persist=0)),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
        os.set_blocking(self.process.stdin.fileno(), False)  # written by _write, by the call's deadline
        self.buffer = b""
        self.source = NODE_SOURCE  # written ahead of the first request (the agent reads it first)
        # One request at a time, each answer read by its asker: a call another thread makes meanwhile (a Ctrl-C
        # leaves a watch's look waiting in its worker while the stop begins) waits for the one before.
        self.lock = threading.Lock()
        self.spoiled = False  # a call ended before its answer was read: no later call may take it for its own

    @property
    def alive(self) -> bool:
        return not self.spoiled and self.process.poll() is None

    def call(self, verb: str, args: Sequence[str], input: str | None, timeout: float) -> dict:
        request = node_side.request_frame({"verb": verb, "args": list(args), "input": input})
        with self.lock:
            if self.spoiled:
                raise HostFailure("the node agent was left with an answer nobody read (an interrupted call)")
            deadline = time.monotonic() + timeout
            try:
                self._write(self.source + request, deadline, timeout)
                self.source = b""
            except (BrokenPipeError, OSError):
                raise self.failure() from None
            try:
                line = self._readline(deadline, timeout)
            except BaseException as error:
                if not isinstance(error, HostFailure):  # a Ctrl-C while waiting: this agent's answers are off
                    self.spoiled = True
                    self.close_input()
                raise
        try:
            reply = json.loads(line)
            ok, result = reply["ok"], reply.get("result")
        except (ValueError, KeyError, TypeError):
            self.close()
            raise HostFailure(f"unexpected answer from the node agent: {line[:200]!r}") from None
        if not ok:
            raise HostFailure(reply.get("error", "the node agent failed"))
        return result

    def _write(self, data: bytes, deadline: float, timeout: float) -> None:
        """The request on the agent's input, by the call's deadline: an agent that has gone while other sessions
        ride on its ssh (the node's shared connection, which stays for them) reads no more, and a request larger
        than the pipe would wait on it for ever."""
        descriptor, view = self.process.stdin.fileno(), memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0 or not writable(descriptor, left):
                self.spoiled = True  # part of a request may have gone: no later call may take its answer
                self.close()
                raise HostFailure(f"the node agent took no request within {timeout:g}s")
            try:
                view = view[os.write(descriptor, view):]
            except BlockingIOError:
                continue

    def _readline(self, deadline: float, timeout: float) -> bytes:
        descriptor = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise HostFailure(f"no answer within {timeout:g}s")
            if readable(descriptor, left):
                chunk = os.read(descriptor, 1 << 16)
                if not chunk:
                    raise self.failure()
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def failure(self) -> HostFailure:
        """Why the agent is gone: ssh's reason, or the missing Python (an ssh still carrying other sessions is
        left to them: close)."""
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.close(wait=0)
            return HostFailure("the node agent is gone (its connection carries other sessions)")
        stderr = self.process.stderr.read().decode(errors="replace")
        if code == 127 and self.python in stderr:
            return HostFailure(f"no {self.python} on the node: name the nodes' Python with --python PATH")
        return HostFailure(describe_failure(code, stderr))

    def close_input(self) -> None:
        """End of requests: the agent exits when it reads end of file."""
        if self.process.stdin and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass

    def close(self, wait: float = 5) -> None:
        """End of requests, and `wait` seconds for the agent's ssh to end. One that does not is left to end by
        itself, never killed: it is most often its node's shared connection, which other sessions may ride on (this
        command's, another's), and it ends with the last of them."""
        self.close_input()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=wait)


_AGENTS: dict[tuple, Agent] = {}
_AGENTS_LOCK = threading.Lock()
_POOLS: dict[int, ThreadPoolExecutor] = {}


def workers(fanout: int) -> ThreadPoolExecutor:
    """One thread pool per fan-out width for the whole process: starting hundreds
    of threads for every round would cost more than the round."""
    with _AGENTS_LOCK:
        if fanout not in _POOLS:
            _POOLS[fanout] = ThreadPoolExecutor(max_workers=fanout, thread_name_prefix=f"kiln-{fanout}")
        return _POOLS[fanout]


@atexit.register
def close_agents() -> None:
    """End every node agent: each ends at the end of its input, and its ssh with it, ControlPersist seconds after
    this process (its ssh is the node's shared connection, for the next command meanwhile). Nothing waits for them:
    the operator's command is done, and an ssh whose session is over leaves by itself."""
    with _AGENTS_LOCK:
        agents = list(_AGENTS.values())
        _AGENTS.clear()
    with timeline.step("exit", len(agents)):
        hold_until_exit([agent.process.stdin.fileno() for agent in agents
                         if agent.process.stdin and not agent.process.stdin.closed],
                        max((agent.linger for agent in agents), default=0))
        for agent in agents:
            agent.close_input()


def hold_until_exit(descriptors: Sequence[int], linger_s: int = 0) -> None:
    """Hand `descriptors` (the agents' inputs) to a helper that keeps them open until this process has exited, and
    `linger_s` seconds more. Each agent ends when the last copy of its input closes; closed here, one after another,
    each close would wake that agent's ssh, which takes the core from this process, so the command would wait on
    every agent's end (0.9 s of 1000 nodes' on a 2-core machine); the helper's copies close together when it
    exits, which it does when this process is gone (its input ends) and the linger has passed. Without the helper
    (none could start), they close here as before."""
    if not descriptors:
        return
    gone, alive = os.pipe()  # `alive` is never written: its end (this process's) ends the helper's read
    wait = f"read _; exec sleep {int(linger_s)}" if linger_s > 0 else "read _"
    try:
        subprocess.Popen(["sh", "-c", wait], stdin=gone, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         pass_fds=descriptors, start_new_session=True)
    except OSError:
        os.close(alive)
    finally:
        os.close(gone)


class Remote:
    """Runs commands on many hosts, in parallel up to `fanout`, each with a timeout."""

    def __init__(self, options: SshOptions, *, fanout: int = 64, timeout: float = 120):
        if options.control_path is None:
            options = replace(options, control_path=os.path.join(default_control_dir(), "%C"))
        self.options = options
        self.fanout = max(1, fanout)
        self.timeout = timeout

    def agent(self, host: Host, python: str) -> Agent:
        """The host's agent, shared by every task of this `fab` run with the same ssh settings."""
        key = (host, python, self.options)
        with _AGENTS_LOCK:
            agent = _AGENTS.get(key)
        if agent is not None and agent.alive:
            return agent
        fresh = Agent(host, python, self.options)  # started outside the lock: hosts start in parallel
        with _AGENTS_LOCK:
            agent = _AGENTS.get(key)
            if agent is None or not agent.alive:
                _AGENTS[key] = agent = fresh
        if agent is not fresh:
            fresh.close()
        return agent

    def forget(self, agent: Agent) -> None:
        with _AGENTS_LOCK:
            for key, known in list(_AGENTS.items()):
                if known is agent:
                    del _AGENTS[key]

    def _execute(self, host: Host, argv: Sequence[str], timeout: float, input: str | None) -> Result:
        limit = timeout + self.options.connect_timeout + 10
        try:
            done = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=limit,
                                  stdin=None if input is not None else subprocess.DEVNULL, start_new_session=True)
        except subprocess.TimeoutExpired:
            return Result(host, 124, "", f"no answer within {limit:g}s")
        return Result(host, done.returncode, done.stdout, done.stderr)

    def run(self, host: Host, command: str | Sequence[str], *, timeout: float | None = None,
            input: str | None = None) -> Result:
        """Run a shell command string, or an argv without a shell, on `host`; the
        remote side is bounded by `timeout` too."""
        limit = timeout or self.timeout
        bound = ["timeout", "-k", "5", f"{limit:g}"]
        argv = [*bound, "sh", "-c", command] if isinstance(command, str) else [*bound, *command]
        return self._execute(host, commands.ssh_argv(host, shlex.join(argv), self.options), limit, input)

    def check(self, host: Host, command: str | Sequence[str], **kwargs) -> str:
        """Like run, but a failure raises HostFailure with a readable reason."""
        result = self.run(host, command, **kwargs)
        if result.code != 0:
            raise HostFailure(describe_failure(result.code, result.stderr))
        return result.stdout

    def node(self, host: Host, python: str, verb: str, *args: str, input: str | dict | None = None,
             timeout: float | None = None, sudo: bool = False) -> dict:
        """Run a verb of bootstrap/node.py with the node's `python`; its JSON answer.
        Calls go to the host's agent; with `sudo`, to a one-off root process."""
        limit = timeout or self.timeout
        if not sudo:
            agent = self.agent(host, python)
            try:
                return agent.call(verb, args, input, limit + self.options.connect_timeout)
            except HostFailure:
                if not agent.alive:
                    self.forget(agent)
                raise
        text = input if input is None or isinstance(input, str) else json.dumps(input)  # a one-off call reads text
        result = self.run(host, ["sh", "-c", AS_ROOT, "kiln", python, "-S", "-c", NODE_SCRIPT, verb, *args],
                          input=text, timeout=limit)
        if result.code != 0:
            raise HostFailure(describe_failure(result.code, result.stderr))
        try:
            return json.loads(result.stdout)
        except json.JSONDecodeError:
            raise HostFailure(f"unexpected answer from {python}: {result.stdout.strip()[:200]!r}") from None

    def rsync(self, host: Host, argv: Sequence[str], timeout: float | None = None,
              progress: Callable[[int, int], None] | None = None) -> None:
        """One rsync to or from `host`. Its exit 24 (files that vanished before they could be sent: a stopped
        process's status file renamed into place meanwhile) is a copy of everything that was there: not a failure.
        With `progress` (argv with commands.RSYNC_PROGRESS), it is called with the bytes done and the whole as they
        move, and the rsync is bounded by `timeout` seconds without a byte (rsync's own --timeout too), not by
        its length: a large project takes as long as its bytes take."""
        if progress is None:
            result = self._execute(host, argv, timeout or self.timeout, None)
        else:
            result = self._streamed(host, argv, (timeout or self.timeout) + self.options.connect_timeout + 10,
                                    progress)
        if result.code not in (0, RSYNC_VANISHED):
            raise HostFailure(describe_failure(result.code, result.stderr))

    def _streamed(self, host: Host, argv: Sequence[str], idle: float, progress: Callable[[int, int], None]) -> Result:
        counted = RsyncBytes()
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True, env={**os.environ, "LC_ALL": "C"})  # digits as parsed
        said: list[bytes] = []
        drain = threading.Thread(target=lambda: said.append(child.stderr.read()), daemon=True)
        drain.start()
        try:
            for chunk in proc.chunks(child.stdout, deadline=float("inf"), idle=idle):
                counted.feed(chunk.decode(errors="replace"))
                progress(counted.done, counted.total)
            code = child.wait(timeout=idle)
        except (TimeoutError, subprocess.TimeoutExpired):
            return Result(host, 124, "", f"nothing moved for {idle:g}s")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            drain.join(timeout=10)
            child.stdout.close()
            child.stderr.close()
        return Result(host, code, "", b"".join(said).decode(errors="replace"))

    def map(self, hosts: Iterable[Host], action: Callable[[Host], T]) -> tuple[dict[Host, T], dict[Host, str]]:
        """Apply `action` to every host in parallel (bounded); results and failures by host."""
        hosts = list(hosts)
        results: dict[Host, T] = {}
        failures: dict[Host, str] = {}

        def attempt(host: Host) -> None:
            try:
                results[host] = action(host)
            except HostFailure as failure:
                failures[host] = str(failure)
            except (OSError, ValueError) as error:  # no local ssh/rsync, out of descriptors, undecodable output
                failures[host] = f"{type(error).__name__}: {error}"

        list(workers(self.fanout).map(attempt, hosts))
        return {h: results[h] for h in hosts if h in results}, {h: failures[h] for h in hosts if h in failures}

    def map_or_raise(self, step: str, hosts: Iterable[Host], action: Callable[[Host], T]) -> dict[Host, T]:
        results, failures = self.map(hosts, action)
        if failures:
            raise RemoteError(step, {host.label: reason for host, reason in failures.items()})
        return results

    def disconnect(self, hosts: Iterable[Host]) -> None:
        """Close the shared connections to `hosts` (quietly; they may be gone)."""
        self.map(hosts, lambda host: self._execute(host, commands.control_argv(host, "exit", self.options), 10, None))

    def reachable(self, host: Host) -> str | None:
        """Why a fresh connection to `host` fails (the shared one may hang on a peer that is gone), or None."""
        fresh = replace(self.options, control_path="none")
        result = self._execute(host, commands.ssh_argv(host, "true", fresh), self.options.connect_timeout, None)
        return None if result.code == 0 else describe_failure(result.code, result.stderr)

    def unreachable(self, hosts: Iterable[Host], probes: int = 3, pause: float = 1.0) -> list[Host]:
        """The hosts among `hosts` whose machine is gone: a fresh connection cannot be made. A host that ends
        the connection (probe_verdict's "unclear") is asked again, up to `probes` times `pause` seconds apart: a
        machine on its way down ends one, then refuses or times out; one that keeps ending them is not lost."""
        hosts = list(hosts)
        lost, asking = set(), hosts
        for probe in range(probes):
            if probe:
                time.sleep(pause)
            reasons = self.map(asking, self.reachable)[0]
            verdicts = {host: probe_verdict(reasons.get(host)) for host in asking}
            lost.update(host for host, verdict in verdicts.items() if verdict == "lost")
            if not (asking := [host for host, verdict in verdicts.items() if verdict == "unclear"]):
                break
        return [host for host in hosts if host in lost]

    def reset(self, hosts: Iterable[Host]) -> None:
        """Drop what is open to `hosts` (their machines were replaced): their agents and shared connections."""
        hosts = set(hosts)
        with _AGENTS_LOCK:
            keys = [key for key in _AGENTS if key[0] in hosts]
            agents = [_AGENTS.pop(key) for key in keys]
        for agent in agents:
            agent.close(wait=1)
        self.disconnect(hosts)

    def user_known_hosts(self, host: Host) -> tuple[str, ...]:
        """The known_hosts files ssh would use for `host`, from `ssh -G`."""
        argv = ["ssh", "-G", *(["-F", self.options.config_file] if self.options.config_file else []),
                *commands.host_args(host), host.address]
        output = self._execute(host, argv, 10, None).stdout
        for line in output.splitlines():
            key, _, value = line.partition(" ")
            if key == "userknownhostsfile":
                return tuple(os.path.expanduser(path) for path in value.split())
        return ()
