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


def collective_implementation(gpus: int) -> str:
    """The name of MultiWorkerMirroredStrategy's collective implementation: NCCL across GPUs, else gRPC's ring."""
    return "NCCL" if gpus else "RING"
