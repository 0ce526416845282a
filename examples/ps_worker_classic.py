"""Between-graph replication as TensorFlow 1's distributed MNIST wrote it: each process is told its job and index
and every host on the command line, parameter servers hold the variables and serve until killed, workers train
asynchronously and each stops on its own once the shared global step reaches --train-steps.

    kiln train --mode tf-config --ps 1 --no-chief -- python ps_worker_classic.py \
        --job_name={kiln:task_type} --task_index={kiln:task_index} \
        --ps_hosts={kiln:ps_hosts} --worker_hosts={kiln:worker_hosts}

kiln fills the {kiln:...} placeholders per process; the run is done when every worker has exited 0, and kiln
then stops the parameter servers. Worker 0 is the chief (it initialises the variables). Written with
tf.compat.v1 (graph mode), as such programs are.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
FEATURES = 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job_name", required=True, choices=("ps", "worker"))
    parser.add_argument("--task_index", type=int, required=True)
    parser.add_argument("--ps_hosts", required=True)
    parser.add_argument("--worker_hosts", required=True)
    parser.add_argument("--train-steps", type=int, default=200)
    args = parser.parse_args()

    tf1.disable_eager_execution()
    cluster = tf1.train.ClusterSpec({"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")})
    server = tf1.train.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    if args.job_name == "ps":
        server.join()  # serves until the launcher stops it
        return

    rng = np.random.default_rng(args.task_index)
    x_all = rng.normal(size=(2048, FEATURES)).astype("float32")
    y_all = (x_all @ np.linspace(-1, 1, FEATURES) > 0).astype("float32").reshape(-1, 1)
    worker = f"/job:worker/task:{args.task_index}"
    with tf1.device(tf1.train.replica_device_setter(worker_device=worker, cluster=cluster)):
        step = tf1.train.get_or_create_global_step()
        x = tf1.placeholder(tf.float32, [None, FEATURES])
        y = tf1.placeholder(tf.float32, [None, 1])
        weights = tf1.get_variable("w", [FEATURES, 1], initializer=tf1.zeros_initializer())
        bias = tf1.get_variable("b", [1], initializer=tf1.zeros_initializer())
        loss = tf1.reduce_mean(tf1.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=x @ weights + bias))
        train = tf1.train.GradientDescentOptimizer(0.5).minimize(loss, global_step=step)

    hooks = [tf1.train.StopAtStepHook(last_step=args.train_steps)]
    done, last = 0, None
    config = tf1.ConfigProto(device_filters=["/job:ps", worker])
    with tf1.train.MonitoredTrainingSession(master=server.target, is_chief=args.task_index == 0, hooks=hooks,
                                            config=config) as session:
        while not session.should_stop():
            batch = rng.integers(0, len(x_all), 64)
            _, last, reached = session.run([train, loss, step], {x: x_all[batch], y: y_all[batch]})
            done += 1
    output = os.environ.get("KILN_OUTPUT_DIR", ".")
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "result.json"), "w") as handle:
        json.dump({"task_index": args.task_index, "steps_here": done, "global_step": int(reached),
                   "loss": float(last)}, handle)
    print(f"worker {args.task_index}: {done} steps here, global step {reached}, loss {last:.4f}", flush=True)


if __name__ == "__main__":
    main()
