"""Preflight: judge what the nodes reported before anything is started (pure)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bootstrap import interconnect
from bootstrap.mesh import Node

CHECKS = ("reach", "hostname", "resolve", "versions", "ports", "mesh")
MESH_PROBES = 8  # nodes that prove the mesh by logging in to the next (kiln check --probes)
VERSIONED = ("python", "tensorflow", "tf-keras", "horovod")  # the same on every node, whatever the run
FRAMEWORKS = ("torch", "jax", "keras")  # the same on every node where the run needs them


@dataclass(frozen=True)
class Finding:
    host: str
    check: str
    problem: str


def versions_of(facts: dict) -> dict[str, str | None]:
    return {"python": facts.get("python"),
            **{k: facts.get("packages", {}).get(k) for k in (*VERSIONED[1:], *FRAMEWORKS)}}


def check_nodes(nodes: Sequence[Node], *, ports: Sequence[int] = (), required: Sequence[str] = ("tensorflow",),
                compare_versions: bool = True) -> list[Finding]:
    """Every problem found in the facts: duplicate or loopback-bound hostnames,
    names that don't resolve to the node's address, mismatched versions (unless not `compare_versions`: a run
    in a container image compares the image's), busy ports."""
    findings: list[Finding] = []
    by_name: dict[str, list[Node]] = {}
    for node in nodes:
        by_name.setdefault(node.name, []).append(node)
    for name, same in by_name.items():
        if len(same) > 1:
            for node in same:
                findings.append(Finding(node.host.label, "hostname", f"hostname {name!r} is not unique"))
    by_node_name = {node.name: node for node in nodes}
    for node in nodes:
        findings += _resolution(node, by_node_name)
        findings += [Finding(node.host.label, "ports", f"port {port} is in use")
                     for port in ports if not node.facts.get("ports", {}).get(str(port), True)]
    if compare_versions:
        findings += _versions(nodes, required)
    return findings


def _resolution(node: Node, by_name: dict[str, Node]) -> list[Finding]:
    """What `node` found wrong in its own name and in the names it looked up (each against that node's address,
    from its name: a node looks up a few others, so the check grows with the cluster, not its square)."""
    found = []
    resolved = node.facts.get("resolve", {})
    own = resolved.get(node.name, [])
    loopback = [a for a in own if ipaddress.ip_address(a.split("%")[0]).is_loopback]
    if not own:
        found.append(Finding(node.host.label, "resolve", f"own hostname {node.name!r} does not resolve"))
    elif loopback:
        found.append(Finding(node.host.label, "resolve",
                             f"own hostname {node.name!r} resolves to loopback {', '.join(loopback)} "
                             "(Gloo would bind there); run kiln mesh"))
    for name, addresses in resolved.items():
        other = by_name.get(name)
        if other is None or other is node:
            continue
        if addresses != [other.address]:
            shown = ", ".join(addresses) or "nothing"
            found.append(Finding(node.host.label, "resolve",
                                 f"{other.name!r} resolves to {shown}, expected {other.address}"))
    return found


def _versions(nodes: Sequence[Node], required: Sequence[str]) -> list[Finding]:
    found = []
    for node in nodes:
        for package in required:
            if not versions_of(node.facts).get(package):
                found.append(Finding(node.host.label, "versions",
                                     f"{package} is not installed for {node.facts.get('executable')}"))
    if not nodes:
        return found
    reference = versions_of(nodes[0].facts)
    for node in nodes[1:]:
        mine = versions_of(node.facts)
        for key in dict.fromkeys([*VERSIONED, *(package for package in required if package in FRAMEWORKS)]):
            if mine[key] != reference[key]:
                found.append(Finding(node.host.label, "versions",
                                     f"{key} {mine[key] or 'missing'} differs from {reference[key] or 'missing'} "
                                     f"on {nodes[0].host.label}"))
    return found


def neighbours(count: int, index: int, size: int = 8) -> list[int]:
    """The nodes whose names node `index` resolves in preflight: the next `size`
    round the ring (all others when there are that few), so the checks grow
    linearly with the cluster, yet every name is looked up somewhere."""
    return [(index + step) % count for step in range(1, min(size, count - 1) + 1)]


def ring_probes(count: int, probes: int) -> list[tuple[int, int]]:
    """Which nodes prove the mesh by logging in to the next one: `probes` of them,
    spread evenly round the ring (every node when there are that few)."""
    if count < 2 or probes < 1:
        return []
    chosen = sorted({round(i * count / min(probes, count)) % count for i in range(min(probes, count))})
    return [(i, (i + 1) % count) for i in chosen]


def check_probes(nodes: Sequence[Node]) -> list[Finding]:
    """A mesh probe must reach its target and get that node's hostname back."""
    found = []
    for node in nodes:
        probe = node.facts.get("probe")
        if probe and probe.get("answer") != probe["target"]:
            reason = probe.get("error") or f"answered {probe.get('answer')!r}"
            found.append(Finding(node.host.label, "mesh", f"ssh {probe['target']}: {reason}"))
    return found


def check_fabric(nodes: Sequence[Node]) -> tuple[list[Finding], str]:
    """Where any node has a fabric (EFA, InfiniBand): a node without it up while others have it (a run would use
    TCP sockets on every node), and devices that are down; with the line saying what a run would use. Nothing
    where no node has one."""
    fabrics = [(node.host.label, interconnect.of_node(node.facts)) for node in nodes]
    if not any(fabric.kind for _, fabric in fabrics):
        return [], ""
    choice = interconnect.choose(fabrics)
    up = [label for label, fabric in fabrics if fabric.devices]
    kinds = " or ".join(sorted({interconnect.NAMES[fabric.kind] for _, fabric in fabrics if fabric.devices}))
    found = []
    for label, fabric in fabrics:
        if up and not choice.kind and not fabric.devices:
            found.append(Finding(label, "fabric", f"no {kinds} device up where {', '.join(up)} "
                                 f"ha{'s' if len(up) == 1 else 've'} it: NCCL would use TCP sockets on every node"))
        if fabric.down:
            found.append(Finding(label, "fabric", f"{', '.join(fabric.down)} down"))
    return found, choice.note or "fabric: none up: NCCL uses TCP sockets"


def format_table(hosts: Sequence[str], findings: Sequence[Finding], unreachable: Mapping[str, str],
                 checks: Sequence[str] = CHECKS) -> str:
    """A per-host table of checks (ok / FAIL), then what failed, host by host."""
    failed = {(f.host, f.check) for f in findings} | {(h, "reach") for h in unreachable}
    width = max([len("host"), *(len(h) for h in hosts)])
    lines = ["  ".join(["host".ljust(width), *(c.ljust(8) for c in checks)]).rstrip()]
    for host in hosts:
        cells = []
        for check in checks:
            if host in unreachable and check != "reach":
                cells.append("-".ljust(8))
            else:
                cells.append(("FAIL" if (host, check) in failed else "ok").ljust(8))
        lines.append("  ".join([host.ljust(width), *cells]).rstrip())
    problems = [f"{h}: reach: {reason}" for h, reason in unreachable.items()]
    problems += [f"{f.host}: {f.check}: {f.problem}" for f in findings]
    if problems:
        lines += ["", *problems]
    return "\n".join(lines)
