"""Is a cluster's all-reduce as fast as its GPUs and network should make it? (pure)

What decides a multi-node run's speed is the collective, not one GPU: a node whose NVLink is slow, or whose NIC
fell back to TCP, holds every step of every rank back. This module reads all-reduce measurements (NVIDIA's
nccl-tests `all_reduce_perf` output, or the figures of kiln's own framework probe, kiln.gpu.allreduce) as bus
bandwidth, the figure nccl-tests reports and the public health checks hold nodes to: for an all-reduce over n
ranks, busbw = algbw * 2 (n - 1) / n, algbw = bytes / seconds (nccl-tests doc/PERFORMANCE.md). It judges each
node's figure against the floor for its GPUs, the cluster's against the floor for its node type, and names a node
far below the others.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

OUTLIER_SHARE = 0.75  # a node under 75 % of the nodes' median bus bandwidth is named
PAIR_SHARE = 0.5  # a node whose pairs are all under half the other pairs' median is named (a NIC on TCP, a bad
# link: several times slower; the network's own noise stays well above half)


@dataclass(frozen=True)
class Row:
    """One message size of an all_reduce_perf table: bytes, and out-of-place / in-place bus bandwidth (GB/s)."""

    size: int
    busbw_out: float
    busbw_in: float
    wrong: int


@dataclass(frozen=True)
class Measurement:
    """An all-reduce measurement: ranks, their devices (`host: model`), each size's row, nccl-tests' average and
    whether its data check passed."""

    ranks: int
    devices: tuple[str, ...]
    rows: tuple[Row, ...]
    average: float | None
    valid: bool
    tool: str = "nccl-tests"

    @property
    def peak(self) -> float:
        """The out-of-place bus bandwidth at the largest size measured: what the floors hold a node to (they are
        measured at large sizes, where the wires, not the latency, set the pace)."""
        return max(self.rows, key=lambda row: row.size).busbw_out if self.rows else 0.0

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(device.split(": ", 1)[0] for device in self.devices))

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({device.split(": ", 1)[1] for device in self.devices}))


_DEVICE = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+"
                     r"device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$")
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+\S+\s+\S+\s+(-?\d+)?\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+|N/A)\s+"
                  r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+|N/A)\s*$")
_AVERAGE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([\d.]+)")
_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(\w+)")


class ParseError(ValueError):
    """The text is not an all_reduce_perf report."""


def parse_nccl_tests(text: str) -> Measurement:
    """Read `all_reduce_perf` output (nccl-tests 2.x: the device list, one row per size, the averages); lines
    mpirun prefixes with `[1,0]<stdout>:` are read too."""
    devices: dict[int, str] = {}
    rows, average, valid = [], None, True
    for raw in text.splitlines():
        line = re.sub(r"^\[\d+,\d+\]<stdout>:", "", raw).rstrip()
        if match := _DEVICE.match(line):
            devices[int(match.group(1))] = f"{match.group(2)}: {match.group(3)}"
        elif match := _ROW.match(line):
            wrong = sum(int(value) for value in (match.group(7), match.group(11)) if value != "N/A")
            rows.append(Row(int(match.group(1)), float(match.group(6)), float(match.group(10)), wrong))
        elif match := _AVERAGE.match(line.strip()):
            average = float(match.group(1))
        elif match := _BOUNDS.match(line.strip()):
            valid = int(match.group(1)) == 0 and match.group(2) == "OK"
    if not rows:
        raise ParseError("no all_reduce_perf result rows in the output")
    return Measurement(len(devices), tuple(devices[rank] for rank in sorted(devices)), tuple(rows), average,
                       valid and all(row.wrong == 0 for row in rows))


def bus_bandwidth(size: int, seconds: float, ranks: int) -> float:
    """All-reduce bus bandwidth in GB/s (10^9 bytes/s), as nccl-tests computes it: algbw * 2 (n - 1) / n."""
    if seconds <= 0 or ranks < 1:
        raise ValueError(f"cannot compute a bandwidth from {seconds} s over {ranks} rank(s)")
    return size / seconds / 1e9 * (2 * (ranks - 1) / ranks)


@dataclass(frozen=True)
class Floor:
    """The lowest all-reduce bus bandwidth (GB/s) a healthy node (scope "node": all its GPUs) or cluster of such
    nodes (scope "cluster": all ranks over the network) shows. `pattern` matches the GPU model for node floors,
    the node type (instance type) for cluster floors; `gpus`: the GPU count it holds for. A node floor is `busbw`;
    a cluster floor is `share` of the most its fabric's `line_rate` (GB/s each way, per node) lets whichever
    algorithm NCCL picks reach (ring_ceiling: a ring gets the line rate at most; a hierarchical all-reduce more on
    few nodes, ceiling), so it holds for every node count."""

    scope: str
    pattern: str
    gpus: int
    busbw: float
    source: str
    fabric: str = ""  # the fabric a cluster floor holds over (efa, ib); "" for a node's own
    line_rate: float = 0.0
    share: float = 0.0

    def matches(self, name: str, gpus: int) -> bool:
        return self.gpus == gpus and re.search(self.pattern, name) is not None

    def wanted(self, nodes: int) -> float:
        """The bus bandwidth held to (GB/s), for a cluster floor over `nodes` nodes."""
        if self.scope == "node":
            return self.busbw
        return self.share * min(ring_ceiling(self.line_rate), ceiling(self.line_rate, max(2, nodes), self.gpus))


def ring_ceiling(line_rate: float) -> float:
    """The highest bus bandwidth a ring all-reduce across nodes can show: each node's network carries 2(N-1)/N of
    the data, as much as nccl-tests counts as bus traffic, so the bus bandwidth is the line rate at most."""
    return line_rate


def ceiling(line_rate: float, nodes: int, gpus: int) -> float:
    """The highest all-reduce bus bandwidth (GB/s) that `nodes` nodes of `gpus` GPUs each can show when each node
    reaches the others at `line_rate` GB/s each way (pure). At best an all-reduce moves 2(n-1)/n of the data in and
    out of each of the n nodes, and nccl-tests counts 2(N-1)/N of it as bus traffic for N ranks, so the bus bandwidth
    is at most line_rate x n(N-1) / ((n-1)N): 750 GB/s for two p5 nodes (400 GB/s of EFA), 575 for three."""
    if nodes < 2:
        raise ValueError("a fabric's ceiling holds across 2 nodes or more")
    ranks = nodes * gpus
    return line_rate * nodes * (ranks - 1) / ((nodes - 1) * ranks)


FLOORS = (
    # Azure's node health checks (Azure/azurehpc-health-checks, the ND H100 v5 configuration): NCCL all-reduce
    # within the node, 16 GB messages, at least 460 GB/s bus bandwidth.
    Floor("node", r"H100 80GB HBM3|H100 SXM", 8, 460.0, "Azure node health checks, ND H100 v5"),
    # The same checks hold ND A100 v4 (8 x A100 80GB SXM) to 228 GB/s within the node.
    Floor("node", r"A100-SXM4-80GB", 8, 228.0, "Azure node health checks, ND A100 v4"),
    # Across p5 nodes over EFA: 3200 Gbps (400 GB/s) of EFA per node (AWS's P5 instance page,
    # https://aws.amazon.com/ec2/instance-types/p5/: p5, p5e and p5en alike) sets the ceiling; nccl-tests' bus
    # bandwidth is read against such a hardware peak (NVIDIA/nccl-tests, doc/PERFORMANCE.md). kiln holds a healthy
    # cluster to 60% of what a ring can reach over it (the line rate; a tree or hierarchical all-reduce reaches
    # more on few nodes): 240 GB/s on any node count.
    Floor("cluster", r"^p5\.48xlarge$|^p5e\.48xlarge$|^p5en\.48xlarge$", 8, 0.0,
          "60% of the ceiling of 3200 Gbps EFA per p5 node, aws.amazon.com/ec2/instance-types/p5", "efa",
          line_rate=400.0, share=0.6),
)


FABRIC_NAMES = {"efa": "EFA", "ib": "InfiniBand", "socket": "TCP sockets"}


def floor_for(scope: str, name: str, gpus: int) -> Floor | None:
    return next((floor for floor in FLOORS if floor.scope == scope and floor.matches(name, gpus)), None)


def judge_measurement(label: str, measurement: Measurement, floor: Floor | None,
                      nodes: int = 1) -> tuple[list[str], list[str]]:
    """(problems, notes) of one all-reduce measurement (over `nodes` nodes): wrong results, and the peak bus
    bandwidth against the floor (none known: noted, not judged)."""
    found, notes = [], []
    if not measurement.valid:
        found.append(f"all-reduce over {measurement.ranks} rank(s) returned wrong values ({measurement.tool})")
    if floor is None:
        notes.append(f"{label}: no all-reduce floor for {', '.join(measurement.models) or 'these devices'} "
                     f"x {measurement.ranks}, bus bandwidth {gbps(measurement.peak)} GB/s not judged")
    elif measurement.peak < floor.wanted(nodes):
        found.append(f"all-reduce bus bandwidth {gbps(measurement.peak)} GB/s over {measurement.ranks} GPU(s), "
                     f"under the {floor.wanted(nodes):.0f} GB/s floor ({floor.source})")
    return found, notes


def outliers(peaks: Mapping[str, float], share: float = OUTLIER_SHARE) -> dict[str, str]:
    """Nodes whose bus bandwidth is far below the others' (under `share` of the median): node -> why."""
    if len(peaks) < 2:
        return {}
    median = statistics.median(peaks.values())
    return {node: f"all-reduce bus bandwidth {gbps(value)} GB/s, under {share:.0%} of the nodes' median "
                  f"{gbps(median)} GB/s" for node, value in sorted(peaks.items()) if value < share * median}


