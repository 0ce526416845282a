"""The launcher's errors: children of kiln's one hierarchy (kiln.errors), caught once at the task edge."""

from kiln.errors import KilnError, UsageError

__all__ = ["KilnError", "UsageError", "HostListError", "TopologyError", "RemoteError", "RunFailed"]


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
