"""How often a long step says how far it is where the output is not a terminal (a CI log, a pipe): one setting for
every step that reports (a pull's bytes, a bake's tasks)."""

from __future__ import annotations

import os

from kiln.errors import UsageError


def line_seconds() -> float:
    """How often a report prints its line where the output is not a terminal: KILN_PROGRESS_SECONDS, else 30."""
    given = os.environ.get("KILN_PROGRESS_SECONDS", "30")
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise UsageError(f"KILN_PROGRESS_SECONDS={given!r}: give how many seconds between progress lines")
    return seconds
