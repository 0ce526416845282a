"""Bounded subprocesses: every command kiln runs locally has a timeout, and a failure reads as one message."""

from __future__ import annotations

import os
import resource
import select
import shlex
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from kiln.errors import KilnError


def tail(text: str, lines: int = 15) -> str:
    """The last non-empty lines of a command's output (carriage returns of progress bars dropped)."""
    kept = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def shown(argv: Sequence[str], words: int = 4) -> str:
    """A command as a message names it: its first words."""
    return shlex.join(argv[:words]) + (" ..." if len(argv) > words else "")


def run(argv: Sequence[str], *, timeout: float, check: bool = True, input: str | None = None,
        cwd: Path | str | None = None, env: Mapping[str, str] | None = None,
        tail_lines: int = 15) -> subprocess.CompletedProcess[str]:
    """Run argv with its output captured as text and stdin closed (or fed `input`).

    Raises KilnError naming the command when it runs past `timeout` seconds, or (with `check`) exits non-zero;
    the message carries the last `tail_lines` lines of what it printed.
    """
    try:
        done = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env=None if env is None else dict(env),
                              stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise KilnError(f"{shown(argv)} timed out after {timeout:g} s") from None
    except OSError as error:
        raise KilnError(f"{shown(argv)} could not start: {error.strerror or error}") from None
    if check and done.returncode != 0:
        raise KilnError(f"{shown(argv)} exited {done.returncode}: "
                        f"{tail(done.stderr or done.stdout, tail_lines) or 'no output'}")
    return done


def raise_descriptor_limit() -> int:
    """Lift this process's open-file limit to the hard one: each node kiln talks to holds an ssh connection and
    its pipes (about four descriptors), so the usual soft limit of 1024 ends near 250 nodes. The new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return wanted
        except (ValueError, OSError):
            return soft
    return soft


def chunks(stream: BinaryIO, *, deadline: float, size: int = 65536, idle: float | None = None) -> Iterator[bytes]:
    """What a pipe gives, as it comes, until its end; TimeoutError once `deadline` (time.monotonic()) passes, or
    once `idle` seconds pass without a byte."""
    descriptor = stream.fileno()
    waiting = select.poll()  # not select(): a large cluster's pipes are numbered past 1023
    waiting.register(descriptor, select.POLLIN | select.POLLHUP | select.POLLERR)
    last = time.monotonic()
    while True:
        now = time.monotonic()
        left = deadline - now if idle is None else min(deadline - now, last + idle - now)
        if left <= 0:
            raise TimeoutError("the deadline passed" if now >= deadline else f"nothing came for {idle:g} s")
        if not waiting.poll(min(left, 1.0) * 1000):
            continue
        chunk = os.read(descriptor, size)
        if not chunk:
            return
        last = time.monotonic()
        yield chunk
