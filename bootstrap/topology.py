"""Who runs where: roles, slots, ports, TF_CONFIG per process, Horovod hostfile (pure)."""

from __future__ import annotations

import shlex
from collections import Counter
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


def next_base_port(ports: Sequence[int]) -> int:
    """Where to try a run's ports next when others hold some of them: just past the highest it wanted."""
    return max(ports) + 1


def describe_reserved(conflicts: Mapping[str, Mapping[str, str]]) -> str:
    """`ports 23456, 23457 on node1 are reserved by run R` for each node and holder (pure)."""
    parts = []
    for node, held in sorted(conflicts.items()):
        by_run: dict[str, list[str]] = {}
        for port, run in sorted(held.items(), key=lambda item: int(item[0])):
            by_run.setdefault(run, []).append(port)
        parts += [f"port(s) {', '.join(ports)} on {node} reserved by run {run}" for run, ports in by_run.items()]
    return "; ".join(parts)


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
    no_chief: bool = False,
) -> Topology:
    """Place one worker per slot; with `ps` > 0 add a chief (the coordinator) and
    parameter servers, or with `no_chief` parameter servers and workers alone (the
    between-graph shape: worker 0 leads). The chief goes on the first host,
    parameter server i on host i mod n, the evaluator beside the chief (it reads
    the model the chief writes). Ports count up from `base_port` on each host."""
    if not names:
        raise TopologyError("no hosts to place processes on")
    if len(names) != len(slots):
        raise TopologyError("every host needs a slot count")
    if ps < 0:
        raise TopologyError(f"--ps must be 0 or more, got {ps}")
    if no_chief and chief:
        raise TopologyError("--chief and --no-chief contradict each other")
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

    if (chief or ps) and not no_chief:
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
    parameter servers (servers serve forever; workers may end on their own),
    otherwise chief, workers and evaluator (with parameter servers and no chief:
    the workers, which lead themselves)."""
    roles = {p.role for p in topology.processes}
    ending = ("chief", "evaluator") if "ps" in roles and "chief" in roles else ("chief", "worker", "evaluator")
    return [p for p in topology.processes if p.role in ending]


PER_NODE_MODES = ("tf-config", "jax")  # one process drives every GPU of its node


def resolve_slots(mode: str, asked: Sequence[int | None], gpus: Sequence[int] | None) -> tuple[int, ...]:
    """Processes per host: what was asked (--slots, a hostfile's slots=N), else one per GPU in horovod and torchrun
    modes and kiln run (one on a node without GPUs, and while the nodes' GPUs are not known: `gpus` None), one in
    tf-config and jax modes (MultiWorkerMirroredStrategy, and JAX, drive every GPU of their node from one
    process)."""
    counts = gpus if gpus is not None else [0] * len(asked)
    if len(counts) != len(asked):
        raise TopologyError("every host needs a GPU count")
    per_gpu = mode not in PER_NODE_MODES
    return tuple(slots or (max(count, 1) if per_gpu else 1) for slots, count in zip(asked, counts, strict=True))


def local_ranks(hosts: Sequence[int]) -> list[tuple[int, int]]:
    """(local rank, local size) of each process, given each process's host: its place among the processes on
    its host, in order, and how many there are."""
    sizes = Counter(hosts)
    seen: Counter[int] = Counter()
    ranks = []
    for host in hosts:
        ranks.append((seen[host], sizes[host]))
        seen[host] += 1
    return ranks


def placement_note(mode: str, names: Sequence[str], asked: Sequence[int | None], slots: Sequence[int],
                   gpus: Sequence[int] | None) -> str:
    """The placement as a person reads it: how many processes on which nodes, and why."""
    if gpus is None:
        known = "GPUs counted when the nodes connect"
        counts: Sequence[int | None] = [None] * len(names)
    else:
        known, counts = "", gpus
    groups: dict[tuple[int, int | None, bool], list[str]] = {}
    for name, wanted, count, gpu_count in zip(names, asked, slots, counts, strict=True):
        groups.setdefault((count, gpu_count, wanted is not None), []).append(name)
    parts = []
    for (count, gpu_count, given), members in groups.items():
        where = ", ".join(members) if len(members) <= 4 else f"{members[0]} ... {members[-1]} ({len(members)} nodes)"
        has = "" if gpu_count is None else f", {gpu_count} GPU(s)" if gpu_count else ", no GPUs"
        why = "as given" if given else "one per GPU" if mode not in PER_NODE_MODES and gpu_count else ""
        parts.append(f"{count} process(es) on {where}{has}{f' ({why})' if why else ''}")
    lines = ["placement: " + "; ".join(parts)]
    if len(groups) > 1:
        lines.append("  the nodes differ: each gets its own count (the hostfile's slots)")
    if mode == "tf-config":
        lines.append("  tf-config: one worker per node unless --slots says otherwise; MultiWorkerMirroredStrategy "
                     "uses every GPU of its node")
    if mode == "jax":
        lines.append("  jax: one process per node unless --slots says otherwise; it drives every GPU of its node")
    if known and mode not in PER_NODE_MODES:
        lines.append(f"  {known}: where no slots were given, a node with GPUs gets one process per GPU")
    return "\n".join(lines)


def horovod_hostfile(names: Sequence[str], slots: Sequence[int]) -> str:
    """Horovod's hostfile: `name slots=N` per line, ranks assigned in this order."""
    return "".join(f"{name} slots={count}\n" for name, count in zip(names, slots, strict=True))


def discovery_script(names: Sequence[str], slots: Sequence[int], timeout: int = 3) -> str:
    """Horovod's elastic host discovery script: `name:slots` for each of the run's nodes that answers SSH now
    (through kiln's ssh shim, first on the processes' PATH: the cluster's pinned keys), the first node (where it
    runs) always. Checked side by side, each within `timeout` seconds."""
    checks = "".join(
        f"( ssh -o BatchMode=yes -o ConnectTimeout={timeout} {shlex.quote(name)} true </dev/null >/dev/null 2>&1 "
        f"&& echo {shlex.quote(f'{name}:{count}')} > \"$tmp/{index}\" ) &\n"
        for index, (name, count) in enumerate(zip(names, slots, strict=True)) if index)
    return ("#!/bin/sh\n# kiln: the run's nodes that answer now (horovodrun --host-discovery-script)\n"
            f"tmp=$(mktemp -d) || exit 1\necho {shlex.quote(f'{names[0]}:{slots[0]}')}\n{checks}wait\n"
            "cat \"$tmp\"/* 2>/dev/null\nrm -rf \"$tmp\"\n")


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
