"""localcloud.vmspec: a local VM's qemu argv, NoCloud seed and ssh config (exact output, no qemu needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.errors import UsageError
from localcloud.vmspec import (
    VmSpec,
    check_hostname,
    qemu_argv,
    seed_meta_data,
    seed_user_data,
    ssh_config_text,
    storage_daemon_argv,
)


def spec(**overrides) -> VmSpec:
    values = {"disk": Path("/i/disk.qcow2"), "kernel": Path("/i/vmlinuz"), "initrd": Path("/i/initrd.img"),
              "state": Path("/s"), "port": 2222}
    return VmSpec(**{**values, **overrides})


def test_qemu_boots_the_kernel_under_tcg_with_ssh_forwarded_from_loopback():
    assert qemu_argv(spec()) == [
        "qemu-system-x86_64", "-name", "kiln-vm,debug-threads=on", "-nodefaults", "-no-user-config",
        "-machine", "q35", "-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "4096",
        "-kernel", "/i/vmlinuz", "-initrd", "/i/initrd.img", "-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0",
        "-drive", "file=/i/disk.qcow2,if=virtio,format=qcow2",
        "-drive", "file=/s/seed.iso,if=virtio,format=raw,readonly=on",
        "-netdev", "user,id=net0,hostfwd=tcp:127.0.0.1:2222-:22", "-device", "virtio-net-pci,netdev=net0",
        "-device", "virtio-rng-pci", "-display", "none", "-serial", "file:/s/console.log",
        "-daemonize", "-pidfile", "/s/qemu.pid"]


def test_a_raw_disk_in_snapshot_mode_keeps_nothing():
    argv = qemu_argv(spec(disk=Path("/i/disk.raw"), snapshot=True, cpus=1, memory=1024))
    assert "file=/i/disk.raw,if=virtio,format=raw" in argv and argv[-1] == "-snapshot"
    assert argv[argv.index("-smp") + 1] == "1" and argv[argv.index("-m") + 1] == "1024"


def test_the_seed_authorizes_keys_for_root_only_and_names_the_instance():
    assert seed_meta_data("kiln-ab12", "vm1") == "instance-id: kiln-ab12\nlocal-hostname: vm1\n"
    assert seed_user_data(["ssh-ed25519 AAAA a@b\n", "ssh-ed25519 BBBB c@d"]) == (
        "#cloud-config\ndisable_root: false\nssh_pwauth: false\nusers: []\nssh_authorized_keys:\n"
        "  - ssh-ed25519 AAAA a@b\n  - ssh-ed25519 BBBB c@d\n")


def test_a_data_volume_is_the_third_disk_and_its_settings_ride_in_the_seed():
    argv = qemu_argv(spec(data_disk=Path("/s/data.img")))
    drives = [argv[i + 1] for i, word in enumerate(argv) if word == "-drive"]
    assert drives == ["file=/i/disk.qcow2,if=virtio,format=qcow2", "file=/s/seed.iso,if=virtio,format=raw,readonly=on",
                      "file=/s/data.img,if=virtio,format=raw"]
    assert seed_user_data(["ssh-ed25519 AAAA a@b"], [{"path": "/etc/kiln/data-volume.json", "content": "{}\n"}]) == (
        "#cloud-config\ndisable_root: false\nssh_pwauth: false\nusers: []\nssh_authorized_keys:\n"
        "  - ssh-ed25519 AAAA a@b\n"
        'write_files: [{"content": "{}\\n", "path": "/etc/kiln/data-volume.json"}]\n')


def test_the_ssh_config_checks_the_pinned_host_key():
    text = ssh_config_text(Path("/s"), 2222)
    assert "Host kiln-vm\n  HostName 127.0.0.1\n  Port 2222\n  User root\n" in text
    assert "  UserKnownHostsFile /s/known_hosts\n  StrictHostKeyChecking yes\n" in text
    assert "  IdentityFile /s/id_ed25519\n  IdentitiesOnly yes\n" in text


@pytest.mark.parametrize("name", ["Kiln", "-vm", "vm-", "a" * 64, "vm_1", ""])
def test_bad_hostnames_are_refused_as_usage_errors(name):
    with pytest.raises(UsageError, match="invalid hostname"):
        check_hostname(name)
    assert check_hostname("kiln-vm1") == "kiln-vm1"


def test_a_qcow2_disk_is_served_raw_and_read_only_through_its_format_layer():
    argv = storage_daemon_argv(Path("/i/kiln.qcow2"), "qcow2", Path("/s/raw"))
    assert argv == ["qemu-storage-daemon",
                    "--blockdev", "driver=file,filename=/i/kiln.qcow2,node-name=file,read-only=on",
                    "--blockdev", "driver=qcow2,file=file,node-name=disk,read-only=on",
                    "--export", "type=fuse,id=disk,node-name=disk,mountpoint=/s/raw,writable=off"]


def test_a_raw_disk_is_exported_as_it_is():
    argv = storage_daemon_argv(Path("/i/disk.raw"), "raw", Path("/s/raw"))
    assert argv == ["qemu-storage-daemon",
                    "--blockdev", "driver=file,filename=/i/disk.raw,node-name=file,read-only=on",
                    "--export", "type=fuse,id=disk,node-name=file,mountpoint=/s/raw,writable=off"]
