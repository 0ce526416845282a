"""The pure parts of resuming: checkpoint flags, where a resumed run starts and
stops, when a checkpoint is due, and the checks on --data and output dirs made
before TensorFlow is imported."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainer.cli import parse_args
from trainer.errors import TrainerError
from trainer.inputs import check_data, check_writable_dir, load_npz
from trainer.plan import ResumePlan, TrainPlan, checkpoint_due, plan_resume

ROOT = Path(__file__).resolve().parents[2]


def train_plan(epochs: int = 4, steps_per_epoch: int = 23) -> TrainPlan:
    return TrainPlan(world_size=1, replicas_in_sync=1, global_batch_size=64, per_replica_batch_size=64,
                     process_batch_size=64, learning_rate=0.01, steps_per_epoch=steps_per_epoch, epochs=epochs)


def test_checkpoint_dir_defaults_to_run_dir_checkpoints():
    config = parse_args(["--run-dir", "/tmp/r"])
    assert (config.checkpoint_dir, config.checkpoints, config.checkpoint_every) == (None, Path("/tmp/r/checkpoints"), 0)


def test_checkpoint_flags_land_in_train_config():
    config = parse_args(["--checkpoint-dir", "/c", "--checkpoint-every", "5"])
    assert (config.checkpoints, config.checkpoint_every) == (Path("/c"), 5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint-every", "-1"], "argument --checkpoint-every: expected a non-negative integer, got '-1'"),
        (["--data", "mnist"], "argument --data: expected digits, synthetic, or a path to an .npz, a "
         ".tfrecord, or a folder or glob of .tfrecord files, got 'mnist'"),
    ],
)
def test_bad_checkpoint_and_data_flags_are_one_line_errors(argv, message):
    with pytest.raises(TrainerError) as error:
        parse_args(argv)
    assert str(error.value) == message


def test_npz_path_is_accepted_as_data():
    assert parse_args(["--data", "/data/set.npz"]).data == "/data/set.npz"


@pytest.mark.parametrize(
    ("restored", "expected"),
    [
        (0, ResumePlan(start_step=0, total_steps=92, initial_epoch=0, remaining=92)),
        (46, ResumePlan(start_step=46, total_steps=92, initial_epoch=2, remaining=46)),
        (50, ResumePlan(start_step=50, total_steps=92, initial_epoch=2, remaining=42)),
        (92, ResumePlan(start_step=92, total_steps=92, initial_epoch=4, remaining=0)),
        (120, ResumePlan(start_step=120, total_steps=92, initial_epoch=4, remaining=0)),
    ],
)
def test_resume_reaches_the_planned_total_and_never_exceeds_it(restored, expected):
    assert plan_resume(train_plan(), restored) == expected


def test_checkpoints_are_due_every_n_steps_or_each_epoch_and_at_the_end():
    due = [s for s in range(1, 93) if checkpoint_due(s, every=5, steps_per_epoch=23, total_steps=92)]
    assert due == [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 92]
    due = [s for s in range(1, 93) if checkpoint_due(s, every=0, steps_per_epoch=23, total_steps=92)]
    assert due == [23, 46, 69, 92]


def test_npz_arrays_are_loaded_as_float32_and_int32(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.ones((4, 3), np.float64), y=np.array([0, 1, 2, 1]))
    x, y = load_npz(path)
    assert (x.dtype, x.shape, y.dtype, list(y)) == (np.float32, (4, 3), np.int32, [0, 1, 2, 1])


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"y": np.zeros(3, int)}, "the .npz has no array 'x' (it has: y)"),
        ({"x": np.zeros((3, 2))}, "the .npz has no array 'y' (it has: x)"),
        ({"x": np.zeros((3, 2)), "y": np.zeros(2, int)}, "x has 3 rows but y has 2 labels"),
        ({"x": np.zeros(3), "y": np.zeros(3, int)}, "x must be a non-empty N x features array, got shape (3,)"),
        ({"x": np.zeros((1, 2)), "y": np.zeros(1, int)},
         "one example; the trainer needs two at least (one to train on, one to test)"),
        ({"x": np.zeros((3, 2)), "y": np.array([0.5, 1, 2])}, "y must hold non-negative integer labels, got float64"),
        ({"x": np.zeros((3, 2)), "y": np.array([0, -1, 2])}, "y must hold non-negative integer labels, got int64"),
    ],
)
def test_bad_npz_content_is_named(arrays, message, tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    with pytest.raises(TrainerError) as error:
        check_data(str(path))
    assert str(error.value) == f"--data {path}: {message}"


def test_missing_or_garbled_npz_is_an_error(tmp_path):
    with pytest.raises(TrainerError, match="no such file"):
        check_data(str(tmp_path / "none.npz"))
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(TrainerError, match="not a readable .npz file"):
        check_data(str(tmp_path / "bad.npz"))


def test_builtin_datasets_need_no_file():
    check_data("digits")
    check_data("synthetic")


def test_a_dir_below_a_file_is_not_writable_and_nothing_is_created(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(TrainerError) as error:
        check_writable_dir("--model-dir", tmp_path / "f" / "m")
    assert str(error.value) == f"--model-dir {tmp_path}/f/m: not writable ({tmp_path}/f is not a directory)"
    check_writable_dir("--model-dir", tmp_path / "new" / "deeper")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
