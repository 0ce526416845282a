"""Fixtures for the slow image tests: a real local bake (qemu under TCG) and VMs booted from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bake.provision import ANSIBLE, playbook, recap, served, wheelhouse  # noqa: F401 (the tests' helpers)
from kiln.paths import PROJECT as ROOT
from testbed.vm import booted

SCRIPTS = ROOT / "scripts"


def pytest_configure(config):
    config.addinivalue_line("markers", "image_bake: bakes and boots real local images under qemu (slow, root)")


def run(argv: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def images_dir(tmp_path_factory) -> Path:
    """A fresh images folder: the tests bake for real rather than reuse one from the cache."""
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="session")
def baked_image(images_dir) -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root (debootstrap for the base disk)")
    result = run([sys.executable, "-m", "bake.image", "local"], timeout=5400, env={"KILN_IMAGES": str(images_dir)})
    assert result.returncode == 0, f"the local bake failed:\n{result.stdout[-8000:]}\n{result.stderr[-3000:]}"
    found = list(images_dir.glob("local-cpu-*/image.json"))
    assert len(found) == 1, f"expected one image in {images_dir}, found {found}"
    return found[0].parent


@pytest.fixture(scope="session")
def baked_vm(baked_image, tmp_path_factory):
    """The baked image booted once on a throwaway overlay for the tests that provision it again, with the
    wheelhouse served to it and a blank data volume attached (as kiln up --volume gives a node): yields
    (ssh_config, wheelhouse port)."""
    state = tmp_path_factory.mktemp("baked-vm")
    with booted(baked_image, state / "vm", "kiln-again", data_gib=1) as ssh_config, served(wheelhouse()) as port:
        yield ssh_config, port
