"""usage: scripts/image PROVIDER [--profile gpu|cpu] [--matrix F] [--var-file F]... [--registry R] [--force]
                     [--timeout S]

Bake an image with Packer and Ansible: PROVIDER is aws, gcp, azure, local or docker. The bake's inputs
(templates, roles, the version matrix, provider, profile; for local the base disk and the wheelhouse, for
docker the base image and the wheelhouse) give a fingerprint; an image with that fingerprint already in images/
is reused, not baked again (--force bakes anyway). --matrix F bakes with a matrix file's entries (matrices/) in
place of the version matrix's, e.g. an older TensorFlow by choice; the fingerprint and the image record them.
local boots scripts/base-image's Debian 12 disk under qemu
(TCG) and installs Python packages from scripts/wheelhouse, served to the VM on 127.0.0.1 over qemu's user-mode
network. docker runs the container roles in a container of the local Docker engine (cpu: the Debian base
bake/container_base.py makes; gpu: NVIDIA's CUDA/cuDNN image, pulled) and tags the result
kiln:PROFILE-FINGERPRINT; --registry HOST[:PORT] also pushes it there.
The result is images/PROVIDER-PROFILE-FINGERPRINT/ with image.json (what was made), versions.json
(every component's version, read from the image) and packer-manifest.json; local adds disk/kiln.qcow2,
vmlinuz and initrd.img. The cloud providers need a current packer (>= 1.7) and credentials.
(`make image` runs this module: python -m bake.image.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bake import base_image, container, container_base, provision
from bake import plan as imagelib
from bake.matrix import labels, read_matrix, read_override
from bake.packer import compat_tree, is_modern, parse_packer_version, pkrvars
from bake.plan import Bake
from bake.provision import VM_ADDRESS_OF_HOST
from kiln import proc
from kiln.errors import KilnError, UsageError, run_main
from kiln.paths import PROJECT as ROOT
from kiln.paths import cache_dir

IMAGES = Path(os.environ.get("KILN_IMAGES", ROOT / "images"))


def packer_version() -> tuple[int, int, int]:
    if not shutil.which("packer"):
        raise UsageError("packer is not installed (make setup installs Debian's)")
    return parse_packer_version(proc.run(["packer", "version"], timeout=30).stdout)


def run_packer(argv: list[str], log: Path, timeout: float) -> None:
    """Run packer, its output to the terminal and to log (each line with the seconds since the start);
    bounded in time; Ctrl-C lets it clean up."""
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "PACKER_NO_COLOR": "1",
           "PACKER_CACHE_DIR": os.environ.get("PACKER_CACHE_DIR", str(cache_dir() / "packer"))}
    print("image: " + " ".join(argv), flush=True)
    with log.open("w", buffering=1) as out:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                   cwd=ROOT, start_new_session=True)
        timer = threading.Timer(timeout, lambda: os.killpg(process.pid, signal.SIGINT))
        timer.start()
        started = time.monotonic()
        try:
            for line in process.stdout:
                sys.stdout.write(line)
                out.write(f"[{time.monotonic() - started:8.1f}] {line}")
            process.wait()
        except KeyboardInterrupt:
            os.killpg(process.pid, signal.SIGINT)  # packer stops the VM and removes what it made
            process.wait(timeout=120)
            raise
        finally:
            timer.cancel()
    if process.returncode != 0:
        raise KilnError(f"packer build failed (exit {process.returncode}); its log: {log}")


def local_inputs(matrix_file: Path | None) -> tuple[dict[str, str], Path, Path]:
    base = base_image.ensure(cache_dir())
    wheelhouse = provision.wheelhouse(matrix_file)
    return {"base": base.name, "wheelhouse": wheelhouse.name}, base, wheelhouse


def docker_inputs(profile: str, matrix: dict[str, str],
                  matrix_file: Path | None) -> tuple[dict[str, str], str, bool, Path | None]:
    """The base image (made here on cpu, NVIDIA's on gpu), whether packer pulls it, and the wheelhouse (cpu: the
    Horovod wheel built here fits the Debian base; gpu: Horovod is built in the image against CUDA)."""
    if not shutil.which("docker"):
        raise UsageError("PROVIDER=docker needs docker (make setup installs Debian's docker.io)")
    if profile == "gpu":
        base, pull = container.base_image(profile, matrix)
        return {"base": base}, base, pull, None
    base, pull = container.base_image(profile, matrix, container_base.ensure(cache_dir()))
    wheelhouse = provision.wheelhouse(matrix_file)
    return {"base": container.image_id(base), "wheelhouse": wheelhouse.name}, base, pull, wheelhouse


def publish(record: dict, registry: str) -> None:
    """Tag the baked image kiln:PROFILE-FINGERPRINT (and push it to `registry`); record what was made."""
    name = container.tag(record["profile"], record["fingerprint"])
    container.tag_image(record["image_id"], name)
    record["image"] = name
    if registry:
        remote = container.tag(record["profile"], record["fingerprint"], registry)
        container.tag_image(record["image_id"], remote)
        record["pushed"] = container.push(remote)
        print(f"image: pushed {record['pushed']}")


def reusable(output: Path, provider: str, registry: str) -> bool:
    """An image with this fingerprint is there: its records, and for docker the image in the engine (pushed
    now where a registry is asked for and it was not pushed there yet)."""
    if not (output / "image.json").exists():
        return False
    if provider != "docker":
        return True
    record = json.loads((output / "image.json").read_text())
    if container.inspect(record.get("image", "")) is None:
        return False
    if registry and not record.get("pushed", "").startswith(f"{registry}/"):
        publish(record, registry)
        (output / "image.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return True


def bake(args) -> Path:
    profile = imagelib.choose_profile(args.provider, args.profile)
    version = packer_version()
    imagelib.check_packer_for(args.provider, version)
    registry = container.check_registry(args.registry) if args.registry else ""
    if registry and args.provider != "docker":
        raise UsageError(f"REGISTRY={registry} belongs to PROVIDER=docker (a container image is pushed)")
    matrix_file = Path(args.matrix) if args.matrix else None
    base_matrix = read_matrix()
    chosen = read_override(matrix_file, base_matrix) if matrix_file else {}
    matrix = {**base_matrix, **chosen}
    # The local VM reaches the wheelhouse over plain http on qemu's host address, which pip trusts only where told
    # (the tensorflow role tells it; the frameworks role does not yet).
    carried = [name for name in ("frameworks_torch_version", "frameworks_jax_version") if matrix.get(name)]
    if carried and args.provider == "local":
        raise UsageError(f"MATRIX={matrix_file}: {', '.join(carried)} for PROVIDER=local: the frameworks role does "
                         "not install from a wheelhouse served to a VM yet; bake them into a container image "
                         "(PROVIDER=docker) or a cloud image (aws|gcp|azure)")
    extra, base, wheelhouse = local_inputs(matrix_file) if args.provider == "local" else ({}, None, None)
    if args.provider == "docker":
        extra, docker_base, docker_pull, wheelhouse = docker_inputs(profile, matrix, matrix_file)
    if chosen:
        extra["matrix-override"] = json.dumps(chosen, sort_keys=True)
    for var_file in args.var_file:
        if not Path(var_file).is_file():
            raise UsageError(f"--var-file {var_file}: no such file")
        extra[f"var-file:{Path(var_file).name}"] = Path(var_file).read_text()
    fingerprint = imagelib.fingerprint(ROOT, args.provider, profile, extra)
    output = imagelib.output_dir(IMAGES, args.provider, profile, fingerprint)
    job = Bake(args.provider, profile, fingerprint, output)
    if not args.force and reusable(output, args.provider, registry):
        print(f"image: up to date, fingerprint {fingerprint} unchanged: {output}")
        return output

    started = time.monotonic()
    work = output.with_name(f".{output.name}.tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    templates = ROOT / "packer"
    if not is_modern(version):
        templates = work / "packer"
        compat_tree(ROOT / "packer", templates)
    variables = {
        "profile": profile, "fingerprint": fingerprint, "versions": labels(matrix),
        "ansible_playbook_command": str(Path(sys.executable).with_name("ansible-playbook")),
        "ansible_directory": str(ROOT / "ansible"), "output_directory": str(work),
        "ansible_extra_vars": {"kiln_image_fingerprint": fingerprint, **chosen,
                               "kiln_image_matrix_override": json.dumps(chosen, sort_keys=True)},
    }
    try:
        with contextlib.ExitStack() as stack:
            if args.provider == "local":
                port = stack.enter_context(provision.served(wheelhouse))
                variables["ansible_extra_vars"]["tensorflow_wheelhouse_url"] = f"http://{VM_ADDRESS_OF_HOST}:{port}/"
                variables.update({
                    "local_base_disk": str(base / "disk.qcow2"), "local_kernel": str(base / "vmlinuz"),
                    "local_initrd": str(base / "initrd.img"), "local_ssh_private_key_file": str(base / "bake_key"),
                    "local_output_directory": str(work / "disk"), "local_serial_log": str(work / "console.log"),
                })
            if args.provider == "docker":
                variables["ansible_extra_vars"]["kiln_image_target"] = "container"
                variables.update({"docker_base_image": docker_base, "docker_pull": docker_pull})
                if wheelhouse:  # the container runs on the host's network: 127.0.0.1 is this machine
                    port = stack.enter_context(provision.served(wheelhouse))
                    variables["ansible_extra_vars"]["tensorflow_wheelhouse_url"] = f"http://127.0.0.1:{port}/"
            (work / "kiln.pkrvars.hcl").write_text(pkrvars(variables))
            var_files = [ROOT / "packer" / "vars" / f"{args.provider}.pkrvars.hcl", *map(Path, args.var_file),
                         work / "kiln.pkrvars.hcl"]
            run_packer(imagelib.packer_build_argv(job, templates, var_files), work / "packer.log", args.timeout)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if args.provider == "local":
        for name in ("vmlinuz", "initrd.img"):
            shutil.copy2(base / name, work / name)
    record = {"provider": args.provider, "profile": profile, "fingerprint": fingerprint,
              "versions": json.loads((work / "versions.json").read_text()),
              "bake_seconds": round(time.monotonic() - started, 1),
              "matrix_override": {"file": str(matrix_file), "entries": chosen} if chosen else None}
    if args.provider == "local":
        record.update({"disk": "disk/kiln.qcow2", "kernel": "vmlinuz", "initrd": "initrd.img"})
    if args.provider == "docker":
        record["image_id"] = container.artifact_id(json.loads((work / "packer-manifest.json").read_text()))
        record["base"] = docker_base
        publish(record, registry)
    (work / "image.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(output, ignore_errors=True)
    work.rename(output)
    print(f"image: baked in {record['bake_seconds']} s: {output}")
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/image", description=__doc__.split("\n\n")[1])
    parser.add_argument("provider")
    parser.add_argument("--profile", choices=("gpu", "cpu"))
    parser.add_argument("--matrix", default="", help="a matrix file (matrices/) whose entries replace the matrix's")
    parser.add_argument("--var-file", action="append", default=[], help="more packer variables (credentials stay out)")
    parser.add_argument("--registry", default="", help="docker: also push the image to this registry (HOST[:PORT])")
    parser.add_argument("--force", action="store_true", help="bake even when an image with this fingerprint exists")
    parser.add_argument("--timeout", type=float, default=5400, help="seconds the whole packer build may take")
    args = parser.parse_args(argv)
    return run_main("image", lambda: bake(args) and 0)


if __name__ == "__main__":
    sys.exit(main())
