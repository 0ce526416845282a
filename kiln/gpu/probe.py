"""Measure each GPU with whatever framework this Python has: a matmul checked against numpy, device-memory
bandwidth, and matrix throughput. Run on a node as `python probe.py [--framework F] [--device gpu|cpu]`;
it prints one JSON object. Standard library, numpy and the framework only: it is sent to nodes as it is.

Bandwidth is a copy from one buffer into another (an elementwise multiply, or CuPy's device-to-device copy),
counting the bytes read and written (how NVIDIA and most benchmarks count a copy). Throughput is a square
matmul in bfloat16 where the device has it (compute capability 8.0 on), else float16, counting 2*n^3 operations.
"""

import argparse
import json
import os
import sys
import time

FRAMEWORKS = ("tensorflow", "torch", "jax", "cupy")


def timed(step, sync, warmup, reps):
    """Seconds per call of `step`, after `warmup` calls; `sync(result)` waits for the device."""
    result = None
    for _ in range(warmup):
        result = step()
    sync(result)
    began = time.perf_counter()
    for _ in range(reps):
        result = step()
    sync(result)
    return (time.perf_counter() - began) / reps


def relative_error(got, want):
    import numpy as np
    return float(np.max(np.abs(np.asarray(got, dtype="float64") - want)) / np.max(np.abs(want)))


def reference(size):
    import numpy as np
    a = np.random.default_rng(0).standard_normal((size, size)).astype("float32")
    return a, a.astype("float64") @ a.astype("float64")


def measure(device, ops, args):
    """One device's figures from a framework's three operations."""
    a, want = reference(args.check_size)
    elements = args.copy_mib * (1 << 20) // 4
    copy_seconds = timed(ops["scale"](elements), ops["sync"], 3, args.reps)
    n = args.matmul_size
    dtype = ops["matmul_dtype"]
    matmul_seconds = timed(ops["matmul"](n, dtype), ops["sync"], 3, args.reps)
    return {"device": device, "name": ops.get("name", device),
            "matmul_error": relative_error(ops["check"](a), want),
            "copy_tbps": 2 * elements * 4 / copy_seconds / 1e12,
            "matmul_tflops": 2 * n ** 3 / matmul_seconds / 1e12, "matmul_dtype": dtype,
            "copy_mib": args.copy_mib, "matmul_size": n}


def with_tensorflow(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    kind = "GPU" if args.device == "gpu" else "CPU"
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    results = []
    for device in tf.config.list_logical_devices(kind):
        details = {}
        if kind == "GPU":
            physical = tf.config.list_physical_devices("GPU")[len(results)]
            details = tf.config.experimental.get_device_details(physical)
        capability = details.get("compute_capability", (8, 0))
        with tf.device(device.name):
            def scale(elements):
                source = tf.ones([elements], tf.float32)
                return lambda: source * 2.0

            def matmul(n, dtype):
                x = tf.cast(tf.random.normal([n, n]), dtype)
                return lambda: tf.linalg.matmul(x, x)

            ops = {"scale": scale, "matmul": matmul, "check": lambda a: tf.linalg.matmul(a, a).numpy(),
                   "sync": lambda result: result[:1].numpy(), "name": details.get("device_name", device.name),
                   "matmul_dtype": "bfloat16" if kind == "CPU" or capability >= (8, 0) else "float16"}
            results.append(measure(device.name, ops, args))
    return f"tensorflow {tf.__version__}", results


def with_torch(args):
    import torch
    if args.device == "gpu":
        devices = [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())]
    else:
        devices = [torch.device("cpu")]
    results = []
    for device in devices:
        gpu = device.type == "cuda"
        capability = torch.cuda.get_device_capability(device) if gpu else (8, 0)

        def scale(elements, device=device):
            source = torch.ones(elements, device=device)
            target = torch.empty_like(source)
            return lambda: torch.mul(source, 2.0, out=target)

        def matmul(n, dtype, device=device):
            x = torch.randn(n, n, device=device).to(getattr(torch, dtype))
            return lambda: x @ x

        def sync(_result, device=device):
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        def check(a, device=device):
            return (torch.from_numpy(a).to(device) @ torch.from_numpy(a).to(device)).cpu().numpy()

        ops = {"scale": scale, "matmul": matmul, "check": check, "sync": sync,
               "name": torch.cuda.get_device_name(device) if gpu else "cpu",
               "matmul_dtype": "bfloat16" if capability >= (8, 0) else "float16"}
        results.append(measure(str(device), ops, args))
    return f"torch {torch.__version__}", results


