"""The evaluator task: a side-car outside the training cluster that evaluates the
chief's final model on the test split once it appears in --model-dir."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import tf_keras as keras

from trainer import data, report
from trainer.cluster import Task
from trainer.config import TrainConfig
from trainer.model import evaluate_accuracy

POLL_SECONDS = 2.0


def _fresh_saved_model(model_dir: Path, since: float) -> bool:
    marker = model_dir / "saved_model.pb"
    return marker.is_file() and marker.stat().st_mtime >= since


def wait_for_model(model_dir: Path, since: float, poll_seconds: float = POLL_SECONDS) -> keras.Model:
    """Block until a SavedModel written after ``since`` loads from ``model_dir``.

    Runs until killed when none appears (a model dir on another host's disk):
    like the ps servers, the evaluator is not a task whose exit ends a run.
    """
    while True:
        if _fresh_saved_model(model_dir, since):
            try:
                return keras.models.load_model(str(model_dir), compile=False)
            except (OSError, ValueError):
                pass  # still being written
        time.sleep(poll_seconds)


def evaluate(config: TrainConfig, task: Task, *, since: float) -> dict[str, Any]:
    """Wait for the chief's model (one saved after ``since``, so a model left by
    an earlier run does not count), evaluate it, write ``result.<task>.json``."""
    report.write_json(
        report.result_path(config.run_dir, task.name),
        {"strategy": config.strategy, "task": task.name, "model_dir": str(config.model_dir), "status": "waiting"},
    )
    model = wait_for_model(config.model_dir, since)
    split = data.load_split(config.data, config.seed)
    weights = model.get_weights()
    result = {
        "strategy": config.strategy,
        "task": task.name,
        "model_dir": str(config.model_dir),
        "test_accuracy": evaluate_accuracy(weights, split.x_test, split.y_test, config.seed, config.model),
        "weights_sha256": report.weights_sha256(weights),
        "wall_time": time.time() - since,
        "status": "ok",
    }
    report.write_json(report.result_path(config.run_dir, task.name), result)
    return result
