"""The one error hierarchy of the launcher, caught once at the task edge."""


class KilnError(Exception):
    """A failure the user can act on; the message says what and where."""

    exit_code = 1


class UsageError(KilnError):
    """Bad input on the command line or in a file."""

    exit_code = 2


class HostListError(UsageError):
    """A host list or hostfile that cannot be parsed; names the bad item."""


class TopologyError(UsageError):
    """A role layout that cannot be placed on the given hosts."""


class RemoteError(KilnError):
    """One or more hosts failed a step; carries the per-host reasons."""

    def __init__(self, step: str, failures: dict[str, str]):
        self.step = step
        self.failures = dict(failures)
        lines = [f"{step} failed on {len(failures)} host(s):"]
        lines += [f"  {host}: {reason}" for host, reason in sorted(failures.items())]
        super().__init__("\n".join(lines))


class RunFailed(KilnError):
    """A training run ended badly; the message names the host and process."""
