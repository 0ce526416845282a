"""The local VM path: bake.base_image makes (or reuses) the Debian 12 base disk, localcloud.vm boots an image under
qemu (TCG, snapshot mode) like a cloud instance, and SSH to it checks the host key it printed on its console.

The VM is the image tests' own (tests/image/conftest.py: the local bake booted once, by `localcloud.vm boot` as
`make verify` boots it): one boot under TCG, not two, serves test_bake_local's tests and these. This module runs
after them in the same worker (tests/integration/conftest.py: SHARED_SESSION, LONGEST_FIRST; alone, its name sorts
last in tests/image), and its last test powers that VM off."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import BAKED_HOSTNAME

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = ["-m", "bake.base_image"]
VM = ["-m", "localcloud.vm"]
TOOLS = ("debootstrap", "mkfs.ext4", "qemu-img", "qemu-system-x86_64", "genisoimage", "ssh", "ssh-keygen")

MIRROR = "http://deb.debian.org/debian"
HELLO = "pool/main/h/hello/hello_2.10-3_amd64.deb"  # bookworm's, as its Packages list gives it
HELLO_SHA256 = "2e6e2f1a0007dc43bc91c273fd36e91e40a4f1c2765a03eca68b70a42103878a"
# A cold base disk build (debootstrap) takes minutes; the image tests' VM is booted already (or boots here, alone).
pytestmark = [pytest.mark.image_bake, pytest.mark.timeout(2400)]


def run(argv: list[str], timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def process_running(pid: int) -> bool:
    """pid exists and is not a zombie (a daemonized qemu is reaped by init, whenever init gets to it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def qemus_of(state: Path) -> list[int]:
    """Running qemu processes whose command line names the state directory."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and b"qemu-system" in cmdline and str(state).encode() in cmdline:
            found.append(int(entry.name))
    return [pid for pid in found if process_running(pid)]


@dataclass
class Vm:
    state: Path
    record: dict
    base: Path

    @property
    def console(self) -> str:
        return (self.state / "console.log").read_text(errors="replace")

    def ssh(self, command: str, timeout: float = 120, *options: str) -> subprocess.CompletedProcess:
        """Log in as the operator would: the VM's own ssh config, host key checked."""
        return run(["ssh", "-F", self.state / "ssh_config", *options, "kiln-vm", command], timeout=timeout)

    def evidence(self, done: subprocess.CompletedProcess) -> str:
        return f"rc={done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}\nconsole tail:\n" + \
            "\n".join(self.console.splitlines()[-20:])


@pytest.fixture(scope="module")
def base_dir() -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root (debootstrap)")
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (scripts/setup installs them)")
    done = run([sys.executable, *BASE_IMAGE, "--print"], timeout=2400, check=True)
    return Path(done.stdout.strip())


@pytest.fixture(scope="module")
def vm(base_dir, baked_vm):
    """The image tests' VM (booted by `localcloud.vm boot --hostname kiln-again`, its state beside its ssh_config)."""
    state = Path(baked_vm[0]).parent
    return Vm(state, json.loads((state / "vm.json").read_text()), base_dir)


def test_base_disk_is_reused_with_its_files(base_dir):
    again = run([sys.executable, *BASE_IMAGE, "--print"], timeout=60, check=True)
    assert Path(again.stdout.strip()) == base_dir
    meta = json.loads((base_dir / "base.json").read_text())
    assert meta["suite"] == "bookworm" and meta["key"] in base_dir.name
    assert (base_dir / "bake_key").stat().st_mode & 0o077 == 0
    for name in ("vmlinuz", "initrd.img"):
        assert (base_dir / name).stat().st_mode & 0o044 == 0o044, f"{name} is not readable"


def test_hostname_comes_from_the_seed(vm):
    done = vm.ssh("hostname")
    assert done.returncode == 0, vm.evidence(done)
    assert done.stdout.strip() == BAKED_HOSTNAME


def test_root_logs_in_with_the_per_boot_key_only(vm, tmp_path):
    per_boot = (vm.state / "id_ed25519.pub").read_text().split()[1]
    done = vm.ssh("id -un; cat /root/.ssh/authorized_keys")
    assert done.returncode == 0, vm.evidence(done)
    assert done.stdout.splitlines()[0] == "root"
    assert per_boot in done.stdout
    stranger = tmp_path / "stranger"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", stranger], check=True)
    config = tmp_path / "ssh_config"
    config.write_text((vm.state / "ssh_config").read_text().replace(str(vm.state / "id_ed25519"), str(stranger)))
    refused = run(["ssh", "-F", config, "kiln-vm", "true"], timeout=60)
    assert refused.returncode == 255 and "Permission denied" in refused.stderr, vm.evidence(refused)


def test_apt_reaches_debians_mirror(vm):
    """apt's own transport (apt-helper) fetches bookworm's Release and a package from Debian's pool, checked against
    its SHA256: the VM's network reaches the mirror. The image's lists and cache stay as baked, and nothing parses
    bookworm's lists under TCG (30-80 s of a core)."""
    helper = "/usr/lib/apt/apt-helper download-file"
    done = vm.ssh(f"cd /tmp && {helper} {MIRROR}/dists/bookworm/Release Release && grep '^Codename:' Release && "
                  f"{helper} {MIRROR}/{HELLO} hello.deb SHA256:{HELLO_SHA256} && dpkg-deb -f hello.deb Package",
                  timeout=600)
    assert done.returncode == 0, vm.evidence(done)
    assert "Codename: bookworm" in done.stdout and done.stdout.strip().splitlines()[-1] == "hello"


def test_python_is_3_11(vm):
    done = vm.ssh("python3 -c 'import sys; print(*sys.version_info[:2])'")
    assert done.returncode == 0, vm.evidence(done)
    assert done.stdout.split() == ["3", "11"]


def test_host_key_pinned_from_the_console(vm):
    known = (vm.state / "known_hosts").read_text().splitlines()
    assert known and all(line.startswith(f"[127.0.0.1]:{vm.record['port']} ") for line in known)
    done = vm.ssh("cat /etc/ssh/ssh_host_*_key.pub")
    assert done.returncode == 0, vm.evidence(done)
    served = {" ".join(line.split()[:2]) for line in done.stdout.splitlines()}
    assert {" ".join(line.split()[1:3]) for line in known} == served


def test_changed_host_key_is_refused(vm, tmp_path):
    impostor = tmp_path / "impostor"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", impostor], check=True)
    wrong = f"[127.0.0.1]:{vm.record['port']} {' '.join(impostor.with_suffix('.pub').read_text().split()[:2])}\n"
    config = tmp_path / "ssh_config"
    config.write_text((vm.state / "ssh_config").read_text().replace(str(vm.state / "known_hosts"),
                                                                    str(tmp_path / "known_hosts")))
    (tmp_path / "known_hosts").write_text(wrong)
    done = run(["ssh", "-F", config, "kiln-vm", "true"], timeout=60)
    assert done.returncode == 255, vm.evidence(done)
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in done.stderr or "Host key verification failed" in done.stderr
    assert (tmp_path / "known_hosts").read_text() == wrong, "ssh must not rewrite the pinned known_hosts"


def test_boot_timeout_names_the_console_and_kills_qemu(base_dir, tmp_path):
    state = tmp_path / "slow"
    done = run([sys.executable, *VM, "boot", "--disk", base_dir / "disk.qcow2", "--kernel", base_dir / "vmlinuz",
                "--initrd", base_dir / "initrd.img", "--state", state, "--snapshot", "--memory", "1024",
                "--timeout", "3"], timeout=120)
    assert done.returncode == 1
    assert "timed out after 3 s" in done.stderr and str(state / "console.log") in done.stderr
    assert not (state / "vm.json").exists()
    assert run([sys.executable, *VM, "status", "--state", state]).returncode == 3
    assert not qemus_of(state), "qemu was left running after a failed boot"


@pytest.mark.after_the_rest("one boot under TCG serves the image tests, and this powers that VM off")
def test_stop_powers_off_and_is_idempotent(vm):
    pid = vm.record["pid"]
    first = run([sys.executable, *VM, "stop", "--state", vm.state, "--timeout", "60"], timeout=180)
    assert first.returncode == 0, first.stderr
    assert "powered off" in first.stderr, first.stderr
    assert not process_running(pid), "qemu is still running after stop"
    assert not qemus_of(vm.state), "a qemu of this VM's state directory is left"
    assert run([sys.executable, *VM, "stop", "--state", vm.state]).returncode == 0
    assert run([sys.executable, *VM, "status", "--state", vm.state]).returncode == 3
