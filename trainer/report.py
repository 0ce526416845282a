"""The end-of-run record: weights digest, result.<task>.json and the summary line.

Pure apart from :func:`write_json`; needs numpy, not TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np


def weights_sha256(weights: Iterable[np.ndarray]) -> str:
    """sha256 over all weights as float32 bytes, in model order: equal on every
    replica exactly when the replicas ended with identical weights."""
    digest = hashlib.sha256()
    for array in weights:
        digest.update(np.ascontiguousarray(array, dtype=np.float32).tobytes())
    return digest.hexdigest()


def metrics_path(run_dir: Path, task_name: str) -> Path:
    return run_dir / f"metrics.{task_name}.jsonl"


def result_path(run_dir: Path, task_name: str) -> Path:
    return run_dir / f"result.{task_name}.json"


def summary_line(result: Mapping[str, Any]) -> str:
    """One human line for the end of the log (training or evaluator result)."""
    accuracy = result.get("test_accuracy")
    parts = [f"trainer: strategy={result['strategy']} task={result['task']}"]
    if "world_size" in result:
        loss = result.get("final_loss")
        parts.append(f"world={result['world_size']} final_loss={'n/a' if loss is None else f'{loss:.4f}'}")
    parts.append(f"test_accuracy={'n/a' if accuracy is None else f'{accuracy:.4f}'}")
    if "examples_per_sec" in result:
        parts.append(f"examples/s={result['examples_per_sec']:.0f}")
    return " ".join(parts)


def write_json(path: Path, record: Mapping[str, Any]) -> None:
    """Write ``record`` to ``path`` atomically (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    partial.replace(path)
