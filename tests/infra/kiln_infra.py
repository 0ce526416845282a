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
