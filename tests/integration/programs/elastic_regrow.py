"""An elastic Horovod program that trains until its world has shrunk and grown back, then a few epochs more: a
test of a replacement joining a live job cannot then be raced by the job finishing first (a fixed epoch count ends
earlier on a faster machine). What it remembers of the sizes is elastic state, so a rank that joins learns it.

    python elastic_regrow.py --size 3 --after 5 --limit 3000
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, required=True, help="the world's full size")
    parser.add_argument("--after", type=int, default=5, help="epochs to train once grown back")
    parser.add_argument("--limit", type=int, default=3000, help="epochs at most (then fail: it never grew back)")
    args = parser.parse_args()

    hvd.init()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 8)).astype("float32")
    y = (x @ rng.normal(size=8) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
    model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(2)])
    model.compile(
        optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.optimizer.build(model.trainable_variables)
    # Elastic state, synced from rank 0 at every reset: every rank takes the same decision at the same epoch.
    # A world that starts below its full size and grows has not shrunk: only a loss after being full counts.
    state = hvd.elastic.KerasState(model, batch=0, epoch=0, full=False, shrunk=False, regrown_at=-1)

    def on_epoch_end(epoch, logs):
        if hvd.size() < args.size:
            state.shrunk = state.shrunk or state.full
        elif not state.shrunk:
            state.full = True
        elif state.regrown_at < 0:
            state.regrown_at = state.epoch
        if hvd.rank() == 0:
            print(f"epoch {state.epoch} on {hvd.size()} ranks, loss {logs['loss']:.4f}", flush=True)
        if state.regrown_at >= 0 and state.epoch - state.regrown_at >= args.after:
            state.model.stop_training = True

    callbacks = [
        hvd.elastic.CommitStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        tf.keras.callbacks.LambdaCallback(on_epoch_end=on_epoch_end),
    ]

    @hvd.elastic.run
    def train(state):
        state.model.fit(
            data, steps_per_epoch=4 - state.batch, epochs=args.limit - state.epoch, callbacks=callbacks, verbose=0
        )

    train(state)
    output = os.environ.get("KILN_OUTPUT_DIR", ".")
    os.makedirs(output, exist_ok=True)
    result = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "epochs": state.epoch,
        "shrunk": state.shrunk,
        "regrown_at": state.regrown_at,
    }
    with open(os.path.join(output, "result.json"), "w") as handle:
        json.dump(result, handle)
    print(f"rank {hvd.rank()}: done on {hvd.size()} ranks at epoch {state.epoch} ({result})", flush=True)
    return 0 if state.regrown_at >= 0 else 3


if __name__ == "__main__":
    sys.exit(main())
