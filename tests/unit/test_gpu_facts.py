"""kiln.gpu.facts and kiln.gpu.health against outputs recorded on a real NVIDIA H100 80GB HBM3 (driver 580.159.04,
CUDA 13.0; tests/unit/data/gpu/). The faulty hosts are those recordings with one value changed."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kiln.gpu import facts, health
from kiln.gpu.facts import host_facts, parse_smi_xml, problems

DATA = Path(__file__).parent / "data" / "gpu"
XML = (DATA / "h100-nvidia-smi-q-x.xml").read_text()
GATHERED = (DATA / "h100-gather.txt").read_text()


def probe(framework: str) -> dict:
    return json.loads((DATA / f"h100-probe-{framework}.json").read_text())


def test_the_xml_parser_agrees_with_nvidia_smis_own_csv_query():
    report = parse_smi_xml(XML)
    rows = list(csv.reader((DATA / "h100-query-gpu.csv").read_text().splitlines(), skipinitialspace=True))
    query = dict(zip(rows[0], rows[1], strict=True))
    gpu = report.gpus[0]
    assert len(report.gpus) == 1
    assert (gpu.name, gpu.uuid, gpu.bus_id) == (query["name"], query["uuid"], query["pci.bus_id"])
    assert report.driver == query["driver_version"] == "580.159.04"
    assert gpu.memory_mib["total"] == int(query["memory.total [MiB]"].split()[0]) == 81559
    assert gpu.memory_mib["free"] == int(query["memory.free [MiB]"].split()[0])
    assert gpu.persistence_mode is (query["persistence_mode"] == "Enabled")
    assert gpu.ecc_enabled is (query["ecc.mode.current"] == "Enabled")
    assert gpu.ecc_uncorrectable["volatile"] == int(query["ecc.errors.uncorrected.volatile.total"]) == 0
    assert gpu.clocks_mhz["max_sm"] == int(query["clocks.max.sm [MHz]"].split()[0]) == 1980


def test_the_xml_report_reads_what_na_hides_as_unknown():
    gpu = parse_smi_xml(XML).gpus[0]
    assert parse_smi_xml(XML).cuda == "13.0"
    assert gpu.architecture == "Hopper"
    # Hopper remaps rows instead of retiring pages: nvidia-smi says N/A, which is unknown, not zero
    assert gpu.retired_pages == {"single_bit": None, "double_bit": None, "pending": None}
    assert gpu.remapped_rows == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert gpu.pcie == {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}
    assert gpu.slowdowns == []  # gpu_idle is active, and is no slowdown
    assert gpu.mig is False and gpu.power_w["limit"] == 700.0


def test_the_gathered_output_of_a_real_h100_host():
    found = host_facts(GATHERED)
    assert [g["name"] for g in found["gpus"]] == ["NVIDIA H100 80GB HBM3"]
    assert found["pci_gpus"] == ["0000:00:06.0"]  # the host has no lspci: sysfs lists it
    assert found["driver"] == {"version": "580.159.04", "module": {"version": "580.159.04", "flavour": "open"}}
    assert found["cuda"] == {"driver_supports": "13.0", "toolkit": "13.0.88"}  # from nvcc: CUDA 13 has no version.json
    assert found["nccl"]["version"] == "2.28.3" and found["nccl"]["found"]["wheel nvidia-nccl-cu13"] == "2.28.9"
    assert found["cudnn"]["found"] == {"deb libcudnn9-cuda-13": "9.14.0.64", "wheel nvidia-cudnn-cu13": "9.19.0.56"}
    assert found["xid"] == {"readable": True, "events": []}
    assert problems(found) == []
    json.dumps(found)  # what --facts-json writes


def test_the_gathering_command_runs_on_this_host():
    """Every section comes back on any host: on one without NVIDIA's tools (CI) the facts say so; on a GPU host
    (the lent H100) nvidia-smi and the PCI bus agree."""
    result = subprocess.run(["sh", "-c", facts.gather_command("python3")], capture_output=True, text=True,
                            timeout=120)
    found = host_facts(result.stdout)
    assert set(facts.split_sections(result.stdout)) == {"smi", "pci", "module", "kernel_log", "debs",
                                                        "cuda_toolkit", "wheels", "nccl_library"}
    if shutil.which("nvidia-smi") is None:
        assert found["gpus"] == []
        assert found["errors"]["nvidia-smi"] == "nvidia-smi is not installed"
    else:
        assert found["gpus"] and len(found["gpus"]) == len(found["pci_gpus"]), found
        assert found["driver"]["version"] == found["driver"]["module"]["version"]
    sections = facts.split_sections(result.stdout)
    if not os.path.exists("/dev/nvidiactl") and not found["pci_gpus"]:  # no Python started for nothing
        assert {name: sections[name].rc for name in ("wheels", "nccl_library")} == \
            {"wheels": facts.GPU_ABSENT_RC, "nccl_library": facts.GPU_ABSENT_RC}, sections
        assert found["packages"]["wheels"] == {} and found["nccl"]["version"] is None
    else:
        assert sections["wheels"].rc == 0, sections["wheels"]


def faulty(old: str, new: str, count: int = 1) -> dict:
    """The recorded H100 host with one XML value changed."""
    assert old in GATHERED
    return host_facts(GATHERED.replace(old, new, count))


@pytest.mark.parametrize(("old", "new", "problem"), [
    ("<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>3</dram_uncorrectable>",
     "3 uncorrectable ECC error(s) since the driver loaded"),
    ("<remapped_row_pending>No</remapped_row_pending>", "<remapped_row_pending>Yes</remapped_row_pending>",
     "a row remap is pending: reset the GPU or reboot"),
    ("<remapped_row_failure>No</remapped_row_failure>", "<remapped_row_failure>Yes</remapped_row_failure>",
     "row remapping failed: the GPU needs service"),
    ("<clocks_event_reason_hw_slowdown>Not Active", "<clocks_event_reason_hw_slowdown>Active",
     "clocks held down by hw_slowdown"),
])
def test_a_faulty_gpu_is_named_with_its_problem(old, new, problem):
    assert problems(faulty(old, new)) == [f"GPU 0 (00000000:00:06.0): {problem}"]


def test_aggregate_ecc_errors_of_the_past_are_no_problem_now():
    found = faulty("<dram_uncorrectable>0</dram_uncorrectable>\n\t\t\t\t<sram_threshold_exceeded>",
                   "<dram_uncorrectable>2</dram_uncorrectable>\n\t\t\t\t<sram_threshold_exceeded>")
    assert found["gpus"][0]["ecc_uncorrectable"] == {"volatile": 0, "aggregate": 2}
    assert problems(found) == []


def test_a_gpu_on_the_bus_that_nvidia_smi_does_not_see():
    found = faulty("0000:00:06.0 0x10de 0x030200", "0000:00:06.0 0x10de 0x030200\n0000:00:07.0 0x10de 0x030200")
    assert problems(found) == ["nvidia-smi sees 1 GPU(s), the PCI bus has 2 (not seen: 0000:00:07.0)"]
    assert problems(host_facts(GATHERED), expect_gpus=8) == ["1 GPU(s), expected 8"]


def test_a_driver_upgraded_without_a_reboot():
    found = faulty("Kernel Module for x86_64  580.159.04", "Kernel Module for x86_64  580.95.05")
    assert problems(found) == ["the kernel module is 580.95.05 but nvidia-smi's library is 580.159.04: "
                               "a driver upgrade waits for a reboot"]


def with_section(name: str, text: str, rc: int = 0) -> str:
    """The recorded gathering output with one section's output and exit code replaced."""
    before, rest = GATHERED.split(f"### kiln-gpu {name}\n")
    after = rest.split("### kiln-gpu-rc ", 1)[1].split("\n", 1)[1]
    return f"{before}### kiln-gpu {name}\n{text}\n### kiln-gpu-rc {rc}\n{after}"


