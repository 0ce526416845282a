"""Who this process is: task naming and chief detection from TF_CONFIG (pure)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer.errors import TrainerError

LOCAL_STRATEGIES = ("onedevice", "mirrored")
# Variables horovodrun (gloo: HOROVOD_RANK) or Open MPI's mpirun sets in every rank.
HOROVOD_RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK")


@dataclass(frozen=True)
class Task:
    """One process of a training job: ``chief-0``, ``worker-1``, ``rank-3``, ``local-0``."""

    type: str
    index: int

    @property
    def name(self) -> str:
        return f"{self.type}-{self.index}"


LOCAL_TASK = Task("local", 0)


def load_tf_config(text: str | None) -> dict[str, Any] | None:
    """Parse the TF_CONFIG environment value; None when it is unset or empty."""
    if text is None or not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrainerError(f"TF_CONFIG is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise TrainerError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    return value


def cluster_of(tf_config: Mapping[str, Any]) -> dict[str, list[str]]:
    """Return TF_CONFIG's cluster: task type → list of host:port, checked for shape."""
    cluster = tf_config.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise TrainerError("TF_CONFIG has no 'cluster' (task type -> list of host:port)")
    for task_type, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise TrainerError(f"TF_CONFIG cluster[{task_type!r}] must be a list of host:port")
    return cluster


def task_from_tf_config(tf_config: Mapping[str, Any]) -> Task:
    """Return the task TF_CONFIG assigns to this process, checked against its cluster."""
    cluster = cluster_of(tf_config)
    task = tf_config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise TrainerError("TF_CONFIG has no 'task' with 'type' and 'index'")
    task_type, index = task["type"], task["index"]
    if not isinstance(task_type, str) or not isinstance(index, int) or isinstance(index, bool):
        raise TrainerError("TF_CONFIG task must have a string 'type' and an integer 'index'")
    if task_type == "evaluator":
        # The evaluator is a side-car outside the cluster spec.
        if index != 0:
            raise TrainerError(f"TF_CONFIG task evaluator {index}: there is only evaluator 0")
        return Task(task_type, index)
    if task_type not in cluster:
        raise TrainerError(f"TF_CONFIG task type {task_type!r} is not in the cluster")
    if not 0 <= index < len(cluster[task_type]):
        raise TrainerError(
            f"TF_CONFIG task {task_type} {index} is out of range: the cluster has "
            f"{len(cluster[task_type])} {task_type} task(s)"
        )
    return Task(task_type, index)


def is_chief(task: Task, cluster: Mapping[str, Any] | None = None) -> bool:
    """Whether this task saves the model: chief, else worker 0 when there is no chief,
    horovod rank 0, or a local process."""
    if task.type in ("chief", "local"):
        return True
    if task.type == "rank":
        return task.index == 0
    if task.type == "worker":
        return task.index == 0 and "chief" not in (cluster or {})
    return False


def training_workers(cluster: Mapping[str, list[str]]) -> int:
    """Number of processes that compute gradients under MultiWorkerMirroredStrategy."""
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def resolve_task(strategy: str, tf_config: Mapping[str, Any] | None) -> Task:
    """Return this process's task for a tf.distribute strategy, or raise TrainerError
    naming what is missing. Horovod ranks are known only after ``hvd.init()``:
    see :func:`horovod_task`."""
    if strategy in LOCAL_STRATEGIES:
        return LOCAL_TASK
    if strategy == "horovod":
        raise ValueError("horovod tasks come from horovod_task(rank)")
    if tf_config is None:
        raise TrainerError(f"--strategy {strategy} needs TF_CONFIG (cluster and task) in the environment")
    task = task_from_tf_config(tf_config)
    cluster = cluster_of(tf_config)
    if strategy == "multiworker":
        if "ps" in cluster:
            raise TrainerError("TF_CONFIG has ps tasks: use --strategy ps, not multiworker")
        if task.type not in ("chief", "worker", "evaluator"):
            raise TrainerError(f"--strategy multiworker runs chief, worker and evaluator tasks, not {task.type!r}")
        if len(cluster.get("chief", [])) > 1:
            raise TrainerError("TF_CONFIG may name at most one chief")
        return task
    if strategy == "ps":
        missing = [t for t in ("chief", "worker", "ps") if not cluster.get(t)]
        if missing:
            raise TrainerError(
                f"--strategy ps needs chief, worker and ps tasks in TF_CONFIG; missing: {', '.join(missing)}"
            )
        if len(cluster["chief"]) != 1:
            raise TrainerError("--strategy ps needs exactly one chief (the coordinator)")
        return task
    raise TrainerError(f"unknown strategy {strategy!r}")


def horovod_task(rank: int) -> Task:
    """Return the task of horovod rank ``rank``."""
    return Task("rank", rank)


def process_environment(strategy: str) -> dict[str, str]:
    """Environment to set before TensorFlow is imported, for this strategy."""
    if strategy == "ps":
        # Per the ParameterServerStrategy guide: let the coordinator see worker
        # failures instead of gRPC retrying forever.
        return {"GRPC_FAIL_FAST": "use_caller"}
    return {}


def cluster_strategy(env: Mapping[str, str]) -> str | None:
    """The strategy the launch environment implies for ``--strategy auto``, or
    None when it implies none (a local run):

    horovod when a Horovod/MPI rank variable is set; ps when TF_CONFIG's cluster
    has a ``ps`` job; multiworker when it has more than one chief/worker.
    Raises TrainerError on a TF_CONFIG that is not a JSON object.
    """
    if any(env.get(name, "").strip() for name in HOROVOD_RANK_VARIABLES):
        return "horovod"
    tf_config = load_tf_config(env.get("TF_CONFIG"))
    cluster = tf_config.get("cluster") if tf_config else None
    if not isinstance(cluster, dict):
        return None
    if cluster.get("ps"):
        return "ps"
    if len(cluster.get("chief") or []) + len(cluster.get("worker") or []) > 1:
        return "multiworker"
    return None


def local_strategy(gpus: int) -> str:
    """``--strategy auto`` on one machine: mirrored over more than one visible GPU,
    else onedevice."""
    return "mirrored" if gpus > 1 else "onedevice"


def auto_strategy(env: Mapping[str, str], gpus: int) -> str:
    """What ``--strategy auto`` picks from the environment and the visible GPUs."""
    return cluster_strategy(env) or local_strategy(gpus)
