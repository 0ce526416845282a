"""kiln's horovodrun (bootstrap/shim/horovodrun.py): horovodrun itself, with its per-launch build check
answered from a cache kept per Horovod install. Real horovodrun launches over Gloo on this machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.paths import PROJECT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.quick,
    pytest.mark.skipif(importlib.util.find_spec("horovod") is None, reason="horovod is not installed in this Python"),
]

SHIM = PROJECT / "bootstrap" / "shim" / "horovodrun.py"


def horovodrun(cache_home: Path, *command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    return subprocess.run([sys.executable, str(SHIM), "-np", "1", "-H", "localhost:1", "--gloo", *command],
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_first_launch_checks_the_build_and_caches_the_answer(tmp_path):
    done = horovodrun(tmp_path, "echo", "rank ran")
    assert done.returncode == 0, done.stderr
    assert "rank ran" in done.stdout
    cached = json.loads((tmp_path / "kiln" / "horovod-build.json").read_text())
    assert cached["gloo"] is True
    assert "horovod" in cached["key"] and sys.executable in cached["key"]


def test_a_cached_answer_is_what_horovodrun_acts_on(tmp_path):
    horovodrun(tmp_path, "true")
    path = tmp_path / "kiln" / "horovod-build.json"
    cached = json.loads(path.read_text())
    # Say Gloo is missing for this very install: horovodrun must refuse without checking again.
    path.write_text(json.dumps({**cached, "gloo": False}))
    refused = horovodrun(tmp_path, "echo", "rank ran")
    assert refused.returncode != 0
    assert "Gloo support has not been built" in refused.stderr
    assert "rank ran" not in refused.stdout


def test_an_answer_for_another_install_is_checked_again(tmp_path):
    path = tmp_path / "kiln" / "horovod-build.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": "[\"0.0.0\"]", "gloo": False, "mpi": False}))
    done = horovodrun(tmp_path, "echo", "rank ran")
    assert done.returncode == 0, done.stderr
    assert "rank ran" in done.stdout
    assert json.loads(path.read_text())["gloo"] is True
