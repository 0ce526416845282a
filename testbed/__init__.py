"""Stand-ins only the tests use, for the cloud APIs that have no emulator: Compute Engine (testbed.gce) and Azure
Resource Manager (testbed.arm), each serving the published API over HTTP(S) with its faults. They build on the local
cloud (localcloud/: host keys, quiet servers); nothing outside the tests imports them."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Container, Sequence


def take_fault(faults: list, meets: Callable[[object], bool]):
    """The fault a call meets, if any: every set fault it `meets` counts the call down, and the first whose count
    reaches 0 is its (taken out of `faults`, with any other due now); nth counts the calls since it was set."""
    mine = [fault for fault in faults if meets(fault)]
    for fault in mine:
        fault.countdown -= 1
    due = [fault for fault in mine if fault.countdown == 0]
    for fault in due:
        faults.remove(fault)
    return due[0] if due else None


def settle(ops: dict, pending: Callable[[object], bool], complete: Callable[[object], None]) -> None:
    """Complete (`complete`) the operations of `ops` still `pending` whose time (`due`) has come, in the order they
    began."""
    now = time.monotonic()
    for op in list(ops.values()):
        if pending(op) and op.due <= now:
            complete(op)


def end_operation(op):
    """An operation's end, as every stand-in's ends: one that meets a fault undoes what it did at once (and its fault
    is returned), any other does what it finishes with (and None is returned)."""
    if op.fault:
        if op.undo:
            op.undo()
        return op.fault
    if op.finish:
        op.finish()
    return None


def next_free(hosts: Sequence[str], used: Container[str], start: int) -> tuple[str, int] | None:
    """The first of `hosts` from index `start` on, round robin, that is not `used`, and the index the next search
    starts at (past it, so that a freed address is not handed out at once); None where every one is used."""
    for step in range(len(hosts)):
        address = hosts[(start + step) % len(hosts)]
        if address not in used:
            return address, (start + step + 1) % len(hosts)
    return None


def stand_in_parser(name: str, description: str, operation_done: str) -> argparse.ArgumentParser:
    """The command line of `python -m testbed.NAME`: where the stand-in listens and how long its operations take
    (`operation_done`: what an operation's end is called); the stand-in adds what it serves."""
    parser = argparse.ArgumentParser(prog=f"python -m testbed.{name}", description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    parser.add_argument("--op-delay", type=float, default=0.05, help=f"seconds until an operation {operation_done}")
    return parser


def serve(server) -> None:
    """Serve until interrupted (Ctrl-C)."""
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
