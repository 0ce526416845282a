"""bake.verify: which of the suite's checks a local image's disk answers and which its boot does, and the
refusals that come before anything runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bake import verify
from kiln.paths import PROJECT


def selected(markers: str) -> set[str]:
    """The infra suite's tests that `-m markers` selects (collected on this machine, nothing run)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only",
                           "-p", "no:randomly", str(PROJECT / "tests" / "infra"), "-m", markers],
                          capture_output=True, text=True, timeout=120, cwd=PROJECT)
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_a_local_images_disk_and_boot_together_run_every_check_of_an_image():
    """Every check `make verify` ran on a booted image runs on its disk or on it booted; the kernel's and devices'
    only on it booted; a boot's checks on both (a disk that never booted has none of what a boot makes)."""
    disk, boot = selected(verify.DISK_MARKERS), selected(verify.BOOT_MARKERS)
    assert disk and boot
    assert selected("image or gpu or fabric") == disk | boot
    assert selected("machine") <= boot - disk
    assert selected("gpu") <= boot - disk
    both = disk & boot
    assert any("test_nothing_is_left_from_the_bake" in test for test in both), sorted(both)
    assert any("test_tensorflow_and_tf_keras_import" in test for test in disk - boot), sorted(disk)


@pytest.mark.parametrize("argv", [["--no-boot", "--hosts", "ssh://h"], ["--no-boot", "--local"]])
def test_no_boot_is_a_local_images_alone(argv, capsys):
    assert verify.main(argv) == 2
    assert "--no-boot: a local image's" in capsys.readouterr().err
