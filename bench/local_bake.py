#!/usr/bin/env python3
"""usage: bench/local_bake.py [--image DIR]

The local bake, measured in one run (qemu under TCG on this machine):
  bake_s            `scripts/image local --force`: base disk boot, the cpu profile, cleanup, shutdown
  provision_1_s     the first ansible/image.yml run inside that bake (from Packer's log)
  provision_2_s     image.yml again on the baked image, booted on a throwaway overlay (changes nothing)
  ratio             provision_2_s / provision_1_s
  fingerprint_hit_s `scripts/image local` again with nothing changed (reuses the image)
  make_image_hit_s  `make image` with nothing changed: `make validate` first, then the reuse
Nothing is asserted. The base disk and the wheelhouse are cached first, so they are not counted.
With --image DIR (a local image baked by this checkout, e.g. by `make image-test`), bake_s and
provision_1_s are read from that bake's own record and log instead of baking again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bake import base_image
from bake.provision import ANSIBLE, playbook, recap, served, wheelhouse
from kiln.paths import PROJECT as ROOT
from kiln.paths import cache_dir
from localcloud.vm import booted

STAMP = re.compile(r"^\[\s*([\d.]+)\]")


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL, timeout=7200)
    return time.monotonic() - started


def first_provisioning(log: Path) -> float:
    """Seconds from the first Ansible provisioner's start to the manifest download after it."""
    start = end = None
    for line in log.read_text().splitlines():
        stamp = STAMP.match(line)
        if not stamp:
            continue
        if start is None and "Provisioning with Ansible" in line:
            start = float(stamp.group(1))
        elif start is not None and "/etc/kiln/manifest.json" in line:
            end = float(stamp.group(1))
            break
    if start is None or end is None:
        raise SystemExit(f"bench: cannot find the first provisioning run in {log}")
    return end - start


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench/local_bake.py")
    parser.add_argument("--image", type=Path, help="measure on this baked local image instead of baking one")
    args = parser.parse_args()
    wheels = wheelhouse()
    base_image.ensure(cache_dir())
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        if args.image:
            image = args.image.resolve()
            record = json.loads((image / "image.json").read_text())
            bake_s = record["bake_seconds"]
        else:
            bake_s = timed([sys.executable, "-m", "bake.image", "local", "--force"], {"KILN_IMAGES": tmp})
            image = next(Path(tmp).glob("local-cpu-*"))
            record = json.loads((image / "image.json").read_text())
        env = {"KILN_IMAGES": str(image.parent)}
        provision_1_s = first_provisioning(image / "packer.log")
        with booted(image, Path(tmp) / "vm", "kiln-bench") as ssh_config, served(wheels) as port:
            started = time.monotonic()
            result = playbook(ssh_config, ANSIBLE / "image.yml", "-e", "kiln_image_profile=cpu",
                              "-e", f"kiln_image_fingerprint={record['fingerprint']}",
                              "-e", f"tensorflow_wheelhouse_url=http://10.0.2.2:{port}/")
            provision_2_s = time.monotonic() - started
        changed = recap(result.stdout).get("changed")
        hit_s = timed([sys.executable, "-m", "bake.image", "local"], env)
        make_hit_s = timed(["make", "--no-print-directory", "image"], env)
    print(f"{'bake_s':>8} {'provision_1_s':>14} {'provision_2_s':>14} {'ratio':>6} {'changed_2':>9} "
          f"{'fingerprint_hit_s':>18} {'make_image_hit_s':>17}")
    print(f"{bake_s:8.0f} {provision_1_s:14.0f} {provision_2_s:14.0f} {provision_2_s / provision_1_s:6.2f} "
          f"{changed:9d} {hit_s:18.2f} {make_hit_s:17.1f}")


if __name__ == "__main__":
    main()
