"""Slurm in a machine image (the slurm role): the daemons, the client tools, MUNGE and the PMIx plugin, at the
matrix's release or a later one, with nothing of a cluster in them (no MUNGE key, no configuration, off at boot).
kiln starts them per cluster; these hold on a captured image and on a live node of a queue alike."""

from __future__ import annotations

import pytest
from kiln_infra import run_checked

pytestmark = pytest.mark.image

TOOLS = ["slurmd", "slurmctld", "sbatch", "srun", "scontrol", "sinfo", "munged", "munge"]


def release(version: str) -> tuple[int, ...]:
    """22.05.8-4+deb12u3 (or 1:21.08.5-2ubuntu1) -> (22, 5, 8)."""
    upstream = version.split(":", 1)[-1].split("-", 1)[0]
    return tuple(int(part) for part in upstream.split(".") if part.isdigit())


@pytest.mark.parametrize("tool", TOOLS)
def test_the_tool_is_installed(host, tool, machine_image):
    assert host.exists(tool), f"{tool} is not on the image's PATH"


def test_the_release_is_the_matrix_or_later_and_the_manifest_says_which(host, matrix, manifest, machine_image):
    installed = run_checked(host, "dpkg-query --showformat='${Version}' --show slurmd").stdout.strip()
    assert release(installed) >= release(matrix["slurm_min_release"]), (
        f"Slurm {installed}: the matrix wants {matrix['slurm_min_release']} or later")
    recorded = manifest.get("installed", {}).get("slurm_min_release") or "0"
    assert release(recorded) == release(installed), f"the manifest records Slurm {recorded}, the image has {installed}"


def test_srun_has_the_pmix_plugin(host, machine_image):
    """srun --mpi=pmix's plugin (srun --mpi=list reads a cluster's slurm.conf first, which an image has none of)."""
    found = run_checked(host, "find /usr/lib -path '*slurm*' -name 'mpi_pmix*.so'").stdout.split()
    assert found, "no mpi_pmix plugin under /usr/lib: srun --mpi=pmix would fail"


def test_the_image_has_no_munge_key(host, machine_image):
    assert not host.file("/etc/munge/munge.key").exists, "a MUNGE key in the image: its every cluster would share it"


def test_the_image_has_no_cluster_configuration(host, machine_image):
    found = [path for path in ("/etc/slurm/slurm.conf", "/etc/slurm/gres.conf") if host.file(path).exists]
    assert not found, f"cluster configuration baked in: {found}"


@pytest.mark.parametrize("unit", ["slurmd.service", "slurmctld.service", "munge.service"])
def test_the_service_is_off_at_boot(host, unit, machine_image):
    state = host.run(f"systemctl is-enabled {unit}").stdout.strip()
    assert state in ("disabled", "masked"), f"{unit} is {state or 'unknown'}: kiln starts it per cluster"
