"""ParameterServerStrategy training as TensorFlow's tutorial writes it: the ps and worker tasks serve, the chief
coordinates and trains.

    kiln -H h1,h2,h3 train --mode tf-config --ps 1 -- python parameter_server.py --epochs 2

kiln starts a chief, the workers and the parameter servers, each with its TF_CONFIG; the run ends when the chief
does, and kiln stops the servers.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

FEATURES = 20


def write_result(result: dict) -> None:
    output = os.environ.get("KILN_OUTPUT_DIR", ".")
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "result.json"), "w") as handle:
        json.dump(result, handle)


def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    rng = np.random.default_rng(context.input_pipeline_id)
    x = rng.normal(size=(1024, FEATURES)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    batch = context.get_per_replica_batch_size(64)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024).repeat().batch(batch).prefetch(2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="steps per epoch")
    args = parser.parse_args()

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        write_result({"task": f"{resolver.task_type}-{resolver.task_id}", "serving": True})
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol="grpc", start=True)
        server.join()
        return

    strategy = tf.distribute.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((FEATURES,)), tf.keras.layers.Dense(16, activation="relu"),
                                     tf.keras.layers.Dense(2)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), steps_per_execution=1,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=args.epochs,
                        steps_per_epoch=args.steps, verbose=0)
    cluster = resolver.cluster_spec().as_dict()
    write_result({"task": "chief-0", "workers": len(cluster.get("worker", [])), "ps": len(cluster.get("ps", [])),
                  "epochs": len(history.history["loss"]), "loss": float(history.history["loss"][-1])})
    print(f"trained {args.epochs} epoch(s) over {len(cluster.get('worker', []))} worker(s)", flush=True)


if __name__ == "__main__":
    main()
