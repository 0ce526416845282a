"""Measure all-reduce across every GPU of this node and print one JSON object: with NVIDIA's nccl-tests
(`all_reduce_perf`) where the node has it, else with TensorFlow's NCCL all-reduce (MirroredStrategy over the local
GPUs). Run on a node as `python allreduce.py [--device gpu|cpu] [--max-bytes N]`; standard library and the
framework only: it is sent to nodes as it is (kiln.gpu.probe's way). With `--horovod`, every rank of a horovodrun
across nodes runs it (one per GPU, each on its own; one per node without GPUs) and rank 0 prints the all-ranks
all-reduce over the network (NCCL on GPUs where Horovod has it, Gloo otherwise).

The JSON: {"tool": "nccl-tests", "output": its text} (read by kiln.gpu.collective.parse_nccl_tests), or
{"framework": ..., "ranks": n, "devices": [...], "timings": [[bytes, seconds], ...], "valid": bool}, or an
"error". `--device cpu --ranks N` runs the framework path over N logical CPU devices (no NCCL): it checks the
probe itself on a machine without GPUs, its figures judge nothing.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

NCCL_TESTS = ("all_reduce_perf", "/opt/nccl-tests/build/all_reduce_perf", "/usr/local/bin/all_reduce_perf")
MIN_BYTES = 64 << 20


def sizes(max_bytes, min_bytes=MIN_BYTES):
    """Message sizes from `min_bytes` (64 MiB), doubling, up to `max_bytes`."""
    size, found = min_bytes, []
    while size <= max(max_bytes, min_bytes):
        found.append(size)
        size *= 2
    return found


def find_nccl_tests():
    return next((path for path in (shutil.which(name) or name for name in NCCL_TESTS)
                 if os.path.isfile(path) and os.access(path, os.X_OK)), None)


def with_nccl_tests(path, gpus, max_bytes, timeout):
    argv = [path, "-b", str(MIN_BYTES), "-e", str(max_bytes), "-f", "2", "-g", str(gpus)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        return {"tool": "nccl-tests", "error": f"all_reduce_perf exited {done.returncode}: "
                                               f"{(done.stderr or done.stdout).strip()[-300:]}"}
    return {"tool": "nccl-tests", "output": done.stdout}


def grow_gpu_memory(tf):
    """Let every GPU's memory grow as needed (not all of it taken at once); the GPUs (`tf`: TensorFlow, imported
    by the caller, late)."""
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    return gpus


def with_tensorflow(device, ranks, max_bytes, reps):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    if device == "cpu":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * ranks)
        names = [f"/cpu:{i}" for i in range(ranks)]
        reduce_ops = tf.distribute.ReductionToOneDevice()
    else:
        names = [f"/gpu:{i}" for i in range(len(grow_gpu_memory(tf)))]
        reduce_ops = tf.distribute.NcclAllReduce()
    if len(names) < 2:
        return {"framework": f"tensorflow {tf.__version__}", "ranks": len(names), "devices": [], "timings": [],
                "error": f"{len(names)} device(s): an all-reduce needs two or more"}
    strategy = tf.distribute.MirroredStrategy(devices=names, cross_device_ops=reduce_ops)
    timings, valid = [], True
    for size in sizes(max_bytes):
        elements = size // 4
        # each device's buffer made once, outside what is timed (filling 16 GB is no all-reduce)
        values = strategy.run(lambda elements=elements: tf.ones([elements], tf.float32))

        @tf.function
        def step(values=values):
            return strategy.run(lambda value: tf.distribute.get_replica_context().all_reduce("sum", value),
                                args=(values,))

        result = step()  # traced and warmed up
        valid = valid and all(float(tf.reduce_min(part)) == len(names) == float(tf.reduce_max(part))
                              for part in strategy.experimental_local_results(result))
        began = time.perf_counter()
        for _ in range(reps):
            result = step()
        for part in strategy.experimental_local_results(result):
            part.numpy()[:1]  # wait for every device
        timings.append([size, (time.perf_counter() - began) / reps])
    detail = [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
              for gpu in tf.config.list_physical_devices("GPU")] if device == "gpu" else ["CPU"] * len(names)
    host = os.uname().nodename
    return {"framework": f"tensorflow {tf.__version__}", "ranks": len(names),
            "devices": [f"{host}: {name}" for name in detail], "timings": timings, "valid": valid}


def with_horovod(min_bytes, max_bytes, reps):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    gpus = grow_gpu_memory(tf)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    device = "/gpu:0" if gpus else "/cpu:0"
    timings, valid = [], True
    for size in sizes(max_bytes, min_bytes):
        with tf.device(device):
            ones = tf.ones([size // 4], tf.float32)
            result = hvd.allreduce(ones, op=hvd.Sum)  # the first one sets the collective up
            valid = valid and float(tf.reduce_min(result)) == hvd.size() == float(tf.reduce_max(result))
            began = time.perf_counter()
            for _ in range(reps):
                result = hvd.allreduce(ones, op=hvd.Sum)
            float(result[0])  # wait for the device
        timings.append([size, (time.perf_counter() - began) / reps])
    controllers = {(True, True): "nccl", (True, False): "no nccl"} if gpus else {}
    controller = controllers.get((True, bool(hvd.nccl_built())), "gloo" if hvd.gloo_enabled() else "mpi")
    import horovod

    return {"framework": f"horovod {horovod.__version__} ({controller})", "ranks": hvd.size(),
            "devices": [f"{os.uname().nodename}: {'GPU' if gpus else 'CPU'}"], "timings": timings,
            "valid": valid, "rank": hvd.rank()}


def remote_argv(python, gpus, max_bytes):
    """How a host runs this file without a copy of it (kiln.gpu.probe's way): the source given to `python -c`."""
    with open(__file__) as source:
        return ["env", "TF_CPP_MIN_LOG_LEVEL=3", python, "-c", source.read(), "--gpus", str(gpus),
                "--max-bytes", str(max_bytes)]


def main(argv):
    parser = argparse.ArgumentParser(prog="allreduce", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    parser.add_argument("--gpus", type=int, default=0, help="the node's GPU count (nccl-tests' -g)")
    parser.add_argument("--ranks", type=int, default=2, help="--device cpu: logical CPU devices")
    parser.add_argument("--max-bytes", type=int, default=4 << 30, help="the largest message (default 4 GiB)")
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES, help="--horovod: the smallest message")
    parser.add_argument("--horovod", action="store_true", help="one rank of a horovodrun across nodes")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300, help="seconds all_reduce_perf may take")
    args = parser.parse_args(argv)
    nccl_tests = find_nccl_tests() if args.device == "gpu" and args.gpus > 1 and not args.horovod else None
    try:
        if args.horovod:
            result = with_horovod(args.min_bytes, args.max_bytes, args.reps)
            if result["rank"] != 0:
                return 0  # rank 0 speaks for all
        elif nccl_tests:
            result = with_nccl_tests(nccl_tests, args.gpus, args.max_bytes, args.timeout)
        else:
            import importlib.util
            if importlib.util.find_spec("tensorflow") is None:
                result = {"unavailable": f"{sys.executable} has neither nccl-tests' all_reduce_perf nor "
                                         "tensorflow"}
            else:
                result = with_tensorflow(args.device, args.ranks, args.max_bytes, args.reps)
    except Exception as error:  # the node reports any failure as data for the operator to judge
        result = {"error": f"{type(error).__name__}: {error}"}
    print(json.dumps(result))
    return 1 if result.get("error") else 0  # "unavailable" is no failure: nothing here measures it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
