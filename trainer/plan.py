"""Batch sizes, learning rate and steps derived from the config and the replica
layout (pure: no TensorFlow)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from trainer.config import TrainConfig
from trainer.errors import TrainerError


@dataclass(frozen=True)
class Replicas:
    """How a strategy lays out replicas.

    ``in_sync``: replicas whose gradients form one synchronous step (the global
    batch is split over them); ``in_process``: of those, how many this process
    runs; ``world_size``: the training replicas/ranks/workers reported.
    """

    in_sync: int
    in_process: int
    world_size: int


@dataclass(frozen=True)
class TrainPlan:
    world_size: int
    replicas_in_sync: int
    global_batch_size: int
    per_replica_batch_size: int
    process_batch_size: int
    learning_rate: float
    steps_per_epoch: int
    epochs: int


def replicas_for(strategy: str, num_replicas_in_sync: int, workers: int = 1) -> Replicas:
    """Return the replica layout of ``strategy``.

    ``num_replicas_in_sync`` is the tf.distribute strategy's (horovod: the
    number of ranks); ``workers`` the number of worker processes.
    ParameterServerStrategy steps are asynchronous: each step runs the whole
    global batch on one worker, and the coordinator dispatches all of them.
    """
    if strategy == "multiworker":
        return Replicas(num_replicas_in_sync, max(1, num_replicas_in_sync // workers), num_replicas_in_sync)
    if strategy == "ps":
        return Replicas(num_replicas_in_sync, num_replicas_in_sync, workers)
    if strategy == "horovod":
        return Replicas(num_replicas_in_sync, 1, num_replicas_in_sync)
    return Replicas(num_replicas_in_sync, num_replicas_in_sync, num_replicas_in_sync)


def per_replica_batch_size(global_batch_size: int, replicas: int) -> int:
    """Split the global batch evenly; raise TrainerError when a replica would get none."""
    if global_batch_size < replicas:
        raise TrainerError(
            f"--batch-size {global_batch_size} is smaller than the {replicas} replicas: "
            "each replica needs at least one example per step"
        )
    return global_batch_size // replicas


def scaled_learning_rate(base: float, replicas: int) -> float:
    """Linear scaling rule: the learning rate grows with the replicas in one step."""
    return base * replicas


def default_steps_per_epoch(train_size: int, global_batch_size: int) -> int:
    """Steps for one pass over the training split (the last batch may be partial)."""
    return max(1, math.ceil(train_size / global_batch_size))


def plan_training(config: TrainConfig, replicas: Replicas, train_size: int) -> TrainPlan:
    """Derive everything the training loop needs from the config and the layout."""
    per_replica = per_replica_batch_size(config.batch_size, replicas.in_sync)
    global_batch = per_replica * replicas.in_sync
    return TrainPlan(
        world_size=replicas.world_size,
        replicas_in_sync=replicas.in_sync,
        global_batch_size=global_batch,
        per_replica_batch_size=per_replica,
        process_batch_size=per_replica * replicas.in_process,
        learning_rate=scaled_learning_rate(config.learning_rate, replicas.in_sync),
        steps_per_epoch=config.steps_per_epoch or default_steps_per_epoch(train_size, global_batch),
        epochs=config.epochs,
    )


@dataclass(frozen=True)
class ResumePlan:
    """Where a (possibly resumed) run starts and stops, in global steps.

    ``initial_epoch``: the Keras epoch to start ``fit`` at; ``remaining``: steps
    this process still runs, so that ``start_step + remaining == total_steps``
    (0 when a checkpoint is already at or past the planned total).
    """

    start_step: int
    total_steps: int
    initial_epoch: int
    remaining: int


def plan_resume(plan: TrainPlan, restored_step: int) -> ResumePlan:
    """Resume the planned ``epochs x steps_per_epoch`` from ``restored_step``
    (0 when fresh) without exceeding it."""
    total = plan.epochs * plan.steps_per_epoch
    start = max(0, restored_step)
    return ResumePlan(
        start_step=start,
        total_steps=total,
        initial_epoch=min(start // plan.steps_per_epoch, plan.epochs),
        remaining=max(0, total - start),
    )


def checkpoint_due(step: int, *, every: int, steps_per_epoch: int, total_steps: int) -> bool:
    """Whether global step ``step`` (just completed) ends with a checkpoint: every
    ``every`` steps, or at each epoch's end when ``every`` is 0, and always at the
    last planned step."""
    if step >= total_steps:
        return True
    interval = every or steps_per_epoch
    return step % interval == 0


# Horovod's ranks agree on stopping (a SIGTERM on any of them) with a collective. Agreeing every step halved the
# 1-node throughput of a small model (bench/throughput.py), so after STOP_WARMUP steps agreed one by one while
# their pace is measured, the ranks agree about every STOP_LATENCY seconds at that pace: a notice's stop then
# comes that much later at most (well inside EC2's two minutes and Azure's 30 s), unless steps slow down later.
STOP_LATENCY = 2.0
STOP_WARMUP = 10
STOP_MAX_INTERVAL = 1000


def stop_interval(step_seconds: float, latency: float = STOP_LATENCY, cap: int = STOP_MAX_INTERVAL) -> int:
    """Steps between two agreements on stopping, so that one comes about every ``latency`` seconds at
    ``step_seconds`` a step: at least 1, at most ``cap``."""
    if step_seconds <= 0:
        return cap
    return max(1, min(cap, int(latency / step_seconds)))


def step_pace(ends: Sequence[float]) -> float:
    """Seconds per step from the times steps ended: the median gap, the first step's left out (it traces)."""
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)][1:]
    return statistics.median(gaps) if gaps else 0.0


@dataclass
class StopSchedule:
    """At which global steps the ranks agree on stopping: each of the first ``warmup`` steps after ``start``,
    then every ``interval`` steps (set once the pace is agreed, at the ``warmup``-th step)."""

    start: int
    warmup: int = STOP_WARMUP
    interval: int = 1

    def measuring(self, step: int) -> bool:
        return step - self.start <= self.warmup

    def measured(self, step: int) -> bool:
        return step - self.start == self.warmup

    def due(self, step: int) -> bool:
        done = step - self.start
        return done <= self.warmup or (done - self.warmup) % self.interval == 0
