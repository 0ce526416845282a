"""The training driver: set up the strategy, fit, evaluate, save, report."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from trainer import data, evaluator, lineage, report, splits, storage, strategies
from trainer.checkpoints import Agreement, CheckpointCallback, Checkpoints, Preempted, StopFlag
from trainer.cluster import Task, horovod_task, is_chief, training_workers
from trainer.config import TrainConfig
from trainer.idrecord import IdRecorder
from trainer.metrics import MetricsLogger
from trainer.model import build_model, compile_model, evaluate_accuracy, export_model
from trainer.plan import TrainPlan, plan_resume, plan_training, replicas_for


@dataclass
class Setup:
    """What differs between strategies, decided before the model is built."""

    task: Task
    chief: bool
    strategy: tf.distribute.Strategy
    plan: TrainPlan
    train_input: Any  # a tf.data.Dataset, or a DatasetCreator for ParameterServerStrategy
    wrap_optimizer: Callable[[Any], Any] | None = None
    callbacks: list[keras.callbacks.Callback] = field(default_factory=list)
    # Turns this process's SIGTERM into the job's decision to stop (None: local).
    agreement: Agreement | None = None


def _setup_horovod(config: TrainConfig, split: splits.Split, recorder: IdRecorder | None, hvd: Any) -> Setup:
    plan = plan_training(config, replicas_for("horovod", hvd.size()), split.train_size)
    task = horovod_task(hvd.rank())
    dataset = data.train_dataset(
        split,
        plan.per_replica_batch_size,
        config.seed,
        shard=(hvd.size(), hvd.rank()),
        tap=recorder.tap if recorder else None,
    )
    return Setup(
        task=task,
        chief=is_chief(task),
        strategy=tf.distribute.get_strategy(),
        plan=plan,
        train_input=dataset,
        wrap_optimizer=lambda optimizer: strategies.horovod_optimizer(hvd, optimizer),
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            # Before MetricsLogger, so the epoch loss it reports is the ranks' mean.
            hvd.callbacks.MetricAverageCallback(),
        ],
        agreement=Agreement(
            stop=lambda requested: bool(
                hvd.allreduce(tf.constant(int(requested)), op=hvd.Sum, name="trainer_stop").numpy() > 0
            ),
            pace=lambda seconds: float(
                hvd.allreduce(tf.constant(seconds, tf.float64), op=hvd.Average, name="trainer_pace").numpy()
            ),
        ),
    )


def _ps_dataset_creator(split: splits.Split, global_batch_size: int, seed: int) -> Any:
    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return data.train_dataset(
            split,
            context.get_per_replica_batch_size(global_batch_size),
            seed,
            shard=(context.num_input_pipelines, context.input_pipeline_id),
        )

    return keras.utils.experimental.DatasetCreator(dataset_fn)


def _setup_tf_distribute(
    config: TrainConfig, split: splits.Split, task: Task, cluster: dict[str, list[str]], recorder: IdRecorder | None
) -> Setup:
    strategy = strategies.build(config.strategy)
    workers = len(cluster.get("worker", [])) if config.strategy == "ps" else training_workers(cluster) or 1
    replicas = replicas_for(config.strategy, strategy.num_replicas_in_sync, workers)
    plan = plan_training(config, replicas, split.train_size)
    if config.strategy == "ps":
        train_input = _ps_dataset_creator(split, plan.global_batch_size, config.seed)
    else:
        # MirroredStrategy variants take the GLOBAL batch and split it over replicas.
        train_input = data.train_dataset(
            split,
            plan.global_batch_size,
            config.seed,
            auto_shard_data=config.strategy == "multiworker",
            tap=recorder.tap if recorder else None,
        )
    return Setup(task=task, chief=is_chief(task, cluster), strategy=strategy, plan=plan, train_input=train_input)


def train(
    config: TrainConfig, task: Task | None, cluster: dict[str, list[str]], *, started: float,
    restore_from: Path, trained_on: Mapping[str, str],
) -> dict[str, Any]:
    """Train under ``config``; ``task`` is None for horovod (known after init);
    ``started`` is when this process started (``time.time()``); ``restore_from``:
    where to look for a checkpoint, ``trained_on``: what the chief records beside
    its checkpoints (both from trainer.lineage, decided before TensorFlow loads).

    ParameterServerStrategy's ps and worker tasks serve until killed and never
    return; the evaluator waits for the chief's model and evaluates it.
    Returns the result record, also written to ``result.<task>.json``.
    """
    # Devices first: a process's visible GPUs are fixed before TensorFlow first touches them.
    hvd = strategies.start_horovod() if config.strategy == "horovod" else None
    if config.strategy in ("multiworker", "mirrored"):
        strategies.grow_gpu_memory()
    keras.utils.set_random_seed(config.seed)
    tf.config.experimental.enable_op_determinism()
    if task is not None and task.type == "evaluator":
        return evaluator.evaluate(config, task, since=started)
    if config.strategy == "ps" and task is not None and task.type in ("ps", "worker"):
        strategies.serve(task, config.run_dir)
    stop = StopFlag()
    if config.strategy != "multiworker":
        # MultiWorkerMirroredStrategy keeps SIGTERM's default (see strategies.multiworker):
        # one worker stopping alone would leave its peers blocked in a collective.
        stop.install()
    split = splits.shard_split(data.load_split(config.data, config.seed), config.shard)
    recorder = IdRecorder() if config.record_ids else None
    if config.strategy == "horovod":
        setup = _setup_horovod(config, split, recorder, hvd)
    else:
        assert task is not None
        setup = _setup_tf_distribute(config, split, task, cluster, recorder)
    plan = setup.plan

    with setup.strategy.scope():
        model = build_model(config.seed, split.features, split.classes, config.model)
        compile_model(model, plan.learning_rate, setup.wrap_optimizer)
        model.optimizer.build(model.trainable_variables)
        checkpoints = Checkpoints(
            config.checkpoints, model, writer=setup.chief, collective=config.strategy == "multiworker"
        )
        restored = checkpoints.restore(restore_from)
    if setup.chief:
        lineage.record(config.checkpoints, trained_on)
    resume = plan_resume(plan, restored)
    if restored:
        elsewhere = restore_from != config.checkpoints
        print(f"trainer: resumed from step {restored}" + (f" of {restore_from}" if elsewhere else ""), flush=True)
    logger = MetricsLogger(
        report.metrics_path(config.run_dir, setup.task.name),
        log_every=config.log_every,
        examples_per_step=plan.process_batch_size,
        task_name=setup.task.name,
        summed_replicas=plan.replicas_in_sync if config.strategy in ("mirrored", "multiworker") else 1,
        start_step=resume.start_step,
        total_steps=resume.total_steps,
    )
    keeper = CheckpointCallback(
        checkpoints,
        resume,
        every=config.checkpoint_every,
        steps_per_epoch=plan.steps_per_epoch,
        stop=stop,
        agreement=setup.agreement,
    )
    summary = None
    # TensorBoard's event files (the epoch's loss, per epoch) in the run folder, from the chief alone: what
    # `kiln tensorboard` shows. ParameterServerStrategy's coordinator keeps to kiln's own metrics.
    board = ([keras.callbacks.TensorBoard(log_dir=str(config.run_dir / "tensorboard"), update_freq="epoch",
                                          profile_batch=0, write_graph=False)]
             if setup.chief and config.strategy != "ps" else [])
    try:
        if resume.remaining:
            model.fit(
                setup.train_input,
                epochs=plan.epochs,
                initial_epoch=resume.initial_epoch,
                steps_per_epoch=plan.steps_per_epoch,
                callbacks=[*setup.callbacks, logger, keeper, *board],
                verbose=0,
            )
            summary = logger.summary()
    finally:
        checkpoints.close()
    if recorder is not None:
        recorder.write(config.run_dir, setup.task.name, plan.steps_per_epoch, plan.epochs)
    base = {
        "strategy": config.strategy,
        "task": setup.task.name,
        "world_size": plan.world_size,
        "epochs": plan.epochs,
        "resumed_from_step": resume.start_step,
        "global_batch_size": plan.global_batch_size,
        "per_replica_batch_size": plan.per_replica_batch_size,
        "learning_rate": plan.learning_rate,
    }
    if keeper.preempted:
        report.write_json(
            report.result_path(config.run_dir, setup.task.name),
            {**base, "steps": keeper.step, "checkpoint_saved": keeper.saved, "status": "preempted"},
        )
        raise Preempted(keeper.step, keeper.saved)
    weights = model.get_weights()
    accuracy = evaluate_accuracy(weights, split.x_test, split.y_test, config.seed, config.model)
    if setup.chief:
        export_model(weights, config.model_dir, config.seed, split.features, config.model)
        if config.model_uri is not None:
            storage.upload(config.model_dir, config.model_uri)

    result = {
        **base,
        "steps": summary.steps if summary else resume.start_step,
        "first_loss": summary.first_loss if summary else None,
        "final_loss": summary.final_loss if summary else None,
        "test_accuracy": accuracy,
        "examples_per_sec": summary.examples_per_sec if summary else 0.0,
        "wall_time": summary.wall_time if summary else 0.0,
        "weights_sha256": report.weights_sha256(weights),
        "status": "ok",
    }
    report.write_json(report.result_path(config.run_dir, setup.task.name), result)
    return result
