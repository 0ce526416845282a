"""Idle shutdown of a cluster's nodes (`kiln up --idle-minutes N`, `kiln autostop`): what is pure about it.

Each node runs an agent (node.py's `autostop` verb, detached) that powers the node off once no process of a kiln
run has been on it for N minutes. The cluster's provider says what powering off means (Provider.shutdown): on AWS
the instance shuts down and, launched with InstanceInitiatedShutdownBehavior=terminate, is terminated (its data
volume stays); on Azure the VM deallocates itself as its own managed identity (a VM that only shut down would stay
allocated and billed); on a local cluster the node's processes are killed, as a machine that is switched off.
"""

from __future__ import annotations

from bootstrap.errors import UsageError

MAX_IDLE_MINUTES = 7 * 24 * 60
STATE_FILE = "~/kiln/autostop.json"
SHUTDOWNS = ("system", "namespace", "azure")  # what node.py's agent does to power a node off (the provider says which)


def validate_idle_minutes(minutes) -> float | None:
    """--idle-minutes N: None when not given; 0 cancels (autostop only)."""
    if minutes is None or minutes is False:
        return None
    try:
        value = float(minutes)
    except (TypeError, ValueError):
        raise UsageError(f"--idle-minutes {minutes!r}: give minutes, e.g. 30") from None
    if not 0 <= value <= MAX_IDLE_MINUTES:
        raise UsageError(f"--idle-minutes {value:g}: give 0 (cancel) to {MAX_IDLE_MINUTES} minutes")
    return value


def check_interval(idle_s: float) -> float:
    """How often the agent looks for runs: often enough that a node is off within a sixth of the window late,
    never more than every 30 s nor less than every second."""
    return max(1.0, min(30.0, idle_s / 6))


def agent_args(idle_minutes: float, shutdown: str) -> list[str]:
    """The arguments of node.py's `autostop` verb; `shutdown` is the cluster provider's power-off."""
    if shutdown not in SHUTDOWNS:
        raise UsageError(f"power-off {shutdown!r}: kiln's node agent knows {', '.join(SHUTDOWNS)}")
    idle_s = idle_minutes * 60
    return [f"{idle_s:g}", f"{check_interval(idle_s):g}", shutdown, STATE_FILE]


def describe(idle_minutes: float, hosts: list[str]) -> str:
    if idle_minutes == 0:
        return f"autostop cancelled on {', '.join(hosts)}"
    return (f"autostop: {', '.join(hosts)} power off after {idle_minutes:g} minute(s) without a kiln run "
            f"(kiln autostop --cluster NAME --idle-minutes 0 cancels)")
