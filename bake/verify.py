"""usage: scripts/verify [--hosts URLS [--ssh-config F]] [--local] [--rootfs DIR] [--container REF]
                       [--image DIR [--no-boot]] [--matrix F] [-- PYTEST-ARGS...]

Run the testinfra suite (tests/infra) against:
  --hosts ssh://user@host,...   live nodes or images booted anywhere (testinfra's host URLs)
  --local                       this machine (testinfra's local backend), e.g. a GPU host kiln did not bake:
                                scripts/verify --local -- -m gpu --gpu=required --facts-only --facts-json F
  --rootfs DIR                  a captured image's root filesystem (chroot; /proc, /sys, /dev bound in for the run)
  --container REF               a container image (make image PROVIDER=docker): one container of it, checked
                                through testinfra's docker backend (markers image, gpu, fabric), then removed
  (neither)                     the newest local image in images/ (or --image DIR): first what its disk holds,
                                read from the disk here without booting it (DISK_MARKERS, natively: seconds; as
                                root), then what only its boot shows (BOOT_MARKERS) on the image booted under qemu
                                on a throwaway overlay, over SSH with its host key pinned (TCG: every command is
                                slow); not as root, every check on the image booted; --no-boot stops after the
                                disk; a -m of your own runs in one place (the disk with --no-boot, else booted)
                                (cluster checks belong to meshed nodes that reach a time server; a lone VM here
                                reaches neither)
The versions expected are the version matrix's; --matrix F holds the hosts to it with a matrix file's entries
(matrices/) in place, as `make image MATRIX=F` bakes; a local image baked so is held to the entries it records.
PYTEST-ARGS go to pytest (e.g. -m image, --gpu=required). The exit code is pytest's (of a local image's two
parts, the first that failed; 5, no test selected, only where neither part selected one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bake.matrix import read_matrix, read_override
from kiln import proc
from kiln.errors import UsageError, run_main
from kiln.paths import PROJECT as ROOT
from localcloud import vm

IMAGES = Path(os.environ.get("KILN_IMAGES", ROOT / "images"))
# A local image's checks in two parts: what its disk holds, read from the disk (a chroot here, as --rootfs), and
# what only a boot of it shows (marker boot: its first boot's host keys and machine-id, what the bake left once it
# booted, its data volume, its running engine; marker machine: its kernel and devices), on the image booted
DISK_MARKERS = "(image or fabric) and not machine"
BOOT_MARKERS = "boot or machine or gpu"


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


@contextlib.contextmanager
def container_of(image: str):
    """One container of `image`, idle, on the host's network (as kiln runs them); always removed."""
    name = f"kiln-verify-{os.getpid()}"
    argv = ["docker", "run", "-d", "--rm", "--name", name, "--network", "host", "--entrypoint", "sleep", image,
            "infinity"]
    started = proc.run(argv, timeout=300, check=False)
    if started.returncode != 0:
        said = [line for line in started.stderr.splitlines() if line.strip() and not line.startswith("Run ")]
        raise UsageError(f"--container {image}: docker run failed: {said[-1] if said else 'no output'}")
    try:
        yield name
    finally:
        proc.run(["docker", "rm", "-f", name], timeout=60, check=False)


@contextlib.contextmanager
def matrix_args(chosen: dict[str, str]):
    """The suite's --matrix: the version matrix with the chosen entries in place, written for the run; none when
    nothing is chosen (the suite reads the matrix itself)."""
    if not chosen:
        yield []
        return
    with tempfile.NamedTemporaryFile("w", prefix="kiln-matrix-", suffix=".yml") as file:
        yaml.safe_dump({**read_matrix(), **chosen}, file)
        file.flush()
        yield [f"--matrix={file.name}"]


def chosen_entries(matrix_file: Path | None, image: Path | None) -> dict[str, str]:
    """What the hosts are held to in place of the matrix: a matrix file's entries, else those a local image
    records it was baked with."""
    if matrix_file:
        return read_override(matrix_file)
    if image and (image / "image.json").is_file():
        override = json.loads((image / "image.json").read_text()).get("matrix_override") or {}
        if override:
            print(f"verify: {image.name} was baked with {override['file']}: holding it to those entries", flush=True)
        return override.get("entries", {})
    return {}


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
    parser.add_argument("--container", help="a container image to check, e.g. kiln:cpu-FINGERPRINT")
    parser.add_argument("--image", type=Path, help="a local image folder (default: the newest in images/)")
    parser.add_argument("--no-boot", action="store_true",
                        help="a local image: check what its disk holds, without booting it")
    parser.add_argument("--matrix", type=Path, help="a matrix file whose entries replace the version matrix's")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    return run_main("verify", lambda: verify(args))


