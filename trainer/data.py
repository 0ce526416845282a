"""Datasets: the train/test split as numpy arrays, and the tf.data pipelines
each strategy feeds from them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainer import splits
from trainer.inputs import load_npz
from trainer.splits import CLASSES, Split
from trainer.tfrecords import load_tfrecords

FEATURES = 64
SYNTHETIC_EXAMPLES = 1797  # as many as digits


def _split(x: np.ndarray, y: np.ndarray, seed: int, classes: int = CLASSES) -> Split:
    train, test = splits.split_indices(y, seed)
    return Split(x[train], y[train], x[test], y[test], classes)


def digits_split(seed: int) -> Split:
    """The trainer's bundled 8x8 digits (splits.DIGITS_FILE), pixels scaled to [0, 1]."""
    return _split(*splits.digits(), seed)


def synthetic_split(seed: int) -> Split:
    """Random features of digits' shape, labelled by a fixed random linear map
    (so the loss can still fall)."""
    rng = np.random.default_rng(seed)
    x = rng.random((SYNTHETIC_EXAMPLES, FEATURES), dtype=np.float32)
    projection = rng.normal(size=(FEATURES, CLASSES)).astype(np.float32)
    y = np.argmax((x - 0.5) @ projection, axis=1).astype(np.int32)
    return _split(x, y, seed)


def npz_split(path: Path, seed: int) -> Split:
    """A local ``.npz`` with ``x`` and ``y`` (checked by :func:`load_npz`), split
    like digits; the classes are ``0..max(y)``."""
    x, y = load_npz(path)
    return _split(x, y, seed, classes=int(y.max()) + 1)


def tfrecord_split(text: str, seed: int) -> Split:
    """TFRecord files (see :mod:`trainer.tfrecords`), split like an ``.npz``."""
    x, y = load_tfrecords(text)
    return _split(x, y, seed, classes=int(y.max()) + 1)


def load_split(name: str, seed: int) -> Split:
    """``digits``, ``synthetic``, a path to a local ``.npz``, or local TFRecords."""
    if name == "digits":
        return digits_split(seed)
    if name == "synthetic":
        return synthetic_split(seed)
    if name.endswith(".npz"):
        return npz_split(Path(name), seed)
    return tfrecord_split(name, seed)


def train_dataset(
    split: Split,
    batch_size: int,
    seed: int,
    *,
    shard: tuple[int, int] | None = None,
    auto_shard_data: bool = False,
    tap: Callable[[tf.data.Dataset], tf.data.Dataset] | None = None,
) -> tf.data.Dataset:
    """Shuffled batches of the training split, repeated forever: one pass is one
    epoch of ``ceil(examples / batch)`` batches, so every process can run the same
    fixed number of steps.

    ``shard=(count, index)`` keeps every count-th example (horovod, PS workers);
    ``auto_shard_data`` lets MultiWorkerMirroredStrategy shard the batches by
    DATA, so each example is seen once per epoch across workers. The shuffle seed
    is the same on every process, which DATA sharding relies on. ``tap`` wraps
    the batched, repeated dataset before prefetching (``--record-ids``).
    """
    dataset = tf.data.Dataset.from_tensor_slices((split.x_train, split.y_train))
    if shard is not None:
        dataset = dataset.shard(*shard)
    dataset = dataset.shuffle(split.train_size, seed=seed, reshuffle_each_iteration=True).batch(batch_size).repeat()
    if tap is not None:
        dataset = tap(dataset)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    if auto_shard_data:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        dataset = dataset.with_options(options)
    return dataset
