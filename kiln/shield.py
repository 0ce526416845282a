"""Work that a Ctrl-C must not cut short: an undo of what a failed `up` made, a run stopped and collected before its
cluster goes. The first Ctrl-C started it; the next one is told that the work goes on (and what stopping it would
leave); only the one after that stops it (KeyboardInterrupt), so a stuck cloud cannot hold the terminal forever.
Signals reach Python's main thread alone: elsewhere the shield holds nothing and Ctrl-C acts as ever."""

from __future__ import annotations

import contextlib
import os
import signal
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
        # os.write: a print here could land inside another print to stderr (Python refuses the reentrant call)
        os.write(2, f"\nkiln: {what}; Ctrl-C again stops it, which {stopping_leaves}\n".encode())

    previous = signal.signal(signal.SIGINT, pressed)
    try:
        yield presses
    finally:
        # a handler set outside Python reads as None, and cannot be set back: Python's default stands in
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
