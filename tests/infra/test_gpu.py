"""The GPUs, end to end: what the host has (count, driver, ECC, pending repairs, Xid events, speed against the
model's data sheet, all-reduce over its GPUs against its floor) and, for a kiln image, that the versions are the
matrix's and containers and TensorFlow see every GPU. Skipped where the PCI bus has no NVIDIA GPU (--gpu=required
makes that a failure). With --facts-only the matrix checks are left out, so the suite judges any GPU host, and
--facts-json writes what it found."""

from __future__ import annotations

import shlex

import pytest
from kiln_infra import VENV, run_checked, venv_python

from kiln.gpu import allreduce as gpuallreduce
from kiln.gpu import collective as gpucollective
from kiln.gpu import facts as gpufacts
from kiln.gpu import health
from kiln.gpu import probe as gpuprobe

pytestmark = pytest.mark.gpu


def gpu_python(host, pytestconfig) -> str:
    """The Python the probe runs with: --gpu-python, else a kiln image's venv, else python3."""
    chosen = pytestconfig.getoption("gpu_python")
    if chosen:
        return chosen
    return f"{VENV}/bin/python" if host.file(f"{VENV}/bin/python").exists else "python3"


@pytest.fixture(scope="module")
def facts(host, pytestconfig, host_record) -> dict:
    """What the host has (kiln.gpu.facts), or a skip (a failure with --gpu=required) without an NVIDIA GPU."""
    gathered = gpufacts.host_facts(host.run(gpufacts.gather_command(gpu_python(host, pytestconfig))).stdout)
    host_record["facts"] = gathered
    if not gathered["pci_gpus"] and not gathered["gpus"]:
        smi = "missing" if gathered["errors"].get("nvidia-smi") == "nvidia-smi is not installed" else "found"
        reason = f"no NVIDIA GPU on this host (the PCI bus lists 0, nvidia-smi {smi})"
        if pytestconfig.getoption("gpu") == "required":
            pytest.fail(reason + " and --gpu=required")
        pytest.skip(reason)
    return gathered


@pytest.fixture(scope="module")
def probe(host, facts, pytestconfig, host_record) -> dict:
    """The probe's figures for every GPU, measured with the framework the host's Python has."""
    argv = gpuprobe.remote_argv(gpu_python(host, pytestconfig), pytestconfig.getoption("gpu_framework"))
    result = host.run(f"timeout 600 {shlex.join(argv)}")
    measured = gpuprobe.read_result(result.rc, result.stdout, result.stderr)
    host_record["probe"] = measured
    if measured.get("error"):
        pytest.fail(f"the probe failed: {measured['error']}")
    return measured


@pytest.fixture
def matrix_checks(pytestconfig):
    if pytestconfig.getoption("facts_only"):
        pytest.skip("--facts-only: versions are not held against kiln's matrix")


def test_nvidia_smi_sees_every_gpu(facts, pytestconfig):
    expected = pytestconfig.getoption("expect_gpus")
    pci = facts["pci_gpus"]
    assert "nvidia-smi" not in facts["errors"], f"nvidia-smi: {facts['errors'].get('nvidia-smi')}"
    assert len(facts["gpus"]) == len(pci), (
        f"nvidia-smi sees {len(facts['gpus'])} GPUs, the PCI bus has {len(pci)}: {pci}")
    if expected is not None:
        assert len(facts["gpus"]) == expected, f"{len(facts['gpus'])} GPUs, expected {expected}"


def test_the_loaded_driver_is_the_installed_one(facts):
    module = facts["driver"]["module"]
    assert module, "the NVIDIA kernel module is not loaded (no /proc/driver/nvidia/version)"
    assert module["version"] == facts["driver"]["version"], (
        f"kernel module {module['version']}, nvidia-smi's library {facts['driver']['version']}: reboot")


def test_no_uncorrectable_ecc_errors(facts):
    bad = {gpu["bus_id"]: gpu["ecc_uncorrectable"]["volatile"] for gpu in facts["gpus"]
           if gpu["ecc_uncorrectable"]["volatile"]}
    assert not bad, f"uncorrectable ECC errors since the driver loaded: {bad}"


def test_no_memory_repair_waits_for_a_reset(facts):
    waiting = {gpu["bus_id"]: problem for gpu in facts["gpus"] for problem in gpufacts.gpu_problems(gpu)
               if "pending" in problem or "remapping failed" in problem}
    assert not waiting, f"{waiting}"


def test_no_hardware_slowdown(facts):
    held = {gpu["bus_id"]: gpu["slowdowns"] for gpu in facts["gpus"]
            if set(gpu["slowdowns"]) & set(gpufacts.SLOWDOWNS)}
    assert not held, f"clocks held down: {held}"


def test_no_xid_events(facts):
    if not facts["xid"]["readable"]:
        pytest.skip("the kernel log is not readable here (dmesg needs root or kernel.dmesg_restrict=0)")
    found, notes = gpufacts.xid_findings(facts)
    assert not found, f"Xid events in the kernel log that ask something of the node: {found} (also: {notes})"


def test_cuda_nccl_and_cudnn_are_found(facts):
    missing = [name for name, found in (("the CUDA driver API", facts["cuda"]["driver_supports"]),
                                        ("NCCL", facts["nccl"]["version"]), ("cuDNN", facts["cudnn"]["version"]))
               if not found]
    assert not missing, f"not found: {', '.join(missing)} (packages: {facts['packages']})"


