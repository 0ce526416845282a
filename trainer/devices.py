"""Which GPUs a process uses (pure: no TensorFlow).

Horovod runs one process per GPU: each rank makes only its local rank's GPU visible, as Horovod's own examples
do first thing; without that every rank of a node lands on GPU 0. MultiWorkerMirroredStrategy runs one process
per node over every local GPU, with NCCL's collectives where there are GPUs.
"""

from __future__ import annotations


def visible_gpu(local_rank: int, gpus: int) -> int | None:
    """The index of the one GPU a rank uses: its local rank's. With more ranks than GPUs on a node (an explicit
    --slots), they share the GPUs in turn; None on a node without GPUs."""
    if local_rank < 0:
        raise ValueError(f"local rank {local_rank} is negative")
    return local_rank % gpus if gpus else None


def collective_implementation(gpus: int, workers_here: int = 1) -> str:
    """The name of MultiWorkerMirroredStrategy's collective implementation: NCCL where this worker has its
    node's GPUs to itself (the one worker there: kiln's tf-config default), else TensorFlow's own choice (AUTO:
    gRPC's ring; two NCCL workers driving the same GPUs would fail)."""
    return "NCCL" if gpus and workers_here == 1 else "AUTO"


def workers_on_host(tf_config: dict) -> int:
    """How many chief and worker tasks of TF_CONFIG's cluster share this task's host (pure)."""
    cluster, task = tf_config.get("cluster", {}), tf_config.get("task", {})
    mine = cluster.get(task.get("type"), [])
    index = task.get("index", 0)
    if not isinstance(mine, list) or index >= len(mine):
        return 1
    host = mine[index].rsplit(":", 1)[0]
    return sum(1 for role in ("chief", "worker") for address in cluster.get(role, [])
               if address.rsplit(":", 1)[0] == host)
