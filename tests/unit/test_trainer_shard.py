import numpy as np
import pytest

from trainer.cli import parse_args
from trainer.errors import TrainerError
from trainer.splits import Split, shard_split


def test_shard_option_parses_index_and_count():
    assert parse_args(["--shard", "1/3"]).shard == (1, 3)
    assert parse_args([]).shard is None
    for bad in ("3/3", "1", "a/b", "1/x", "1/0"):
        with pytest.raises(TrainerError, match="expected INDEX/COUNT"):
            parse_args(["--shard", bad])


def test_shards_partition_the_training_examples_and_keep_the_test_split():
    split = Split(np.arange(10).reshape(10, 1), np.arange(10), np.zeros((2, 1)), np.zeros(2))
    parts = [shard_split(split, (i, 3)) for i in range(3)]
    assert [p.y_train.tolist() for p in parts] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert all(p.x_test is split.x_test for p in parts)
    assert shard_split(split, None) is split
