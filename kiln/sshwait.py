"""Is a host up? Its SSH banner within a deadline, for many hosts at once (the one SSH wait of kiln)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

SSH_BANNERS = ("SSH-2.0-", "SSH-1.99-")
SSH_ATTEMPT_TIMEOUT_S = 5
SSH_RETRY_S = 2
SSH_FANOUT = 64
SSH_PORT = 22  # an endpoint without a port (a cloud's machine: Host.port None) is probed there


def ssh_banner(data: bytes) -> str | None:
    """The SSH identification line in what a server sent first (RFC 4253 lets other lines come before it)."""
    for line in data.decode("ascii", errors="replace").splitlines():
        if line.startswith(SSH_BANNERS):
            return line.strip()
    return None


def probe_ssh(address: str, port: int, timeout_s: float) -> str | None:
    """One attempt: connect and read the server's SSH banner within timeout_s; the banner, or None."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((address, port), timeout=timeout_s) as connection:
            data = b""
            while b"\n" not in data[-256:] or ssh_banner(data) is None:
                left = deadline - time.monotonic()
                if left <= 0 or len(data) > 8192:
                    return None
                connection.settimeout(left)
                chunk = connection.recv(1024)
                if not chunk:
                    return None
                data += chunk
            return ssh_banner(data)
    except OSError:  # refused, unreachable, timed out, reset
        return None


def wait_for_ssh(endpoints: Sequence[tuple[str, int]], timeout_s: float, *,
                 attempt_timeout_s: float = SSH_ATTEMPT_TIMEOUT_S, retry_s: float = SSH_RETRY_S,
                 fanout: int = SSH_FANOUT, alive: Callable[[tuple[str, int]], bool] | None = None,
                 answered: Callable[[str], None] | None = None) -> list[str]:
    """Probe every endpoint in parallel (at most `fanout` at once) until its SSH banner comes or timeout_s has
    passed (an endpoint's port None: SSH_PORT); the endpoints ("address:port", as given) that never answered, in
    the order given. Every endpoint gets at least one attempt, so the wait is bounded by timeout_s plus one attempt
    per `fanout` endpoints. `alive(endpoint)`, asked before each attempt, gives up on an endpoint early (its server
    process is gone); `answered("address:port")` is called as each answers."""
    deadline = time.monotonic() + timeout_s
    stop = threading.Event()  # set when the caller gives up (Ctrl-C), so no worker outlives the call by much

    def answers(endpoint: tuple[str, int]) -> bool:
        while not stop.is_set():
            if alive is not None and not alive(endpoint):
                return False
            left = deadline - time.monotonic()
            if probe_ssh(endpoint[0], endpoint[1] or SSH_PORT, max(0.05, min(attempt_timeout_s, left))):
                if answered is not None:
                    answered(f"{endpoint[0]}:{endpoint[1]}")
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            stop.wait(min(retry_s, left))
        return False

    if not endpoints:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(fanout, len(endpoints))), thread_name_prefix="ssh-wait") as pool:
        try:
            answered = list(pool.map(answers, endpoints))
        finally:
            stop.set()
    return [f"{address}:{port}" for (address, port), ok in zip(endpoints, answered, strict=True) if not ok]