def verify(args: argparse.Namespace) -> int:
    extra = [a for a in args.pytest_args if a != "--"]
    if sum(map(bool, (args.hosts, args.local, args.rootfs, args.container))) > 1:
        raise UsageError("give one of --hosts, --local, --rootfs and --container")
    if args.no_boot and (args.hosts or args.local or args.rootfs or args.container):
        raise UsageError("--no-boot: a local image's (--image, or the newest in images/) alone")
    image = None
    if not (args.hosts or args.local or args.rootfs or args.container):
        image = args.image or newest_local_image()
    with matrix_args(chosen_entries(args.matrix, image)) as matrix:
        return check(args, [*matrix, *extra], image)


def check(args: argparse.Namespace, extra: list[str], image: Path | None) -> int:
    if args.local:
        return subprocess.run(pytest_argv("--hosts=local://", *extra)).returncode
    if args.hosts:
        ssh_config = [f"--ssh-config={args.ssh_config}"] if args.ssh_config else []
        return subprocess.run(pytest_argv(f"--hosts={args.hosts}", *ssh_config, *extra)).returncode
    if args.rootfs:
        if not (args.rootfs / "etc").is_dir():
            raise UsageError(f"{args.rootfs} is not a root filesystem")
        return on_rootfs(args.rootfs.resolve(), extra)
    if args.container:
        with container_of(args.container) as name:
            return subprocess.run(pytest_argv(f"--hosts=docker://{name}",
                                              *markers(extra, "image or gpu or fabric"))).returncode
    assert image is not None
    root = os.geteuid() == 0
    if not root and not args.no_boot:
        print("verify: not root, so the image's disk is not read here: every check runs on the image booted",
              flush=True)
    codes = []
    for where, argv in parts(extra, no_boot=args.no_boot, root=root):
        if where == "disk":
            disk = image / json.loads((image / "image.json").read_text())["disk"]
            print(f"verify: what {disk} holds, read from the disk", flush=True)
            with tempfile.TemporaryDirectory(prefix="kiln-verify-disk-") as state, \
                    vm.opened(disk, Path(state)) as tree:
                codes.append(on_rootfs(tree, argv))
        else:
            print(f"verify: {image.name}, booted under qemu", flush=True)
            codes.append(on_booted(image, argv))
        if codes[-1] in STOPPING:
            break
    return combined(codes)


# pytest's exit codes: 0 passed, 1 some failed, 2 interrupted, 3 internal error, 4 usage error, 5 none selected
STOPPING = (2, 3, 4)


def chosen_markers(extra: list[str]) -> str | None:
    """The marker expression pytest arguments choose (-m EXPR, -mEXPR, --markexpr[=]EXPR; the last wins), or
    None."""
    chosen = None
    for index, arg in enumerate(extra):
        if arg in ("-m", "--markexpr") and index + 1 < len(extra):
            chosen = extra[index + 1]
        elif arg.startswith("--markexpr="):
            chosen = arg.split("=", 1)[1]
        elif arg.startswith("-m") and not arg.startswith("--") and len(arg) > 2:
            chosen = arg[2:]
    return chosen


def markers(extra: list[str], default: str) -> list[str]:
    """The pytest arguments with `-m default` where they choose no markers themselves."""
    return extra if chosen_markers(extra) is not None else ["-m", default, *extra]


def parts(extra: list[str], *, no_boot: bool, root: bool) -> list[tuple[str, list[str]]]:
    """Where a local image's checks run, in order: ("disk", pytest args) on its disk read here (root alone may
    mount and chroot), ("booted", pytest args) on the image booted. A marker expression of the user's runs in
    one place: on the disk with --no-boot, else booted; without root every check runs booted."""
    chosen = chosen_markers(extra)
    if not root:
        if no_boot:
            raise UsageError("--no-boot: reading the image's disk takes root (a loop mount and a chroot)")
        return [("booted", markers(extra, "image or gpu or fabric"))]
    if no_boot:
        return [("disk", markers(extra, DISK_MARKERS))]
    if chosen is not None:
        return [("booted", extra)]
    return [("disk", ["-m", DISK_MARKERS, *extra]), ("booted", ["-m", BOOT_MARKERS, *extra])]


def combined(codes: list[int]) -> int:
    """One exit code for the parts run: the first part's that failed; 5 (no test selected) only where no part
    selected any (a -k that picks tests of one part leaves the other none)."""
    failed = [code for code in codes if code not in (0, 5)]
    if failed:
        return failed[0]
    return 0 if 0 in codes else 5


def on_rootfs(root: Path, extra: list[str]) -> int:
    with bound(root):
        return subprocess.run(pytest_argv(f"--hosts={root}", "--connection=chroot", *extra)).returncode


def on_booted(image: Path, extra: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="kiln-verify-") as state, \
            vm.booted(image, Path(state), "kiln-verify") as ssh_config:
        return subprocess.run(pytest_argv("--hosts=ssh://kiln-vm", f"--ssh-config={ssh_config}", *extra)).returncode


if __name__ == "__main__":
    sys.exit(main())
