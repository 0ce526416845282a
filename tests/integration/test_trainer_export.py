"""The chief's export: a SavedModel that ``tf.saved_model.load`` serves through
its documented ``serving_default`` signature, predicting the test split with the
accuracy the run reported. A real trainer process, no mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.quick]

ROOT = Path(__file__).resolve().parents[2]
SEED = 7


def test_export_serves_the_test_split_with_the_reported_accuracy(tmp_path):
    """Run with --strategy auto on a CPU-only host with no cluster environment:
    it picks onedevice, says so, and records it."""
    run_dir, model_dir = tmp_path / "run", tmp_path / "model"
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "--strategy", "auto", "--epochs", "2", "--seed", str(SEED),
         "--learning-rate", "0.05", "--run-dir", str(run_dir), "--model-dir", str(model_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("trainer: --strategy auto chose onedevice\n")
    result = json.loads((run_dir / "result.local-0.json").read_text())
    assert result["strategy"] == "onedevice"
    assert not (tmp_path / ".model.partial").exists()

    import tensorflow as tf  # after the trainer package pinned tf_keras (imported below)

    from trainer.data import load_split

    split = load_split("digits", SEED)
    loaded = tf.saved_model.load(str(model_dir))
    serve = loaded.signatures["serving_default"]
    assert list(serve.structured_input_signature[1]) == ["features"]
    spec = serve.structured_input_signature[1]["features"]
    assert (spec.dtype, spec.shape.as_list()) == (tf.float32, [None, 64])
    assert set(serve.structured_outputs) == {"logits", "probabilities"}

    outputs = serve(features=tf.constant(split.x_test, tf.float32))
    logits, probabilities = outputs["logits"].numpy(), outputs["probabilities"].numpy()
    assert logits.shape == probabilities.shape == (len(split.x_test), 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == split.y_test))
    assert np.argmax(probabilities, axis=1).tolist() == np.argmax(logits, axis=1).tolist()
    assert abs(accuracy - result["test_accuracy"]) <= 1e-6, (accuracy, result["test_accuracy"])
    assert accuracy >= 0.85

    # The evaluator side-car loads the same export as a Keras model.
    import tf_keras

    from trainer.report import weights_sha256

    keras_model = tf_keras.models.load_model(str(model_dir), compile=False)
    assert weights_sha256(keras_model.get_weights()) == result["weights_sha256"]
