"""Progress on a long step, per node: a bar each with bytes, rate and time left on a terminal (rich), and where the
output is not a terminal (a CI log, a pipe) a line at most every `every` seconds, so a long pull is never silent.

`PullBytes` reads what `docker pull` prints on a terminal (each layer's `Downloading 12.5MB/77.2MB` and
`Extracting ...`) and counts its bytes (pure). `Report` shows any such count, for any step."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from rich import filesize

from kiln.progress import line_seconds

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_MOVING = re.compile(r"([0-9a-f]{12}): (Downloading|Extracting)\s+(?:\[[=> ]*\]\s+)?"
                     r"([\d.]+)\s?([kKMGT]?B)/([\d.]+)\s?([kKMGT]?B)")
_DONE = re.compile(r"([0-9a-f]{12}): (Download complete|Pull complete|Already exists)")


def size(number: str, unit: str) -> int:
    """docker's human size (decimal units: go-units) in bytes."""
    return int(float(number) * _UNITS[unit])


@dataclass
class PullBytes:
    """One node's `docker pull`, from its terminal output: each layer's size (as the registry sends it, compressed),
    downloaded and unpacked bytes. `done`
    counts both halves (a layer downloaded is half done, unpacked is done), so it reaches `total` at the end; a
    layer's size is known once it starts downloading, so `total` grows while layers wait their turn."""

    sizes: dict[str, int] = field(default_factory=dict)
    downloaded: dict[str, int] = field(default_factory=dict)
    unpacked: dict[str, int] = field(default_factory=dict)
    text: str = ""  # what was printed, without the terminal's escapes (the error, where it fails)
    pending: str = ""  # a line not yet ended

    def feed(self, chunk: str) -> None:
        whole = self.pending + chunk
        ended = max(whole.rfind("\r"), whole.rfind("\n")) + 1
        self.pending = whole[ended:]
        clean = _ANSI.sub("", whole[:ended]).replace("\r", "\n")
        self.text = (self.text + clean)[-20000:]
        for layer, phase, done, done_unit, whole, whole_unit in _MOVING.findall(clean):
            self.sizes[layer] = size(whole, whole_unit)
            (self.downloaded if phase == "Downloading" else self.unpacked)[layer] = size(done, done_unit)
        for layer, said in _DONE.findall(clean):
            if said == "Already exists":
                self.sizes.pop(layer, None)
            elif layer in self.sizes:
                self.downloaded[layer] = self.sizes[layer]
                if said == "Pull complete":
                    self.unpacked[layer] = self.sizes[layer]

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    @property
    def done(self) -> int:
        return sum(self.downloaded.get(layer, 0) + self.unpacked.get(layer, 0) for layer in self.sizes) // 2


_RSYNC = re.compile(r"^\s*([\d,]+)\s+(\d+)%\s+\S+/s\s+\d+:\d\d:\d\d", re.MULTILINE)


@dataclass
class RsyncBytes:
    """One node's rsync, from what `--info=progress2` prints (a line, rewritten with carriage returns, of the bytes
    so far and the share of the whole): bytes done and the whole, known once the share is (pure). With
    `--no-inc-recursive` the share is of every file from the start."""

    done: int = 0
    total: int = 0
    pending: str = ""

    def feed(self, chunk: str) -> None:
        whole = self.pending + chunk
        ended = max(whole.rfind("\r"), whole.rfind("\n")) + 1
        self.pending = whole[ended:]
        for done, share in _RSYNC.findall(whole[:ended].replace("\r", "\n")):
            self.done = int(done.replace(",", ""))
            if int(share) > 0:
                self.total = max(self.done, self.done * 100 // int(share))
            if int(share) == 100:
                self.total = self.done


def line_of(what: str, counts: dict[str, tuple[int, int]], seconds: float) -> str:
    """The line a report prints where the output is not a terminal (pure)."""
    done = sum(d for d, _ in counts.values())
    parts = [f"{name} {filesize.decimal(d)}" + (f" of {filesize.decimal(t)}" if t else "")
             for name, (d, t) in counts.items()]
    rate = f", {filesize.decimal(int(done / seconds))}/s" if seconds > 0 and done else ""
    return f"{what}: {', '.join(parts)} ({seconds:.0f} s{rate})"


class Report:
    """Progress of one step on several nodes (thread-safe: each node's worker updates its own)."""

    def __init__(self, what: str, names: Sequence[str], *, stream: TextIO | None = None, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic, terminal: bool | None = None, quiet_s: float = 0):
        """`quiet_s`: a step over sooner says nothing (a sync of a small project); a longer one shows its bars
        from then on, or its lines (every `every` seconds) without the opening line."""
        self.what, self.stream, self.clock, self.quiet_s = what, stream or sys.stdout, clock, quiet_s
        self.every = line_seconds() if every is None else every
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.counts = {name: (0, 0) for name in names}
        self.began = self.said = clock()
        self.shown = not quiet_s  # whether it has said anything (a step past its quiet start)
        self.lock = threading.Lock()
        self.bars = None
        if self.terminal:
            from rich import console, progress  # only on a terminal

            self.bars = progress.Progress(
                progress.TextColumn("{task.description}"), progress.BarColumn(), progress.DownloadColumn(),
                progress.TransferSpeedColumn(), progress.TimeRemainingColumn(),
                console=console.Console(file=self.stream))
            self.tasks = {name: self.bars.add_task(f"{what} {name}", total=None) for name in names}

    def __enter__(self) -> Report:
        if self.bars and self.shown:
            self.bars.start()
        elif self.shown:
            print(f"{self.what} on {', '.join(self.counts)}", file=self.stream, flush=True)
        return self

    def __exit__(self, *exc) -> None:
        if self.bars and self.shown:
            self.bars.stop()

    def update(self, name: str, done: int, total: int) -> None:
        with self.lock:
            self.counts[name] = (done, total)
            if self.bars:
                if not self.shown and self.clock() - self.began >= self.quiet_s:
                    self.shown = True
                    self.bars.start()
                self.bars.update(self.tasks[name], completed=done, total=total or None)
                return
            now = self.clock()
            if now - self.said >= self.every:
                self.said, self.shown = now, True
                print(line_of(self.what, self.counts, now - self.began), file=self.stream, flush=True)
