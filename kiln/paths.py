"""Where kiln's own files are: the checkout it runs from, and the cache of slow, unchanged results."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent  # the checkout: packer/, ansible/, the packages


def cache_dir() -> Path:
    """${KILN_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kiln}: outside any clone, keyed by content inside (what
    scripts/setup and scripts/wheelhouse also use)."""
    if os.environ.get("KILN_CACHE"):
        return Path(os.environ["KILN_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln"
