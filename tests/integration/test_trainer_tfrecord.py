"""``--data`` as TFRecord files written by the test (x: float list, y: int64),
one file, a folder or a glob. Real trainer processes, no mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainer import splits

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def write_records(path: Path, x: np.ndarray, y: np.ndarray, *, label: str = "y") -> Path:
    import tensorflow as tf

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for features, target in zip(x, y, strict=True):
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=features.tolist())),
                label: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(target)])),
            }))
            writer.write(example.SerializeToString())
    return path


def trainer(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def digits():
    return splits.digits()


def test_a_folder_of_tfrecords_trains_the_digits_above_the_floor(tmp_path, digits):
    x, y = digits
    folder = tmp_path / "records"
    write_records(folder / "part-0.tfrecord", x[:900], y[:900])
    write_records(folder / "part-1.tfrecord", x[900:], y[900:])
    (folder / "README.txt").write_text("not a record")
    run_dir = tmp_path / "run"
    done = trainer("--data", str(folder), "--epochs", "3", "--learning-rate", "0.05",
                   "--run-dir", str(run_dir), "--model-dir", str(tmp_path / "model"))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((run_dir / "result.local-0.json").read_text())
    assert result["steps"] == 3 * 23  # ceil(1437 / 64) steps per epoch: all 1797 examples were read
    assert result["test_accuracy"] >= 0.85


def test_one_tfrecord_file_and_a_glob_give_the_same_examples(tmp_path, digits):
    from trainer.tfrecords import load_tfrecords

    x, y = digits
    one = write_records(tmp_path / "all.tfrecord", x[:100], y[:100])
    write_records(tmp_path / "g" / "a.tfrecords", x[:40], y[:40])
    write_records(tmp_path / "g" / "b.tfrecords", x[40:100], y[40:100])
    for text in (str(one), str(tmp_path / "g" / "*.tfrecords")):
        loaded_x, loaded_y = load_tfrecords(text)
        np.testing.assert_array_equal(loaded_x, x[:100])
        assert loaded_y.tolist() == y[:100].tolist()


def test_bad_tfrecord_data_is_one_line_and_exit_2(tmp_path, digits):
    x, y = digits
    no_y = write_records(tmp_path / "no-y.tfrecord", x[:10], y[:10], label="label")
    garbage = tmp_path / "garbage.tfrecord"
    garbage.write_bytes(b"this is not a TFRecord file at all")
    (tmp_path / "empty").mkdir()
    cases = [
        (str(no_y), f"--data {no_y}: record 0 has no feature 'y'"),
        (str(tmp_path / "missing.tfrecord"), f"--data {tmp_path}/missing.tfrecord: no such file"),
        (str(tmp_path / "empty"), f"--data {tmp_path}/empty: no .tfrecord or .tfrecords files there"),
        (str(garbage), f"--data {garbage}: not a readable TFRecord file"),
    ]
    for data, message in cases:
        run_dir = tmp_path / "run"
        done = trainer("--data", data, "--run-dir", str(run_dir), "--model-dir", str(tmp_path / "model"))
        # TFRecords are read through TensorFlow, whose start-up log lines may come first:
        # the error is the one trainer line, and the last.
        errors = [line for line in done.stderr.splitlines() if line.startswith("trainer:")]
        assert done.returncode == 2 and len(errors) == 1, done.stdout + done.stderr
        assert errors[0].startswith(f"trainer: error: {message}"), errors[0]
        assert done.stderr.splitlines()[-1] == errors[0]
        assert not run_dir.exists() and not (tmp_path / "model").exists()
