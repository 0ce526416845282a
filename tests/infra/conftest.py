"""pytest-testinfra suite: proves a baked image or a live node is what kiln says it is.

    pytest tests/infra --hosts=ssh://user@host [--ssh-config=F] [--gpu=auto|required] [-m image|gpu|cluster|fabric]
    pytest tests/infra --hosts=chroot:///path/to/rootfs     # a captured image's root filesystem
    pytest tests/infra --hosts=docker://CONTAINER           # a container of a kiln container image

The expected versions come from this checkout's version matrix (ansible/group_vars/all/versions.yml)
and must also equal the image's own manifest (/etc/kiln/manifest.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kiln_infra import MANIFEST, MATRIX, read_json


def pytest_addoption(parser):
    group = parser.getgroup("kiln")
    group.addoption("--gpu", choices=("auto", "required"), default="auto",
                    help="auto: GPU checks skip where no NVIDIA GPU is present; required: they fail there")
    group.addoption("--expect-gpus", type=int, default=None,
                    help="how many GPUs every host must have (default: as many as the PCI bus lists)")
    group.addoption("--matrix", default=str(MATRIX), help="the version matrix the image must match")
    group.addoption("--facts-only", action="store_true",
                    help="judge what the GPU hosts have (health, speed) without holding them to kiln's matrix")
    group.addoption("--facts-json", help="write what the suite found on each host (GPU facts, probe) to this file")
    group.addoption("--gpu-python", help="the Python whose framework measures the GPUs "
                                         "(default: the kiln image's venv where present, else python3)")
    group.addoption("--gpu-framework", default="auto", choices=("auto", "tensorflow", "torch", "jax", "cupy"),
                    help="the framework the probe measures with (default: the first the Python has)")
    group.addoption("--gpu-container-image", default="ubuntu:24.04",
                    help="the image `docker run --gpus all` uses to prove the container runtime sees the GPUs")


def pytest_configure(config):
    for marker, text in (("image", "what the image carries: versions, imports, hygiene, services"),
                         ("gpu", "NVIDIA driver, CUDA, cuDNN, NCCL, containers and TensorFlow on the GPUs"),
                         ("cluster", "what a node needs to train with others: names, time, ports"),
                         ("fabric", "the GPU fabric's stack (EFA, InfiniBand) and, where present, its devices"),
                         ("boot", "what a boot of the image does (its first boot's host keys and machine-id, what the "
                                  "bake left once booted, its data volume, its running engine): also read from a "
                                  "disk that never booted, as it should be then"),
                         ("machine", "what the running machine's kernel and devices show: not a disk's to say")):
        config.addinivalue_line("markers", f"{marker}: {text}")


RECORDS = pytest.StashKey[dict]()


@pytest.fixture(scope="module")
def host_record(host, pytestconfig) -> dict:
    """What the suite found on this host, written to --facts-json at the end."""
    records = pytestconfig.stash.setdefault(RECORDS, {})
    return records.setdefault(host.backend.get_pytest_id(), {})


def pytest_sessionfinish(session):
    path = session.config.getoption("facts_json", None)
    records = session.config.stash.get(RECORDS, {})
    if path and records:
        Path(path).write_text(json.dumps(records, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="session")
def matrix(pytestconfig) -> dict[str, str]:
    loaded = yaml.safe_load(Path(pytestconfig.getoption("matrix")).read_text())
    return {key: str(value) for key, value in loaded.items()}


@pytest.fixture(scope="module")
def manifest(host) -> dict:
    return read_json(host, MANIFEST)


@pytest.fixture(scope="module")
def captured(host) -> bool:
    """True for an image that has not booted since its capture (systemd fills /etc/machine-id at first boot)."""
    machine_id = host.file("/etc/machine-id")
    return not machine_id.exists or machine_id.size == 0



@pytest.fixture(scope="module")
def machine_image(manifest) -> None:
    """Skips a check of what only a machine image has (services, SSH host keys, data volume units): a container
    image (make image PROVIDER=docker, manifest target "container") leaves those to its host."""
    if manifest.get("target") == "container":
        pytest.skip("a container image: its host has the services, host keys and disks")


@pytest.fixture(scope="module")
def container_image(manifest) -> None:
    """Skips a check that only a container image needs (how kiln runs processes inside it)."""
    if manifest.get("target") != "container":
        pytest.skip("a machine image: kiln runs its processes on the host")