def with_jax(args):
    import jax
    import jax.numpy as jnp
    double = jax.jit(lambda x: x * 2.0)
    product = jax.jit(lambda x: x @ x)
    results = []
    for device in jax.devices("gpu" if args.device == "gpu" else "cpu"):
        def scale(elements, device=device):
            source = jax.device_put(jnp.ones(elements, jnp.float32), device)
            return lambda: double(source)

        def matmul(n, dtype, device=device):
            x = jax.device_put(jax.random.normal(jax.random.PRNGKey(0), (n, n)).astype(dtype), device)
            return lambda: product(x)

        def check(a, device=device):
            return jax.device_get(product(jax.device_put(a, device)))

        capability = float(getattr(device, "compute_capability", "8.0") or "8.0")
        ops = {"scale": scale, "matmul": matmul, "check": check, "sync": lambda r: r.block_until_ready(),
               "name": getattr(device, "device_kind", str(device)),
               "matmul_dtype": "bfloat16" if capability >= 8.0 else "float16"}
        results.append(measure(str(device), ops, args))
    return f"jax {jax.__version__}", results


def with_cupy(args):
    import cupy
    if args.device != "gpu":
        raise RuntimeError("CuPy runs on GPUs only")
    results = []
    for index in range(cupy.cuda.runtime.getDeviceCount()):
        with cupy.cuda.Device(index) as device:
            def scale(elements):
                source = cupy.ones(elements, dtype=cupy.float32)
                target = cupy.empty_like(source)
                # a device-to-device memcpy: CuPy's elementwise kernels reach 1.7 of an H100's 3.0 TB/s
                return lambda: cupy.copyto(target, source)

            def matmul(n, dtype):
                x = cupy.random.standard_normal((n, n), dtype=cupy.float32).astype(dtype)
                return lambda: x @ x

            properties = cupy.cuda.runtime.getDeviceProperties(index)
            ops = {"scale": scale, "matmul": matmul, "check": lambda a: cupy.asnumpy(cupy.asarray(a) @ cupy.asarray(a)),
                   "sync": lambda _result, device=device: device.synchronize(),
                   "name": properties["name"].decode(), "matmul_dtype": "float16"}  # CuPy has no bfloat16
            results.append(measure(f"cuda:{index}", ops, args))
    return f"cupy {cupy.__version__}", results


def remote_argv(python, framework="auto"):
    """How a host runs this file without a copy of it: the source given to `python -c` (the launcher's ssh and
    testinfra's host.run both send it this way)."""
    with open(__file__) as source:
        return ["env", "TF_CPP_MIN_LOG_LEVEL=3", python, "-c", source.read(), "--framework", framework]


def read_result(code, stdout, stderr):
    """The JSON a run printed last, or an error result naming the exit code and what it said."""
    lines = stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        return json.loads(lines[-1])
    said = (stderr.strip() or stdout.strip() or "no output")[-300:]
    return {"framework": None, "devices": [], "error": f"exited {code} without a result: {said}"}


RUNNERS = {"tensorflow": with_tensorflow, "torch": with_torch, "jax": with_jax, "cupy": with_cupy}


def installed(name):
    import importlib.util
    return importlib.util.find_spec(name) is not None


def main(argv):
    parser = argparse.ArgumentParser(prog="probe", description=__doc__.splitlines()[0])
    parser.add_argument("--framework", default="auto", choices=("auto", *FRAMEWORKS),
                        help="auto: the first installed of " + ", ".join(FRAMEWORKS))
    parser.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    parser.add_argument("--copy-mib", type=int, default=1024, help="buffer size for the bandwidth test")
    parser.add_argument("--matmul-size", type=int, default=8192, help="n of the n*n*n throughput matmul")
    parser.add_argument("--check-size", type=int, default=1024, help="n of the float32 matmul checked on the host")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    chosen = args.framework
    if chosen == "auto":
        chosen = next((name for name in FRAMEWORKS if installed(name)), None)
    if chosen is None:
        print(json.dumps({"framework": None, "devices": [],
                          "error": f"{sys.executable} has none of " + ", ".join(FRAMEWORKS)}))
        return 3
    try:
        framework, devices = RUNNERS[chosen](args)
    except Exception as error:  # the node reports any failure as data for the launcher to judge
        print(json.dumps({"framework": chosen, "devices": [], "error": f"{type(error).__name__}: {error}"}))
        return 1
    print(json.dumps({"framework": framework, "device_kind": args.device, "devices": devices}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