def test_a_gpu_with_the_driver_not_loaded():
    found = host_facts(with_section("module", "cat: /proc/driver/nvidia/version: No such file or directory", 1))
    assert found["driver"]["module"] is None
    assert problems(found) == ["1 NVIDIA GPU(s) on the PCI bus but the driver is not loaded "
                               "(no /proc/driver/nvidia/version)"]


def test_xid_events_in_the_kernel_log():
    # the line as the driver writes it (NVIDIA's Xid documentation); none was in the recorded log
    line = "[ 8823.129] NVRM: Xid (PCI:0000:00:06): 79, pid=1234, name=python, GPU has fallen off the bus."
    found = host_facts(with_section("kernel_log", line))
    assert found["xid"]["events"] == [{"pci": "0000:00:06", "xid": 79,
                                       "text": "pid=1234, name=python, GPU has fallen off the bus."}]
    assert problems(found) == ["Xid 79 on 0000:00:06: pid=1234, name=python, GPU has fallen off the bus. "
                               "(reboot the node)"]
    assert host_facts(with_section("kernel_log", "", 1))["xid"] == {"readable": False, "events": []}


@pytest.mark.parametrize(("line", "kind"), [
    ("NVRM: Xid (PCI:0000:00:06): 13, pid=77, name=python, Graphics Exception: ESR 0x504648=0x1000",
     facts.XID_APPLICATION),
    ("NVRM: Xid (PCI:0000:00:06): 48, pid=77, name=python, An uncorrectable double bit error", facts.XID_RESET),
    ("NVRM: Xid (PCI:0000:00:06): 63, Row Remapper: New row marked for remapping, reset gpu to activate.",
     facts.XID_RECORD),
    # a real pair from a public NVIDIA developer-forum report (an RTX 5080's GSP watchdog)
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     facts.XID_RESET),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x2 "
     "(Node Reboot Required)", facts.XID_REBOOT),
    ("NVRM: Xid (PCI:0000:01:00): 62, 323f0f30 0000c3d8 00000000 206dae68 206da022 206da190 206d85f6 206d8d86",
     "unknown (see NVIDIA's Xid catalog)"),
])
def test_xid_events_are_classed_by_what_they_ask_of_the_node(line, kind):
    found = host_facts(with_section("kernel_log", line))
    problems_, notes = facts.xid_findings(found)
    assert (problems_ + notes)[0].endswith(f"({kind})")
    assert bool(notes) == (kind in facts.NODE_FINE), "a program's fault or a record is a note, not a node problem"
    assert (problems_[0] in problems(found)) if problems_ else not any("Xid" in p for p in problems(found))


