"""Multi-worker Keras training as TensorFlow's tutorial writes it: the cluster comes from TF_CONFIG alone.

    kiln -H h1,h2,h3 train --mode tf-config -- python keras_multiworker.py --epochs 4

BackupAndRestore keeps the training state in KILN_CHECKPOINT_DIR, so a run kiln restarts (--max-restarts)
resumes from the last finished epoch. What a worker writes to KILN_OUTPUT_DIR comes back to the run folder.
"""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

FEATURES = 20


def dataset(global_batch: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=FEATURES) > 0).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=0).repeat().batch(global_batch)


def build_model() -> tf.keras.Model:
    model = tf.keras.Sequential([
        tf.keras.layers.Input((FEATURES,)),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(2),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


class Progress(tf.keras.callbacks.Callback):
    """Counts the batches this worker ran and says when each epoch ends."""

    def __init__(self, pause: float):
        super().__init__()
        self.pause, self.batches, self.epochs = pause, 0, []

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(epoch)
        print(f"epoch {epoch} done: loss {logs['loss']:.4f}", flush=True)
        time.sleep(self.pause)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to wait after each epoch")
    args = parser.parse_args()

    tf_config = json.loads(os.environ["TF_CONFIG"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model()
    progress = Progress(args.pause)
    backup = os.environ.get("KILN_CHECKPOINT_DIR", "/tmp/keras-backup")
    history = model.fit(dataset(64 * strategy.num_replicas_in_sync), epochs=args.epochs,
                        steps_per_epoch=args.steps, verbose=0,
                        callbacks=[tf.keras.callbacks.BackupAndRestore(backup), progress])

    task = tf_config["task"]
    output = os.environ.get("KILN_OUTPUT_DIR", ".")
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "result.json"), "w") as handle:
        json.dump({"task": f"{task['type']}-{task['index']}", "replicas": strategy.num_replicas_in_sync,
                   "batches": progress.batches, "epochs": progress.epochs,
                   "loss": float(history.history["loss"][-1])}, handle)


if __name__ == "__main__":
    main()
