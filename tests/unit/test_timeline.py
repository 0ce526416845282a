"""The phase record of a run (bootstrap.timeline, runs.process_times, summary.json's phases)."""

from __future__ import annotations

import json
import os
from itertools import count
from pathlib import Path

import pytest

from bootstrap import runs
from bootstrap.state import RunRecord, TaskRecord
from bootstrap.timeline import NODE_PHASES, OPERATOR_PHASES, ProcessTimes, Timeline, node_spans, span, totals


def ticking() -> Timeline:
    ticks = count(100)
    return Timeline(clock=lambda: float(next(ticks)))


def test_phases_are_recorded_in_order_with_their_attempt():
    timeline = ticking()
    with timeline.phase("connect"):
        pass
    timeline.attempt = 1
    with pytest.raises(RuntimeError), timeline.phase("start"):
        raise RuntimeError("a failed phase is still recorded")
    assert timeline.spans == [
        {"phase": "connect", "attempt": 0, "began": 100.0, "ended": 101.0, "seconds": 1.0},
        {"phase": "start", "attempt": 1, "began": 102.0, "ended": 103.0, "seconds": 1.0},
    ]
    assert timeline.of("start") == timeline.spans[1:]


def test_node_spans_from_process_start_to_the_watch_noticing_the_exit():
    times = {"horovod@node1": ProcessTimes(started=10.0, exited=40.0),
             "rank-0@node1": ProcessTimes(first_step=18.0, last_step=30.0),
             "rank-1@node2": ProcessTimes(first_step=18.5, last_step=30.5)}
    assert node_spans(times, watch_ended=42.0, attempt=2) == [
        span("startup", 10.0, 18.0, 2), span("training", 18.0, 30.5, 2), span("teardown", 30.5, 40.0, 2),
        span("noticed", 40.0, 42.0, 2)]
    assert [item["phase"] for item in node_spans(times, 42.0)] == list(NODE_PHASES)


def test_a_program_without_metrics_has_only_the_noticed_span():
    times = {"shard-0@node1": ProcessTimes(started=10.0, exited=12.0)}
    assert node_spans(times, watch_ended=13.5) == [span("noticed", 12.0, 13.5)]
    assert node_spans({}, watch_ended=None) == []


def test_totals_add_up_attempts():
    spans = [span("start", 0, 1), span("watch", 1, 5), span("start", 6, 7.5, 1)]
    assert totals(spans) == {"start": 2.5, "watch": 4.0}


def touch(path: Path, text: str, when: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (when, when))


def metrics(*stamps: float) -> str:
    return "".join(json.dumps({"step": i + 1, "time": stamp}) + "\n" for i, stamp in enumerate(stamps))


def test_process_times_read_the_collected_files(tmp_path):
    touch(tmp_path / "hosts/node1/horovod.pid", "42\n", 1000.0)
    touch(tmp_path / "hosts/node1/horovod.exit", "0\n", 1030.0)
    # An earlier attempt's lines (before this attempt's start) stay in a resumed run's file.
    touch(tmp_path / "hosts/node1/metrics.rank-0.jsonl", metrics(900.0, 1008.0, 1020.0) + "cut sho", 1020.0)
    touch(tmp_path / "hosts/node2/metrics.rank-1.jsonl", metrics(1009.0, 1021.0), 1021.0)
    assert runs.process_times(tmp_path) == {
        "horovod@node1": ProcessTimes(started=1000.0, exited=1030.0),
        "rank-0@node1": ProcessTimes(first_step=1008.0, last_step=1020.0),
        "rank-1@node2": ProcessTimes(first_step=1009.0, last_step=1021.0),
    }


def test_summary_keeps_the_phases_in_time_order_with_totals(tmp_path):
    record = RunRecord(run_id="r", mode="tf-config", cluster="c", python="python", hosts=(), names=("node1",),
                       root="/k", tasks=(TaskRecord("node1", 0, "worker-0"),), finishing=("worker-0",))
    phases = [span("watch", 5, 9), span("connect", 0, 1), span("training", 6, 8)]
    data = runs.summary(record, status="ok", failure=None, folder=tmp_path, wall=9.0, phases=phases)
    assert [item["phase"] for item in data["phases"]] == ["connect", "watch", "training"]
    assert data["phase_seconds"] == {"watch": 4.0, "connect": 1.0, "training": 2.0}
    assert set(data["phase_seconds"]) <= set(OPERATOR_PHASES) | set(NODE_PHASES)
    json.dumps(data)  # summary.json must be able to hold it


def test_a_stopped_run_is_stopped_not_failed():
    assert runs.status_line("failed: worker-0 on n1 exited with status 143", {"status": "stopped", "failure": None}) \
        == "stopped (kiln stop)"
    assert runs.status_line("failed: x", {"status": "stopped", "failure": "could not stop: n2"}) == \
        "stopped (kiln stop); could not stop: n2"
    assert runs.status_line("running", None) == "running"
    assert runs.status_line("failed: x", {"status": "failed", "failure": "x"}) == "failed: x"
