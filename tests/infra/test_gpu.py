"""The GPUs, end to end: driver, CUDA, cuDNN, NCCL, containers, TensorFlow. Skipped where no NVIDIA GPU
is present (--gpu=required makes that a failure)."""

from __future__ import annotations

import json

import pytest
from kiln_infra import run_checked, venv_python

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpus(host, pytestconfig) -> list[dict]:
    """The GPUs nvidia-smi sees, or a skip (a failure with --gpu=required) where there are none."""
    listed = host.run("lspci -d 10de: -n 2>/dev/null | grep -cE ' 03(00|02): '").stdout.strip()
    if not host.exists("nvidia-smi") or listed in ("", "0"):
        smi = "found" if host.exists("nvidia-smi") else "missing"
        reason = f"no NVIDIA GPU on this host (lspci lists {listed or 0}, nvidia-smi {smi})"
        if pytestconfig.getoption("gpu") == "required":
            pytest.fail(reason + " and --gpu=required")
        pytest.skip(reason)
    query = run_checked(host, "nvidia-smi --query-gpu=index,name,driver_version,uuid --format=csv,noheader")
    rows = [dict(zip(("index", "name", "driver", "uuid"), (c.strip() for c in line.split(",")), strict=True))
            for line in query.stdout.splitlines() if line.strip()]
    return rows


def test_nvidia_smi_sees_every_gpu(host, gpus, pytestconfig):
    expected = pytestconfig.getoption("expect_gpus")
    if expected is None:
        expected = int(host.run("lspci -d 10de: -n | grep -cE ' 03(00|02): '").stdout.strip())
    assert len(gpus) == expected, f"nvidia-smi sees {len(gpus)} GPUs, expected {expected}: {gpus}"


def test_driver_is_the_matrix_branch(gpus, matrix):
    drivers = {gpu["driver"] for gpu in gpus}
    assert drivers == {matrix["nvidia_driver_version"]}, (
        f"driver {sorted(drivers)}, the matrix wants {matrix['nvidia_driver_version']}")


def test_cuda_toolkit_version(host, gpus, matrix):
    version = json.loads(run_checked(host, "cat /usr/local/cuda/version.json").stdout)["cuda"]["version"]
    assert version == matrix["cuda_version"], f"CUDA {version}, the matrix wants {matrix['cuda_version']}"


def test_cudnn_version(host, gpus, matrix):
    header = run_checked(host, "cat /usr/include/x86_64-linux-gnu/cudnn_version_v9.h /usr/include/cudnn_version.h "
                               "2>/dev/null | grep -E '#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) '").stdout
    parts = {line.split()[1]: line.split()[2] for line in header.splitlines()}
    version = ".".join(parts[k] for k in ("CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL"))
    assert matrix["cuda_cudnn_version"].startswith(version + "."), (
        f"cuDNN {version}, the matrix wants {matrix['cuda_cudnn_version']}")


def test_nccl_version(host, gpus, matrix):
    code = ("import ctypes; lib = ctypes.CDLL('libnccl.so.2'); v = ctypes.c_int(); "
            "lib.ncclGetVersion(ctypes.byref(v)); v = v.value; "
            "print(f'{v // 10000}.{v % 10000 // 100}.{v % 100}')")
    version = run_checked(host, f"python3 -c \"{code}\"").stdout.strip()
    assert version == matrix["cuda_nccl_version"], f"NCCL {version}, the matrix wants {matrix['cuda_nccl_version']}"


def test_docker_runs_a_container_on_every_gpu(host, gpus, pytestconfig):
    image = pytestconfig.getoption("gpu_container_image")
    result = run_checked(host, f"timeout 300 docker run --rm --gpus all {image} nvidia-smi -L")
    seen = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
    assert len(seen) == len(gpus), f"the container sees {len(seen)} GPUs, the host {len(gpus)}:\n{result.stdout}"


def test_tensorflow_sees_every_gpu(host, gpus):
    code = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    seen = int(run_checked(host, venv_python(code)).stdout.split()[-1])
    assert seen == len(gpus), f"TensorFlow sees {seen} GPUs, nvidia-smi {len(gpus)}"


def test_matmul_on_every_gpu_matches_numpy(host, gpus):
    code = (
        "import numpy as np, tensorflow as tf\n"
        "a = np.random.default_rng(0).standard_normal((1024, 1024)).astype('float32')\n"
        "want = a @ a\n"
        "for gpu in tf.config.list_logical_devices('GPU'):\n"
        "    with tf.device(gpu.name):\n"
        "        got = tf.linalg.matmul(a, a).numpy()\n"
        "    print(gpu.name, float(np.max(np.abs(got - want)) / np.max(np.abs(want))))\n"
    )
    rows = [line.split() for line in run_checked(host, venv_python(code)).stdout.splitlines() if "GPU" in line]
    assert len(rows) == len(gpus), f"the matmul ran on {len(rows)} GPUs of {len(gpus)}"
    bad = [(name, err) for name, err in rows if float(err) > 1e-3]
    assert not bad, f"matmul differs from numpy on {bad}"
