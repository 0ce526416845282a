"""What trained a checkpoint, so a run never silently resumes another run's (no TensorFlow).

The chief records the model and data of its run as ``trained-on.json`` beside its
checkpoints. Before anything starts, every process compares that record with its
own options: a checkpoint of another configuration is refused unless the user
names it with ``--resume-from``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from trainer.config import TrainConfig
from trainer.errors import TrainerError

RECORD = "trained-on.json"
STATE_FILE = "checkpoint"  # tf.train.CheckpointManager's index of the checkpoints it kept


def identity(config: TrainConfig) -> dict[str, str]:
    """What must be the same for a checkpoint to be resumed: the model and the data it is trained on."""
    shard = f"{config.shard[0]}/{config.shard[1]}" if config.shard else "all"
    return {"model": config.model, "data": config.data, "shard": shard}


def has_checkpoint(directory: Path) -> bool:
    return (directory / STATE_FILE).is_file()


def read_identity(directory: Path) -> dict[str, str] | None:
    try:
        recorded = json.loads((directory / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def differences(recorded: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """``"model: cnn here, mlp there"`` for each option that differs, in ``wanted``'s order."""
    return [f"{key}: {wanted[key]} here, {recorded.get(key, 'unrecorded')} there"
            for key in wanted if recorded.get(key) != wanted[key]]


def restore_dir(checkpoints: Path, resume_from: Path | None, wanted: Mapping[str, str]) -> Path:
    """Where this process restores from: its own checkpoints when they are this configuration's (or
    ``--resume-from`` names them), else ``--resume-from``'s, else none yet (``checkpoints``, empty).
    Raise TrainerError for another configuration's checkpoints or a ``--resume-from`` without one."""
    if has_checkpoint(checkpoints):
        if resume_from is not None and resume_from.resolve() == checkpoints.resolve():
            return checkpoints
        recorded = read_identity(checkpoints)
        if recorded is None:
            why = f"no {RECORD} says which model and data wrote them"
        else:
            why = "; ".join(differences(recorded, wanted))
        if recorded is None or why:
            raise TrainerError(
                f"--checkpoint-dir {checkpoints} holds checkpoints of another run ({why}): "
                f"resume them on purpose with --resume-from {checkpoints}, or give this run its own "
                f"--model-dir or --checkpoint-dir"
            )
        return checkpoints
    if resume_from is not None:
        if not has_checkpoint(resume_from):
            raise TrainerError(f"--resume-from {resume_from}: no checkpoint there (no {STATE_FILE} file)")
        return resume_from
    return checkpoints


def record(checkpoints: Path, wanted: Mapping[str, str]) -> None:
    """Write ``trained-on.json`` (the chief, before its first checkpoint), atomically."""
    checkpoints.mkdir(parents=True, exist_ok=True)
    partial = checkpoints / f".{RECORD}.partial"
    partial.write_text(json.dumps(dict(wanted), indent=2) + "\n")
    os.replace(partial, checkpoints / RECORD)
