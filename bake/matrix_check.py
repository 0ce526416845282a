"""usage: python -m bake.matrix_check [--timeout SECONDS]

Is the version matrix current? For each pin of ansible/group_vars/all/versions.yml, the newest release of the
same line (the same major.minor; a driver's branch) and the newest release overall, from the package index
that publishes it: PyPI (through pip's configured index) for the Python pins, NVIDIA's CUDA and container
toolkit repositories for the NVIDIA ones. An index out of reach is said on its rows; nothing is changed.
`make matrix-check` runs it (not CI: it reads the network).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from bake.matrix import read_matrix

# Where each pin is published: ("pypi", distribution) or ("nvidia", repository, package name pattern, how the
# package's version maps back to the pin). The OpenMPI major comes from the distribution's own archive.
PYPI = {"tensorflow_version": "tensorflow", "tensorflow_tf_keras_version": "tf-keras",
        "tensorflow_numpy_version": "numpy", "tensorflow_tensorboard_version": "tensorboard",
        "tensorflow_horovod_version": "horovod"}
CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/Packages.gz"
TOOLKIT_REPO = "https://nvidia.github.io/libnvidia-container/stable/deb/amd64/Packages"
NVIDIA = {  # matrix entry: (repository, the packages that carry it, the pin's length in release parts)
    "nvidia_driver_version": (CUDA_REPO, r"nvidia-driver-\d+-open", 3),
    "cuda_version": (CUDA_REPO, r"cuda-toolkit-\d+-\d+", 3),
    "cuda_cudnn_version": (CUDA_REPO, r"libcudnn\d+-cuda-\d+", 4),
    "cuda_nccl_version": (CUDA_REPO, r"libnccl2", 3),
    "cuda_dcgm_version": (CUDA_REPO, r"datacenter-gpu-manager-4-core", 3),
    "container_runtime_nvidia_toolkit_version": (TOOLKIT_REPO, r"nvidia-container-toolkit", 3),
}
LINE = {"nvidia_driver_version": 1}  # release parts that make a line: a driver's branch; else major.minor


@dataclass(frozen=True)
class Row:
    name: str
    pinned: str
    newest_in_line: str | None
    newest: str | None
    note: str = ""


def parse(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def debian_upstream(version: str, parts: int) -> str:
    """A Debian package version's upstream release, as the matrix writes it: the epoch, the revision and a
    build suffix dropped (1:4.2.3-1 -> 4.2.3; 2.27.7-1+cuda12.9 -> 2.27.7), at most `parts` parts."""
    upstream = version.split(":", 1)[-1].rsplit("-", 1)[0].split("+", 1)[0].split("~", 1)[0]
    return ".".join(upstream.split(".")[:parts])


def compare(name: str, pinned: str, available: Iterable[str], *, note: str = "") -> Row:
    """The newest of `available` in the pin's line and overall (pre-releases left out), as a row (pure)."""
    pin = parse(pinned)
    releases = sorted({(v, text) for v, text in ((parse(text), text) for text in available)
                       if v is not None and not v.is_prerelease})  # each as the index writes it (580.172.01)
    if pin is None or not releases:
        return Row(name, pinned, None, None, note or ("no releases found" if pin else "the pin is no version"))
    width = LINE.get(name, 2)
    line = [text for v, text in releases if v.release[:width] == pin.release[:width]]
    return Row(name, pinned, line[-1] if line else None, releases[-1][1], note)


def packages_versions(index: str, packages: str) -> list[str]:
    """Every version of the packages whose whole name matches the regular expression `packages` in a Debian
    Packages index's text (pure)."""
    pattern = re.compile(packages)
    found, current = [], ""
    for line in index.splitlines():
        if line.startswith("Package: "):
            current = line.split(": ", 1)[1].strip()
        elif line.startswith("Version: ") and pattern.fullmatch(current):
            found.append(line.split(": ", 1)[1].strip())
    return found


def format_rows(rows: Iterable[Row]) -> str:
    rows = list(rows)
    header = ("pin", "pinned", "newest in its line", "newest")
    table = [header, *((r.name, r.pinned, r.newest_in_line or "-", r.newest or "-") for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in table]
    for row in rows:
        if row.note:
            lines.append(f"{row.name}: {row.note}")
        elif row.newest and row.newest != row.pinned:
            lines.append(f"{row.name}: {row.newest} is out (pinned {row.pinned})")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- I/O

def pypi_versions(distribution: str, timeout: float) -> list[str]:
    """Every version pip's configured index lists for `distribution`."""
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", distribution, "--json",
                           "--disable-pip-version-check"], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise OSError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "pip index failed")
    return list(json.loads(done.stdout).get("versions", []))


def fetch_index(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 (a fixed https URL)
        data = answer.read()
    return gzip.decompress(data).decode() if url.endswith(".gz") else data.decode()


def check(matrix: Mapping[str, str], timeout: float) -> list[Row]:
    rows, indexes = [], {}
    for name, distribution in PYPI.items():
        try:
            rows.append(compare(name, matrix[name], pypi_versions(distribution, timeout)))
        except (OSError, ValueError, subprocess.TimeoutExpired) as error:
            rows.append(Row(name, matrix[name], None, None, f"PyPI did not answer: {error}"))
    for name, (url, packages, parts) in NVIDIA.items():
        if url not in indexes:
            try:
                indexes[url] = fetch_index(url, timeout)
            except (OSError, ValueError) as error:
                indexes[url] = error
        index = indexes[url]
        if isinstance(index, Exception):
            rows.append(Row(name, matrix[name], None, None, f"{url} is out of reach: {index}"))
            continue
        versions = [debian_upstream(v, parts) for v in packages_versions(index, packages)]
        rows.append(compare(name, matrix[name], versions))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(prog="make matrix-check", description=__doc__.splitlines()[2])
    parser.add_argument("--timeout", type=float, default=30)
    options = parser.parse_args()
    print(format_rows(check(read_matrix(), options.timeout)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
