"""Is a GPU as fast as its model should be, and are a cluster's nodes alike? (pure)

One table holds what each GPU model can do by its data sheet (memory bandwidth, dense matmul throughput in the
precision the probe uses); a GPU passes when the probe measures at least a fixed share of that. The shares come
from real runs: an H100 80GB HBM3 measured 2.99 TB/s (89 % of 3.35) and 789 bf16 TFLOP/s (80 % of 989), an H200
4.3 TB/s (90 % of 4.8) and 788 TFLOP/s (kiln check --gpu there: 4.05-4.20 TB/s, 791-802 TFLOP/s). A GPU under
75 % / 60 % is throttled, mis-seated (a narrower PCIe link does not show here, a slower clock does), shared with
another job or faulty.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kiln.gpu import collective, dcgm
from kiln.gpu.facts import problems, xid_findings

BANDWIDTH_SHARE = 0.75
MATMUL_SHARE = 0.60
MAX_MATMUL_ERROR = 1e-3


@dataclass(frozen=True)
class Spec:
    """A GPU model by its data sheet: `pattern` matches nvidia-smi's product name."""

    pattern: str
    memory_tbps: float
    matmul_tflops: dict[str, float]

    def matches(self, name: str) -> bool:
        return re.search(self.pattern, name) is not None


# Dense (no sparsity) throughput; float16 only where the model has no bfloat16 (before compute capability 8.0).
SPECS = (
    Spec(r"H100 80GB HBM3|H100 SXM", 3.35, {"bfloat16": 989, "float16": 989}),
    Spec(r"H100 NVL", 3.9, {"bfloat16": 835, "float16": 835}),
    Spec(r"H100 PCIe", 2.0, {"bfloat16": 756, "float16": 756}),
    Spec(r"H200", 4.8, {"bfloat16": 989, "float16": 989}),
    Spec(r"A100-SXM4-80GB", 2.039, {"bfloat16": 312, "float16": 312}),
    Spec(r"A100 80GB PCIe", 1.935, {"bfloat16": 312, "float16": 312}),
    Spec(r"A100-(SXM4|PCIE)-40GB", 1.555, {"bfloat16": 312, "float16": 312}),
    Spec(r"L40S", 0.864, {"bfloat16": 362, "float16": 362}),
    Spec(r"\bL4\b", 0.3, {"bfloat16": 121, "float16": 121}),
    Spec(r"\bT4\b", 0.32, {"float16": 65}),
    Spec(r"V100", 0.9, {"float16": 125}),
)


def spec_for(name: str) -> Spec | None:
    return next((spec for spec in SPECS if spec.matches(name)), None)


def judge_probe(name: str, device: Mapping) -> tuple[list[str], list[str]]:
    """(problems, notes) of one device's probe figures against its model's data sheet."""
    found, notes = [], []
    error = device.get("matmul_error")
    if error is None or error > MAX_MATMUL_ERROR:
        found.append(f"float32 matmul differs from numpy by {error} (more than {MAX_MATMUL_ERROR})")
    spec = spec_for(name)
    if spec is None:
        notes.append(f"{name}: no data sheet figures in kiln.gpu.health.SPECS, speed not judged")
        return found, notes
    bandwidth, floor = device["copy_tbps"], BANDWIDTH_SHARE * spec.memory_tbps
    if bandwidth < floor:
        found.append(f"memory bandwidth {bandwidth:.2f} TB/s, under {floor:.2f} ({BANDWIDTH_SHARE:.0%} of "
                     f"{spec.memory_tbps} for {name})")
    dtype = device["matmul_dtype"]
    peak = spec.matmul_tflops.get(dtype)
    if peak is None:
        notes.append(f"{name}: no {dtype} figure on its data sheet, matmul speed not judged")
    elif device["matmul_tflops"] < MATMUL_SHARE * peak:
        found.append(f"{dtype} matmul {device['matmul_tflops']:.0f} TFLOP/s, under {MATMUL_SHARE * peak:.0f} "
                     f"({MATMUL_SHARE:.0%} of {peak} for {name})")
    return found, notes


@dataclass(frozen=True)
class NodeReport:
    """One node's GPU health: its facts (kiln.gpu.facts.host_facts) and its probe's JSON (None: not probed)."""

    label: str
    facts: Mapping
    probe: Mapping | None = None
    allreduce: Mapping | None = None  # kiln.gpu.allreduce's JSON over the node's GPUs (None: not measured)
    dcgm: str | None = None  # what `dcgmi diag -r 1` printed (kiln.gpu.dcgm; None: not run)