def judge_nodes(measurements: Mapping[str, Measurement]) -> tuple[dict[str, list[str]], list[str]]:
    """Each node's all-reduce over its own GPUs, against its GPUs' floor and against the other nodes:
    ({node: problems}, notes)."""
    verdicts, notes = {}, []
    for label, measurement in measurements.items():
        model = measurement.models[0] if measurement.models else ""
        found, said = judge_measurement(label, measurement, floor_for("node", model, measurement.ranks))
        verdicts[label], notes = found, notes + said
    for label, why in outliers({label: m.peak for label, m in measurements.items()}).items():
        verdicts[label].append(why)
    return verdicts, notes


def judge_cluster(measurement: Measurement, node_type: str | None, gpus_per_node: int,
                  fabric: str = "") -> tuple[list[str], list[str]]:
    """The all-ranks all-reduce across the nodes against the floor for their node type (None: not known); a
    floor that holds over a fabric (EFA) the measurement did not use (`fabric`: the one it used, "" for TCP
    sockets) fails the cluster for that, whatever the figure: its machines were paid for the fabric."""
    floor = floor_for("cluster", node_type, gpus_per_node) if node_type else None
    nodes = max(1, measurement.ranks // max(1, gpus_per_node))
    found, notes = judge_measurement("the cluster", measurement, floor, nodes)
    if floor and floor.fabric and fabric != floor.fabric:
        found.append(f"the all-reduce ran over {FABRIC_NAMES.get(fabric, 'TCP sockets')} where {node_type} is held "
                     f"to {floor.wanted(nodes):.0f} GB/s over {FABRIC_NAMES[floor.fabric]} ({floor.source}): the "
                     f"nodes' {FABRIC_NAMES[floor.fabric]} is not in use (kiln check's fabric column says why)")
    return found, notes


def gbps(value: float) -> str:
    """A bus bandwidth as read: 470.7, 0.18."""
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def summary(label: str, measurement: Measurement) -> str:
    return (f"{label}: all-reduce over {measurement.ranks} rank(s) ({measurement.tool}): "
            f"{gbps(measurement.peak)} GB/s bus bandwidth")


def from_probe(result: Mapping) -> Measurement:
    """A measurement from kiln's framework probe's JSON (kiln.gpu.allreduce): its sizes and seconds."""
    rows = tuple(Row(int(size), busbw, busbw, 0) for size, seconds in result["timings"]
                 for busbw in [bus_bandwidth(int(size), float(seconds), int(result["ranks"]))])
    return Measurement(int(result["ranks"]), tuple(result.get("devices", ())), rows, None,
                       bool(result.get("valid", True)), tool=str(result.get("framework", "framework")))


def read_probe(result: Mapping) -> Measurement | str:
    """The node's all-reduce probe's JSON (kiln.gpu.allreduce) as a measurement, or what went wrong."""
    if result.get("error"):
        return str(result["error"])
    try:
        return parse_nccl_tests(result["output"]) if "output" in result else from_probe(result)
    except (ParseError, KeyError, TypeError, ValueError) as error:
        return f"unreadable all-reduce result: {error}"


def max_bytes(memory_mib: Sequence[int | None], default: int = 4 << 30, cap: int = 16 << 30) -> int:
    """The largest all-reduce message a node's GPUs take: a quarter of the smallest GPU's memory (nccl-tests
    holds three buffers of it), at most `cap` (16 GB, where Azure's floor is measured)."""
    known = [mib for mib in memory_mib if mib]
    if not known:
        return default
    return min(cap, (min(known) << 20) // 4)


def ring_pairs(count: int) -> list[tuple[int, int]]:
    """The pairs of nodes measured to find a slow one: each node with the next, round the ring (two nodes: the
    one pair; fewer: none)."""
    if count < 2:
        return []
    if count == 2:
        return [(0, 1)]
    return [(index, (index + 1) % count) for index in range(count)]


def pair_rounds(pairs: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The pairs in rounds in which no node is in two pairs (measured side by side, a node in two pairs at once
    would halve both)."""
    rounds: list[list[tuple[int, int]]] = []
    for pair in pairs:
        free = next((round_ for round_ in rounds if not {n for p in round_ for n in p} & set(pair)), None)
        if free is None:
            rounds.append([pair])
        else:
            free.append(pair)
    return rounds


def blame_pairs(names: Sequence[str], peaks: Mapping[tuple[int, int], float],
                share: float = PAIR_SHARE) -> dict[str, str]:
    """The nodes whose every measured pair is far below the pairs without them (under `share` of their median):
    a node's slow NIC or link slows every pair it is in. node -> why. Fewer than three pairs: nobody can be told
    apart."""
    if len(peaks) < 3:
        return {}
    blamed = {}
    for index, name in enumerate(names):
        mine = [pair for pair in peaks if index in pair]
        others = [value for pair, value in peaks.items() if index not in pair]
        if len(mine) < 2 or not others:
            continue
        reference = statistics.median(others)
        if all(peaks[pair] < share * reference for pair in mine):
            figures = ", ".join(f"with {names[b if a == index else a]} {gbps(peaks[(a, b)])} GB/s"
                                for a, b in mine)
            blamed[name] = (f"all-reduce across nodes far below the others ({figures}; the other pairs' median "
                            f"{gbps(reference)} GB/s)")
    return blamed


def read_horovod_output(text: str) -> dict:
    """Rank 0's JSON in what horovodrun printed (its lines come prefixed `[0]<stdout>:`), or an error."""
    for line in reversed(text.splitlines()):
        start = line.find('{"')
        if start >= 0 and ('"framework"' in line or '"error"' in line):
            try:
                return json.loads(line[start:])
            except json.JSONDecodeError:
                continue
    said = " ".join(text.split())[-300:] or "no output"
    return {"error": f"horovodrun printed no result: {said}"}


@dataclass(frozen=True)
class Across:
    """The verdict on all-reduce across nodes: problems by node, the cluster's own, notes, and what was
    measured, line by line."""

    nodes: dict[str, list[str]]
    cluster: list[str]
    notes: list[str]
    lines: list[str]


def judge_across(names: Sequence[str], everyone: Mapping, pairs: Mapping[tuple[int, int], Mapping],
                 node_type: str | None, gpus_per_node: int, fabric: str = "") -> Across:
    """All ranks at once against the node type's floor (where known), and the ring pairs side by side against
    each other (a node in only slow pairs is named)."""
    nodes: dict[str, list[str]] = {name: [] for name in names}
    cluster, notes, lines = [], [], []
    read = read_probe(everyone)
    if isinstance(read, str):
        cluster.append(f"all-reduce across the nodes: {read}")
    else:
        cluster, notes = judge_cluster(read, node_type, gpus_per_node, fabric)
        lines.append(summary(f"across {len(names)} node(s)", read))
    peaks = {}
    for (a, b), result in pairs.items():
        measured = read_probe(result)
        if isinstance(measured, str):
            nodes[names[a]].append(f"all-reduce with {names[b]}: {measured}")
        else:
            peaks[(a, b)] = measured.peak
    if peaks:
        lines.append("pairs: " + ", ".join(f"{names[a]}+{names[b]} {gbps(value)} GB/s"
                                           for (a, b), value in sorted(peaks.items())))
    for name, why in blame_pairs(names, peaks).items():
        nodes[name].append(why)
    return Across(nodes, cluster, notes, lines)
