"""Remote execution over OpenSSH with one shared connection per node (I/O).

Every call goes through the system `ssh` with ControlMaster: the first call to a
node makes the one authenticated connection, later calls (ssh and rsync, in this
process and in the next `fab` within ControlPersist) ride on it. That keeps
OpenSSH's default key exchange and the user's ssh_config semantics.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from bootstrap import commands
from bootstrap.commands import SshOptions
from bootstrap.errors import RemoteError
from bootstrap.hosts import Host

T = TypeVar("T")
NODE_SCRIPT = (Path(__file__).parent / "node.py").read_text()

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


class HostFailure(Exception):
    """One host failed one call; the message is the reason shown to the user."""


@dataclass(frozen=True)
class Result:
    host: Host
    code: int
    stdout: str
    stderr: str


def describe_failure(code: int, stderr: str) -> str:
    """A one-line reason for a failed ssh call."""
    for pattern, reason in _FAILURES:
        if pattern.search(stderr):
            return reason
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "no output"
    return f"exit {code}: {last}" if code != 255 else f"ssh failed: {last}"


def default_control_dir() -> str:
    """A private folder for connection sockets (short path: sockets are limited to ~100 bytes)."""
    path = Path(tempfile.gettempdir()) / f"kiln-ssh-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_uid != os.getuid() or path.stat().st_mode & 0o077:
        raise RemoteError("setup", {str(path): "control socket folder is not private to this user"})
    return str(path)


class Remote:
    """Runs commands on many hosts, in parallel up to `fanout`, each with a timeout."""

    def __init__(self, options: SshOptions, *, fanout: int = 64, timeout: float = 120):
        if options.control_path is None:
            options = replace(options, control_path=os.path.join(default_control_dir(), "%C"))
        self.options = options
        self.fanout = max(1, fanout)
        self.timeout = timeout

    def _execute(self, host: Host, argv: Sequence[str], timeout: float, input: str | None) -> Result:
        limit = timeout + self.options.connect_timeout + 10
        try:
            done = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=limit,
                                  stdin=None if input is not None else subprocess.DEVNULL)
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

    def node(self, host: Host, python: str, verb: str, *args: str, input: str | None = None,
             timeout: float | None = None, sudo: bool = False) -> dict:
        """Run a verb of bootstrap/node.py with the node's `python`; its JSON answer."""
        argv = [*(["sudo", "-n"] if sudo else []), python, "-c", NODE_SCRIPT, verb, *args]
        result = self.run(host, argv, input=input, timeout=timeout)
        if result.code == 127 and python in result.stderr:
            raise HostFailure(f"no {python} on the node: name the nodes' Python with --python PATH")
        if result.code != 0:
            raise HostFailure(describe_failure(result.code, result.stderr))
        output = result.stdout
        try:
            return json.loads(output)
        except json.JSONDecodeError:
            raise HostFailure(f"unexpected answer from {python}: {output.strip()[:200]!r}") from None

    def rsync(self, host: Host, argv: Sequence[str], timeout: float | None = None) -> None:
        result = self._execute(host, argv, timeout or self.timeout, None)
        if result.code != 0:
            raise HostFailure(describe_failure(result.code, result.stderr))

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

        with ThreadPoolExecutor(max_workers=min(self.fanout, max(1, len(hosts)))) as pool:
            list(pool.map(attempt, hosts))
        return {h: results[h] for h in hosts if h in results}, {h: failures[h] for h in hosts if h in failures}

    def map_or_raise(self, step: str, hosts: Iterable[Host], action: Callable[[Host], T]) -> dict[Host, T]:
        results, failures = self.map(hosts, action)
        if failures:
            raise RemoteError(step, {host.label: reason for host, reason in failures.items()})
        return results

    def disconnect(self, hosts: Iterable[Host]) -> None:
        """Close the shared connections to `hosts` (quietly; they may be gone)."""
        self.map(hosts, lambda host: self._execute(host, commands.control_argv(host, "exit", self.options), 10, None))

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
