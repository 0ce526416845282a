"""Helpers shared by the infra suite's tests (kept apart from conftest.py, whose name other suites share)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "ansible" / "group_vars" / "all" / "versions.yml"
MANIFEST = "/etc/kiln/manifest.json"
BAKE_RECORD = "/etc/kiln/bake.json"
VENV = "/opt/kiln/venv"



def read_json(host, path: str) -> dict:
    file = host.file(path)
    if not file.exists:
        pytest.fail(f"{path} is missing: this is not a kiln image, or its bake did not finish")
    return json.loads(file.content_string)


def run_checked(host, command: str):
    """Run a command; fail with its output as the evidence when it exits non-zero."""
    result = host.run(command)
    if result.rc != 0:
        pytest.fail(f"`{command}` exited {result.rc}\n{result.stdout}\n{result.stderr}")
    return result


def venv_python(code: str) -> str:
    return f"TF_CPP_MIN_LOG_LEVEL=3 TF_USE_LEGACY_KERAS=1 {VENV}/bin/python -c {shlex.quote(code)}"


# The RDMA devices the kernel shows (EFA, InfiniBand HCAs), a line each: name, driver, first port's link layer
# and state; the same view as kiln's launcher (bootstrap/node.py rdma_devices).
RDMA_LISTING = (
    'for d in /sys/class/infiniband/*; do [ -e "$d" ] || continue; '
    'printf "%s|%s|%s|%s\\n" "${d##*/}" "$(basename "$(readlink "$d/device/driver")")" '
    '"$(cat "$d/ports/1/link_layer" 2>/dev/null)" "$(cat "$d/ports/1/state" 2>/dev/null)"; done'
)


def rdma_devices(listing: str) -> list[dict[str, str]]:
    """RDMA_LISTING's output as the launcher's facts have it."""
    found = []
    for line in listing.splitlines():
        if line.count("|") == 3:
            name, driver, link_layer, state = line.split("|")
            found.append({"name": name, "driver": driver, "link_layer": link_layer, "state": state})
    return found
