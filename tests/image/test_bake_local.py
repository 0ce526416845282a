"""A real local bake: Packer boots the Debian 12 base disk under qemu (TCG), Ansible bakes the cpu profile
with Python wheels from the wheelhouse, cleanup runs, and the image is verified, re-provisioned and reused."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from bake.matrix import read_matrix
from bake.verify import BOOT_MARKERS

from .conftest import ANSIBLE, SAID, playbook, recap, run

# The bake (a fixture of the first test) takes up to 5400 s when the image must be baked again under TCG.
pytestmark = [pytest.mark.image_bake, pytest.mark.timeout(5400),
              pytest.mark.in_written_order("the suite runs on the VM as booted, before it is provisioned again")]

MATRIX = read_matrix()


def slowest_lines(title: str, output: str) -> list[str]:
    """The slowest tests pytest --durations listed in `output`, under `title` (the run's summary shows them)."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if "slowest" in line and "durations" in line), None)
    if start is None:
        return []
    found = [line for line in lines[start + 1:] if line[:1].isdigit()]
    found = found[:next((i for i, line in enumerate(found) if not line.split()[0].endswith("s")), len(found))]
    return [f"{title}, the slowest tests:", *(f"  {line}" for line in found)]


def test_the_bake_records_every_version_of_the_matrix(baked_image):
    record = json.loads((baked_image / "image.json").read_text())
    assert record["profile"] == "cpu" and record["provider"] == "local"
    installed = record["versions"]["installed"]
    for key in ("tensorflow_version", "tensorflow_tf_keras_version", "tensorflow_numpy_version",
                "tensorflow_tensorboard_version", "tensorflow_horovod_version"):
        assert installed[key] == MATRIX[key], f"{key}: baked {installed[key]}, the matrix wants {MATRIX[key]}"
    assert record["versions"]["fingerprint"] == record["fingerprint"]
    assert (baked_image / record["disk"]).stat().st_size > 0
    manifest = json.loads((baked_image / "packer-manifest.json").read_text())
    assert manifest["builds"][-1]["custom_data"]["fingerprint"] == record["fingerprint"]


def test_an_unchanged_fingerprint_reuses_the_image(baked_image, images_dir):
    before = (baked_image / "image.json").stat().st_mtime
    result = run([sys.executable, "-m", "bake.image", "local"], timeout=600, env={"KILN_IMAGES": str(images_dir)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout and str(baked_image) in result.stdout, result.stdout
    assert "packer build" not in result.stdout
    assert (baked_image / "image.json").stat().st_mtime == before


def test_the_suite_passes_on_what_the_disk_holds(baked_image):
    """`make verify`'s first part: the baked disk itself opened here (read-only, never booted), the suite's checks
    of what an image holds run on it natively: versions, imports, Horovod's build, services enabled, nothing of
    the bake left in a disk that never booted."""
    result = run([sys.executable, "-m", "bake.verify", "--image", str(baked_image), "--no-boot", "--", "-rA"],
                 timeout=900)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    passed = {line.split()[1].split("[")[0] for line in result.stdout.splitlines() if line.startswith("PASSED ")}
    for test in ("test_image.py::test_tensorflow_and_tf_keras_import", "test_image.py::test_horovodrun_starts",
                 "test_image.py::test_nothing_is_left_from_the_bake", "test_image.py::test_machine_id_is_not_the_bakes",
                 "test_slurm.py::test_the_image_has_no_munge_key"):
        assert f"tests/infra/{test}" in passed, f"{test} did not pass on the disk: {sorted(passed)}"
    assert not any("test_gpu.py" in test or "apparmor" in test for test in passed), sorted(passed)


def test_the_suite_passes_on_the_booted_image(baked_vm):
    """`make verify`'s second part, what only a boot shows, on the VM the next test provisions again (one boot
    under TCG, not two); it runs first, so the suite sees the image as it booted. `make verify` boots its own VM
    the same way (localcloud.vm.booted)."""
    ssh_config, _ = baked_vm
    result = run([sys.executable, "-m", "bake.verify", "--hosts", "ssh://kiln-vm", "--ssh-config", str(ssh_config),
                  "--", "-m", BOOT_MARKERS, "-rfEs", "--durations=8"], timeout=1800)
    SAID.extend(slowest_lines("the suite on the booted VM", result.stdout))
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert "given no data volume" not in result.stdout, "the VM's data volume check was skipped: " + result.stdout


def test_a_container_runs_on_the_booted_image(baked_vm, tmp_path):
    """The image's Docker engine runs a container, with the cgroup driver that keeps GPUs in running containers:
    an image of one static busybox, made here and imported in over SSH (no registry reaches the VM, and a 2 MB image
    crosses into a TCG VM in seconds where kiln's 181 MB container base took minutes)."""
    ssh_config, _ = baked_vm
    (tmp_path / "bin").mkdir()
    shutil.copy2("/bin/busybox", tmp_path / "bin" / "busybox")
    (tmp_path / "bin" / "sh").symlink_to("busybox")
    ssh = ["ssh", "-F", str(ssh_config), "kiln-vm"]
    ready = run([*ssh, "timeout 300 sh -c 'until docker info >/dev/null 2>&1; do sleep 2; done'"], timeout=360)
    assert ready.returncode == 0, "the VM's Docker engine did not answer: " + ready.stderr
    imported = subprocess.run(["sh", "-c", f"tar -C {tmp_path} -c bin | {shlex.join(ssh)} docker import - kiln-tiny"],
                              capture_output=True, text=True, timeout=600)
    assert imported.returncode == 0, imported.stderr
    ran = run([*ssh, "docker run --rm --network host kiln-tiny /bin/sh -c 'echo $((6 * 7))'"], timeout=600)
    assert ran.returncode == 0 and ran.stdout.strip() == "42", ran.stdout + ran.stderr
    driver = run([*ssh, "docker info --format '{{.CgroupDriver}}'"], timeout=120)
    assert driver.stdout.strip() == "cgroupfs", driver.stdout + driver.stderr
    assert run([*ssh, "docker rmi kiln-tiny"], timeout=300).returncode == 0


def test_a_second_provisioning_run_changes_nothing(baked_image, baked_vm):
    ssh_config, port = baked_vm
    fingerprint = json.loads((baked_image / "image.json").read_text())["fingerprint"]
    started = time.monotonic()
    result = playbook(ssh_config, ANSIBLE / "image.yml", "-e", "kiln_image_profile=cpu",
                      "-e", f"kiln_image_fingerprint={fingerprint}",
                      "-e", f"tensorflow_wheelhouse_url=http://10.0.2.2:{port}/")
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    counts = recap(result.stdout)
    changed = [line for line in result.stdout.splitlines() if line.startswith("changed:")]
    assert counts["changed"] == 0, f"the second run changed {changed}:\n{result.stdout[-4000:]}"
    print(f"second provisioning run on the baked image: {seconds:.0f} s, {counts}")
