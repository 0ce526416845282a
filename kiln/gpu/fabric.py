"""What the GPU fabric's own tools say (pure): libfabric's `fi_info -p efa` and rdma-core's `ibv_devinfo`, read into
the devices they show working, and the verdicts the infra suite (tests/infra/test_fabric.py) gives a host whose
kernel lists the devices (bootstrap/node.py rdma_devices: /sys/class/infiniband)."""

from __future__ import annotations

import re
from collections.abc import Sequence

ACTIVE_PORT = "PORT_ACTIVE"


def efa_devices(fi_info: str) -> list[str]:
    """The devices libfabric's EFA provider opens, from `fi_info -p efa` (each domain is DEVICE-rdm or
    DEVICE-dgrm), in order, once each."""
    found: list[str] = []
    provider = ""
    for line in fi_info.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "provider":
            provider = value.strip()
        elif key == "domain" and provider == "efa":
            device = re.sub(r"-(rdm|dgrm)$", "", value.strip())
            if device not in found:
                found.append(device)
    return found


def ib_ports(ibv_devinfo: str) -> dict[str, dict[str, str]]:
    """Each HCA `ibv_devinfo` shows, with its first port's state (PORT_ACTIVE when up) and link layer."""
    ports: dict[str, dict[str, str]] = {}
    hca = ""
    for line in ibv_devinfo.splitlines():
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "hca_id":
            hca = value
            ports[hca] = {"state": "", "link_layer": ""}
        elif hca and key in ("state", "link_layer") and not ports[hca][key]:
            ports[hca][key] = value.split()[0] if value else ""
    return ports


def efa_missing(kernel: Sequence[str], fi_info: str) -> list[str]:
    """The EFA devices the kernel lists that libfabric's EFA provider does not open (a missing or wrong stack)."""
    opened = set(efa_devices(fi_info))
    return [name for name in kernel if name not in opened]


def ib_not_up(kernel: Sequence[str], ibv_devinfo: str) -> list[str]:
    """The InfiniBand HCAs the kernel lists whose port is not active on InfiniBand, each with what it shows."""
    ports = ib_ports(ibv_devinfo)
    problems = []
    for name in kernel:
        port = ports.get(name)
        if port is None:
            problems.append(f"{name}: not shown by ibv_devinfo")
        elif port["state"] != ACTIVE_PORT or port["link_layer"] != "InfiniBand":
            problems.append(f"{name}: {port['state'] or 'no state'} on {port['link_layer'] or 'no link layer'}")
    return problems
