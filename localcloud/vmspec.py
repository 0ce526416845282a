"""A local VM's plan: the qemu argv, the NoCloud seed and the ssh config (pure).

Nothing here touches the system; localcloud.vm does the I/O.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import UsageError

ALIAS = "kiln-vm"
DEFAULT_APPEND = "root=/dev/vda rw console=ttyS0 net.ifnames=0"
HOSTNAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class VmSpec:
    disk: Path
    kernel: Path
    initrd: Path
    state: Path
    port: int
    memory: int = 4096  # MiB
    cpus: int = 2
    snapshot: bool = False
    append: str = DEFAULT_APPEND
    data_disk: Path | None = None  # a blank raw disk, /dev/vdc: the node's data volume (kiln up --volume)

    @property
    def console(self) -> Path:
        return self.state / "console.log"

    @property
    def seed(self) -> Path:
        return self.state / "seed.iso"

    @property
    def pidfile(self) -> Path:
        return self.state / "qemu.pid"


def disk_format(disk: Path) -> str:
    return "qcow2" if disk.suffix == ".qcow2" else "raw"


def qemu_argv(spec: VmSpec, qemu: str = "qemu-system-x86_64") -> list[str]:
    """qemu under TCG (nested KVM hangs here), -cpu max (TensorFlow wants AVX), direct kernel boot, the disk as
    /dev/vda and the seed as /dev/vdb, user-mode networking with 127.0.0.1:port -> guest 22, serial to a file."""
    argv = [
        qemu, "-name", "kiln-vm,debug-threads=on", "-nodefaults", "-no-user-config",
        "-machine", "q35", "-accel", "tcg", "-cpu", "max", "-smp", str(spec.cpus), "-m", str(spec.memory),
        "-kernel", str(spec.kernel), "-initrd", str(spec.initrd), "-append", spec.append,
        "-drive", f"file={spec.disk},if=virtio,format={disk_format(spec.disk)}",
        "-drive", f"file={spec.seed},if=virtio,format=raw,readonly=on",
        "-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{spec.port}-:22",
        "-device", "virtio-net-pci,netdev=net0",
        "-device", "virtio-rng-pci",
        "-display", "none", "-serial", f"file:{spec.console}",
        "-daemonize", "-pidfile", str(spec.pidfile),
    ]
    if spec.data_disk:
        argv[argv.index("-netdev"):argv.index("-netdev")] = ["-drive", f"file={spec.data_disk},if=virtio,format=raw"]
    if spec.snapshot:
        argv.append("-snapshot")
    return argv


def check_hostname(name: str) -> str:
    if not HOSTNAME_RE.fullmatch(name):
        raise UsageError(f"invalid hostname {name!r}: lowercase letters, digits and '-', at most 63")
    return name


def seed_meta_data(instance_id: str, hostname: str) -> str:
    return f"instance-id: {instance_id}\nlocal-hostname: {hostname}\n"


def seed_user_data(public_keys: list[str], files: Sequence[dict] = ()) -> str:
    """cloud-config authorizing the keys for root only (no default user), key login only; `files` are
    cloud-init write_files entries (the data volume's settings, as kiln up --volume gives an instance)."""
    lines = ["#cloud-config", "disable_root: false", "ssh_pwauth: false", "users: []", "ssh_authorized_keys:"]
    lines += [f"  - {key.strip()}" for key in public_keys]
    if files:
        lines.append(f"write_files: {json.dumps(list(files), sort_keys=True)}")  # YAML reads JSON
    return "\n".join(lines) + "\n"


def ssh_config_text(state: Path, port: int) -> str:
    """An ssh config that logs in as root with the per-boot key and checks the host key pinned in state."""
    return (
        f"Host {ALIAS}\n"
        f"  HostName 127.0.0.1\n"
        f"  Port {port}\n"
        f"  User root\n"
        f"  IdentityFile {state / 'id_ed25519'}\n"
        f"  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {state / 'known_hosts'}\n"
        f"  StrictHostKeyChecking yes\n"
        f"  UpdateHostKeys no\n"
        f"  BatchMode yes\n"
        f"  ConnectTimeout 15\n"
        f"  ServerAliveInterval 15\n"
        f"  ServerAliveCountMax 4\n"
    )


def storage_daemon_argv(disk: Path, form: str, raw: Path) -> list[str]:
    """qemu-storage-daemon serving `disk` (of format `form`) read-only as the raw file `raw` (a FUSE export)."""
    nodes = ["--blockdev", f"driver=file,filename={disk},node-name=file,read-only=on"]
    if form != "raw":
        nodes += ["--blockdev", f"driver={form},file=file,node-name=disk,read-only=on"]
    return ["qemu-storage-daemon", *nodes, "--export",
            f"type=fuse,id=disk,node-name={'file' if form == 'raw' else 'disk'},mountpoint={raw},writable=off"]
