"""When each phase of a run began and ended, for summary.json: the operator's own steps as they happen,
and the nodes' (process start, first and last logged step, exit) read back from the collected files."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

# The operator's steps, in the order a run takes them (a restart adds restore, then start..collect again; a run in
# a container image adds pull, the image on every node, and container, the run's container on each).
OPERATOR_PHASES = ("connect", "mesh", "pull", "preflight", "sync", "container", "start", "watch", "stop", "collect",
                   "replace", "restore")
# What the nodes' files tell, between the start and the watch's end.
NODE_PHASES = ("startup", "training", "teardown", "noticed")
# Where a command's steps over every node (facts, mesh, judge, ...) add their seconds, one JSON line each, when the
# environment names a file: bench/fanout.py reads them to say where the time above its floor goes.
STEP_TIMES = "KILN_STEP_TIMES"


def span(name: str, began: float, ended: float, attempt: int = 0) -> dict:
    return {"phase": name, "attempt": attempt, "began": round(began, 3), "ended": round(ended, 3),
            "seconds": round(max(0.0, ended - began), 3)}


@contextmanager
def step(name: str, hosts: int) -> Iterator[None]:
    """Time one step over `hosts` nodes into the file KILN_STEP_TIMES names (nothing without it)."""
    path = os.environ.get(STEP_TIMES)
    began = time.monotonic()
    try:
        yield
    finally:
        if path:
            line = {"step": name, "hosts": hosts, "seconds": round(time.monotonic() - began, 3)}
            with open(path, "a") as handle:
                handle.write(json.dumps(line) + "\n")


@dataclass
class Timeline:
    """The spans of one run in the order they ended; `attempt` counts restarts."""

    clock: Callable[[], float] = time.time
    spans: list[dict] = field(default_factory=list)
    attempt: int = 0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = self.clock()
        try:
            yield
        finally:
            self.spans.append(span(name, began, self.clock(), self.attempt))

    def of(self, name: str) -> list[dict]:
        return [item for item in self.spans if item["phase"] == name]


@dataclass(frozen=True)
class ProcessTimes:
    """One process's life as its files on the node tell it (epoch seconds; None: not seen)."""

    started: float | None = None      # its pid file
    first_step: float | None = None   # its first metrics line
    last_step: float | None = None    # its last metrics line
    exited: float | None = None       # its exit file


def node_spans(times: Mapping[str, ProcessTimes], watch_ended: float | None, attempt: int = 0) -> list[dict]:
    """The nodes' side of one attempt: startup (first process started to the first logged step), training
    (first to last logged step), teardown (last logged step to the last exit), noticed (last exit to the end
    of kiln's watch). Without logged steps (a user's program), startup and training are left out and teardown
    is unknown; `noticed` still is."""
    def known(values: Sequence[float | None]) -> list[float]:
        return [value for value in values if value is not None]

    started = known([t.started for t in times.values()])
    firsts = known([t.first_step for t in times.values()])
    lasts = known([t.last_step for t in times.values()])
    exits = known([t.exited for t in times.values()])
    spans = []
    if started and firsts:
        spans.append(span("startup", min(started), min(firsts), attempt))
    if firsts and lasts:
        spans.append(span("training", min(firsts), max(lasts), attempt))
    if lasts and exits:
        spans.append(span("teardown", max(lasts), max(exits), attempt))
    if exits and watch_ended is not None:
        spans.append(span("noticed", max(exits), watch_ended, attempt))
    return spans


def totals(spans: Sequence[dict]) -> dict[str, float]:
    """Seconds per phase over all attempts, in the order phases first appear."""
    found: dict[str, float] = {}
    for item in spans:
        found[item["phase"]] = round(found.get(item["phase"], 0.0) + item["seconds"], 3)
    return found
