"""What differs between the bake's targets, one record each (I/O at the edges of a bake: bake.image calls them).

Every target bakes the same templates and roles with Packer; what differs is what a target adds to the bake's
fingerprint and to Packer's variables, what it serves the builder while it runs (a wheelhouse over http), what
makes an earlier image reusable, and what it records or publishes afterwards:

- the clouds (aws, gcp, azure): nothing beyond the tree; Packer's own builders make and keep the image;
- local: the Debian base disk (scripts/base-image) booted under qemu, the wheelhouse served to the VM on qemu's
  host address; the kernel and initrd kept beside the disk;
- docker: the base image (made here on cpu, NVIDIA's on gpu), the wheelhouse served on this machine's loopback
  (the container shares its network); the result tagged kiln:PROFILE-FINGERPRINT, and pushed with --registry.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from bake import base_image, container, container_base, provision
from bake.provision import VM_ADDRESS_OF_HOST
from kiln.errors import UsageError
from kiln.paths import cache_dir


@dataclass
class Prepared:
    """One bake's inputs beyond the tree: what the fingerprint adds (`extra`), and what the bake uses."""

    extra: dict[str, str] = field(default_factory=dict)
    wheelhouse: Path | None = None  # served to the builder while it runs
    base: Path | None = None  # local: the base disk's folder
    base_image: str = ""  # docker: the base image's reference
    pull: bool = False  # docker: whether packer pulls it


class Cloud:
    """aws, gcp, azure: Packer's builders make and keep the image in the cloud."""

    pushes = False  # takes --registry

    def __init__(self, name: str):
        self.name = name

    def check(self, matrix: dict[str, str], matrix_file: Path | None) -> None:
        """Refuse a matrix this target cannot bake (before anything is made)."""

    def prepare(self, profile: str, matrix: dict[str, str], matrix_file: Path | None) -> Prepared:
        return Prepared()

    def reusable(self, output: Path, registry: str) -> bool:
        """An image with this fingerprint is there (its records)."""
        return (output / "image.json").exists()

    def variables(self, prepared: Prepared, work: Path, stack: contextlib.ExitStack) -> tuple[dict, dict]:
        """Packer's variables and Ansible's extra variables of this target (what it serves, held open by `stack`
        for the bake)."""
        return {}, {}

    def finish(self, prepared: Prepared, work: Path, record: dict, registry: str) -> None:
        """What the image's record adds, once Packer is done (and what is published)."""


class Local(Cloud):
    """The local qemu image: the base disk booted under qemu (TCG), the wheelhouse served to the VM."""

    # The VM reaches the wheelhouse over plain http on qemu's host address, which pip trusts only where told (the
    # tensorflow role tells it; the frameworks role does not yet).
    CARRIED_BY_WHEELHOUSE_ONLY = ("frameworks_torch_version", "frameworks_jax_version")

    def check(self, matrix: dict[str, str], matrix_file: Path | None) -> None:
        if carried := [name for name in self.CARRIED_BY_WHEELHOUSE_ONLY if matrix.get(name)]:
            raise UsageError(f"MATRIX={matrix_file}: {', '.join(carried)} for PROVIDER=local: the frameworks role "
                             "does not install from a wheelhouse served to a VM yet; bake them into a container "
                             "image (PROVIDER=docker) or a cloud image (aws|gcp|azure)")

    def prepare(self, profile: str, matrix: dict[str, str], matrix_file: Path | None) -> Prepared:
        base = base_image.ensure(cache_dir())
        wheelhouse = provision.wheelhouse(matrix_file)
        return Prepared({"base": base.name, "wheelhouse": wheelhouse.name}, wheelhouse, base)

    def variables(self, prepared: Prepared, work: Path, stack: contextlib.ExitStack) -> tuple[dict, dict]:
        port = stack.enter_context(provision.served(prepared.wheelhouse))
        base = prepared.base
        return ({"local_base_disk": str(base / "disk.qcow2"), "local_kernel": str(base / "vmlinuz"),
                 "local_initrd": str(base / "initrd.img"), "local_ssh_private_key_file": str(base / "bake_key"),
                 "local_output_directory": str(work / "disk"), "local_serial_log": str(work / "console.log")},
                {"tensorflow_wheelhouse_url": f"http://{VM_ADDRESS_OF_HOST}:{port}/"})

    def finish(self, prepared: Prepared, work: Path, record: dict, registry: str) -> None:
        for name in ("vmlinuz", "initrd.img"):
            shutil.copy2(prepared.base / name, work / name)
        record.update({"disk": "disk/kiln.qcow2", "kernel": "vmlinuz", "initrd": "initrd.img"})


