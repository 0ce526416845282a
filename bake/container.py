"""Container images (make image PROVIDER=docker): the base a profile starts from, the tag a bake gets, and the
engine calls that tag, find and push it.

Pure names first; the engine calls (docker CLI, bounded) after them. bake.image is the edge that uses them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from kiln import proc
from kiln.errors import KilnError, UsageError

REPOSITORY = "kiln"
# NVIDIA's CUDA image with cuDNN at the matrix's versions; devel, because Horovod's NCCL operations are compiled
# in the bake. Ubuntu 22.04: the matrix's CUDA release has no Debian 12 image.
GPU_BASE = "nvidia/cuda:{cuda}-cudnn-devel-ubuntu22.04"


def tag(profile: str, fingerprint: str, registry: str = "") -> str:
    """kiln:PROFILE-FINGERPRINT, under REGISTRY/ when one is given."""
    name = f"{REPOSITORY}:{profile}-{fingerprint}"
    return f"{registry.rstrip('/')}/{name}" if registry else name


def check_registry(registry: str) -> str:
    """A registry as `docker push` takes it: HOST[:PORT][/PATH], no scheme, no tag."""
    if registry.startswith(("http://", "https://")) or any(c.isspace() for c in registry) or "@" in registry \
            or not registry.strip("/"):
        raise UsageError(f"REGISTRY={registry}: give HOST[:PORT][/PATH] without a scheme, e.g. 127.0.0.1:5000")
    return registry.rstrip("/")


def base_image(profile: str, matrix: Mapping[str, str], local_base: str = "") -> tuple[str, bool]:
    """The image a profile's bake starts from and whether it must be pulled: the local Debian base on cpu,
    NVIDIA's CUDA/cuDNN image at the matrix's CUDA version on gpu."""
    if profile == "gpu":
        return GPU_BASE.format(cuda=matrix["cuda_version"]), True
    return local_base, False


def artifact_id(packer_manifest: Mapping) -> str:
    """The committed image's id from packer-manifest.json (the last build's artifact)."""
    builds = packer_manifest.get("builds") or []
    if not builds or not builds[-1].get("artifact_id"):
        raise KilnError("packer-manifest.json names no image: the docker build made none")
    return builds[-1]["artifact_id"]


# --- the engine ---------------------------------------------------------------------------------------------

def inspect(reference: str, timeout: float = 60) -> dict | None:
    """docker image inspect of one image (None when the engine has no such image)."""
    done = proc.run(["docker", "image", "inspect", reference], timeout=timeout, check=False)
    if done.returncode != 0:
        return None
    return json.loads(done.stdout)[0]


def image_id(reference: str) -> str:
    found = inspect(reference)
    if found is None:
        raise KilnError(f"the Docker engine has no image {reference}")
    return found["Id"]


def tag_image(image: str, name: str) -> None:
    proc.run(["docker", "tag", image, name], timeout=60)


def skopeo_tls(reference: str, option: str) -> list[str]:
    """Plain HTTP for a registry on loopback (as Docker allows it), TLS checked anywhere else."""
    host = reference.split("/", 1)[0].rsplit(":", 1)[0]
    return [f"--{option}=false"] if host in ("127.0.0.1", "localhost", "[::1]") else []


def held(reference: str, digest: str, timeout: float = 60) -> str | None:
    """The registry reference REGISTRY/REPOSITORY@DIGEST of `reference`'s repository where the registry holds the
    manifest of that digest (content-addressed: the very image an earlier push made, whatever the registry was
    called then), else None. None without skopeo, or where the registry does not answer."""
    if not (digest.startswith("sha256:") and shutil.which("skopeo")):
        return None
    found = f"{reference.rsplit(':', 1)[0]}@{digest}"
    done = proc.run(["skopeo", "inspect", "--raw", *skopeo_tls(found, "tls-verify"), f"docker://{found}"],
                    timeout=timeout, check=False)
    return found if done.returncode == 0 else None


def push(image: str, reference: str, timeout: float = 1800) -> str:
    """Push `image` of this machine's engine as `reference` (REGISTRY/REPOSITORY:TAG); its repository digest
    (REGISTRY/REPOSITORY@sha256:...). skopeo reads the image from the engine and compresses its layers on every
    core (kiln's 2.9 GB cpu image: 36 s, where docker push, one core, took 77 s here); docker push where skopeo is
    missing or cannot (an engine newer than its API version, a registry only the engine is told is insecure)."""
    repository = reference.rsplit(":", 1)[0]
    deadline = time.monotonic() + timeout
    if shutil.which("skopeo"):
        # skopeo keeps the engine's export (the whole image, uncompressed) in TMPDIR: here, removed after it, on
        # a disk (as skopeo's own default, /var/tmp; /tmp may be memory)
        with tempfile.TemporaryDirectory(prefix="kiln-push-", dir="/var/tmp" if Path("/var/tmp").is_dir() else None) \
                as scratch:
            digest_file = Path(scratch) / "digest"
            try:
                done = proc.run(["skopeo", "copy", "--quiet", "--digestfile", str(digest_file),
                                 *skopeo_tls(reference, "dest-tls-verify"), f"docker-daemon:{image}",
                                 f"docker://{reference}"], timeout=timeout, check=False,
                                env={**os.environ, "TMPDIR": scratch})
            except KilnError as error:  # it ran out its time: docker push would too
                raise KilnError(f"pushing {image} to {reference}: {error}") from None
            if done.returncode == 0 and digest_file.is_file():
                return f"{repository}@{digest_file.read_text().strip()}"
            print(f"push: skopeo could not push {image} ({proc.tail(done.stderr or done.stdout, 1) or 'no output'})"
                  f"; docker push instead", file=sys.stderr, flush=True)
    tagged = image != reference
    if tagged:
        tag_image(image, reference)
    try:
        proc.run(["docker", "push", reference], timeout=max(60.0, deadline - time.monotonic()))
        found = inspect(reference) or {}
    finally:
        if tagged:
            proc.run(["docker", "rmi", reference], timeout=60, check=False)
    for digest in found.get("RepoDigests", []):
        if digest.startswith(f"{repository}@"):
            return digest
    raise KilnError(f"docker push {reference} gave no digest")
