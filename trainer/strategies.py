"""Building the distribution strategy for this process, and the roles that do
not train: ParameterServerStrategy's ps and worker servers."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import tensorflow as tf

from trainer import devices, report
from trainer.cluster import Task


def onedevice() -> tf.distribute.Strategy:
    """One device: the first GPU if one is visible, else the CPU."""
    device = "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
    return tf.distribute.OneDeviceStrategy(device)


def mirrored() -> tf.distribute.Strategy:
    """All visible devices of this machine (one replica on a CPU-only host)."""
    return tf.distribute.MirroredStrategy()


def grow_gpu_memory() -> list:
    """Let every visible GPU's memory grow as needed (not all of it taken at once); the GPUs."""
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    return gpus


def use_local_gpu(local_rank: int) -> None:
    """Make only this rank's GPU visible (devices.visible_gpu), its memory growing as needed."""
    gpus = grow_gpu_memory()
    index = devices.visible_gpu(local_rank, len(gpus))
    if index is not None:
        tf.config.set_visible_devices(gpus[index], "GPU")


def multiworker() -> tf.distribute.MultiWorkerMirroredStrategy:
    """Synchronous data parallelism across the workers TF_CONFIG names, over every GPU of each worker's node
    (NCCL's collectives between them; gRPC's ring on CPUs)."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    here = devices.workers_on_host(json.loads(os.environ.get("TF_CONFIG", "{}")))
    implementation = devices.collective_implementation(len(tf.config.list_physical_devices("GPU")), here)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=getattr(tf.distribute.experimental.CommunicationImplementation, implementation))
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)
    # TF's coordination service catches SIGTERM (a preemption notice for
    # PreemptionCheckpointHandler, which this trainer does not use), so a worker
    # would ignore a launcher's stop. Give SIGTERM back its default: terminate.
    # (While the constructor above still waits for its peers, only SIGKILL works.)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return strategy


def parameter_server() -> tf.distribute.ParameterServerStrategy:
    """The coordinator's strategy: variables on the ps tasks, steps on the workers."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.ParameterServerStrategy(resolver)


def build(name: str) -> tf.distribute.Strategy:
    builders = {
        "onedevice": onedevice,
        "mirrored": mirrored,
        "multiworker": multiworker,
        "ps": parameter_server,
    }
    return builders[name]()


def serve(task: Task, run_dir: Path) -> NoReturn:
    """Run this ps or worker task's gRPC server for the coordinator until killed.

    Writes ``result.<task>.json`` with status "serving" first, so a launcher can
    tell a server that came up from one that did not.
    """
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=task.type,
        task_index=task.index,
        protocol="grpc",
        start=True,
    )
    report.write_json(
        report.result_path(run_dir, task.name),
        {"strategy": "ps", "task": task.name, "target": server.target, "status": "serving"},
    )
    print(f"trainer: strategy=ps task={task.name} serving {server.target}", flush=True)
    server.join()
    raise SystemExit(0)  # join() returns only if the server is stopped


def import_horovod() -> ModuleType:
    """Import ``horovod.tensorflow.keras`` bound to tf_keras, not Keras 3."""
    import tf_keras

    sys.modules["keras"] = tf_keras
    import horovod.tensorflow.keras as hvd

    return hvd


def start_horovod() -> ModuleType:
    """Horovod initialised, this rank on its own GPU (its local rank's): ``horovod.tensorflow.keras``."""
    hvd = import_horovod()
    hvd.init()
    use_local_gpu(hvd.local_rank())
    return hvd


def horovod_optimizer(hvd: ModuleType, optimizer: Any) -> Any:
    """``hvd.DistributedOptimizer(optimizer)``, without AutoGraph converting Horovod's gradient allreduce.

    Horovod wraps its allreduce in a plain ``tf.function``, so the first training step of every rank
    transpiles Horovod's own Python (every branch of its grouping and compression code): about 2.5 s
    here, against 0.3 s for the same step with the function traced as written (it has no Python control
    flow on tensors that AutoGraph would need to convert). horovod 0.28.1 keeps that function in
    ``_allreduce_grads``; with another version, whatever it does is left alone.
    """
    distributed = hvd.DistributedOptimizer(optimizer)
    allreduce = getattr(distributed, "_allreduce_grads", None)
    python_function = getattr(allreduce, "python_function", None)
    if python_function is not None:
        distributed._allreduce_grads = tf.function(tf.autograph.experimental.do_not_convert(python_function))
    return distributed
