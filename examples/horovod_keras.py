"""Horovod with Keras as Horovod's examples write it: hvd.init(), a DistributedOptimizer, rank 0 broadcasts.

    kiln -H h1,h2,h3 train -- python horovod_keras.py --epochs 3

horovodrun runs this on every rank over kiln's hostfile and pinned SSH; each rank reads its own shard. On nodes with
GPUs kiln starts one rank per GPU, and each rank makes only its own GPU visible first thing, as Horovod's examples
do (without that every rank of a node would land on GPU 0).
Horovod 0.28's Keras callbacks import the standalone `keras` package, which is Keras 3 beside TensorFlow 2.16+;
they work with the legacy Keras that tf.keras is under kiln (TF_USE_LEGACY_KERAS=1), so `keras` is bound to it
before Horovod is imported.
"""

import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf
import tf_keras

sys.modules["keras"] = tf_keras
import horovod.tensorflow.keras as hvd  # noqa: E402  (after binding keras, above)

FEATURES = 20


def visible_gpu(local_rank: int, gpus: int) -> int | None:
    """The one GPU this rank uses: its local rank's (more ranks than GPUs share them in turn); None without."""
    return local_rank % gpus if gpus else None


def use_local_gpu(local_rank: int) -> None:
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    index = visible_gpu(local_rank, len(gpus))
    if index is not None:
        tf.config.set_visible_devices(gpus[index], "GPU")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    hvd.init()
    use_local_gpu(hvd.local_rank())
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3072, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=FEATURES) > 0).astype("int32")
    shard = tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank()).batch(32)

    model = tf.keras.Sequential([tf.keras.layers.Input((FEATURES,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05 * hvd.size())),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(shard, epochs=args.epochs, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    examples = sum(int(batch[0].shape[0]) for batch in shard) * args.epochs

    output = os.environ.get("KILN_OUTPUT_DIR", ".")
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "result.json"), "w") as handle:
        json.dump({"rank": hvd.rank(), "size": hvd.size(), "examples": examples,
                   "loss": float(history.history["loss"][-1])}, handle)
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, loss {history.history['loss'][-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
