"""``--data`` as TFRecord files: one ``tf.train.Example`` per example, with

- ``x``: a float feature (``float_list``) of the same length in every record
  (the features), and
- ``y``: an int64 feature (``int64_list``) holding one non-negative label.

``--data`` names one file (``.tfrecord``/``.tfrecords``), a folder (its
``*.tfrecord``/``*.tfrecords`` files) or a glob; files are read in sorted order,
uncompressed. The examples are loaded into memory and split like an ``.npz``.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np

from trainer.arrays import checked_arrays
from trainer.errors import TrainerError

SUFFIXES = (".tfrecord", ".tfrecords")
GLOB_CHARS = frozenset("*?[")


def tfrecord_files(text: str) -> list[str]:
    """The files ``text`` names, sorted; raise TrainerError when there are none."""
    path = Path(text)
    if path.is_dir():
        files = sorted(str(p) for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
    elif GLOB_CHARS & set(text):
        files = sorted(p for p in glob.glob(text) if Path(p).is_file())
    elif path.is_file():
        files = [text]
    elif path.suffix in SUFFIXES:
        raise TrainerError(f"--data {text}: no such file")
    else:
        raise TrainerError(f"--data {text}: no such file or folder")
    if not files:
        raise TrainerError(f"--data {text}: no .tfrecord or .tfrecords files there")
    return files


def load_tfrecords(text: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` from the TFRecord files ``text`` names (schema above)."""
    import tensorflow as tf

    files = tfrecord_files(text)
    xs: list[list[float]] = []
    ys: list[int] = []
    try:
        for index, raw in enumerate(tf.data.TFRecordDataset(files).as_numpy_iterator()):
            features = tf.train.Example.FromString(raw).features.feature
            missing = [name for name in ("x", "y") if name not in features]
            if missing:
                raise TrainerError(f"--data {text}: record {index} has no feature {' or '.join(map(repr, missing))}")
            x, y = features["x"].float_list.value, features["y"].int64_list.value
            if len(y) != 1:
                raise TrainerError(f"--data {text}: record {index}: y must be one int64 label, got {len(y)} values")
            if xs and len(x) != len(xs[0]):
                raise TrainerError(
                    f"--data {text}: record {index}: x has {len(x)} floats, the first record had {len(xs[0])}"
                )
            xs.append(list(x))
            ys.append(int(y[0]))
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as exc:
        raise TrainerError(f"--data {text}: not a readable TFRecord file ({exc.message.splitlines()[0]})") from None
    except Exception as exc:  # protobuf's DecodeError: a record that is not a tf.train.Example
        if isinstance(exc, TrainerError) or type(exc).__name__ != "DecodeError":
            raise
        raise TrainerError(f"--data {text}: a record is not a tf.train.Example") from None
    if not xs:
        raise TrainerError(f"--data {text}: no records")
    return checked_arrays(text, np.asarray(xs, dtype=np.float32), np.asarray(ys, dtype=np.int64))
