"""Work that a Ctrl-C must not cut short: an undo of what a failed `up` made, a run stopped and collected before its
cluster goes. The first Ctrl-C started it; the next one is told that the work goes on (and what stopping it would
leave); only the one after that stops it (KeyboardInterrupt), so a stuck cloud cannot hold the terminal forever.
Signals reach Python's main thread alone: elsewhere the shield holds nothing and Ctrl-C acts as ever."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def shielded(what: str, stopping_leaves: str) -> Iterator[list[int]]:
    """Run the block with Ctrl-C held off: the first press says `what` is still under way and that stopping it
    `stopping_leaves`; the second raises KeyboardInterrupt. Yields the count of presses (a list of one)."""
    presses = [0]
    if threading.current_thread() is not threading.main_thread():
        yield presses
        return

    def pressed(signum, frame) -> None:
        presses[0] += 1
        if presses[0] >= 2:
            raise KeyboardInterrupt
        print(f"\nkiln: {what}; Ctrl-C again stops it, which {stopping_leaves}", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, pressed)
    try:
        yield presses
    finally:
        signal.signal(signal.SIGINT, previous)
