"""``--strategy auto``: the strategy picked from the environment and the visible
GPUs (pure; no TensorFlow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.cli import parse_args
from trainer.cluster import auto_strategy, cluster_strategy, local_strategy
from trainer.errors import TrainerError

ROOT = Path(__file__).resolve().parents[2]


def tf_config(cluster: dict, task_type: str = "worker", index: int = 0) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


TWO_WORKERS = tf_config({"worker": ["h0:2222", "h1:2222"]})
CHIEF_AND_WORKER = tf_config({"chief": ["h0:2222"], "worker": ["h1:2222"]}, "chief")
PS_CLUSTER = tf_config({"chief": ["h0:2222"], "worker": ["h1:2222"], "ps": ["h2:2222"]}, "ps")
ONE_WORKER = tf_config({"worker": ["h0:2222"]})


@pytest.mark.parametrize(
    ("env", "gpus", "expected"),
    [
        ({}, 0, "onedevice"),
        ({}, 1, "onedevice"),
        ({}, 2, "mirrored"),
        ({}, 8, "mirrored"),
        ({"HOROVOD_RANK": "0"}, 0, "horovod"),
        ({"HOROVOD_RANK": "2"}, 4, "horovod"),
        ({"OMPI_COMM_WORLD_RANK": "1"}, 0, "horovod"),
        ({"HOROVOD_RANK": "0", "TF_CONFIG": PS_CLUSTER}, 0, "horovod"),
        ({"HOROVOD_RANK": ""}, 0, "onedevice"),
        ({"TF_CONFIG": PS_CLUSTER}, 0, "ps"),
        ({"TF_CONFIG": PS_CLUSTER}, 4, "ps"),
        ({"TF_CONFIG": TWO_WORKERS}, 0, "multiworker"),
        ({"TF_CONFIG": CHIEF_AND_WORKER}, 2, "multiworker"),
        ({"TF_CONFIG": tf_config({"worker": ["h0:1", "h1:1"]}, "evaluator")}, 0, "multiworker"),
        ({"TF_CONFIG": ONE_WORKER}, 0, "onedevice"),
        ({"TF_CONFIG": ONE_WORKER}, 2, "mirrored"),
        ({"TF_CONFIG": tf_config({"chief": ["h0:1"]}, "chief")}, 0, "onedevice"),
        ({"TF_CONFIG": ""}, 0, "onedevice"),
        ({"TF_CONFIG": "{}"}, 2, "mirrored"),
        ({"TF_CONFIG": json.dumps({"cluster": {"ps": []}})}, 0, "onedevice"),
        ({"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/usr/bin"}, 1, "onedevice"),
    ],
    ids=lambda value: value if isinstance(value, (str, int)) else None,
)
def test_auto_picks_the_strategy_the_environment_implies(env, gpus, expected):
    assert auto_strategy(env, gpus) == expected


def test_cluster_strategy_is_none_for_a_local_environment():
    assert cluster_strategy({}) is None
    assert cluster_strategy({"TF_CONFIG": ONE_WORKER}) is None
    assert cluster_strategy({"TF_CONFIG": TWO_WORKERS}) == "multiworker"


def test_local_strategy_needs_more_than_one_gpu_to_mirror():
    assert [local_strategy(gpus) for gpus in range(4)] == ["onedevice", "onedevice", "mirrored", "mirrored"]


def test_auto_with_malformed_tf_config_is_a_trainer_error():
    with pytest.raises(TrainerError, match="TF_CONFIG is not valid JSON"):
        auto_strategy({"TF_CONFIG": "{nope"}, 0)


def test_auto_is_an_accepted_strategy():
    assert parse_args(["--strategy", "auto"]).strategy == "auto"


def test_auto_on_a_cluster_environment_does_not_import_tensorflow():
    code = (
        "import os, sys; os.environ['HOROVOD_RANK'] = '0'; "
        "from trainer.__main__ import resolve_auto; from trainer.cli import parse_args; "
        "print(resolve_auto(parse_args(['--strategy', 'auto'])).strategy); "
        "print('tensorflow' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trainer: --strategy auto chose horovod\nhorovod\nFalse\n"
