"""Every benchmark starts: its --help answers (exit 0, its usage) without a cluster, a bake or root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda path: path.name)
def test_each_benchmark_answers_help(script):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:"), done.stdout
