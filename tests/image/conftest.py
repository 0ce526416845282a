"""Fixtures for the slow image tests: a real local bake (qemu under TCG) and VMs booted from it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
ANSIBLE = ROOT / "ansible"


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
    result = run([sys.executable, str(SCRIPTS / "image"), "local"], timeout=5400, env={"KILN_IMAGES": str(images_dir)})
    assert result.returncode == 0, f"the local bake failed:\n{result.stdout[-8000:]}\n{result.stderr[-3000:]}"
    found = list(images_dir.glob("local-cpu-*/image.json"))
    assert len(found) == 1, f"expected one image in {images_dir}, found {found}"
    return found[0].parent


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    result = run([str(SCRIPTS / "wheelhouse"), "build", "--print"], timeout=1800)
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def baked_vm(baked_image, wheelhouse, tmp_path_factory):
    """The baked image booted once on a throwaway overlay for the tests that provision it again, with the
    wheelhouse served to it: yields (ssh_config, wheelhouse port)."""
    state = tmp_path_factory.mktemp("baked-vm")
    with booted_vm(baked_image, state / "vm", "kiln-again") as ssh_config, served(wheelhouse) as port:
        yield ssh_config, port


@contextlib.contextmanager
def booted_vm(image: Path, state: Path, hostname: str):
    record = json.loads((image / "image.json").read_text())
    boot = run([sys.executable, str(SCRIPTS / "vm"), "boot", "--snapshot", "--state", str(state),
                "--hostname", hostname, "--disk", str(image / record["disk"]),
                "--kernel", str(image / record["kernel"]), "--initrd", str(image / record["initrd"])], timeout=900)
    try:
        assert boot.returncode == 0, f"the image did not boot:\n{boot.stdout}\n{boot.stderr}"
        yield state / "ssh_config"
    finally:
        run([sys.executable, str(SCRIPTS / "vm"), "stop", "--state", str(state)], timeout=180)


@contextlib.contextmanager
def served(folder: Path):
    """Serve a folder on 127.0.0.1 (the VM reaches it as 10.0.2.2); yield the port."""
    server = subprocess.Popen([str(SCRIPTS / "wheelhouse"), "serve", str(folder), "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield int(re.search(r"port (\d+)", server.stdout.readline()).group(1))
    finally:
        server.terminate()
        server.wait(timeout=30)


def playbook(ssh_config: Path, play: Path, *extra: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    """ansible-playbook against the VM over its own ssh config (host key pinned by scripts/vm)."""
    env = {"ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "ANSIBLE_SSH_ARGS": f"-F {ssh_config}"}
    return run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "kiln-vm,", *extra, str(play)],
               timeout=timeout, env=env)


def recap(output: str) -> dict[str, int]:
    """The PLAY RECAP counters of the one host."""
    match = re.search(r"kiln-vm\s*:\s*(.*)", output.split("PLAY RECAP")[-1])
    assert match, f"no PLAY RECAP in:\n{output[-3000:]}"
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}
