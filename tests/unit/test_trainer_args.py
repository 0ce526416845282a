"""The trainer's pure parts: arguments, task naming, chief detection, batch and
learning-rate planning, the result digest. None of this may import TensorFlow."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainer.cli import parse_args
from trainer.cluster import (
    LOCAL_TASK,
    Task,
    horovod_task,
    is_chief,
    load_tf_config,
    process_environment,
    resolve_task,
    task_from_tf_config,
    training_workers,
)
from trainer.config import TrainConfig
from trainer.errors import TrainerError
from trainer.plan import (
    Replicas,
    TrainPlan,
    default_steps_per_epoch,
    per_replica_batch_size,
    plan_training,
    replicas_for,
    scaled_learning_rate,
)
from trainer.report import metrics_path, result_path, summary_line, weights_sha256

ROOT = Path(__file__).resolve().parents[2]

MWMS_CLUSTER = {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]}
PS_CLUSTER = {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"], "ps": ["h0:2223"]}


def tf_config(cluster: dict, task_type: str, index: int) -> dict:
    return {"cluster": cluster, "task": {"type": task_type, "index": index}}


# --- arguments ---------------------------------------------------------------


def test_no_arguments_give_the_documented_defaults():
    assert parse_args([]) == TrainConfig(
        strategy="onedevice",
        data="digits",
        epochs=5,
        batch_size=64,
        steps_per_epoch=None,
        learning_rate=0.01,
        seed=42,
        model_dir=Path("model"),
        run_dir=Path("model"),  # state lives with the model, never in the current folder
        log_every=10,
    )


def test_every_flag_lands_in_train_config():
    argv = [
        "--strategy", "horovod", "--data", "synthetic", "--epochs", "3", "--batch-size", "128",
        "--steps-per-epoch", "7", "--learning-rate", "0.05", "--seed", "7",
        "--model-dir", "/tmp/m", "--run-dir", "/tmp/r", "--log-every", "2",
    ]
    assert parse_args(argv) == TrainConfig(
        strategy="horovod",
        data="synthetic",
        epochs=3,
        batch_size=128,
        steps_per_epoch=7,
        learning_rate=0.05,
        seed=7,
        model_dir=Path("/tmp/m"),
        run_dir=Path("/tmp/r"),
        log_every=2,
    )


def test_train_config_is_frozen():
    with pytest.raises(AttributeError):
        parse_args([]).epochs = 9  # type: ignore[misc]


def test_unknown_strategy_is_named_with_the_choices():
    with pytest.raises(TrainerError) as error:
        parse_args(["--strategy", "tpu"])
    assert str(error.value) == (
        "argument --strategy: invalid choice: 'tpu' "
        "(choose from 'onedevice', 'mirrored', 'multiworker', 'ps', 'horovod', 'auto')"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "0"], "argument --epochs: expected a positive integer, got '0'"),
        (["--batch-size", "-4"], "argument --batch-size: expected a positive integer, got '-4'"),
        (["--steps-per-epoch", "many"], "argument --steps-per-epoch: expected a positive integer, got 'many'"),
        (["--learning-rate", "0"], "argument --learning-rate: expected a positive number, got '0'"),
        (["--log-every", "1.5"], "argument --log-every: expected a positive integer, got '1.5'"),
        (["--epochs"], "argument --epochs: expected one argument"),
        (["--colour", "red"], "unrecognized arguments: --colour red"),
    ],
)
def test_bad_values_are_one_line_errors(argv, message):
    with pytest.raises(TrainerError) as error:
        parse_args(argv)
    assert str(error.value) == message


# --- tasks and chiefs ----------------------------------------------------------


@pytest.mark.parametrize(
    ("cluster", "task_type", "index", "name"),
    [
        (MWMS_CLUSTER, "chief", 0, "chief-0"),
        (MWMS_CLUSTER, "worker", 1, "worker-1"),
        (PS_CLUSTER, "ps", 0, "ps-0"),
        (PS_CLUSTER, "evaluator", 0, "evaluator-0"),
    ],
)
def test_task_name_comes_from_tf_config(cluster, task_type, index, name):
    task = task_from_tf_config(tf_config(cluster, task_type, index))
    assert task == Task(task_type, index)
    assert task.name == name


def test_horovod_and_local_task_names():
    assert horovod_task(3).name == "rank-3"
    assert LOCAL_TASK.name == "local-0"


def test_tf_config_json_is_parsed_and_empty_means_none():
    text = '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'
    assert load_tf_config(text) == tf_config({"worker": ["a:1"]}, "worker", 0)
    assert load_tf_config(None) is None
    assert load_tf_config("  ") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "TF_CONFIG is not valid JSON: Expecting property name enclosed in double quotes: "
                      "line 1 column 2 (char 1)"),
        ("[1, 2]", "TF_CONFIG must be a JSON object with 'cluster' and 'task'"),
    ],
)
def test_malformed_tf_config_is_rejected(text, message):
    with pytest.raises(TrainerError) as error:
        load_tf_config(text)
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"task": {"type": "worker", "index": 0}}, "TF_CONFIG has no 'cluster' (task type -> list of host:port)"),
        ({"cluster": MWMS_CLUSTER}, "TF_CONFIG has no 'task' with 'type' and 'index'"),
        (tf_config(MWMS_CLUSTER, "ps", 0), "TF_CONFIG task type 'ps' is not in the cluster"),
        (tf_config(MWMS_CLUSTER, "worker", 2),
         "TF_CONFIG task worker 2 is out of range: the cluster has 2 worker task(s)"),
        (tf_config(MWMS_CLUSTER, "worker", "1"), "TF_CONFIG task must have a string 'type' and an integer 'index'"),
        (tf_config({"worker": "h1:2222"}, "worker", 0), "TF_CONFIG cluster['worker'] must be a list of host:port"),
    ],
)
def test_inconsistent_tf_config_names_the_problem(config, message):
    with pytest.raises(TrainerError) as error:
        task_from_tf_config(config)
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("task", "cluster", "chief"),
    [
        (Task("chief", 0), MWMS_CLUSTER, True),
        (Task("worker", 0), MWMS_CLUSTER, False),
        (Task("worker", 0), {"worker": ["h1:1", "h2:1"]}, True),
        (Task("worker", 1), {"worker": ["h1:1", "h2:1"]}, False),
        (Task("ps", 0), PS_CLUSTER, False),
        (Task("evaluator", 0), PS_CLUSTER, False),
        (Task("rank", 0), None, True),
        (Task("rank", 2), None, False),
        (LOCAL_TASK, None, True),
    ],
)
def test_chief_is_the_chief_else_worker_zero(task, cluster, chief):
    assert is_chief(task, cluster) is chief


def test_training_workers_count_chief_and_workers_not_ps():
    assert training_workers(PS_CLUSTER) == 3
    assert training_workers({"worker": ["a:1", "b:1"]}) == 2


def test_local_strategies_ignore_tf_config():
    assert resolve_task("onedevice", None) == LOCAL_TASK
    assert resolve_task("mirrored", tf_config(MWMS_CLUSTER, "worker", 1)) == LOCAL_TASK


def test_multiworker_and_ps_resolve_their_task():
    assert resolve_task("multiworker", tf_config(MWMS_CLUSTER, "worker", 1)) == Task("worker", 1)
    assert resolve_task("ps", tf_config(PS_CLUSTER, "ps", 0)) == Task("ps", 0)
    assert resolve_task("ps", tf_config(PS_CLUSTER, "evaluator", 0)) == Task("evaluator", 0)


@pytest.mark.parametrize(
    ("strategy", "config", "message"),
    [
        ("multiworker", None, "--strategy multiworker needs TF_CONFIG (cluster and task) in the environment"),
        ("ps", None, "--strategy ps needs TF_CONFIG (cluster and task) in the environment"),
        ("multiworker", tf_config(PS_CLUSTER, "worker", 0),
         "TF_CONFIG has ps tasks: use --strategy ps, not multiworker"),
        ("ps", tf_config(MWMS_CLUSTER, "chief", 0),
         "--strategy ps needs chief, worker and ps tasks in TF_CONFIG; missing: ps"),
        ("ps", tf_config({"worker": ["a:1"], "ps": ["b:1"]}, "worker", 0),
         "--strategy ps needs chief, worker and ps tasks in TF_CONFIG; missing: chief"),
    ],
)
def test_strategy_and_tf_config_must_agree(strategy, config, message):
    with pytest.raises(TrainerError) as error:
        resolve_task(strategy, config)
    assert str(error.value) == message


def test_only_ps_processes_get_grpc_fail_fast():
    assert process_environment("ps") == {"GRPC_FAIL_FAST": "use_caller"}
    assert process_environment("multiworker") == {}


# --- batch, learning rate, steps -----------------------------------------------


def test_global_batch_is_split_evenly_over_replicas():
    assert per_replica_batch_size(64, 1) == 64
    assert per_replica_batch_size(64, 2) == 32
    assert per_replica_batch_size(64, 3) == 21


def test_batch_smaller_than_replicas_is_rejected():
    with pytest.raises(TrainerError) as error:
        per_replica_batch_size(2, 3)
    assert str(error.value) == (
        "--batch-size 2 is smaller than the 3 replicas: each replica needs at least one example per step"
    )


def test_learning_rate_scales_linearly_with_replicas():
    assert scaled_learning_rate(0.01, 1) == 0.01
    assert scaled_learning_rate(0.01, 4) == 0.04


def test_default_steps_cover_the_train_split_once():
    assert default_steps_per_epoch(1437, 64) == 23
    assert default_steps_per_epoch(1280, 64) == 20
    assert default_steps_per_epoch(10, 64) == 1


@pytest.mark.parametrize(
    ("strategy", "in_sync", "workers", "replicas"),
    [
        ("onedevice", 1, 1, Replicas(1, 1, 1)),
        ("mirrored", 4, 1, Replicas(4, 4, 4)),
        ("multiworker", 4, 2, Replicas(4, 2, 4)),
        ("ps", 1, 3, Replicas(1, 1, 3)),
        ("horovod", 3, 3, Replicas(3, 1, 3)),
    ],
)
def test_replica_layout_per_strategy(strategy, in_sync, workers, replicas):
    assert replicas_for(strategy, in_sync, workers) == replicas


@pytest.mark.parametrize(("argv", "replicas", "plan"), [
    # horovod, 3 ranks: the batch rounds down to a multiple of the ranks, the learning rate scales with them
    (["--strategy", "horovod", "--batch-size", "64", "--epochs", "2"], ("horovod", 3, 3),
     TrainPlan(world_size=3, replicas_in_sync=3, global_batch_size=63, per_replica_batch_size=21,
               process_batch_size=21, learning_rate=0.03, steps_per_epoch=23, epochs=2)),
    # ps: the batch and learning rate of one asynchronous step, whatever the workers
    (["--strategy", "ps", "--steps-per-epoch", "5", "--learning-rate", "0.1"], ("ps", 1, 2),
     TrainPlan(world_size=2, replicas_in_sync=1, global_batch_size=64, per_replica_batch_size=64,
               process_batch_size=64, learning_rate=0.1, steps_per_epoch=5, epochs=5)),
], ids=["horovod-3-ranks", "ps-async-step"])
def test_the_plan_of_a_strategy(argv, replicas, plan):
    assert plan_training(parse_args(argv), replicas_for(*replicas), train_size=1437) == plan


# --- results ---------------------------------------------------------------------


def test_weights_digest_is_sha256_of_float32_bytes_in_order():
    weights = [np.arange(6, dtype=np.float64).reshape(2, 3), np.array([0.5], dtype=np.float32)]
    expected = hashlib.sha256(
        np.arange(6, dtype=np.float32).tobytes() + np.array([0.5], dtype=np.float32).tobytes()
    ).hexdigest()
    assert weights_sha256(weights) == expected
    assert weights_sha256(weights[::-1]) != expected


def test_file_names_carry_the_task():
    assert metrics_path(Path("/runs/r1"), "worker-1") == Path("/runs/r1/metrics.worker-1.jsonl")
    assert result_path(Path("/runs/r1"), "rank-3") == Path("/runs/r1/result.rank-3.json")


def test_summary_line():
    result = {
        "strategy": "horovod", "task": "rank-0", "world_size": 3, "final_loss": 0.12345,
        "test_accuracy": 0.95, "examples_per_sec": 1234.4,
    }
    assert summary_line(result) == (
        "trainer: strategy=horovod task=rank-0 world=3 final_loss=0.1235 test_accuracy=0.9500 examples/s=1234"
    )
    assert summary_line({**result, "test_accuracy": None}).endswith("test_accuracy=n/a examples/s=1234")


@pytest.mark.parametrize(("modules", "heavy"), [
    ("trainer.cli, trainer.cluster, trainer.plan, trainer.report, trainer.errors", ("tensorflow", "tf_keras", "keras")),
    ("trainer.inputs", ("tensorflow", "tf_keras", "keras")),  # the input checks run before TensorFlow loads
    ("trainer.storage", ("tensorflow", "boto3", "botocore")),  # until a remote location is used
])
def test_the_pure_modules_import_no_heavy_library(modules, heavy):
    code = f"import sys, {modules}\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
