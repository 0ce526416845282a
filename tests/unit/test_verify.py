"""bake.verify: which of the suite's checks a local image's disk answers and which its boot does, and the
refusals that come before anything runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bake import verify
from kiln.errors import UsageError
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


@pytest.mark.parametrize("extra, chosen", [
    ([], None), (["-rA"], None), (["-m", "gpu"], "gpu"), (["-mgpu"], "gpu"), (["--markexpr", "image"], "image"),
    (["--markexpr=image or boot"], "image or boot"), (["-m", "image", "-m", "gpu"], "gpu"), (["--maxfail=1"], None),
])
def test_the_markers_pytest_arguments_choose_are_read_as_pytest_reads_them(extra, chosen):
    assert verify.chosen_markers(extra) == chosen


def test_a_local_image_is_read_from_its_disk_then_booted_as_root_and_only_booted_otherwise():
    assert verify.parts(["-rA"], no_boot=False, root=True) == [
        ("disk", ["-m", verify.DISK_MARKERS, "-rA"]), ("booted", ["-m", verify.BOOT_MARKERS, "-rA"])]
    assert verify.parts([], no_boot=True, root=True) == [("disk", ["-m", verify.DISK_MARKERS])]
    assert verify.parts([], no_boot=False, root=False) == [("booted", ["-m", "image or gpu or fabric"])]


def test_a_users_own_markers_run_in_one_place():
    assert verify.parts(["-mgpu"], no_boot=False, root=True) == [("booted", ["-mgpu"])]
    assert verify.parts(["-m", "image"], no_boot=True, root=True) == [("disk", ["-m", "image"])]
    assert verify.parts(["-m", "image"], no_boot=False, root=False) == [("booted", ["-m", "image"])]


def test_no_boot_without_root_is_refused_with_one_line():
    with pytest.raises(UsageError, match="--no-boot: reading the image's disk takes root"):
        verify.parts([], no_boot=True, root=False)


@pytest.mark.parametrize("codes, code", [
    ([0, 0], 0), ([1, 0], 1), ([0, 1], 1), ([5, 0], 0), ([0, 5], 0), ([5, 5], 5), ([5, 1], 1), ([4], 4), ([0], 0),
])
def test_the_parts_exit_with_the_first_failure_and_none_selected_only_where_neither_selected_any(codes, code):
    assert verify.combined(codes) == code
