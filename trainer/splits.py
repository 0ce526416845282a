"""The train/test split every dataset gets, its shards, and the bundled digits (numpy only).

Neither imports scikit-learn: its import is 0.7 CPU-seconds of every trainer
start (TensorFlow's is 3), for a file and a shuffle. The digits are
read from the file scikit-learn installs for ``load_digits``, found through its
installed files; where that file is not, ``load_digits`` itself is asked.
"""

from __future__ import annotations

import importlib.metadata
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.errors import TrainerError

TEST_FRACTION = 0.2
DIGITS_FILE = "sklearn/datasets/data/digits.csv.gz"  # load_digits' own: 64 pixels (0-16) and the digit, per row
CLASSES = 10  # digits 0-9


@dataclass(frozen=True)
class Split:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int = CLASSES

    @property
    def train_size(self) -> int:
        return len(self.x_train)

    @property
    def features(self) -> int:
        return int(self.x_train.shape[1])


def shard_split(split: Split, shard: tuple[int, int] | None) -> Split:
    """Keep every COUNT-th training example from INDEX (`--shard INDEX/COUNT`): for plain
    data-parallel jobs where each process just trains on its own part of the input.
    The test split stays whole, so every shard is judged on the same examples."""
    if shard is None:
        return split
    index, count = shard
    return Split(split.x_train[index::count], split.y_train[index::count], split.x_test, split.y_test, split.classes)


def test_count(examples: int, fraction: float = TEST_FRACTION) -> int:
    """How many of ``examples`` go to the test split: at least one, and one left to train on."""
    return min(max(1, math.ceil(examples * fraction)), examples - 1)


def split_indices(y: np.ndarray, seed: int, fraction: float = TEST_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` indices of the labels ``y``, shuffled by ``seed`` (the same on every process).

    Stratified: each class gives the test split its share of its examples, so a rare class is in both.
    Where a class has a single example, it cannot be in both: a plain shuffled split of the whole.
    """
    if len(y) < 2:
        raise ValueError(f"a split needs two examples at least, got {len(y)}")
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(y, return_counts=True)
    if counts.min() < 2:
        order = rng.permutation(len(y))
        cut = test_count(len(y), fraction)
        return np.sort(order[cut:]), np.sort(order[:cut])
    train, test = [], []
    for label in classes:
        members = rng.permutation(np.flatnonzero(y == label))
        cut = test_count(len(members), fraction)
        test.append(members[:cut])
        train.append(members[cut:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def digits_file() -> Path | None:
    """scikit-learn's bundled digits file, from its installed files (nothing imported); None where it has none."""
    try:
        path = Path(importlib.metadata.distribution("scikit-learn").locate_file(DIGITS_FILE))
    except importlib.metadata.PackageNotFoundError:
        return None
    return path if path.is_file() else None


def digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 8x8 digits: pixels scaled to [0, 1] (float32) and their digit (int32)."""
    path = digits_file()
    if path is not None:
        table = np.loadtxt(path, delimiter=",")
        pixels, labels = table[:, :-1], table[:, -1]
    else:
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise TrainerError("--data digits: scikit-learn is not installed (it bundles the digits: "
                               "pip install scikit-learn)") from None
        bunch = load_digits()
        pixels, labels = bunch.data, bunch.target
    return (pixels / 16.0).astype(np.float32), labels.astype(np.int32)
