"""The convolutional model trains on the digits and exports a servable SavedModel; --shard splits the input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_trainer_local import environment, read_result, trainer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_cnn_learns_the_digits_and_exports(tmp_path):
    done = subprocess.run(trainer("--model", "cnn", "--epochs", "6", "--learning-rate", "0.05",
                                  "--run-dir", str(tmp_path), "--model-dir", str(tmp_path / "model")),
                          cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = read_result(tmp_path, "local-0")
    assert result["final_loss"] < result["first_loss"]
    assert result["test_accuracy"] >= 0.85
    check = ("import tensorflow as tf, sys; m = tf.saved_model.load(sys.argv[1]); "
             "f = m.signatures['serving_default']; print(f(features=tf.zeros([2, 64]))['probabilities'].shape)")
    loaded = subprocess.run([sys.executable, "-c", check, str(tmp_path / "model")], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert loaded.stdout.strip().splitlines()[-1] == "(2, 10)", loaded.stderr[-2000:]


def test_cnn_refuses_features_that_are_not_a_square_image(tmp_path):
    import numpy as np

    data = tmp_path / "flat.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.random((60, 10), dtype=np.float32), y=rng.integers(0, 3, 60))
    done = subprocess.run(trainer("--model", "cnn", "--data", str(data), "--epochs", "1", "--run-dir",
                                  str(tmp_path / "run"), "--model-dir", str(tmp_path / "model")),
                          cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "trainer: error: --model cnn needs square images: 10 features are not n x n pixels")
    assert not (tmp_path / "model").exists()


def test_shards_train_on_their_part_of_the_input(tmp_path):
    steps = {}
    for shard in ("0/2", "1/2"):
        run = tmp_path / shard.replace("/", "-")
        done = subprocess.run(trainer("--shard", shard, "--epochs", "1", "--batch-size", "32", "--run-dir", str(run),
                                      "--model-dir", str(run / "model")),
                              cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        steps[shard] = read_result(run, "local-0")["steps"]
    whole = 1437  # digits' 1797 examples less the 20% test split
    assert steps == {"0/2": -(-((whole + 1) // 2) // 32), "1/2": -(-(whole // 2) // 32)}
