"""Command line → :class:`TrainConfig` (pure: no TensorFlow, no I/O)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from trainer.config import AUTO, DATASETS, MODELS, STRATEGIES, TrainConfig
from trainer.errors import TrainerError
from trainer.storage import cache_path, default_state_dir, is_remote, parse_location


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise TrainerError(message)


def _shard(text: str) -> tuple[int, int]:
    index, sep, count = text.partition("/")
    if not (sep and index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise argparse.ArgumentTypeError(f"expected INDEX/COUNT with 0 <= INDEX < COUNT, e.g. 1/3, got {text!r}")
    return int(index), int(count)


def _number(kind: type, allowed, what: str):
    """An argparse type: `kind(text)` that `allowed` accepts, else 'expected <what>'."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not allowed(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


_positive_int = _number(int, lambda v: v >= 1, "a positive integer")
_positive_float = _number(float, lambda v: v > 0, "a positive number")
_non_negative_int = _number(int, lambda v: v >= 0, "a non-negative integer")


def _dataset(text: str) -> str:
    """digits, synthetic, or a path: an ``.npz`` or ``.tfrecord`` (local, s3://
    or gs://), or a local folder or glob of TFRecord files (anything with a
    ``/``); the content is checked later."""
    if text in DATASETS or text.endswith((".npz", ".tfrecord", ".tfrecords")) or "/" in text or "*" in text:
        return text
    raise argparse.ArgumentTypeError(
        f"expected digits, synthetic, or a path to an .npz, a .tfrecord, or a folder or glob of "
        f".tfrecord files, got {text!r}"
    )


