"""The trainer's train/test split and its bundled digits."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from trainer import splits
from trainer.errors import TrainerError

DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"


def test_the_split_is_a_partition_the_same_for_a_seed_and_another_for_another_seed():
    y = np.repeat(np.arange(10), 50)
    train, test = splits.split_indices(y, seed=7)
    assert sorted([*train, *test]) == list(range(len(y)))
    again = splits.split_indices(y, seed=7)
    assert train.tolist() == again[0].tolist() and test.tolist() == again[1].tolist()
    assert set(splits.split_indices(y, seed=8)[1]) != set(test)


def test_every_class_gives_the_test_split_its_share():
    y = np.array([0] * 90 + [1] * 10 + [2] * 3)
    _, test = splits.split_indices(y, seed=1)
    assert np.bincount(y[test]).tolist() == [18, 2, 1]  # ceil(20%) of each: the rare classes are tested too


def test_a_class_of_one_example_gets_a_plain_split_of_the_whole():
    y = np.array([0] * 9 + [1])
    train, test = splits.split_indices(y, seed=3)
    assert len(test) == 2 and sorted([*train, *test]) == list(range(10))


@pytest.mark.parametrize(("examples", "tested"), [(2, 1), (3, 1), (5, 1), (6, 2), (1797, 360)])
def test_the_test_split_takes_a_fifth_rounded_up_and_leaves_one_to_train_on(examples, tested):
    assert splits.test_count(examples) == tested


def test_one_example_cannot_be_split():
    with pytest.raises(ValueError, match="two examples at least"):
        splits.split_indices(np.array([4]), seed=0)


def test_the_digits_are_read_from_the_trainers_own_file_without_scikit_learn():
    found = subprocess.run(
        [sys.executable, "-c", "import sys; from trainer import splits; x, y = splits.digits(); "
                               "print(x.shape, x.dtype, x.min(), x.max(), y.dtype, sorted(set(y.tolist())), "
                               "'sklearn' in sys.modules)"],
        capture_output=True, text=True, timeout=120, check=True).stdout.split(maxsplit=2)
    assert found[:2] == ["(1797,", "64)"]
    assert found[2] == "float32 0.0 1.0 int32 [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] False\n", found


def test_the_digits_file_is_the_one_scikit_learn_bundles():
    """UCI's digits test set as scikit-learn 1.9.1 ships it (sklearn/datasets/data/digits.csv.gz): the same bytes."""
    assert hashlib.sha256(splits.DIGITS_FILE.read_bytes()).hexdigest() == DIGITS_SHA256
    x, y = splits.digits()
    assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert (x * 16 == np.round(x * 16)).all()  # whole pixel counts 0-16, scaled


def test_a_trainer_without_its_digits_file_says_so(tmp_path):
    with pytest.raises(TrainerError, match=r"--data digits: .*digits.csv.gz is missing"):
        splits.digits(tmp_path / "digits.csv.gz")