def test_nvidia_smi_that_cannot_reach_the_driver():
    found = host_facts(with_section(
        "smi", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9))
    assert found["gpus"] == []
    assert problems(found) == [
        "nvidia-smi: exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "nvidia-smi sees 0 GPU(s), the PCI bus has 1 (not seen: 0000:00:06.0)"]


@pytest.mark.parametrize(("text", "version"), [
    ('{"cuda": {"name": "CUDA SDK", "version": "12.5.1"}}', "12.5.1"),
    ("Cuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0", "13.0.88"),
    ("", None),
])
def test_cuda_toolkit_version(text, version):
    assert facts.parse_cuda_toolkit(text) == version


def test_the_bus_address_forms_of_nvidia_smi_and_sysfs_match():
    assert facts._bus("00000000:00:06.0") == facts._bus("0000:00:06.0") == "0000:00:06.0"
    assert facts._bus("00000001:C1:00.0") == "0001:c1:00.0"


@pytest.mark.parametrize("framework", ["torch", "jax", "cupy"])
def test_the_recorded_h100_meets_its_data_sheet(framework):
    device = probe(framework)["devices"][0]
    assert health.judge_probe(device["name"], device) == ([], [])


def test_a_slow_gpu_fails_with_the_figures():
    device = {**probe("torch")["devices"][0], "copy_tbps": 1.69, "matmul_tflops": 410.0}
    found, _ = health.judge_probe("NVIDIA H100 80GB HBM3", device)
    assert found == ["memory bandwidth 1.69 TB/s, under 2.51 (75% of 3.35 for NVIDIA H100 80GB HBM3)",
                     "bfloat16 matmul 410 TFLOP/s, under 593 (60% of 989 for NVIDIA H100 80GB HBM3)"]


def test_a_wrong_matmul_fails_and_an_unknown_model_is_noted_not_judged():
    device = {**probe("torch")["devices"][0], "matmul_error": 0.02}
    found, notes = health.judge_probe("NVIDIA Future GPU", device)
    assert found == ["float32 matmul differs from numpy by 0.02 (more than 0.001)"]
    assert notes == ["NVIDIA Future GPU: no data sheet figures in kiln.gpu.health.SPECS, speed not judged"]


@pytest.mark.parametrize(("name", "pattern"), [
    ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3|H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-40GB", "A100-(SXM4|PCIE)-40GB"), ("NVIDIA L4", r"\bL4\b"),
    ("NVIDIA L40S", "L40S"), ("Tesla T4", r"\bT4\b"), ("Tesla V100-SXM2-16GB", "V100"),
])
def test_each_model_finds_its_own_data_sheet(name, pattern):
    assert health.spec_for(name).pattern == pattern


def test_a_cluster_of_unlike_nodes():
    h100 = host_facts(GATHERED)
    two = {**h100, "gpus": h100["gpus"] * 2, "pci_gpus": h100["pci_gpus"] * 2}
    reports = [health.NodeReport("a", h100, probe("torch")), health.NodeReport("b", two),
               health.NodeReport("c", host_facts(""))]
    verdicts = health.judge_cluster(reports)
    assert verdicts["a"] == []
    assert verdicts["b"] == ["GPUs 2 x NVIDIA H100 80GB HBM3 differ from 1 x NVIDIA H100 80GB HBM3 on a"]
    assert verdicts["c"] == ["no NVIDIA GPU: the PCI bus lists none (nvidia-smi: nvidia-smi is not installed)",
                             "GPUs none differ from 1 x NVIDIA H100 80GB HBM3 on a"]
    assert [health.summary(r) for r in reports] == [
        "a: 1 x NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0; torch 2.11.0+cu130: 3.00 TB/s, "
        "807 bfloat16 TFLOP/s",
        "b: 2 x NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0",
        "c: none"]


def test_a_probe_that_sees_fewer_gpus_than_nvidia_smi():
    h100 = host_facts(GATHERED)
    found, _ = health.judge_node(health.NodeReport("a", h100, {"framework": "tensorflow 2.18.1", "devices": []}))
    assert found == ["tensorflow 2.18.1 sees 0 GPU(s), nvidia-smi 1"]
    found, _ = health.judge_node(health.NodeReport("a", h100, {"framework": None, "devices": [],
                                                               "error": "python3 has none of tensorflow"}))
    assert found == ["probe (no framework): python3 has none of tensorflow"]
