"""The one error hierarchy: every room raises these, and each entry point catches them once."""

from __future__ import annotations

import sys
from collections.abc import Callable


class KilnError(Exception):
    """A failure the user can act on; the message says what and where. `exit_code` is what the command exits with."""

    exit_code = 1

    def __init__(self, message: str = "", *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(KilnError):
    """Bad input on the command line or in a file."""

    exit_code = 2


def run_main(prog: str, main: Callable[[], int | None]) -> int:
    """Call a command's `main`; a KilnError becomes one line `prog: message` and its exit code, Ctrl-C 130."""
    try:
        return main() or 0
    except KilnError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
