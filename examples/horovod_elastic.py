"""Elastic Horovod with Keras, as Horovod's elastic examples write it: the training state (model, optimizer,
epoch, batch) is committed as it goes, and when a host goes (or comes) the ranks that are left restore the last
commit and carry on at the new world size.

    kiln train --min-np 2 -- python horovod_elastic.py --epochs 20

kiln runs horovodrun's elastic mode with a host discovery script listing the cluster's nodes that answer: a
node lost mid-run leaves the job running on the rest. Keras is bound to tf-keras before Horovod is imported
(as in horovod_keras.py).
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batches", type=int, default=40, help="batches per epoch")
    args = parser.parse_args()

    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=FEATURES) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(4096, seed=0).batch(32)

    model = tf.keras.Sequential([tf.keras.layers.Input((FEATURES,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # The optimizer's variables made now, as training makes them: a rank that joins a running job broadcasts the
    # same variables as the ranks there (a fresh optimizer has fewer until its first step, and the sync hangs).
    model.optimizer.build(model.trainable_variables)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    sizes = []

    def on_state_reset():
        tf.keras.backend.set_value(state.model.optimizer.lr, 0.01 * hvd.size())
        sizes.append(hvd.size())

    state.register_reset_callbacks([on_state_reset])
    callbacks = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state),
                 tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: hvd.rank() or print(
                     f"epoch {state.epoch} on {hvd.size()} ranks, loss {logs['loss']:.4f}", flush=True))]

    @hvd.elastic.run
    def train(state):
        state.model.fit(data, steps_per_epoch=args.batches - state.batch, epochs=args.epochs - state.epoch,
                        callbacks=callbacks, verbose=0)

    train(state)
    output = os.environ.get("KILN_OUTPUT_DIR", ".")
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "result.json"), "w") as handle:
        json.dump({"rank": hvd.rank(), "size": hvd.size(), "sizes_seen": sizes, "epochs": state.epoch}, handle)
    print(f"rank {hvd.rank()}: done on {hvd.size()} ranks at epoch {state.epoch} (resets: {sizes})", flush=True)


if __name__ == "__main__":
    main()
