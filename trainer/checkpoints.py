"""Checkpoints that survive a node's death, and a clean stop on SIGTERM.

One ``tf.train.Checkpoint`` of the model and its optimizer (whose
``iterations`` variable is the global step), kept by a
``tf.train.CheckpointManager`` (the last 2, files ``ckpt-<step>.*``) in
``--checkpoint-dir``. Only the chief writes; every process restores from its
own ``--checkpoint-dir`` at start (the launcher copies the chief's folder there).

Why not tf_keras' ``BackupAndRestore``: it deletes its backup when ``fit``
ends (so a rerun with more epochs starts over), it has every Horovod rank write
the same files, and it does not support ParameterServerStrategy. This callback
has one behaviour on every strategy.

Atomicity: TensorFlow writes a checkpoint's data and index under temporary
names and renames them, and the manager rewrites its ``checkpoint`` state file
atomically only after that; a kill -9 mid-write leaves the state file naming
the previous checkpoint, which max_to_keep=2 keeps on disk.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from trainer.plan import ResumePlan, StopSchedule, checkpoint_due, step_pace, stop_interval

MAX_TO_KEEP = 2
PREFIX = "ckpt"


class Preempted(Exception):
    """Training stopped early on SIGTERM; the exit status is 143 (128 + SIGTERM)."""

    def __init__(self, step: int, saved: bool):
        super().__init__(f"stopped by SIGTERM after step {step}")
        self.step = step
        self.saved = saved


class StopFlag:
    """Set by SIGTERM (a spot instance's notice); read at step boundaries."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True


class Checkpoints:
    """The model's and optimizer's checkpoint in ``directory``; ``writer``: whether
    this process may write there (the chief only).

    ``collective``: saving is a collective operation (MultiWorkerMirroredStrategy
    broadcasts during ``save``), so a process that is not the writer still saves,
    into a scratch directory of its own that :meth:`close` deletes.
    """

    def __init__(self, directory: Path, model: keras.Model, *, writer: bool, collective: bool = False):
        self.directory = directory
        self.writer = writer
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        self._optimizer = model.optimizer
        self._scratch: Path | None = None
        target: Path | None = directory
        if not writer:
            self._scratch = Path(tempfile.mkdtemp(prefix="trainer-ckpt-")) if collective else None
            target = self._scratch
        # A manager exists only where it may write: other processes merely read.
        self._manager = (
            tf.train.CheckpointManager(self._checkpoint, str(target), max_to_keep=MAX_TO_KEEP,
                                       checkpoint_name=PREFIX)
            if target is not None else None
        )

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def restore(self, source: Path | None = None) -> int:
        """Restore the newest checkpoint in ``source`` (default: the checkpoint
        directory), if any; return its global step (0: none).

        Call it after the optimizer's variables exist (``optimizer.build``), so
        the momentum slots are restored at once rather than deferred."""
        latest = tf.train.latest_checkpoint(str(source or self.directory))
        if latest is None:
            return 0
        self._checkpoint.restore(latest).assert_existing_objects_matched()
        return int(self._optimizer.iterations.numpy())

    def save(self, step: int) -> None:
        if self._manager is not None:
            self._manager.save(checkpoint_number=step)


@dataclass(frozen=True)
class Agreement:
    """How a job's processes decide together (Horovod's collectives): ``stop`` turns each one's stop request into
    the job's decision (any request stops all), ``pace`` each one's seconds per step into one shared figure."""

    stop: Callable[[bool], bool]
    pace: Callable[[float], float]


class CheckpointCallback(keras.callbacks.Callback):
    """Count global steps from ``resume.start_step``, checkpoint when due, stop
    ``fit`` at the planned total, and stop after a checkpoint on SIGTERM.

    ``agreement`` turns this process's stop request into the job's decision (Horovod:
    any rank's request stops every rank at the same step), on the steps a
    StopSchedule names; without one the decision is local, every step.
    """

    def __init__(
        self,
        checkpoints: Checkpoints,
        resume: ResumePlan,
        *,
        every: int,
        steps_per_epoch: int,
        stop: StopFlag | None = None,
        agreement: Agreement | None = None,
    ):
        super().__init__()
        # It never reads the logs, so ParameterServerStrategy may call it per step.
        self._supports_tf_logs = True
        self._checkpoints = checkpoints
        self._total = resume.total_steps
        self._every = every
        self._steps_per_epoch = steps_per_epoch
        self._stop = stop
        self._agreement = agreement
        self._schedule = StopSchedule(resume.start_step)
        self._ends: list[float] = []
        self.step = resume.start_step
        self.preempted = False
        self._saved_step = -1

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.step += 1
        preempt = self._decide(self._stop is not None and self._stop.requested)
        due = checkpoint_due(self.step, every=self._every, steps_per_epoch=self._steps_per_epoch,
                             total_steps=self._total)
        if due or preempt:
            self._save()
        if preempt and self.step < self._total:
            self.preempted = True
        if preempt or self.step >= self._total:
            self.model.stop_training = True

    def _decide(self, requested: bool) -> bool:
        """Whether the job stops after this step: this process's request alone, or the ranks' agreement on the
        steps the schedule names (every rank reaches the same collectives in the same order)."""
        if self._agreement is None:
            return requested
        schedule = self._schedule
        if schedule.measuring(self.step):
            self._ends.append(time.monotonic())
        if schedule.measured(self.step):
            schedule.interval = stop_interval(self._agreement.pace(step_pace(self._ends)))
        return self._agreement.stop(requested) if schedule.due(self.step) else False

    def _save(self) -> None:
        coordinator = getattr(self.model, "_cluster_coordinator", None)
        if coordinator is not None:
            coordinator.join()  # ParameterServerStrategy: let the dispatched steps finish first
        self._checkpoints.save(self.step)
        self._saved_step = self.step

    @property
    def saved(self) -> bool:
        return self._checkpoints.writer and self._saved_step == self.step
