"""What a training run was asked to do: the validated options, nothing derived yet (pure: no TensorFlow, no I/O).
trainer.cli builds it from the command line; plan, run and evaluator read it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STRATEGIES = ("onedevice", "mirrored", "multiworker", "ps", "horovod")
AUTO = "auto"  # resolved by __main__ before anything else: see trainer.cluster.auto_strategy
# --record-ids can tap these strategies' per-process pipelines (see trainer.idrecord).
RECORDABLE_STRATEGIES = ("onedevice", "mirrored", "horovod")
DATASETS = ("digits", "synthetic")
MODELS = ("mlp", "cnn")


@dataclass(frozen=True)
class TrainConfig:
    """Everything the user asked for, validated; nothing derived yet."""

    strategy: str = "onedevice"
    model: str = "mlp"
    data: str = "digits"
    shard: tuple[int, int] | None = None
    epochs: int = 5
    batch_size: int = 64
    steps_per_epoch: int | None = None
    learning_rate: float = 0.01
    seed: int = 42
    model_dir: Path = Path("model")
    run_dir: Path = Path("model")  # the model dir unless --run-dir says otherwise (trainer.cli)
    log_every: int = 10
    checkpoint_dir: Path | None = None
    resume_from: Path | None = None
    checkpoint_every: int = 0
    record_ids: bool = False
    # --model-dir s3://... or gs://...: the chief exports to model_dir (a local
    # staging folder chosen by __main__) and uploads it here.
    model_uri: str | None = None
    cache_dir: Path | None = None

    @property
    def checkpoints(self) -> Path:
        """Where checkpoints live: --checkpoint-dir, else ``<run-dir>/checkpoints``."""
        return self.checkpoint_dir if self.checkpoint_dir is not None else self.run_dir / "checkpoints"
