"""The one check every dataset passes, whatever it was read from (numpy only)."""

from __future__ import annotations

import numpy as np

from trainer.errors import TrainerError


def checked_arrays(name: str, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` as float32 N x features and int32 labels; raise TrainerError
    naming what is wrong with them (``name`` is the --data value)."""
    path = name
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise TrainerError(f"--data {path}: x must be a non-empty N x features array, got shape {x.shape}")
    if y.ndim != 1:
        raise TrainerError(f"--data {path}: y must be a vector of N labels, got shape {y.shape}")
    if len(x) != len(y):
        raise TrainerError(f"--data {path}: x has {len(x)} rows but y has {len(y)} labels")
    if len(x) < 2:
        raise TrainerError(f"--data {path}: one example; the trainer needs two at least (one to train on, one to test)")
    if not np.issubdtype(x.dtype, np.number) or not np.all(np.isfinite(x)):
        raise TrainerError(f"--data {path}: x must hold finite numbers")
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
        raise TrainerError(f"--data {path}: y must hold non-negative integer labels, got {y.dtype}")
    return x.astype(np.float32), y.astype(np.int32)