def judge_node(report: NodeReport, expect_gpus: int | None = None) -> tuple[list[str], list[str]]:
    """(problems, notes) for one node: its facts, then each probed device against its model."""
    notes: list[str] = []
    gpus = report.facts.get("gpus", [])
    if not gpus and not report.facts.get("pci_gpus"):
        smi = report.facts.get("errors", {}).get("nvidia-smi") or "sees none"
        return [f"no NVIDIA GPU: the PCI bus lists none (nvidia-smi: {smi})"], notes
    found = list(problems(report.facts, expect_gpus))
    notes += xid_findings(report.facts)[1]
    if report.dcgm is not None:
        found += dcgm.judge(report.dcgm)
    probe = report.probe
    if probe is None or not gpus:
        return found, notes
    if probe.get("error"):
        found.append(f"probe ({probe.get('framework') or 'no framework'}): {probe['error']}")
        return found, notes
    devices = probe.get("devices", [])
    if len(devices) != len(gpus):
        found.append(f"{probe['framework']} sees {len(devices)} GPU(s), nvidia-smi {len(gpus)}")
    for gpu, device in zip(gpus, devices, strict=False):
        bad, said = judge_probe(gpu["name"], device)
        found += [f"GPU {gpu['index']}: {problem}" for problem in bad]
        notes += said
    return found, notes


def judge_cluster(reports: Sequence[NodeReport]) -> dict[str, list[str]]:
    """Every node's problems, any node whose GPU model or count differs from the first node's, and each node's
    all-reduce over its GPUs against its floor and the other nodes (kiln.gpu.collective)."""
    verdicts = {}
    first = reports[0] if reports else None
    for report in reports:
        found, _ = judge_node(report)
        if first is not None and report is not first:
            mine, theirs = models(report.facts), models(first.facts)
            if mine != theirs:
                found.append(f"GPUs {describe(mine)} differ from {describe(theirs)} on {first.label}")
        verdicts[report.label] = found
    measured = {}
    for report in reports:
        if report.allreduce is not None and not report.allreduce.get("unavailable"):
            read = collective.read_probe(report.allreduce)
            if isinstance(read, str):
                verdicts[report.label].append(f"all-reduce over the node's GPUs: {read}")
            else:
                measured[report.label] = read
    judged, _ = collective.judge_nodes(measured)
    for label, found in judged.items():
        verdicts[label] += found
    return verdicts


def summary(report: NodeReport) -> str:
    """One line of what a node has and measured: `node1: 8 x NVIDIA H100 80GB HBM3, driver 580.159.04,
    CUDA 13.0; torch 2.11.0: 2.98 TB/s, 807 bfloat16 TFLOP/s (slowest GPU)`."""
    facts = report.facts
    line = f"{report.label}: {describe(models(facts))}"
    if facts.get("gpus"):
        line += f", driver {facts['driver'].get('version')}, CUDA {facts['cuda'].get('driver_supports')}"
    devices = (report.probe or {}).get("devices") or []
    read = collective.read_probe(report.allreduce) if report.allreduce is not None else None
    if devices:
        line += (f"; {report.probe['framework']}: {min(d['copy_tbps'] for d in devices):.2f} TB/s, "
                 f"{min(d['matmul_tflops'] for d in devices):.0f} {devices[0]['matmul_dtype']} TFLOP/s"
                 + (" (slowest GPU)" if len(devices) > 1 else ""))
    if isinstance(read, collective.Measurement):
        line += f"; all-reduce {read.peak:.0f} GB/s bus bandwidth over {read.ranks} GPUs ({read.tool})"
    elif report.allreduce is not None and report.allreduce.get("unavailable"):
        line += f"; all-reduce not measured ({report.allreduce['unavailable']})"
    return line


def models(facts: Mapping) -> dict[str, int]:
    counted: dict[str, int] = {}
    for gpu in facts.get("gpus", []):
        counted[gpu["name"]] = counted.get(gpu["name"], 0) + 1
    return counted


def describe(counted: Mapping[str, int]) -> str:
    return " + ".join(f"{count} x {name}" for name, count in sorted(counted.items())) or "none"
