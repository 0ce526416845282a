"""What a bake is, decided without running anything: provider, profile, the input fingerprint, packer's argv.

bake.image does the I/O.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from bake.packer import SOURCES, is_modern
from kiln.errors import UsageError

DEFAULT_PROFILE = {"aws": "gpu", "gcp": "gpu", "azure": "gpu", "local": "cpu", "docker": "cpu"}
# Providers whose source Debian's packer 1.6.6 builds (the others need current packer's settings).
OLD_PACKER_PROVIDERS = ("local", "docker")
# What a bake's fingerprint covers besides the provider, the profile and the named extra inputs.
FINGERPRINTED = ("packer", "ansible")
IGNORED_PARTS = {"__pycache__", ".pytest_cache"}


@dataclass(frozen=True)
class Bake:
    provider: str
    profile: str
    fingerprint: str
    output: Path

    @property
    def source(self) -> str:
        return SOURCES[self.provider]


def choose_profile(provider: str, profile: str | None) -> str:
    if provider not in SOURCES:
        raise UsageError(f"PROVIDER={provider or '(empty)'}: choose one of {', '.join(SOURCES)}")
    profile = profile or DEFAULT_PROFILE[provider]
    if profile not in ("gpu", "cpu"):
        raise UsageError(f"PROFILE={profile}: choose gpu or cpu")
    return profile


def check_packer_for(provider: str, version: tuple[int, int, int]) -> None:
    """Packer older than 1.7 (Debian's 1.6.6) lacks settings the cloud sources need (IMDSv2 on AWS among them)."""
    if provider not in OLD_PACKER_PROVIDERS and not is_modern(version):
        shown = ".".join(map(str, version))
        raise UsageError(
            f"PROVIDER={provider} needs packer >= 1.7 (this is {shown}): its templates require IMDSv2, "
            "imds_support and settings older packer drops. Install a current packer, run "
            "`packer init packer/plugins`, then make image again")


def input_files(root: Path) -> list[Path]:
    files = []
    for top in FINGERPRINTED:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and not IGNORED_PARTS & set(path.parts):
                files.append(path)
    return files


def fingerprint(root: Path, provider: str, profile: str, extra: dict[str, str]) -> str:
    """A hash of everything a bake depends on: templates, roles, the matrix, provider, profile, extra inputs."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"provider": provider, "profile": profile, **extra}, sort_keys=True).encode())
    for path in input_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def output_dir(images: Path, provider: str, profile: str, fp: str) -> Path:
    return images / f"{provider}-{profile}-{fp}"


def packer_build_argv(bake: Bake, template_dir: Path, var_files: list[Path]) -> list[str]:
    """`packer build` of the provider's source; later var files win."""
    return ["packer", "build", f"-only={bake.source}", *(f"-var-file={path}" for path in var_files), str(template_dir)]
