"""Keras 3 on the JAX backend across nodes, as Keras's distribution guide writes it: `keras.distribution.initialize()`
(kiln gives it the coordinator, the process count and this process's id), then data parallelism over every device
of every process, and `fit` as on one machine.

    kiln train --mode jax -- python keras_jax.py --epochs 3

Each process writes its loss and the devices it trained on to KILN_OUTPUT_DIR/result.json.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402  (the backend is chosen before Keras is imported)
import numpy as np  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    keras.distribution.initialize()
    import jax

    devices = keras.distribution.list_devices()
    # Each process feeds its own share of the data (as a multi-host input pipeline does), its batch split over its
    # devices; Keras keeps the model's replicas in step across every device of every process.
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False))
    rng = np.random.default_rng(0)
    features = rng.normal(size=(2048, 16)).astype("float32")
    target = (features @ rng.normal(size=(16, 1)) > 0).astype("float32")
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    index, count = jax.process_index(), jax.process_count()
    share = len(features) // count  # the same number of batches on every process
    features, target = features[index * share:(index + 1) * share], target[index * share:(index + 1) * share]
    history = model.fit(features, target, batch_size=args.batch_size * jax.local_device_count(), epochs=args.epochs,
                        verbose=2 if index == 0 else 0)
    out = os.environ.get("KILN_OUTPUT_DIR", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "result.json"), "w") as handle:
        json.dump({"process": index, "processes": count, "devices": len(devices),
                   "backend": keras.backend.backend(), "loss": history.history["loss"],
                   "accuracy": history.history["accuracy"][-1]}, handle)


if __name__ == "__main__":
    main()
