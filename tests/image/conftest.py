"""Fixtures for the slow image tests: a real local bake (qemu under TCG) and VMs booted from it.

The bake's images are kept in the cache (KILN_CACHE's image-test/), one: a run whose bake inputs (the fingerprint:
templates, roles, the matrix, the base disk, the wheelhouse) are those of the image there boots that image, as
`make image` reuses an unchanged one; any change to them bakes again, for real. KILN_IMAGE_TEST_FRESH=1 bakes in
a fresh folder whatever is cached. The VMs boot throwaway overlays: the kept image is never written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bake.provision import ANSIBLE, playbook, recap, served, wheelhouse  # noqa: F401 (the tests' helpers)
from kiln.paths import PROJECT as ROOT
from kiln.paths import cache_dir
from localcloud.vm import booted

SCRIPTS = ROOT / "scripts"
BAKED_HOSTNAME = "kiln-again"  # the image tests' VM's, from its seed


def pytest_configure(config):
    config.addinivalue_line("markers", "image_bake: bakes and boots real local images under qemu (slow, root)")


def run(argv: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def images_dir(tmp_path_factory) -> Path:
    """The images folder of the image tests: kept in the cache (an unchanged bake is not baked again), or fresh
    with KILN_IMAGE_TEST_FRESH=1."""
    if os.environ.get("KILN_IMAGE_TEST_FRESH"):
        return tmp_path_factory.mktemp("images")
    kept = cache_dir() / "image-test"
    kept.mkdir(parents=True, exist_ok=True)
    return kept


@pytest.fixture(scope="session")
def baked_image(images_dir) -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root (debootstrap for the base disk)")
    result = run([sys.executable, "-m", "bake.image", "local"], timeout=5400, env={"KILN_IMAGES": str(images_dir)})
    assert result.returncode == 0, f"the local bake failed:\n{result.stdout[-8000:]}\n{result.stderr[-3000:]}"
    image = Path(result.stdout.strip().splitlines()[-1].rsplit(": ", 1)[-1])
    assert (image / "image.json").is_file(), f"bake.image named no image: {result.stdout[-2000:]}"
    for other in images_dir.iterdir():  # one image kept: the others were baked from other inputs
        if other != image:
            shutil.rmtree(other, ignore_errors=True)
    reused = "up to date" in result.stdout
    SAID.append(f"image-test: {'reused the image baked from these very inputs,' if reused else 'baked'} "
                f"{image.name}{' (KILN_IMAGE_TEST_FRESH=1 bakes anyway)' if reused else ''}")
    return image


SAID: list[str] = []


def pytest_terminal_summary(terminalreporter):
    for line in SAID:
        terminalreporter.write_line(line)


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: the controller prints what it said
        session.config.workeroutput["said-image"] = SAID


def pytest_testnodedown(node, error):
    SAID.extend(getattr(node, "workeroutput", {}).get("said-image", []))


@pytest.fixture(scope="package")
def baked_vm(baked_image, tmp_path_factory):
    """The baked image booted once on a throwaway overlay for the tests that provision it again, with the
    wheelhouse served to it and a blank data volume attached (as kiln up --volume gives a node): yields
    (ssh_config, wheelhouse port). The image tests' own: it powers off when a worker moves on to other tests (in
    make test, the integration modules), where an idle guest under TCG held a core's share for the rest of the
    session."""
    state = tmp_path_factory.mktemp("baked-vm")
    # One virtual CPU: make test runs this beside workers of cluster tests on 2 cores, where a second vCPU thread
    # only waits its turn (a guest's vCPU held off the host's cores spins its peers on kernel locks, under TCG)
    with booted(baked_image, state / "vm", BAKED_HOSTNAME, data_gib=1, cpus=1) as ssh_config, \
            served(wheelhouse()) as port:
        yield ssh_config, port
