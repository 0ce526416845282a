"""The image's data-volume mounter (ansible/roles/base/files/kiln-data-volume), run for real as root against loop
devices on this machine: it formats a blank disk of the given size once, mounts it by label from then on (as a
volume restored from a snapshot, or moved to a replacement node, is), and refuses to guess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.quick]

MOUNTER = Path(__file__).resolve().parents[2] / "ansible" / "roles" / "base" / "files" / "kiln-data-volume"
SIZE = 32 * 2**20


@pytest.fixture
def loops(tmp_path):
    if os.geteuid() != 0 or not shutil.which("losetup") or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root, losetup and mkfs.ext4")
    made: list[str] = []

    def attach(size: int = SIZE, backing: Path | None = None) -> str:
        if backing is None:
            backing = tmp_path / f"disk{len(made)}.img"
            with open(backing, "wb") as disk:
                disk.truncate(size)
        device = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True,
                                check=True, timeout=30).stdout.strip()
        made.append(device)
        return device
    yield attach
    subprocess.run(["umount", "-q", str(tmp_path / "data")], timeout=30, check=False)
    for device in made:
        subprocess.run(["losetup", "--detach", device], timeout=30, check=False)


@pytest.fixture
def node(tmp_path):
    """The settings kiln's user data writes, aimed at loop devices and this test's own mount point and fstab."""
    label = f"kt-{uuid.uuid4().hex[:8]}"
    settings = tmp_path / "data-volume.json"
    settings.write_text(json.dumps({"label": label, "mount": str(tmp_path / "data"), "owner": "nobody",
                                    "size_bytes": SIZE, "device_types": ["loop"]}))
    fstab = tmp_path / "fstab"
    fstab.write_text("# kept\nUUID=1234 / ext4 defaults 0 1\n")

    def mount() -> subprocess.CompletedProcess:
        return subprocess.run([str(MOUNTER), "--settings", str(settings), "--fstab", str(fstab)],
                              capture_output=True, text=True, timeout=120)
    return {"label": label, "mount": mount, "data": tmp_path / "data", "fstab": fstab, "settings": settings}


def filesystem_label(device: str) -> str:
    return subprocess.run(["blkid", "-p", "-s", "LABEL", "-o", "value", device], capture_output=True, text=True,
                          timeout=30).stdout.strip()


def test_a_blank_disk_is_formatted_once_then_mounted_by_its_label(loops, node):
    assert node["mount"]().stdout.startswith("kiln-data-volume: no disk labelled")  # not attached yet: fine
    loops(SIZE + 2**20)  # a blank disk of another size is never touched
    device = loops()
    first = node["mount"]()
    assert first.returncode == 0, first.stderr
    assert f"formatted {device} as {node['label']}" in first.stdout
    assert filesystem_label(device) == node["label"]
    assert os.path.ismount(node["data"])
    assert node["data"].stat().st_uid == 65534  # owned by the login user the settings name
    (node["data"] / "checkpoint").write_text("step 40")
    assert node["fstab"].read_text() == (f"# kept\nUUID=1234 / ext4 defaults 0 1\nLABEL={node['label']} "
                                         f"{node['data']} ext4 defaults,nofail,x-systemd.device-timeout=10s 0 2\n")

    assert node["mount"]().returncode == 0  # already mounted: nothing to do
    subprocess.run(["umount", str(node["data"])], check=True, timeout=30)
    again = node["mount"]()  # a reboot, a restored snapshot, a replacement node: the data is there as it was
    assert again.returncode == 0 and f"formatted {device}" not in again.stdout, again.stdout
    assert f"{device} mounted at {node['data']}" in again.stdout
    assert (node["data"] / "checkpoint").read_text() == "step 40"
    assert node["fstab"].read_text().count(node["label"]) == 1


def test_it_never_guesses_between_two_blank_disks(loops, node):
    first, second = loops(), loops()
    refused = node["mount"]()
    assert refused.returncode == 1
    assert refused.stderr.strip() == (f"kiln-data-volume: 2 blank disks of {SIZE} bytes: {first}, {second}; "
                                      "kiln will not guess which to format")
    assert filesystem_label(first) == filesystem_label(second) == ""


def test_bad_settings_are_one_line_and_no_settings_is_no_volume(loops, node):
    node["settings"].write_text("{not json")
    broken = node["mount"]()
    assert broken.returncode == 1 and broken.stderr.startswith(f"kiln-data-volume: {node['settings']}: ")
    node["settings"].unlink()
    assert node["mount"]().returncode == 0


def test_a_disk_of_the_size_with_anything_on_it_is_never_formatted(loops, node):
    """A foreign filesystem or swap on a disk of exactly the asked size: not kiln's blank volume."""
    foreign, swap = loops(), loops()
    subprocess.run(["mkfs.ext4", "-q", "-L", "someone-else", foreign], check=True, timeout=60)
    subprocess.run(["mkswap", swap], check=True, timeout=60, capture_output=True)
    left = node["mount"]()
    assert left.returncode == 0 and left.stdout.startswith("kiln-data-volume: no disk labelled"), left.stdout
    assert filesystem_label(foreign) == "someone-else" and not os.path.ismount(node["data"])
    assert subprocess.run(["blkid", "-p", "-s", "TYPE", "-o", "value", swap], capture_output=True, text=True,
                          timeout=30).stdout.strip() == "swap"


def test_a_volume_restored_larger_than_its_filesystem_is_grown(loops, node, tmp_path):
    device = loops()
    assert node["mount"]().returncode == 0
    subprocess.run(["umount", str(node["data"])], check=True, timeout=30)
    subprocess.run(["losetup", "--detach", device], check=True, timeout=30)
    backing = tmp_path / "disk0.img"
    with open(backing, "r+b") as disk:  # the snapshot was 32 MiB; the new volume is 64
        disk.truncate(2 * SIZE)
    bigger = loops(backing=backing)
    grown = node["mount"]()
    assert grown.returncode == 0 and f"{bigger} mounted at" in grown.stdout, grown.stdout + grown.stderr
    assert os.statvfs(node["data"]).f_blocks * os.statvfs(node["data"]).f_frsize > 1.5 * SIZE
