"""``--record-ids``: the flag, and grouping recorded batches into epochs (pure)."""

from __future__ import annotations

import pytest

from trainer.cli import parse_args
from trainer.idrecord import epochs_of, ids_path


def test_record_ids_is_off_by_default_and_a_flag():
    assert parse_args([]).record_ids is False
    assert parse_args(["--record-ids"]).record_ids is True


def test_batches_are_grouped_by_steps_per_epoch_and_prefetched_ones_dropped():
    batches = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10]]
    assert epochs_of(batches, steps_per_epoch=2, epochs=2) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_epochs_not_reached_are_empty():
    assert epochs_of([[1, 2]], steps_per_epoch=2, epochs=3) == [[1, 2], [], []]


def test_ids_file_is_named_by_task(tmp_path):
    assert ids_path(tmp_path, "rank-2") == tmp_path / "ids.rank-2.json"


@pytest.mark.parametrize("strategy", ["multiworker", "ps"])
def test_record_ids_is_refused_where_tf_distribute_shards_after_the_tap(strategy, tmp_path, monkeypatch, capsys):
    from trainer.__main__ import main

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("HOROVOD_RANK", raising=False)
    assert main(["--strategy", strategy, "--record-ids", "--run-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"trainer: error: --record-ids works with --strategy onedevice, mirrored, horovod, not {strategy}\n"
    )
