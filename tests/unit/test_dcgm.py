"""kiln.gpu.dcgm against `dcgmi diag` tables recorded on real machines and published (tests/unit/data/gpu,
SOURCES.md there): DCGM 3.1.8 on 8 x H200 failing persistence mode, and DCGM 3.3.9 on 2 Blackwell GPUs passing
its level-1 tests; the other faults are those recordings with one value changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.gpu import dcgm, health
from kiln.gpu.facts import host_facts

DATA = Path(__file__).parent / "data" / "gpu"
FAILED = (DATA / "dcgm-diag-r1-h200-persistence-fail.txt").read_text()
PASSED = (DATA / "dcgm-diag-blackwell-level1-pass.txt").read_text()
LEVEL1 = ["Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks", "Persistence Mode",
          "Environment Variables", "Page Retirement/Row Remap", "Graphics Processes", "Inforom"]


def test_a_passing_level_1_diagnostic():
    diag = dcgm.parse_diag(PASSED)
    assert diag.metadata == {"DCGM Version": "3.3.9", "Driver Version Detected": "570.172.08",
                             "GPU Device IDs Detected": "2bb5,2bb5"}
    assert [test for test in diag.results][:9] == LEVEL1 and {diag.results[t] for t in LEVEL1} == {"Pass"}
    assert diag.results["PCIe"] == "Skip - All"
    assert dcgm.problems(diag) == [] and dcgm.judge(PASSED) == []


def test_a_failed_test_is_named_with_dcgms_words_joined_across_its_wrapped_lines():
    diag = dcgm.parse_diag(FAILED)
    assert diag.metadata["DCGM Version"] == "3.1.8" and diag.results["Persistence Mode"] == "Fail"
    (problem,) = dcgm.problems(diag, limit=160)
    assert problem == ("DCGM Persistence Mode: Fail (Error: Persistence mode for GPU 0 is currently disabled. The "
                       "DCGM diagnostic requires peristence mode to be enabled. Enable persistence mode by "
                       "running \"nvidia-...)")


@pytest.mark.parametrize("test", ["Inforom", "Page Retirement/Row Remap", "Graphics Processes"])
def test_a_recording_with_one_result_changed_fails_that_test(test):
    changed = PASSED.replace(f"| {test:<26}| Pass", f"| {test:<26}| Fail")
    assert changed != PASSED
    assert dcgm.judge(changed)[0] == f"DCGM {test}: Fail"


def test_no_diagnostic_is_a_problem_saying_why():
    assert dcgm.judge("dcgmi: not installed (the gpu image installs DCGM)\n") == [
        "DCGM diagnostics did not run: dcgmi: not installed (the gpu image installs DCGM)"]
    assert dcgm.judge("Error: unable to establish a connection to the specified host: localhost\n") == [
        "DCGM diagnostics did not run: Error: unable to establish a connection to the specified host: localhost"]


def test_the_deep_check_joins_a_nodes_gpu_verdict():
    facts = host_facts((DATA / "h100-gather.txt").read_text())
    found, _ = health.judge_node(health.NodeReport("a", facts, None, None, FAILED))
    assert any(problem.startswith("DCGM Persistence Mode: Fail") for problem in found)
    found, _ = health.judge_node(health.NodeReport("a", facts, None, None, PASSED))
    assert not any("DCGM" in problem for problem in found)
