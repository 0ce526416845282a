"""Who runs where: roles, slots, ports, TF_CONFIG per process, Horovod hostfile (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bootstrap.errors import TopologyError

DEFAULT_BASE_PORT = 23456
CLUSTER_ROLES = ("chief", "worker", "ps")


@dataclass(frozen=True)
class Process:
    """One training process: its role, its index in that role, its host and port."""

    role: str
    index: int
    host: int
    port: int

    @property
    def task(self) -> str:
        return f"{self.role}-{self.index}"


@dataclass(frozen=True)
class Topology:
    """The processes of one tf-config run over hosts known by their cluster names."""

    names: tuple[str, ...]
    processes: tuple[Process, ...]

    def address(self, process: Process) -> str:
        return join_host_port(self.names[process.host], process.port)

    def cluster_spec(self) -> dict[str, list[str]]:
        """TensorFlow's cluster dict; the evaluator is not part of it."""
        spec: dict[str, list[str]] = {}
        for role in CLUSTER_ROLES:
            members = [p for p in self.processes if p.role == role]
            if members:
                spec[role] = [self.address(p) for p in sorted(members, key=lambda p: p.index)]
        return spec


def join_host_port(name: str, port: int) -> str:
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


def plan_tf_config(
    names: Sequence[str],
    slots: Sequence[int],
    *,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    base_port: int = DEFAULT_BASE_PORT,
) -> Topology:
    """Place one worker per slot; with `ps` > 0 add a chief (the coordinator) and
    parameter servers. The chief goes on the first host, parameter server i on
    host i mod n, the evaluator beside the chief (it reads the model the chief
    writes). Ports count up from `base_port` on each host."""
    if not names:
        raise TopologyError("no hosts to place processes on")
    if len(names) != len(slots):
        raise TopologyError("every host needs a slot count")
    if ps < 0:
        raise TopologyError(f"--ps must be 0 or more, got {ps}")
    if not 1 <= base_port <= 65535:
        raise TopologyError(f"base port {base_port} is out of range")
    next_port = [base_port] * len(names)
    processes: list[Process] = []

    def place(role: str, index: int, host: int) -> None:
        port = next_port[host]
        if port > 65535:
            raise TopologyError(f"too many processes on {names[host]} above port {base_port}")
        next_port[host] += 1
        processes.append(Process(role, index, host, port))

    if chief or ps:
        place("chief", 0, 0)
    worker = 0
    for host, count in enumerate(slots):
        for _ in range(count):
            place("worker", worker, host)
            worker += 1
    for index in range(ps):
        place("ps", index, index % len(names))
    if evaluator:
        place("evaluator", 0, 0)
    return Topology(tuple(names), tuple(processes))


def tf_config(topology: Topology, process: Process) -> dict:
    """The TF_CONFIG dict for one process, in the shape TensorFlow documents."""
    return {"cluster": topology.cluster_spec(), "task": {"type": process.role, "index": process.index}}


def finishing_tasks(topology: Topology) -> list[Process]:
    """The processes whose exit ends a run: the chief (and evaluator) with
    parameter servers (workers and servers then serve forever), otherwise chief,
    workers and evaluator."""
    roles = {p.role for p in topology.processes}
    ending = ("chief", "evaluator") if "ps" in roles else ("chief", "worker", "evaluator")
    return [p for p in topology.processes if p.role in ending]


def horovod_hostfile(names: Sequence[str], slots: Sequence[int]) -> str:
    """Horovod's hostfile: `name slots=N` per line, ranks assigned in this order."""
    return "".join(f"{name} slots={count}\n" for name, count in zip(names, slots, strict=True))


def horovod_rank_hosts(names: Sequence[str], slots: Sequence[int]) -> list[str]:
    """Which host each rank runs on, rank by rank (Horovod fills hosts in order)."""
    return [name for name, count in zip(names, slots, strict=True) for _ in range(count)]


def common_interface(interfaces: Mapping[str, str]) -> str:
    """The network interface every node uses for its cluster address; Gloo needs
    one name that exists on all of them."""
    distinct = sorted(set(interfaces.values()))
    if len(distinct) != 1:
        detail = ", ".join(f"{host}={iface}" for host, iface in sorted(interfaces.items()))
        raise TopologyError(
            "nodes reach each other over differently named interfaces "
            f"({detail}); pass --nic to name the one to use"
        )
    return distinct[0]
