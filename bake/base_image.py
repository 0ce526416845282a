"""usage: scripts/base-image [--cache DIR] [--print]

Make (or reuse) kiln's local base disk: a bootable Debian 12 (bookworm, amd64) qcow2 built without loop
devices or mounts (debootstrap a rootfs, `mkfs.ext4 -d`, `qemu-img convert`), with its kernel and initrd beside
it for direct kernel boot and an ed25519 "bake key" authorized for root.

Output: CACHE/base/debian12-KEY/{disk.qcow2,vmlinuz,initrd.img,rootfs.tar,bake_key,bake_key.pub,base.json}
(rootfs.tar: the same tree, for scripts/bake-rootfs), where CACHE is
--cache or ${KILN_CACHE:-~/.cache/kiln} and KEY hashes this file and its inputs (suite, mirrors, packages): a
change rebuilds, otherwise the disk is reused. --print prints only the output directory (for make and scripts).
Needs root, debootstrap, e2fsprogs (mkfs.ext4 -d) and qemu-utils.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kiln import proc
from kiln.errors import KilnError, run_main
from kiln.paths import cache_dir

SUITE = "bookworm"
ARCH = "amd64"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
COMPONENTS = "main contrib non-free non-free-firmware"
DISK_SIZE = "16G"
LABEL = "kiln-root"
PACKAGES = (
    "systemd-sysv", "udev", "dbus", "kmod", "linux-image-cloud-amd64", "initramfs-tools",
    "openssh-server", "python3", "python3-venv", "python3-apt", "sudo", "ca-certificates", "curl", "gnupg",
    "cloud-init", "systemd-timesyncd", "iproute2", "ifupdown", "isc-dhcp-client", "netbase", "rsync", "procps",
    "less", "zstd",
    # debootstrap does not resolve virtual packages: python3-cryptography (for cloud-init) needs the provider of
    # python3-cffi-backend-api-min/max named.
    "python3-cffi-backend",
)
# Files written into the rootfs (path -> text). Networking: ifupdown + dhclient on eth0 (net.ifnames=0 on the
# kernel command line); under qemu's user-mode network DHCP hands out 10.0.2.15 and DNS 10.0.2.3.
FILES = {
    "etc/apt/sources.list": (
        f"deb {MIRROR} {SUITE} {COMPONENTS}\n"
        f"deb {MIRROR} {SUITE}-updates {COMPONENTS}\n"
        f"deb {SECURITY_MIRROR} {SUITE}-security {COMPONENTS}\n"
    ),
    "etc/fstab": f"LABEL={LABEL} / ext4 errors=remount-ro 0 1\n",
    "etc/hostname": "kiln-base\n",
    "etc/hosts": "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
    "etc/network/interfaces": (
        "source /etc/network/interfaces.d/*\n\nauto lo\niface lo inet loopback\n\nauto eth0\niface eth0 inet dhcp\n"
    ),
    # First boot without a seed must not wait for metadata services: NoCloud (a cidata seed) or nothing.
    # Root logs in by key only (Debian's sshd default: prohibit-password); cloud-init must not block root
    # keys or create a default user, and must leave the network to ifupdown above.
    "etc/cloud/cloud.cfg.d/90-kiln.cfg": (
        "# kiln base disk (scripts/base-image)\n"
        "datasource_list: [NoCloud, None]\n"
        "disable_root: false\n"
        "ssh_pwauth: false\n"
        "users: []\n"
        "network: {config: disabled}\n"
        "ssh_genkeytypes: [ed25519, ecdsa, rsa]\n"
        "locale: false\n"  # no `locales` package (update-locale); C.UTF-8 is built into glibc
    ),
    "etc/default/locale": "LANG=C.UTF-8\n",
    "etc/ssh/sshd_config.d/50-kiln.conf": "PermitRootLogin prohibit-password\nPasswordAuthentication no\n",
    "etc/initramfs-tools/conf.d/resume": "RESUME=none\n",
}


def input_key(script: bytes) -> str:
    """The cache key: this script's content (which holds every file it writes) and the build inputs."""
    inputs = json.dumps({"suite": SUITE, "arch": ARCH, "mirror": MIRROR, "security": SECURITY_MIRROR,
                         "components": COMPONENTS, "packages": sorted(PACKAGES), "size": DISK_SIZE}, sort_keys=True)
    return hashlib.sha256(script + b"\0" + inputs.encode()).hexdigest()[:12]


def run(argv: list[str], timeout: float) -> None:
    print(f"base-image: {proc.shown(argv, 6)}", file=sys.stderr)
    proc.run(argv, timeout=timeout)


def configure_rootfs(rootfs: Path, bake_pub: str) -> None:
    for rel, text in FILES.items():
        path = rootfs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    ssh = rootfs / "root/.ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text(bake_pub)
    (ssh / "authorized_keys").chmod(0o600)
    # Nothing that must be unique per machine: host keys come from cloud-init at first boot, machine-id from
    # systemd (an empty file means "generate"), and the resolver from DHCP.
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (rootfs / "etc/machine-id").write_text("")
    with contextlib.suppress(FileNotFoundError):
        (rootfs / "var/lib/dbus/machine-id").unlink()
    resolv = rootfs / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("nameserver 10.0.2.3\n")
    for cached in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        cached.unlink()


