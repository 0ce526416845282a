"""Stand-ins only the tests use, for the cloud APIs that have no emulator: Compute Engine (testbed.gce) and Azure
Resource Manager (testbed.arm), each serving the published API over HTTP(S) with its faults. They build on the local
cloud (localcloud/: host keys, quiet servers); nothing outside the tests imports them."""

from __future__ import annotations

from collections.abc import Callable


def take_fault(faults: list, meets: Callable[[object], bool]):
    """The fault a call meets, if any: every set fault it `meets` counts the call down, and the first whose count
    reaches 0 is its (taken out of `faults`, with any other due now); nth counts the calls since it was set."""
    mine = [fault for fault in faults if meets(fault)]
    for fault in mine:
        fault.countdown -= 1
    due = [fault for fault in mine if fault.countdown == 0]
    for fault in due:
        faults.remove(fault)
    return due[0] if due else None