def _local_dir(text: str) -> Path:
    if is_remote(text):
        raise argparse.ArgumentTypeError(
            f"{text}: must be a local (or shared) folder; only --data and --model-dir take s3:// or gs://"
        )
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser behind ``python -m trainer``."""
    defaults = TrainConfig()
    parser = _Parser(
        prog="trainer",
        description="kiln's reference TensorFlow trainer: a small dense net on the bundled "
        "digits (or synthetic data) under one tf.distribute strategy or Horovod.",
    )
    parser.add_argument(
        "--strategy",
        choices=(*STRATEGIES, AUTO),
        default=defaults.strategy,
        help="distribution strategy; multiworker and ps read TF_CONFIG, horovod expects "
        "horovodrun; auto: horovod when HOROVOD_RANK or OMPI_COMM_WORLD_RANK is set, ps when "
        "TF_CONFIG has a ps job, multiworker when it has more than one chief/worker, mirrored "
        "when more than one GPU is visible, else onedevice (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        choices=MODELS,
        default=defaults.model,
        help="mlp: a small dense net; cnn: a small convolutional net for square images given "
        "as flat features (8x8 digits: 64) (default: %(default)s)",
    )
    parser.add_argument(
        "--data",
        type=_dataset,
        default=defaults.data,
        help="digits: the bundled 8x8 digits (UCI's handwritten digits); synthetic: random features of the "
        "same shape, for throughput runs; PATH.npz: a file with arrays x (N x features, "
        "float) and y (N integer labels); PATH.tfrecord, a folder or a glob of them: "
        "tf.train.Examples with a fixed-length float feature x and an int64 feature y; an .npz "
        "or one .tfrecord may be s3://bucket/key or gs://bucket/key, downloaded to --cache-dir "
        "first (default: %(default)s)",
    )
    parser.add_argument(
        "--epochs", type=_positive_int, default=defaults.epochs,
        help="training epochs (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size", type=_positive_int, default=defaults.batch_size,
        help="GLOBAL batch size, split evenly over the replicas (default: %(default)s)",
    )
    parser.add_argument(
        "--steps-per-epoch", type=_positive_int, default=None,
        help="steps per epoch (default: ceil(train examples / global batch))",
    )
    parser.add_argument(
        "--learning-rate", type=_positive_float, default=defaults.learning_rate,
        help="base learning rate, scaled linearly by the replicas in one synchronous step "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--shard", type=_shard, default=None, metavar="INDEX/COUNT",
        help="train on every COUNT-th example from INDEX only, e.g. 0/3, 1/3, 2/3 for three "
        "independent processes that just split the input (no gradient exchange)",
    )
    parser.add_argument(
        "--seed", type=int, default=defaults.seed,
        help="seed for python, numpy, TensorFlow and the data split (default: %(default)s)",
    )
    parser.add_argument(
        "--model-dir", default=str(defaults.model_dir),
        help="where the chief saves the final SavedModel: a local folder, or s3://bucket/prefix "
        "(boto3) or gs://bucket/prefix (tf.io.gfile), exported locally then uploaded "
        "(default: ./%(default)s)",
    )
    parser.add_argument(
        "--run-dir", type=_local_dir, default=None,
        help="where this process writes metrics.<task>.jsonl and result.<task>.json, and the "
        "checkpoints go (default: the --model-dir; for an s3:// or gs:// one, "
        "$XDG_STATE_HOME/kiln/trainer/<scheme>/<bucket>/<prefix>)",
    )
    parser.add_argument(
        "--log-every", type=_positive_int, default=defaults.log_every,
        help="write a metrics line every N steps (default: %(default)s)",
    )
    parser.add_argument(
        "--checkpoint-dir", type=_local_dir, default=None,
        help="where the chief keeps the last 2 checkpoints (model, optimizer, global step) and "
        "where every process looks for one to resume from (default: <run-dir>/checkpoints); "
        "checkpoints written for another --model, --data or --shard are refused",
    )
    parser.add_argument(
        "--resume-from", type=_local_dir, default=None, metavar="CHECKPOINT_DIR",
        help="resume from the newest checkpoint there even if another configuration wrote it "
        "(when --checkpoint-dir has none of its own yet, or is this folder); new checkpoints "
        "still go to --checkpoint-dir (default: resume only this configuration's checkpoints)",
    )
    parser.add_argument(
        "--checkpoint-every", type=_non_negative_int, default=defaults.checkpoint_every,
        help="checkpoint every N global steps; 0: at the end of every epoch (default: %(default)s)",
    )
    parser.add_argument(
        "--record-ids", action="store_true",
        help="testing aid: write ids.<task>.json to --run-dir, the ids (each example's first "
        "feature, x[:, 0]) of the training examples this process pulled, by epoch; "
        "onedevice, mirrored and horovod only (default: off)",
    )
    parser.add_argument(
        "--cache-dir", type=_local_dir, default=None,
        help="where s3:// and gs:// --data is downloaded, as <cache-dir>/<scheme>/<bucket>/<key> "
        "(default: $XDG_CACHE_HOME/kiln/data, else ~/.cache/kiln/data)",
    )
    return parser


def default_run_dir(model_dir: str, env: Mapping[str, str]) -> Path:
    """The model dir itself (checkpoints and metrics live with the model, as tf.estimator kept them);
    for a remote model dir, a local state folder named after it."""
    if not is_remote(model_dir):
        return Path(model_dir)
    return cache_path(default_state_dir(env), parse_location(model_dir))


def parse_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> TrainConfig:
    """Parse ``argv`` (without the program name); raise TrainerError on bad input."""
    ns = build_parser().parse_args(list(argv))
    environ = os.environ if env is None else env
    run_dir = ns.run_dir if ns.run_dir is not None else default_run_dir(ns.model_dir, environ)
    return TrainConfig(
        strategy=ns.strategy,
        model=ns.model,
        data=ns.data,
        epochs=ns.epochs,
        batch_size=ns.batch_size,
        steps_per_epoch=ns.steps_per_epoch,
        learning_rate=ns.learning_rate,
        seed=ns.seed,
        shard=ns.shard,
        model_dir=TrainConfig.model_dir if is_remote(ns.model_dir) else Path(ns.model_dir),
        model_uri=ns.model_dir if is_remote(ns.model_dir) else None,
        cache_dir=ns.cache_dir,
        run_dir=run_dir,
        log_every=ns.log_every,
        checkpoint_dir=ns.checkpoint_dir,
        resume_from=ns.resume_from,
        checkpoint_every=ns.checkpoint_every,
        record_ids=ns.record_ids,
    )
