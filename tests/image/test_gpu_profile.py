"""The gpu profile for real on the local VM, against the signed stand-in NVIDIA repositories
(bake.standin: NVIDIA's package names and the matrix versions, a throwaway key):
repository, key pin, version pins, holds, the container toolkit's daemon.json, the version manifest,
and a second run that changes nothing. The baked image already holds the roles both profiles share
(its own second run proves them idempotent), so the gpu runs take `--tags gpu`: the NVIDIA driver,
CUDA, the container runtime and the fabric's stack (efa, as an AWS image gets it, against the stand-in of AWS's
signed installer), then the manifest. Horovod's NCCL build needs a real CUDA compiler:
on the stand-ins kiln_image_cuda_builds is off, and that part is proven on GPU machines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.paths import cache_dir

from .conftest import ANSIBLE, ROOT, playbook, recap, run, served

pytestmark = [pytest.mark.image_bake, pytest.mark.timeout(7200)]
STANDIN = cache_dir() / "nvidia-standin"


@pytest.fixture(scope="module")
def gpu_vm(baked_vm, tmp_path_factory):
    """The booted baked image (after the cpu profile's second run) converged twice with the gpu profile,
    then checked by the suite; yields the runs."""
    built = run([sys.executable, "-m", "bake.standin", "build", str(STANDIN)], timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    summary = json.loads((STANDIN / "standin.json").read_text())
    state = tmp_path_factory.mktemp("gpu-vm")
    ssh_config, wheel_port = baked_vm
    with served(Path(summary["root"])) as repo_port:
        standin_vars = run([sys.executable, "-m", "bake.standin", "vars", str(STANDIN), f"http://10.0.2.2:{repo_port}"],
                           timeout=60)
        assert standin_vars.returncode == 0, standin_vars.stderr
        extra = {
            "kiln_image_profile": "gpu",
            "kiln_image_cuda_builds": False,
            "kiln_image_fabric": "efa",
            "tensorflow_wheelhouse_url": f"http://10.0.2.2:{wheel_port}/",
            **json.loads(standin_vars.stdout),
        }
        extra_file = state / "gpu.json"
        extra_file.write_text(json.dumps(extra))
        gpu_run = ("--tags", "gpu", "-e", f"@{extra_file}")
        first = playbook(ssh_config, ANSIBLE / "image.yml", *gpu_run)
        second = playbook(ssh_config, ANSIBLE / "image.yml", *gpu_run) if first.returncode == 0 else None
        suite = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", str(ROOT / "tests" / "infra"),
             "--hosts=ssh://kiln-vm", f"--ssh-config={ssh_config}", "-m", "image or gpu or fabric", "-rs",
             # what the gpu runs changed: versions against the matrix and manifest, the GPU checks, NCCL
             "-k", "version or manifest or test_gpu or nccl or efa or infiniband"],
            capture_output=True, text=True, timeout=1800, cwd=ROOT)
        required = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(ROOT / "tests" / "infra"),
             "--hosts=ssh://kiln-vm", f"--ssh-config={ssh_config}", "-m", "gpu", "--gpu=required", "-x"],
            capture_output=True, text=True, timeout=600, cwd=ROOT)
        yield {"first": first, "second": second, "suite": suite, "required": required}


def test_the_gpu_profile_converges_on_the_stand_ins(gpu_vm):
    first = gpu_vm["first"]
    assert first.returncode == 0, first.stdout[-8000:] + first.stderr[-2000:]
    for task in ("nvidia_driver : ", "cuda : ", "container_runtime : ", "efa : "):
        assert f"TASK [{task}" in first.stdout, f"no {task.strip(' :')} tasks ran"


def test_a_second_gpu_run_changes_nothing(gpu_vm):
    second = gpu_vm["second"]
    assert second is not None and second.returncode == 0, (second.stdout[-6000:] if second else "first run failed")
    changed = [line for line in second.stdout.splitlines() if line.startswith("changed:")]
    assert recap(second.stdout)["changed"] == 0, f"the second gpu run changed {changed}:\n{second.stdout[-4000:]}"


def test_the_suite_checks_every_gpu_component_version_and_skips_the_gpu_itself(gpu_vm):
    suite = gpu_vm["suite"]
    assert suite.returncode == 0, suite.stdout[-8000:] + suite.stderr[-2000:]
    assert "not part of the" not in suite.stdout, f"GPU component versions were skipped:\n{suite.stdout[-4000:]}"
    assert "no NVIDIA GPU on this host" in suite.stdout
    assert "no EFA device on this host" in suite.stdout, "the EFA device check skips without a device"
    # The EFA stack's check ran (it skips only saying the image was baked without one, or with another).
    assert "baked without a fabric stack" not in suite.stdout and "not EFA" not in suite.stdout, suite.stdout[-4000:]


def test_gpu_required_fails_without_a_gpu(gpu_vm):
    required = gpu_vm["required"]
    assert required.returncode == 1, required.stdout[-4000:]
    assert "--gpu=required" in required.stdout
