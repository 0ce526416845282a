"""Which checkpoint a trainer may resume, and where its state goes by default (trainer.lineage, trainer.cli)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer import lineage
from trainer.cli import parse_args
from trainer.errors import TrainerError

DIGITS_MLP = {"model": "mlp", "data": "digits", "shard": "all"}


def checkpointed(folder: Path, trained_on: dict | None) -> Path:
    folder.mkdir(parents=True)
    (folder / "checkpoint").write_text('model_checkpoint_path: "ckpt-5"\n')
    if trained_on is not None:
        lineage.record(folder, trained_on)
    return folder


def test_identity_is_model_data_and_shard():
    assert lineage.identity(parse_args([])) == DIGITS_MLP
    assert lineage.identity(parse_args(["--model", "cnn", "--data", "x.npz", "--shard", "1/3"])) == {
        "model": "cnn", "data": "x.npz", "shard": "1/3"}
    # Options a resumed run may change are not part of it.
    assert lineage.identity(parse_args(["--epochs", "9", "--batch-size", "8", "--learning-rate", "1"])) == DIGITS_MLP


def test_differences_name_each_option_both_ways():
    assert lineage.differences(DIGITS_MLP, DIGITS_MLP) == []
    assert lineage.differences({**DIGITS_MLP, "model": "cnn"}, {**DIGITS_MLP, "shard": "0/2"}) == [
        "model: mlp here, cnn there", "shard: 0/2 here, all there"]
    assert lineage.differences({}, {"model": "mlp"}) == ["model: mlp here, unrecorded there"]


def test_own_checkpoints_of_the_same_configuration_resume(tmp_path):
    folder = checkpointed(tmp_path / "ckpt", DIGITS_MLP)
    assert lineage.restore_dir(folder, None, DIGITS_MLP) == folder


def test_an_empty_folder_starts_fresh_and_resume_from_fills_in(tmp_path):
    other = checkpointed(tmp_path / "other", {**DIGITS_MLP, "data": "a.npz"})
    assert lineage.restore_dir(tmp_path / "new", None, DIGITS_MLP) == tmp_path / "new"
    assert lineage.restore_dir(tmp_path / "new", other, DIGITS_MLP) == other


def test_another_configurations_checkpoints_are_refused_naming_the_way_out(tmp_path):
    folder = checkpointed(tmp_path / "ckpt", {**DIGITS_MLP, "model": "cnn"})
    with pytest.raises(TrainerError) as refused:
        lineage.restore_dir(folder, None, DIGITS_MLP)
    assert str(refused.value) == (
        f"--checkpoint-dir {folder} holds checkpoints of another run (model: mlp here, cnn there): resume them "
        f"on purpose with --resume-from {folder}, or give this run its own --model-dir or --checkpoint-dir")
    assert lineage.restore_dir(folder, folder, DIGITS_MLP) == folder  # named on purpose


def test_own_checkpoints_win_over_resume_from(tmp_path):
    # A restarted fine-tuning run continues from its own newest checkpoint, not the one it started from.
    own = checkpointed(tmp_path / "own", DIGITS_MLP)
    other = checkpointed(tmp_path / "other", {**DIGITS_MLP, "data": "a.npz"})
    assert lineage.restore_dir(own, other, DIGITS_MLP) == own


def test_checkpoints_without_a_record_are_refused(tmp_path):
    folder = checkpointed(tmp_path / "ckpt", None)
    with pytest.raises(TrainerError, match="no trained-on.json says which model and data wrote them"):
        lineage.restore_dir(folder, None, DIGITS_MLP)


def test_resume_from_without_a_checkpoint_is_an_error(tmp_path):
    with pytest.raises(TrainerError, match=rf"--resume-from {tmp_path}: no checkpoint there"):
        lineage.restore_dir(tmp_path / "new", tmp_path, DIGITS_MLP)


def test_state_goes_to_the_model_dir_by_default():
    config = parse_args(["--model-dir", "out/model"], env={})
    assert (config.run_dir, config.checkpoints) == (Path("out/model"), Path("out/model/checkpoints"))
    assert parse_args(["--model-dir", "m", "--run-dir", "r"], env={}).checkpoints == Path("r/checkpoints")
    assert parse_args([], env={}).run_dir == Path("model")


def test_a_remote_model_dir_keeps_its_state_in_a_local_state_folder():
    config = parse_args(["--model-dir", "s3://bucket/team/model"], env={"XDG_STATE_HOME": "/state"})
    assert config.run_dir == Path("/state/kiln/trainer/s3/bucket/team/model")
    home = parse_args(["--model-dir", "gs://b/m"], env={})
    assert home.run_dir == Path.home() / ".local/state/kiln/trainer/gs/b/m"