def test_matmul_on_every_gpu_matches_numpy(facts, probe):
    assert len(probe["devices"]) == len(facts["gpus"]), (
        f"{probe['framework']} sees {len(probe['devices'])} GPUs, nvidia-smi {len(facts['gpus'])}")
    bad = {d["device"]: d["matmul_error"] for d in probe["devices"] if d["matmul_error"] > health.MAX_MATMUL_ERROR}
    assert not bad, f"float32 matmul differs from numpy on {bad}"


def test_every_gpu_is_as_fast_as_its_data_sheet_says(facts, probe):
    slow = {}
    for gpu, device in zip(facts["gpus"], probe["devices"], strict=False):
        found, notes = health.judge_probe(gpu["name"], device)
        slow.update({f"GPU {gpu['index']}": problem for problem in found if "matmul differs" not in problem})
        if notes and not found:
            pytest.skip("; ".join(notes))
    assert not slow, f"{slow}"


def test_all_reduce_over_the_hosts_gpus_meets_its_floor(host, facts, pytestconfig, host_record):
    """An all-reduce over every GPU of the host (nccl-tests' all_reduce_perf where present, else TensorFlow's
    NCCL all-reduce) as bus bandwidth, against the floor for the host's GPUs (kiln.gpu.collective.FLOORS)."""
    if len(facts["gpus"]) < 2:
        pytest.skip(f"{len(facts['gpus'])} GPU: an all-reduce needs two or more")
    size = gpucollective.max_bytes([gpu["memory_mib"].get("total") for gpu in facts["gpus"]])
    argv = gpuallreduce.remote_argv(gpu_python(host, pytestconfig), len(facts["gpus"]), size)
    result = host.run(f"timeout 900 {shlex.join(argv)}")
    measured = gpucollective.read_probe(gpuprobe.read_result(result.rc, result.stdout, result.stderr))
    if isinstance(measured, str):
        pytest.fail(f"the all-reduce failed: {measured}")
    host_record["allreduce"] = {"ranks": measured.ranks, "busbw": measured.peak, "tool": measured.tool}
    floor = gpucollective.floor_for("node", facts["gpus"][0]["name"], len(facts["gpus"]))
    found, notes = gpucollective.judge_measurement("this host", measured, floor)
    assert not found, "; ".join(found)
    if notes:
        pytest.skip("; ".join(notes))


def test_driver_is_the_matrix_branch(facts, matrix, matrix_checks):
    assert facts["driver"]["version"] == matrix["nvidia_driver_version"], (
        f"driver {facts['driver']['version']}, the matrix wants {matrix['nvidia_driver_version']}")


def test_cuda_toolkit_version(facts, matrix, matrix_checks):
    assert facts["cuda"]["toolkit"] == matrix["cuda_version"], (
        f"CUDA {facts['cuda']['toolkit']}, the matrix wants {matrix['cuda_version']}")


def test_cudnn_version(facts, matrix, matrix_checks):
    debs = {p: v for p, v in facts["cudnn"]["found"].items() if p.startswith("deb ")}
    assert any(matrix["cuda_cudnn_version"] == v for v in debs.values()), (
        f"cuDNN {debs or facts['cudnn']['found']}, the matrix wants {matrix['cuda_cudnn_version']}")


def test_nccl_version(facts, matrix, matrix_checks):
    loaded = facts["nccl"]["found"].get("library")
    assert loaded == matrix["cuda_nccl_version"], (
        f"NCCL {loaded} (libnccl.so.2), the matrix wants {matrix['cuda_nccl_version']}")


def test_docker_runs_a_container_on_every_gpu(host, facts, pytestconfig, matrix_checks):
    image = pytestconfig.getoption("gpu_container_image")
    result = run_checked(host, f"timeout 300 docker run --rm --gpus all {image} nvidia-smi -L")
    seen = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
    assert len(seen) == len(facts["gpus"]), (
        f"the container sees {len(seen)} GPUs, the host {len(facts['gpus'])}:\n{result.stdout}")


def test_tensorflow_sees_every_gpu(host, facts, matrix_checks):
    code = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    seen = int(run_checked(host, venv_python(code)).stdout.split()[-1])
    assert seen == len(facts["gpus"]), f"TensorFlow sees {seen} GPUs, nvidia-smi {len(facts['gpus'])}"


# Each framework asked how many GPUs it sees, in the host's Python (the image's venv, or --gpu-python).
FRAMEWORK_GPUS = {
    "tensorflow": "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))",
    "torch": "import torch; print(torch.cuda.device_count())",
    "jax": "import jax; print(len([d for d in jax.devices() if d.platform == 'gpu']))",
}


@pytest.mark.parametrize("framework", sorted(FRAMEWORK_GPUS))
def test_every_framework_there_sees_every_gpu(host, facts, pytestconfig, framework):
    """Whichever of TensorFlow, PyTorch and JAX the host's Python carries sees every GPU nvidia-smi lists (an
    image may carry PyTorch and JAX beside TensorFlow; a node of any other make carries what it carries)."""
    python = gpu_python(host, pytestconfig)
    if host.run(f"{python} -c {shlex.quote(f'import {framework}')}").rc != 0:
        pytest.skip(f"{framework} is not installed for {python}")
    code = FRAMEWORK_GPUS[framework]
    seen = int(run_checked(host, f"TF_CPP_MIN_LOG_LEVEL=3 {python} -c {shlex.quote(code)}").stdout.split()[-1])
    assert seen == len(facts["gpus"]), f"{framework} sees {seen} GPUs, nvidia-smi {len(facts['gpus'])}"
