"""Checks on the paths a run reads and writes, made before TensorFlow is
imported and before anything is written (numpy only, no TensorFlow).

Each failure is a :class:`TrainerError`: one ``trainer: error: ...`` line, exit 2.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from trainer.arrays import checked_arrays
from trainer.config import DATASETS
from trainer.errors import TrainerError
from trainer.tfrecords import load_tfrecords


def load_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)`` from a local ``.npz``: x as float32 N x features, y as
    int32 labels in ``0..classes-1``; raise TrainerError naming what is wrong."""
    if not path.is_file():
        raise TrainerError(f"--data {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [name for name in ("x", "y") if name not in archive.files]
            if missing:
                raise TrainerError(
                    f"--data {path}: the .npz has no array {' or '.join(repr(m) for m in missing)} "
                    f"(it has: {', '.join(archive.files) or 'none'})"
                )
            x, y = archive["x"], archive["y"]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise TrainerError(f"--data {path}: not a readable .npz file ({exc})") from None
    return checked_arrays(str(path), x, y)


def check_data(data: str) -> None:
    """Fail early on a ``--data`` path that cannot be trained on (a TFRecord
    path is read through TensorFlow: see trainer.tfrecords)."""
    if data in DATASETS:
        return
    if data.endswith(".npz"):
        load_npz(Path(data))
    else:
        load_tfrecords(data)


def check_writable_dir(flag: str, path: Path) -> None:
    """Fail unless ``path`` is, or can be created as, a directory this process may
    write to. Creates nothing."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise TrainerError(f"{flag} {path}: not writable ({probe} is not a directory)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise TrainerError(f"{flag} {path}: not writable (no write permission on {probe})")
