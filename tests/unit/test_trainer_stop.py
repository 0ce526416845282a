"""When Horovod's ranks agree on stopping (pure): each step while the first steps are timed, then about every
STOP_LATENCY seconds at the agreed pace."""

from __future__ import annotations

import pytest

from trainer.plan import STOP_LATENCY, STOP_MAX_INTERVAL, STOP_WARMUP, StopSchedule, step_pace, stop_interval


@pytest.mark.parametrize(("seconds", "interval"), [
    (0.001, STOP_MAX_INTERVAL), (0.004, 500), (0.1, 20), (STOP_LATENCY, 1), (30.0, 1), (0.0, STOP_MAX_INTERVAL)])
def test_the_interval_keeps_the_stop_within_the_latency(seconds, interval):
    assert stop_interval(seconds) == interval
    if 0 < seconds <= STOP_LATENCY:
        assert stop_interval(seconds) * seconds <= STOP_LATENCY


def test_the_pace_is_the_median_gap_without_the_first_step():
    assert step_pace([0.0, 5.0, 5.1, 5.2, 5.9, 6.0]) == pytest.approx(0.1)
    assert step_pace([0.0, 5.0]) == 0.0


def test_every_warmup_step_is_agreed_then_every_interval():
    schedule = StopSchedule(start=100)
    due = [step for step in range(101, 101 + STOP_WARMUP) if schedule.due(step)]
    assert due == list(range(101, 101 + STOP_WARMUP))
    assert schedule.measured(100 + STOP_WARMUP) and not schedule.measured(101)
    schedule.interval = 25
    later = [step for step in range(100 + STOP_WARMUP + 1, 100 + STOP_WARMUP + 80) if schedule.due(step)]
    assert later == [100 + STOP_WARMUP + 25, 100 + STOP_WARMUP + 50, 100 + STOP_WARMUP + 75]
    assert not schedule.measuring(100 + STOP_WARMUP + 1)