class Docker(Cloud):
    """A container image of the local Docker engine, tagged kiln:PROFILE-FINGERPRINT (pushed with --registry)."""

    pushes = True

    def prepare(self, profile: str, matrix: dict[str, str], matrix_file: Path | None) -> Prepared:
        """The base image (made here on cpu, NVIDIA's on gpu), whether packer pulls it, and the wheelhouse (cpu:
        the Horovod wheel built here fits the Debian base; gpu: Horovod is built in the image against CUDA)."""
        if not shutil.which("docker"):
            raise UsageError("PROVIDER=docker needs docker (make setup installs Debian's docker.io)")
        if profile == "gpu":
            base, pull = container.base_image(profile, matrix)
            return Prepared({"base": base}, base_image=base, pull=pull)
        base, pull = container.base_image(profile, matrix, container_base.ensure(cache_dir()))
        wheelhouse = provision.wheelhouse(matrix_file)
        return Prepared({"base": container.image_id(base), "wheelhouse": wheelhouse.name}, wheelhouse,
                        base_image=base, pull=pull)

    def reusable(self, output: Path, registry: str) -> bool:
        """The records, and the very image they name in the engine (its tag still on that image id; pushed now
        where a registry is asked for and it was not pushed there yet)."""
        if not (output / "image.json").exists():
            return False
        record = json.loads((output / "image.json").read_text())
        if not still_there(record, container.inspect(record.get("image", ""))):
            return False
        if registry and not record.get("pushed", "").startswith(f"{registry}/"):
            publish(record, registry)
            (output / "image.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return True

    def variables(self, prepared: Prepared, work: Path, stack: contextlib.ExitStack) -> tuple[dict, dict]:
        extra = {"kiln_image_target": "container"}
        if prepared.wheelhouse:  # the container runs on the host's network: 127.0.0.1 is this machine
            port = stack.enter_context(provision.served(prepared.wheelhouse))
            extra["tensorflow_wheelhouse_url"] = f"http://127.0.0.1:{port}/"
        return {"docker_base_image": prepared.base_image, "docker_pull": prepared.pull}, extra

    def finish(self, prepared: Prepared, work: Path, record: dict, registry: str) -> None:
        record["image_id"] = container.artifact_id(json.loads((work / "packer-manifest.json").read_text()))
        record["base"] = prepared.base_image
        publish(record, registry)


def still_there(record: dict, found: dict | None) -> bool:
    """Whether the engine's image of the record's tag (`found`, docker image inspect's; None: no such image) is
    the image the record names: a bake elsewhere of the same inputs moves the tag to another image."""
    return found is not None and found.get("Id") == record.get("image_id")


def publish(record: dict, registry: str) -> None:
    """Tag the baked image kiln:PROFILE-FINGERPRINT (and push it to `registry`); record what was made."""
    name = container.tag(record["profile"], record["fingerprint"])
    container.tag_image(record["image_id"], name)
    record["image"] = name
    if registry:
        remote = container.tag(record["profile"], record["fingerprint"], registry)
        container.tag_image(record["image_id"], remote)
        earlier = record.get("pushed", "").partition("@")[2]  # a kept image's digest, pushed before
        if there := container.held(remote, earlier):
            record["pushed"] = there
            print(f"image: {registry} holds it already: {there}")
        else:
            record["pushed"] = container.push(remote, remote)
            print(f"image: pushed {record['pushed']}")


TARGETS = {"aws": Cloud("aws"), "gcp": Cloud("gcp"), "azure": Cloud("azure"), "local": Local("local"),
           "docker": Docker("docker")}
