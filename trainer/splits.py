"""The train/test split every dataset gets, its shards, and the bundled digits (numpy only).

The digits ship beside this file (digits.csv.gz: the test set of UCI's Optical Recognition of Handwritten
Digits, E. Alpaydin and C. Kaynak, 1998, CC BY 4.0, as scikit-learn bundles it for ``load_digits``): 1797 rows
of 64 pixels (0-16) and the digit. kiln installs no scikit-learn for them: where it is installed, Keras's
scikit-learn wrapper imports it with every TensorFlow, 0.6 CPU-seconds of each trainer's start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.errors import TrainerError

TEST_FRACTION = 0.2
DIGITS_FILE = Path(__file__).with_name("digits.csv.gz")  # 64 pixels (0-16) and the digit, per row
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


def digits(path: Path = DIGITS_FILE) -> tuple[np.ndarray, np.ndarray]:
    """The 1797 8x8 digits: pixels scaled to [0, 1] (float32) and their digit (int32)."""
    if not path.is_file():
        raise TrainerError(f"--data digits: {path} is missing: the trainer's folder is incomplete")
    table = np.loadtxt(path, delimiter=",")
    return (table[:, :-1] / 16.0).astype(np.float32), table[:, -1].astype(np.int32)
