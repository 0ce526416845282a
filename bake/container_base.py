"""usage: python -m bake.container_base [--print]

Make (or reuse) kiln's local container base image: a minimal Debian 12 (bookworm, amd64) tree from debootstrap
(python3 for Ansible, venv support, CA certificates, an ssh client for horovodrun's shim, rsync, procps), imported
into the local Docker engine as kiln-base:debian12-KEY. No kernel, init system, sshd or keys: a container gets
those from its host. KEY hashes this file and its inputs: a change makes a new image, otherwise the one in the
engine is reused. `make image PROVIDER=docker PROFILE=cpu` starts from it (there is no Docker Hub here; on the gpu
profile NVIDIA's CUDA runtime image is the base instead). --print prints only the image's name.
Needs root, debootstrap and a Docker engine that answers.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bake.base_image import ARCH, COMPONENTS, MIRROR, SECURITY_MIRROR, SUITE, debs_cache, remove_tree
from kiln import proc
from kiln.errors import KilnError, run_main
from kiln.paths import cache_dir

REPOSITORY = "kiln-base"
PACKAGES = ("python3", "python3-venv", "python3-apt", "ca-certificates", "openssh-client", "rsync", "procps",
            "netbase", "less")
# A container's own files: apt's sources (the same mirrors as the VM base). resolv.conf and hosts come from the
# engine at run time.
FILES = {
    "etc/apt/sources.list": (
        f"deb {MIRROR} {SUITE} {COMPONENTS}\n"
        f"deb {MIRROR} {SUITE}-updates {COMPONENTS}\n"
        f"deb {SECURITY_MIRROR} {SUITE}-security {COMPONENTS}\n"
    ),
    "etc/default/locale": "LANG=C.UTF-8\n",
}
# What the image runs with unless a container says otherwise (docker import --change).
CHANGES = ("ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]')


def input_key(script: bytes) -> str:
    """The cache key: this file (which holds every file it writes) and the build inputs."""
    inputs = json.dumps({"suite": SUITE, "arch": ARCH, "mirror": MIRROR, "security": SECURITY_MIRROR,
                         "components": COMPONENTS, "packages": sorted(PACKAGES), "changes": CHANGES},
                        sort_keys=True)
    return hashlib.sha256(script + b"\0" + inputs.encode()).hexdigest()[:12]


def image_name(key: str) -> str:
    return f"{REPOSITORY}:debian12-{key}"


def import_argv(name: str) -> list[str]:
    """`docker import` of a tar stream on stdin, with the image's settings."""
    return ["docker", "import", *(arg for change in CHANGES for arg in ("--change", change)), "-", name]


def has_image(name: str) -> bool:
    return proc.run(["docker", "image", "inspect", "--format", "{{.Id}}", name], timeout=60, check=False) \
        .returncode == 0


def configure(rootfs: Path) -> None:
    for rel, text in FILES.items():
        path = rootfs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel in ("etc/resolv.conf", "etc/hostname"):
        path = rootfs / rel
        if path.is_symlink() or path.exists():
            path.unlink()
    for cached in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        cached.unlink()
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)


def build(name: str, cache: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=".container-base.", dir=cache))
    try:
        rootfs = work / "rootfs"
        with debs_cache(cache) as debs:
            argv = ["debootstrap", "--variant=minbase", f"--arch={ARCH}",
                    f"--components={COMPONENTS.replace(' ', ',')}", f"--include={','.join(PACKAGES)}",
                    f"--cache-dir={debs}", SUITE, str(rootfs), MIRROR]
            print(f"container-base: {proc.shown(argv, 6)}", file=sys.stderr)
            proc.run(argv, timeout=1800)
        configure(rootfs)
        tar = subprocess.Popen(["tar", "--numeric-owner", "-cf", "-", "-C", str(rootfs), "."],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            imported = subprocess.run(import_argv(name), stdin=tar.stdout, capture_output=True, text=True,
                                      timeout=900)
        finally:
            tar.stdout.close()
            tar.wait(timeout=60)
        if tar.returncode != 0 or imported.returncode != 0:
            said = proc.tail(imported.stderr or tar.stderr.read().decode(errors="replace"), 3)
            raise KilnError(f"docker import of the base tree as {name} failed: {said or 'no output'}")
    finally:
        if work.exists():
            remove_tree(work)


def ensure(cache: Path) -> str:
    """The base image's name in the local engine, built first (as root) unless it is there."""
    if not shutil.which("docker"):
        raise KilnError("docker is not installed (make setup installs Debian's docker.io)")
    name = image_name(input_key(Path(__file__).read_bytes()))
    if has_image(name):
        return name
    if os.geteuid() != 0:
        raise KilnError("must run as root to build the container base image (debootstrap)")
    if not shutil.which("debootstrap"):
        raise KilnError("missing tool: debootstrap (apt-get install debootstrap)")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock-container-base", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build: wait, then reuse it
        if not has_image(name):
            print(f"container-base: building {name} (debootstrap, a few minutes)", file=sys.stderr)
            build(name, cache)
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bake.container_base", description=__doc__.split("\n\n")[1])
    parser.add_argument("--print", action="store_true", help="print only the image's name")
    args = parser.parse_args(argv)

    def make() -> None:
        name = ensure(cache_dir())
        print(name if args.print else f"container-base: {name}")

    return run_main("container-base", make)


if __name__ == "__main__":
    sys.exit(main())
