"""``python -m trainer``: parse, check who this process is, then train.

Importing the ``trainer`` package pins TF_USE_LEGACY_KERAS before TensorFlow
loads. Bad input is checked before TensorFlow is imported, and reported as one
``trainer: error: ...`` line with exit code 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from trainer import lineage
from trainer.cli import parse_args
from trainer.cluster import (
    cluster_of,
    cluster_strategy,
    load_tf_config,
    local_strategy,
    process_environment,
    resolve_task,
    training_workers,
)
from trainer.config import AUTO, RECORDABLE_STRATEGIES, TrainConfig
from trainer.errors import TrainerError
from trainer.inputs import check_data, check_writable_dir
from trainer.plan import per_replica_batch_size
from trainer.storage import check_destination, default_cache_dir, fetch, is_remote

PREEMPTED_EXIT = 143  # 128 + SIGTERM: what a shell reports for a process SIGTERM ended


def _visible_gpus() -> int:
    import tensorflow as tf  # only when the environment names no cluster

    return len(tf.config.list_physical_devices("GPU"))


def resolve_auto(config: TrainConfig) -> TrainConfig:
    """Replace ``--strategy auto`` by the strategy it picks, and say which."""
    if config.strategy != AUTO:
        return config
    chosen = cluster_strategy(os.environ) or local_strategy(_visible_gpus())
    print(f"trainer: --strategy auto chose {chosen}", flush=True)
    return dataclasses.replace(config, strategy=chosen)


def main(argv: Sequence[str] | None = None) -> int:
    started = time.time()
    try:
        config = resolve_auto(parse_args(sys.argv[1:] if argv is None else argv))
        if config.record_ids and config.strategy not in RECORDABLE_STRATEGIES:
            raise TrainerError(
                f"--record-ids works with --strategy {', '.join(RECORDABLE_STRATEGIES)}, not {config.strategy}"
            )
        task, cluster = None, {}
        if config.strategy != "horovod":
            tf_config = load_tf_config(os.environ.get("TF_CONFIG"))
            task = resolve_task(config.strategy, tf_config)
            cluster = cluster_of(tf_config) if tf_config else {}
        if config.strategy == "multiworker":
            # Fail before MultiWorkerMirroredStrategy blocks waiting for its peers.
            per_replica_batch_size(config.batch_size, training_workers(cluster))
        if config.model_uri is None:
            check_writable_dir("--model-dir", config.model_dir)
        elif task is not None and task.type == "evaluator":
            raise TrainerError(f"--model-dir {config.model_uri}: the evaluator needs a local or shared --model-dir")
        check_writable_dir("--checkpoint-dir", config.checkpoints)
        trained_on = lineage.identity(config)
        restore_from = lineage.restore_dir(config.checkpoints, config.resume_from, trained_on)
        if config.model_uri is not None:
            check_destination("--model-dir", config.model_uri)
        if is_remote(config.data):
            cache = config.cache_dir or default_cache_dir(os.environ)
            config = dataclasses.replace(config, data=str(fetch("--data", config.data, cache)))
        check_data(config.data)
        os.environ.update(process_environment(config.strategy))

        from trainer import report, run  # imports TensorFlow
        from trainer.checkpoints import Preempted

        with contextlib.ExitStack() as staging:
            if config.model_uri is not None:
                # The chief exports here, then uploads to --model-dir (see run.train); only then: a folder per
                # process would stay behind wherever a process is killed.
                folder = staging.enter_context(tempfile.TemporaryDirectory(prefix="kiln-export-"))
                config = dataclasses.replace(config, model_dir=Path(folder) / "model")
            try:
                result = run.train(config, task, cluster, started=started,
                                   restore_from=restore_from, trained_on=trained_on)
            except Preempted as stopped:
                saved = "checkpoint saved" if stopped.saved else "no checkpoint written by this process"
                print(f"trainer: {stopped} ({saved}); exiting 143", flush=True)
                return PREEMPTED_EXIT
    except TrainerError as exc:
        print(f"trainer: error: {exc}", file=sys.stderr)
        return 2
    print(report.summary_line(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
