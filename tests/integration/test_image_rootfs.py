"""The image suite against a real captured image: a Debian 12 root filesystem baked natively with the
same playbooks Packer runs (Ansible's chroot connection), then cleaned. The suite passes on it, and
each mutation (a leftover authorized_keys, a wrong TensorFlow, no host-key regeneration) makes it
fail with a message that names the problem.

The captured root filesystem is kept in the cache (rootfs-test/, one, as a tar) by its bake's inputs, the rule
the local and container bakes' tests follow: a run whose inputs (roles, the matrix, the base tree, the
wheelhouse, scripts/bake-rootfs) are those of the kept one unpacks it; any change bakes again, for real, and
KILN_IMAGE_TEST_FRESH=1 always does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FRESH, SAID

from bake import base_image, plan, provision
from kiln.paths import cache_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
XATTRS = ("--xattrs", "--xattrs-include=*")  # file capabilities kept, as an image keeps them


def bake(rootfs: Path, base: Path, wheelhouse: Path) -> None:
    """The base tree unpacked into `rootfs`, baked and cleaned there."""
    subprocess.run(["tar", "-xf", str(base / "rootfs.tar"), "-C", str(rootfs)], check=True, timeout=600)
    with provision.served(wheelhouse) as port:
        done = subprocess.run(
            [str(SCRIPTS / "bake-rootfs"), str(rootfs), "--cleanup", "--",
             "-e", f"tensorflow_wheelhouse_url=http://127.0.0.1:{port}/"],
            capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert done.returncode == 0, f"the rootfs bake failed:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def captured_rootfs(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root (chroot, bind mounts)")
    base = base_image.ensure(cache_dir())
    wheelhouse = provision.wheelhouse()
    inputs = {"base": base.name, "wheelhouse": wheelhouse.name,
              "bake-rootfs": (SCRIPTS / "bake-rootfs").read_text()}
    kept = cache_dir() / "rootfs-test" / f"captured-{plan.fingerprint(ROOT, 'rootfs', 'cpu', inputs)}.tar"
    rootfs = tmp_path_factory.mktemp("captured") / "rootfs"
    rootfs.mkdir()
    try:
        if kept.is_file() and not FRESH:
            subprocess.run(["tar", "-xf", str(kept), *XATTRS, "-C", str(rootfs)], check=True, timeout=600)
            SAID.append(f"captured rootfs: reused the tree baked from these very inputs, {kept.name} "
                        "(KILN_IMAGE_TEST_FRESH=1 bakes anyway)")
        else:
            bake(rootfs, base, wheelhouse)
            SAID.append(f"captured rootfs: baked {kept.name}")
            if not FRESH:  # kept before any test changes it; one kept: those of other inputs go
                kept.parent.mkdir(parents=True, exist_ok=True)
                for other in kept.parent.glob("captured-*.tar*"):
                    other.unlink()
                partial = kept.with_suffix(".tar.partial")
                subprocess.run(["tar", "-cf", str(partial), *XATTRS, "--one-file-system", "-C", str(rootfs), "."],
                               check=True, timeout=600)
                partial.rename(kept)
        yield rootfs
    finally:
        subprocess.run(["umount", "-R", "-l", str(rootfs / "proc"), str(rootfs / "sys"), str(rootfs / "dev")],
                       capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", str(rootfs)], timeout=600)


def verify(rootfs: Path, *pytest_args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bake.verify", "--rootfs", str(rootfs), "--", "-m", "image",
                           "-rfE", *pytest_args], capture_output=True, text=True, timeout=900, cwd=ROOT)


def verify_fails_naming(rootfs: Path, said: str, undo: Callable[[], object], *pytest_args: str) -> str:
    """The suite's checks (`pytest_args`) on a mutated image, the mutation undone (`undo`) whatever happens: they
    fail (exit code 1) with `said` in their output; that output."""
    try:
        result = verify(rootfs, *pytest_args)
    finally:
        undo()
    assert result.returncode == 1, result.stdout[-3000:]
    assert said in result.stdout, result.stdout[-3000:]
    return result.stdout


def test_the_suite_passes_on_a_clean_captured_image(captured_rootfs):
    result = verify(captured_rootfs)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert re.search(r"\d+ passed", result.stdout), result.stdout[-2000:]


def test_a_leftover_authorized_keys_fails_naming_it(captured_rootfs):
    keys = captured_rootfs / "root" / ".ssh" / "authorized_keys"
    keys.parent.mkdir(mode=0o700, exist_ok=True)
    keys.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKiln0bake0key0left0behind0by0mistake00000000000 bake\n")
    said = verify_fails_naming(captured_rootfs, "authorized_keys left in the image", keys.unlink, "-k", "left")
    assert "/root/.ssh/authorized_keys" in said


def test_a_wrong_tensorflow_version_fails_naming_it(captured_rootfs):
    metadata = next((captured_rootfs / "opt" / "kiln" / "venv").glob("lib/python3*/site-packages/tensorflow-*"
                                                                      ".dist-info/METADATA"))
    original = metadata.read_text()
    metadata.write_text(re.sub(r"(?m)^Version: .*$", "Version: 2.17.0", original, count=1))
    verify_fails_naming(captured_rootfs, "tensorflow_version: the host has 2.17.0, the matrix wants",
                        lambda: metadata.write_text(original), "-k", "version")


def test_a_missing_host_key_generator_fails_naming_it(captured_rootfs):
    link = captured_rootfs / "etc" / "systemd" / "system" / "multi-user.target.wants" / "kiln-ssh-hostkeys.service"
    target = os.readlink(link)
    link.unlink()
    verify_fails_naming(captured_rootfs, "no host keys at first boot", lambda: link.symlink_to(target), "-k",
                        "first_boot or enabled")


def test_verify_leaves_no_bind_mounts_behind(captured_rootfs):
    verify(captured_rootfs, "-k", "manifest_is_well_formed")
    mounts = Path("/proc/mounts").read_text()
    assert str(captured_rootfs) not in mounts, "scripts/verify left bind mounts behind"