def kernel_files(rootfs: Path) -> tuple[Path, Path, str]:
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    if len(kernels) != 1:
        raise KilnError(f"expected one kernel in {rootfs}/boot, found {[k.name for k in kernels]}")
    version = kernels[0].name.removeprefix("vmlinuz-")
    initrd = rootfs / "boot" / f"initrd.img-{version}"
    if not initrd.exists():
        raise KilnError(f"no initrd for kernel {version} in {rootfs}/boot")
    return kernels[0], initrd, version


@contextlib.contextmanager
def debs_cache(cache: Path):
    """debootstrap's package cache (--cache-dir), held alone while one debootstrap uses it: two at once (the local
    image's base and the container base, baked side by side by the tests' workers) move each other's files away
    (`cp: cannot stat .../diffutils_1%3a3.8-4_amd64.deb`, seen on a fresh machine)."""
    debs = cache / "debootstrap-debs"
    debs.mkdir(parents=True, exist_ok=True)
    with open(cache / ".debootstrap-debs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield debs


def build(out: Path, cache: Path, key: str) -> None:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        rootfs = work / "rootfs"
        try:
            with debs_cache(cache) as debs:
                run(["debootstrap", "--variant=minbase", f"--arch={ARCH}",
                     f"--components={COMPONENTS.replace(' ', ',')}", f"--include={','.join(PACKAGES)}",
                     f"--cache-dir={debs}", SUITE, str(rootfs), MIRROR], timeout=1800)
        except KilnError:
            log = rootfs / "debootstrap/debootstrap.log"
            if log.exists():
                shutil.copyfile(log, out.parent / f"{out.name}.debootstrap.log")
                print(f"base-image: debootstrap's log: {out.parent / f'{out.name}.debootstrap.log'}", file=sys.stderr)
            raise
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"kiln-bake-{key}", "-f", str(work / "bake_key")],
            timeout=30)
        configure_rootfs(rootfs, (work / "bake_key.pub").read_text())
        kernel, initrd, version = kernel_files(rootfs)
        shutil.copyfile(kernel, work / "vmlinuz")
        shutil.copyfile(initrd, work / "initrd.img")
        for name in ("vmlinuz", "initrd.img", "bake_key.pub"):
            (work / name).chmod(0o644)
        raw = work / "disk.raw"
        with raw.open("wb") as f:
            f.truncate(parse_size(DISK_SIZE))
        run(["mkfs.ext4", "-q", "-F", "-L", LABEL, "-d", str(rootfs), str(raw)], timeout=900)
        run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(work / "disk.qcow2")], timeout=900)
        raw.unlink()
        # The same tree as a tarball: scripts/bake-rootfs bakes it natively (Ansible's chroot connection).
        run(["tar", "--numeric-owner", "--xattrs", "-cf", str(work / "rootfs.tar"), "-C", str(rootfs), "."],
            timeout=900)
        remove_tree(rootfs)
        meta = {"name": "debian12", "key": key, "suite": SUITE, "arch": ARCH, "mirror": MIRROR,
                "security_mirror": SECURITY_MIRROR, "packages": list(PACKAGES), "kernel": version,
                "label": LABEL, "size": DISK_SIZE,
                "append": "root=/dev/vda rw console=ttyS0 net.ifnames=0",
                "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "build_seconds": round(time.monotonic() - started, 1)}
        (work / "base.json").write_text(json.dumps(meta, indent=2) + "\n")
        work.chmod(0o755)  # kernel, initrd and disk readable by a qemu that is not root; bake_key stays 0600
        work.rename(out)
    finally:
        if work.exists():
            remove_tree(work)


def remove_tree(path: Path) -> None:
    """rm -r, but never through a mount (debootstrap mounts /proc and /sys in the rootfs while it runs)."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    inside = [m for m in mounts if m == str(path) or m.startswith(f"{path}/")]
    if inside:
        raise KilnError(f"not removing {path}: still mounted there: {', '.join(inside)} (umount them first)")
    shutil.rmtree(path)


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def complete(out: Path) -> bool:
    names = ("disk.qcow2", "vmlinuz", "initrd.img", "rootfs.tar", "bake_key", "bake_key.pub", "base.json")
    return all((out / name).is_file() for name in names)


def ensure(cache: Path) -> Path:
    """The base disk's folder under cache, built first (as root) unless a complete one is there."""
    key = input_key(Path(__file__).read_bytes())
    out = cache.resolve() / "base" / f"debian12-{key}"
    if complete(out):
        return out
    if os.geteuid() != 0:
        raise KilnError("must run as root to build the base disk (debootstrap)")
    missing = [t for t in ("debootstrap", "mkfs.ext4", "qemu-img", "ssh-keygen") if not shutil.which(t)]
    if missing:
        raise KilnError(f"missing tools: {', '.join(missing)} (apt-get install debootstrap "
                        "e2fsprogs qemu-utils openssh-client)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".lock-{key}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build of the same key: wait, then reuse it
        if not complete(out):
            if out.exists():
                remove_tree(out)
            print(f"base-image: building {out} (debootstrap, several minutes)", file=sys.stderr)
            build(out, cache, key)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/base-image", description=__doc__.splitlines()[2],
                                     usage=__doc__.splitlines()[0][7:])
    parser.add_argument("--cache", type=Path, default=None, help="cache root (default ${KILN_CACHE:-~/.cache/kiln})")
    parser.add_argument("--print", action="store_true", help="print only the output directory")
    args = parser.parse_args(argv)

    def make() -> None:
        out = ensure(args.cache or cache_dir())
        print(out if args.print else f"base-image: {out}")

    return run_main("base-image", make)


if __name__ == "__main__":
    sys.exit(main())
