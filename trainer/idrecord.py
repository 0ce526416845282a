"""``--record-ids``: which training examples this process pulled, by epoch (for
the sharding test; off by default).

An example's id is its first feature, ``x[:, 0]``, so the test data must carry
it there. Only the plain per-process pipelines can be recorded (onedevice,
mirrored, horovod): under multiworker and ps, tf.distribute shards after the
point a tap would see, so those strategies refuse the flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trainer import report


def ids_path(run_dir: Path, task_name: str) -> Path:
    return run_dir / f"ids.{task_name}.json"


def epochs_of(batches: list[list[int]], steps_per_epoch: int, epochs: int) -> list[list[int]]:
    """Group batches (in the order pulled) into epochs of ``steps_per_epoch``
    batches; batches past ``epochs`` (prefetched, never trained on) are dropped."""
    grouped: list[list[int]] = [[] for _ in range(epochs)]
    for index, batch in enumerate(batches):
        epoch = index // steps_per_epoch
        if epoch < epochs:
            grouped[epoch].extend(batch)
    return grouped


class IdRecorder:
    """Taps a batched dataset and keeps the ids of every batch it yields."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def _record(self, x: Any) -> int:
        self.batches.append(np.rint(x.numpy()[:, 0]).astype(np.int64).tolist())
        return 0

    def tap(self, dataset: Any) -> Any:
        """``dataset`` (a tf.data.Dataset of batched ``(x, y)``) recording each batch
        as it is pulled, in order."""
        import tensorflow as tf  # this module's pure part (epochs_of) needs none

        def record(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            done = tf.py_function(self._record, [x], tf.int32)
            with tf.control_dependencies([done]):
                return tf.identity(x), y

        return dataset.map(record, deterministic=True)

    def write(self, run_dir: Path, task_name: str, steps_per_epoch: int, epochs: int) -> None:
        report.write_json(
            ids_path(run_dir, task_name),
            {"task": task_name, "epochs": epochs_of(self.batches, steps_per_epoch, epochs)},
        )
