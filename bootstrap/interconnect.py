"""The GPU fabric a run's collectives use (pure): which one every node has (from the RDMA devices its facts list),
and what NCCL is told so it uses it, or is told plainly to use TCP sockets.

A run uses a fabric only where every node has it up: NCCL's transport is one for the whole job, and a node without
the fabric would leave the others waiting. Where a fabric is chosen, NCCL is made to use it (NCCL_NET names the
transport): a node that cannot open it fails the run at its first collective, saying why, instead of falling back
to sockets at a fraction of the bandwidth with nothing to tell the user."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bootstrap.errors import UsageError
from bootstrap.mesh import Node

CHOICES = ("auto", "efa", "ib", "socket")
ACTIVE = "4: ACTIVE"  # a port's state in sysfs when it is up
NAMES = {"efa": "EFA", "ib": "InfiniBand", "socket": "TCP sockets"}
# NCCL's transports by the names it registers them under: "AWS Libfabric" is the aws-ofi-nccl plugin's (its logs
# read "via NET/AWS Libfabric"), "IB" and "Socket" NCCL's own.
NCCL_NET = {"efa": "AWS Libfabric", "ib": "IB", "socket": "Socket"}
# Azure's topology file for each ND size, by its GPUs' PCI device ids (pci.ids): ND H100 v5 and ND H200 v5 share
# ndv5-topo.xml (Azure's health checks use it for both), ND A100 v4 (40 and 80 GB) ndv4-topo.xml.
TOPOLOGY_BY_GPU = {"ndv5-topo.xml": frozenset({"2330", "2335"}), "ndv4-topo.xml": frozenset({"20b0", "20b2"})}


@dataclass(frozen=True)
class NodeFabric:
    """One node's fabric: its kind ("efa", "ib", or "" for none), the devices that are up, those that are not,
    and the NCCL topology file its image carries (Azure's ND images)."""

    kind: str = ""
    devices: tuple[str, ...] = ()
    down: tuple[str, ...] = ()
    topology: str = ""


@dataclass(frozen=True)
class Choice:
    """The run's fabric: its kind, the environment every process gets for it, and one line saying so."""

    kind: str
    env: Mapping[str, str] = field(default_factory=dict)
    note: str = ""


def of_node(facts: Mapping) -> NodeFabric:
    """A node's fabric from its facts (node.py's `rdma`): EFA devices (the efa driver), else InfiniBand HCAs (their
    link layer says InfiniBand; RoCE ports say Ethernet and are left to NCCL's defaults)."""
    devices = facts.get("rdma") or []
    efa = [d for d in devices if d.get("driver") == "efa"]
    ib = [d for d in devices if d.get("link_layer") == "InfiniBand"]
    kind, chosen = ("efa", efa) if efa else ("ib", ib) if ib else ("", [])
    topology = topology_of(facts) if kind == "ib" else ""
    return NodeFabric(kind, tuple(d["name"] for d in chosen if d.get("state") == ACTIVE),
                      tuple(d["name"] for d in chosen if d.get("state") != ACTIVE), topology)


def topology_of(facts: Mapping) -> str:
    """The NCCL topology file, of those the node's image carries, made for its machine (by its GPUs), or "": a
    file for another machine would mislead NCCL more than none."""
    gpus = set(facts.get("gpu_pci") or [])
    for path in facts.get("nccl_topology") or []:
        if gpus and gpus <= TOPOLOGY_BY_GPU.get(path.rsplit("/", 1)[-1], frozenset()):
            return path
    return ""


def for_nodes(nodes: Sequence[Node], asked: str = "auto") -> Choice:
    """choose() over mesh nodes, each by its name and facts."""
    return choose([(node.name, of_node(node.facts)) for node in nodes], asked)


def validate(asked: str) -> str:
    if asked not in CHOICES:
        raise UsageError(f"--fabric {asked!r}: choose {', '.join(CHOICES)}")
    return asked


def choose(nodes: Sequence[tuple[str, NodeFabric]], asked: str = "auto") -> Choice:
    """The run's fabric: the one every node has up (`auto`), the one asked for (refused, naming the nodes that lack
    it, where one does), or TCP sockets (`socket`, or no fabric on every node: said when some node has one)."""
    validate(asked)
    if asked == "socket":
        kind = common_kind(nodes)
        return Choice("socket", socket_env(), "fabric: TCP sockets (--fabric socket)"
                      + (f", though every node has {NAMES[kind]}" if kind else ""))
    kind = common_kind(nodes)
    if asked != "auto" and kind != asked:
        lacking = [name for name, node in nodes if node.kind != asked or not node.devices]
        raise UsageError(f"--fabric {asked}: {', '.join(lacking)} ha{'s' if len(lacking) == 1 else 've'} no "
                         f"{NAMES[asked]} device up" + (f" ({describe_down(nodes, asked)})"
                                                        if describe_down(nodes, asked) else ""))
    if kind:
        counts = sorted({len(node.devices) for _, node in nodes})
        per_node = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        topologies = {node.topology for _, node in nodes}
        topology = topologies.pop() if len(topologies) == 1 else ""
        return Choice(kind, fabric_env(kind, nodes, topology),
                      f"fabric: {NAMES[kind]} ({per_node} device(s) per node), NCCL over {NCCL_NET[kind]}"
                      + (f", topology {topology}" if topology else ""))
    having = [name for name, node in nodes if node.kind and node.devices]
    if not having:
        down = describe_down(nodes)
        return Choice("", {}, f"fabric: none up ({down}): NCCL uses TCP sockets" if down else "")
    lacking = [name for name, node in nodes if name not in having]
    kinds = sorted({NAMES[node.kind] for _, node in nodes if node.kind and node.devices})
    return Choice("", {}, f"fabric: TCP sockets: {', '.join(lacking)} ha{'s' if len(lacking) == 1 else 've'} no "
                  f"{' or '.join(kinds)} device up where {', '.join(having)} ha{'s' if len(having) == 1 else 've'}"
                  + (f" ({describe_down(nodes)})" if describe_down(nodes) else ""))


def planned(asked: str) -> Choice:
    """What a dry run can say before any node is asked."""
    if validate(asked) == "socket":
        return choose([], asked)
    return Choice("", {}, f"fabric: {'whichever' if asked == 'auto' else NAMES[asked]} every node has up, "
                  "found from their RDMA devices at run time")


def common_kind(nodes: Sequence[tuple[str, NodeFabric]]) -> str:
    """The fabric every node has up, or ""."""
    kinds = {node.kind if node.devices else "" for _, node in nodes}
    return kinds.pop() if len(kinds) == 1 else ""


def describe_down(nodes: Sequence[tuple[str, NodeFabric]], kind: str = "") -> str:
    return "; ".join(f"{name}: {', '.join(node.down)} down" for name, node in nodes
                     if node.down and (not kind or node.kind == kind))


def fabric_env(kind: str, nodes: Sequence[tuple[str, NodeFabric]], topology: str = "") -> dict[str, str]:
    """What NCCL (and libfabric) are told for `kind`. EFA: libfabric's EFA provider, fork-safe verbs (PyTorch's data
    loaders fork), NCCL made to load the aws-ofi-nccl plugin (libnccl-net-ofi.so, as the EFA installer names it from
    1.44.0 on); device RDMA is libfabric's default where the device has it. InfiniBand: NCCL's IB transport on the
    HCAs every node has up (by exact name), the image's topology file where there is one, relaxed PCI ordering
    (Azure's ND guidance)."""
    env = {"NCCL_NET": NCCL_NET[kind]}
    if kind == "efa":
        return {**env, "NCCL_NET_PLUGIN": "ofi", "FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1",
                "RDMAV_FORK_SAFE": "1"}
    env.update({"NCCL_IB_DISABLE": "0", "NCCL_IB_PCI_RELAXED_ORDERING": "1"})
    if shared := [name for name in nodes[0][1].devices if all(name in node.devices for _, node in nodes)]:
        env["NCCL_IB_HCA"] = "=" + ",".join(shared)
    if topology:
        env["NCCL_TOPO_FILE"] = topology
    return env


def socket_env() -> dict[str, str]:
    """NCCL on TCP sockets, whatever the nodes have."""
    return {"NCCL_NET": NCCL_NET["socket"], "NCCL_IB_DISABLE": "1"}
