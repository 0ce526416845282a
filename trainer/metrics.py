"""Per-step metrics: a Keras callback that writes ``metrics.<task>.jsonl``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import tensorflow as tf
import tf_keras as keras


def _to_float(value: Any) -> float:
    if isinstance(value, tf.distribute.experimental.coordinator.RemoteValue):
        value = value.fetch()
    return float(np.asarray(value))


def _fetch_logs(logs: Any) -> dict[str, float]:
    """Turn batch logs (tensors, or a RemoteValue under ParameterServerStrategy)
    into floats; fetching a RemoteValue waits for that step."""
    if isinstance(logs, tf.distribute.experimental.coordinator.RemoteValue):
        logs = logs.fetch()
    return {key: _to_float(value) for key, value in (logs or {}).items()}


def _lines_up_to(path: Path, step: int) -> list[str]:
    """The metrics lines of ``path`` (if any) for global steps up to ``step``."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a kill
    return kept


@dataclass(frozen=True)
class TrainingSummary:
    steps: int
    first_loss: float
    final_loss: float
    examples_per_sec: float
    wall_time: float


class MetricsLogger(keras.callbacks.Callback):
    """Write one JSON line every ``log_every`` steps (and on the first and last),
    print one line per epoch, and summarise the run.

    ``examples_per_step`` is what this process consumes per step, so
    ``examples_per_sec`` is this process's throughput.

    ``start_step``: the global step a resumed run starts after; steps are numbered
    globally (the first line of a resumed run is ``start_step + 1``), the lines of
    the earlier run up to ``start_step`` are kept and any after it (steps that
    are redone) dropped. ``first_loss`` is this run's first step.

    ``summed_replicas``: under MirroredStrategy and MultiWorkerMirroredStrategy
    tf_keras sums each replica's running loss and accuracy into the *batch* logs
    (its "auto" reduction is "sum"; epoch logs are right). Dividing by the
    number of replicas reports their mean, which is the global value when the
    replicas' batches are equal.
    """

    def __init__(
        self,
        path: Path,
        *,
        log_every: int,
        examples_per_step: int,
        task_name: str,
        summed_replicas: int = 1,
        start_step: int = 0,
        total_steps: int | None = None,
    ):
        super().__init__()
        self._start_step = start_step
        self._summed_replicas = summed_replicas
        # Take tensors / RemoteValues as they are: converting happens only on the
        # steps that are logged, so ParameterServerStrategy steps stay asynchronous.
        self._supports_tf_logs = True
        self._path = path
        self._log_every = log_every
        self._examples_per_step = examples_per_step
        self._task_name = task_name
        self._file: IO[str] | None = None
        self._start = 0.0
        self._after_first_step = 0.0
        self._last_time = 0.0
        self._last_step = 0
        self._step = start_step
        self._epoch = 0
        self._total_steps = total_steps
        self._first_loss: float | None = None
        self._final_loss: float | None = None
        self._wall_time = 0.0

    def on_train_begin(self, logs: Any = None) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        kept = _lines_up_to(self._path, self._start_step) if self._start_step else []
        self._file = self._path.open("w")
        self._file.writelines(kept)
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        if self._total_steps is None:
            self._total_steps = epochs * steps if epochs and steps else None
        self._start = self._last_time = time.monotonic()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._step += 1
        last = self._step == self._total_steps
        if self._step == self._start_step + 1 or self._step % self._log_every == 0 or last:
            values = _fetch_logs(logs)
            self._write({key: value / self._summed_replicas for key, value in values.items()})

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        values = _fetch_logs(logs)
        self._final_loss = values.get("loss", self._final_loss)
        print(
            f"trainer: {self._task_name} epoch {epoch + 1}/{self.params.get('epochs')} "
            f"loss={values.get('loss', float('nan')):.4f} "
            f"accuracy={values.get('accuracy', float('nan')):.4f}",
            flush=True,
        )

    def on_train_end(self, logs: Any = None) -> None:
        self._wall_time = time.monotonic() - self._start
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, values: dict[str, float]) -> None:
        now = time.monotonic()
        if self._step == self._start_step + 1:
            self._first_loss = values.get("loss")
            self._after_first_step = now
        interval = max(now - self._last_time, 1e-9)
        record = {
            "step": self._step,
            "epoch": (self._step - 1) // self.params["steps"] if self.params.get("steps") else self._epoch,
            "loss": values.get("loss"),
            "accuracy": values.get("accuracy"),
            "examples_per_sec": (self._step - self._last_step) * self._examples_per_step / interval,
            "wall_time": now - self._start,
            "time": time.time(),  # when, for the launcher's phase record (bootstrap.timeline)
        }
        self._last_time, self._last_step = now, self._step
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def summary(self) -> TrainingSummary:
        """Totals after training. Throughput leaves out the first step, which
        includes tracing the step function, unless it was the only one."""
        ran = self._step - self._start_step
        if ran > 1:
            seconds = self._wall_time - (self._after_first_step - self._start)
            examples = (ran - 1) * self._examples_per_step
        else:
            seconds, examples = self._wall_time, ran * self._examples_per_step
        if self._first_loss is None or self._final_loss is None:
            raise RuntimeError("training ran no steps")
        return TrainingSummary(
            steps=self._step,
            first_loss=self._first_loss,
            final_loss=self._final_loss,
            examples_per_sec=examples / max(seconds, 1e-9),
            wall_time=self._wall_time,
        )
