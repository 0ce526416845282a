"""kiln.gpu.probe as a real process: TensorFlow's path measured on the CPU (the GPU paths ran on an H100:
tests/unit/data/gpu/), and the answers of a Python without the framework asked for."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kiln.gpu import probe

pytestmark = [pytest.mark.integration, pytest.mark.quick]
SMALL = ["--copy-mib", "8", "--matmul-size", "128", "--check-size", "256", "--reps", "2"]


def run_probe(python: str, *args: str) -> tuple[int, dict]:
    done = subprocess.run([python, probe.__file__, *args], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"})
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_tensorflow_measures_and_checks_a_device():
    code, result = run_probe(sys.executable, "--framework", "tensorflow", "--device", "cpu", *SMALL)
    assert code == 0, result
    assert result["framework"].startswith("tensorflow ")
    [device] = result["devices"]
    assert device["matmul_error"] < 1e-3
    assert device["copy_tbps"] > 0 and device["matmul_tflops"] > 0
    assert (device["matmul_dtype"], device["matmul_size"], device["copy_mib"]) == ("bfloat16", 128, 8)


def test_a_framework_that_is_not_installed_is_an_answer_not_a_crash():
    code, result = run_probe(sys.executable, "--framework", "cupy", *SMALL)
    assert code == 1
    assert result["devices"] == [] and result["error"].startswith("ModuleNotFoundError")


def test_a_python_without_any_framework():
    code, result = run_probe("/usr/bin/python3", *SMALL)
    assert code == 3
    assert result == {"framework": None, "devices": [],
                      "error": "/usr/bin/python3 has none of tensorflow, torch, jax, cupy"}
