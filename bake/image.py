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

from bake import container
from bake import plan as imagelib
from bake.matrix import labels, read_matrix, read_override
from bake.packer import compat_tree, is_modern, parse_packer_version, pkrvars
from bake.plan import Bake
from bake.progress import BakeProgress, last_log, logged_tasks
from bake.targets import TARGETS
from kiln import proc
from kiln.errors import KilnError, UsageError, run_main
from kiln.paths import PROJECT as ROOT
from kiln.paths import cache_dir
from kiln.progress import line_seconds

IMAGES = Path(os.environ.get("KILN_IMAGES", ROOT / "images"))


def packer_version() -> tuple[int, int, int]:
    if not shutil.which("packer"):
        raise UsageError("packer is not installed (make setup installs Debian's)")
    return parse_packer_version(proc.run(["packer", "version"], timeout=30).stdout)


def run_packer(argv: list[str], log: Path, timeout: float, before: Path | None = None) -> None:
    """Run packer, its output to the terminal and to log (each line with the seconds since the start);
    bounded in time; Ctrl-C lets it clean up. Every KILN_PROGRESS_SECONDS (30) it says which Ansible task the bake
    is at, and with `before` (the last such bake's log) of about how many and about how long is left."""
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "PACKER_NO_COLOR": "1",
           "PACKER_CACHE_DIR": os.environ.get("PACKER_CACHE_DIR", str(cache_dir() / "packer"))}
    every = line_seconds()
    tasks = BakeProgress(*logged_tasks(before.read_text(errors="replace").splitlines())) if before else BakeProgress()
    print("image: " + " ".join(argv), flush=True)
    with log.open("w", buffering=1) as out:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                   cwd=ROOT, start_new_session=True)
        timer = threading.Timer(timeout, lambda: os.killpg(process.pid, signal.SIGINT))
        timer.start()
        started = time.monotonic()
        done, lock = threading.Event(), threading.Lock()

        def report() -> None:  # on its own clock: a task may be silent for minutes (a pip install)
            while not done.wait(every):
                with lock:
                    print(tasks.line(time.monotonic() - started), flush=True)

        threading.Thread(target=report, name="bake-progress", daemon=True).start()
        try:
            for line in process.stdout:
                with lock:
                    sys.stdout.write(line)
                    out.write(f"[{time.monotonic() - started:8.1f}] {line}")
                    tasks.feed(line)
            process.wait()
        except KeyboardInterrupt:
            os.killpg(process.pid, signal.SIGINT)  # packer stops the VM and removes what it made
            process.wait(timeout=120)
            raise
        finally:
            timer.cancel()
            done.set()
    if process.returncode != 0:
        raise KilnError(f"packer build failed (exit {process.returncode}); its log: {log}")


def bake(args) -> Path:
    profile = imagelib.choose_profile(args.provider, args.profile)
    target = TARGETS[args.provider]
    version = packer_version()
    imagelib.check_packer_for(args.provider, version)
    registry = container.check_registry(args.registry) if args.registry else ""
    if registry and not target.pushes:
        raise UsageError(f"REGISTRY={registry} belongs to PROVIDER=docker (a container image is pushed)")
    matrix_file = Path(args.matrix) if args.matrix else None
    base_matrix = read_matrix()
    chosen = read_override(matrix_file, base_matrix) if matrix_file else {}
    matrix = {**base_matrix, **chosen}
    target.check(matrix, matrix_file)
    prepared = target.prepare(profile, matrix, matrix_file)
    extra = dict(prepared.extra)
    if chosen:
        extra["matrix-override"] = json.dumps(chosen, sort_keys=True)
    for var_file in args.var_file:
        if not Path(var_file).is_file():
            raise UsageError(f"--var-file {var_file}: no such file")
        extra[f"var-file:{Path(var_file).name}"] = Path(var_file).read_text()
    fingerprint = imagelib.fingerprint(ROOT, args.provider, profile, extra)
    output = imagelib.output_dir(IMAGES, args.provider, profile, fingerprint)
    job = Bake(args.provider, profile, fingerprint, output)
    if not args.force and target.reusable(output, registry):
        print(f"image: up to date, fingerprint {fingerprint} unchanged: {output}")
        return output

    if is_modern(version):  # the plugins the templates require (make validate installs them too: no order needed)
        proc.run(["packer", "init", str(ROOT / "packer" / "plugins")], timeout=600)
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
            own, extra_vars = target.variables(prepared, work, stack)
            variables.update(own)
            variables["ansible_extra_vars"].update(extra_vars)
            (work / "kiln.pkrvars.hcl").write_text(pkrvars(variables))
            var_files = [ROOT / "packer" / "vars" / f"{args.provider}.pkrvars.hcl", *map(Path, args.var_file),
                         work / "kiln.pkrvars.hcl"]
            run_packer(imagelib.packer_build_argv(job, templates, var_files), work / "packer.log", args.timeout,
                       last_log(IMAGES, args.provider, profile))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    record = {"provider": args.provider, "profile": profile, "fingerprint": fingerprint,
              "versions": json.loads((work / "versions.json").read_text()),
              "bake_seconds": round(time.monotonic() - started, 1),
              "matrix_override": {"file": str(matrix_file), "entries": chosen} if chosen else None}
    target.finish(prepared, work, record, registry)
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
