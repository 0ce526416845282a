"""usage: scripts/verify [--hosts URLS [--ssh-config F]] [--local] [--rootfs DIR] [--image DIR] [-- PYTEST-ARGS...]

Run the testinfra suite (tests/infra) against:
  --hosts ssh://user@host,...   live nodes or images booted anywhere (testinfra's host URLs)
  --local                       this machine (testinfra's local backend), e.g. a GPU host kiln did not bake:
                                scripts/verify --local -- -m gpu --gpu=required --facts-only --facts-json F
  --rootfs DIR                  a captured image's root filesystem (chroot; /proc, /sys, /dev bound in for the run)
  (neither)                     the newest local image in images/ (or --image DIR): boot it under qemu on a
                                throwaway overlay, check it over SSH with its host key pinned, stop it; markers
                                image and gpu only unless -m is given (cluster checks belong to meshed nodes
                                that reach a time server; a lone VM here reaches neither)
PYTEST-ARGS go to pytest (e.g. -m image, --gpu=required). The exit code is pytest's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kiln.errors import UsageError, run_main
from kiln.paths import PROJECT as ROOT
from testbed import vm

IMAGES = Path(os.environ.get("KILN_IMAGES", ROOT / "images"))


def pytest_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(ROOT / "tests" / "infra"), *args]


@contextlib.contextmanager
def bound(rootfs: Path):
    """Bind /proc, /sys and /dev into a root filesystem; always unbind (lazily, in reverse)."""
    mounted = []
    try:
        for fs in ("proc", "sys", "dev"):
            target = rootfs / fs
            target.mkdir(exist_ok=True)
            if subprocess.run(["mountpoint", "-q", str(target)]).returncode != 0:
                subprocess.run(["mount", "--bind", f"/{fs}", str(target)], check=True, timeout=30)
                mounted.append(target)
        yield
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", "-l", str(target)], timeout=30)


def newest_local_image() -> Path:
    images = sorted(IMAGES.glob("local-*/image.json"), key=lambda p: p.stat().st_mtime)
    if not images:
        raise UsageError(f"no local image in {IMAGES}: run `make image` first, or give --hosts")
    return images[-1].parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/verify", description="Run the testinfra suite.")
    parser.add_argument("--hosts", help="testinfra host URLs, e.g. ssh://ubuntu@10.0.0.5,ssh://ubuntu@10.0.0.6")
    parser.add_argument("--ssh-config", help="an ssh_config for --hosts")
    parser.add_argument("--local", action="store_true", help="check this machine")
    parser.add_argument("--rootfs", type=Path, help="a captured image's root filesystem")
    parser.add_argument("--image", type=Path, help="a local image folder (default: the newest in images/)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    return run_main("verify", lambda: verify(args))


def verify(args: argparse.Namespace) -> int:
    extra = [a for a in args.pytest_args if a != "--"]
    if sum(map(bool, (args.hosts, args.local, args.rootfs))) > 1:
        raise UsageError("give one of --hosts, --local and --rootfs")
    if args.local:
        return subprocess.run(pytest_argv("--hosts=local://", *extra)).returncode
    if args.hosts:
        ssh_config = [f"--ssh-config={args.ssh_config}"] if args.ssh_config else []
        return subprocess.run(pytest_argv(f"--hosts={args.hosts}", *ssh_config, *extra)).returncode
    if args.rootfs:
        if not (args.rootfs / "etc").is_dir():
            raise UsageError(f"{args.rootfs} is not a root filesystem")
        with bound(args.rootfs.resolve()):
            return subprocess.run(pytest_argv(f"--hosts={args.rootfs.resolve()}", "--connection=chroot",
                                              *extra)).returncode
    if "-m" not in extra:
        extra = ["-m", "image or gpu", *extra]
    with tempfile.TemporaryDirectory(prefix="kiln-verify-") as state, \
            vm.booted(args.image or newest_local_image(), Path(state), "kiln-verify") as ssh_config:
        return subprocess.run(pytest_argv("--hosts=ssh://kiln-vm", f"--ssh-config={ssh_config}", *extra)).returncode


if __name__ == "__main__":
    sys.exit(main())
