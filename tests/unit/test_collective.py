"""kiln.gpu.collective against all_reduce_perf outputs recorded on real machines and published (tests/unit/data/gpu,
SOURCES.md there): one 8 x H100 80GB HBM3 node (Azure's ND H100 v5 floor: 460 GB/s) and two such nodes over their
network; the faults are those recordings with one value changed. The framework path's figures come from a real
run of kiln.gpu.allreduce on this machine's CPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.gpu import allreduce, collective, health
from kiln.gpu.collective import bus_bandwidth, parse_nccl_tests
from kiln.gpu.facts import host_facts

DATA = Path(__file__).parent / "data" / "gpu"
NODE = (DATA / "nccl-tests-h100x8-node.txt").read_text()
TWO_NODES = (DATA / "nccl-tests-h100x8-2nodes.txt").read_text()
H100 = "NVIDIA H100 80GB HBM3"


def test_a_recorded_8_gpu_node():
    measured = parse_nccl_tests(NODE)
    assert measured.ranks == 8 and measured.hosts == ("host",) and measured.models == (H100,)
    assert [row.size for row in measured.rows] == [268435456, 536870912, 1073741824, 2147483648]
    assert measured.peak == 470.73 and measured.average == 448.212 and measured.valid


def test_the_bus_bandwidth_formula_gives_nccl_tests_own_figure():
    assert bus_bandwidth(2147483648, 7983.5e-6, 8) == pytest.approx(470.73, abs=0.005)
    assert bus_bandwidth(8589934592, 81958e-6, 16) == pytest.approx(196.52, abs=0.005)
    with pytest.raises(ValueError):
        bus_bandwidth(1024, 0.0, 8)


def test_mpirun_prefixed_output_of_two_nodes():
    prefixed = "".join(f"[1,0]<stdout>:{line}\n" for line in TWO_NODES.splitlines())
    for text in (TWO_NODES, prefixed):
        measured = parse_nccl_tests(text)
        assert measured.ranks == 16 and len(measured.hosts) == 2 and measured.peak == 196.52


def test_the_recorded_node_meets_its_floor():
    verdicts, notes = collective.judge_nodes({"node1": parse_nccl_tests(NODE)})
    assert verdicts == {"node1": []} and notes == []


def test_a_slow_node_fails_its_floor_and_is_named_among_its_peers():
    slow = parse_nccl_tests(NODE.replace("470.73", "117.68"))
    verdicts, _ = collective.judge_nodes({"node1": parse_nccl_tests(NODE), "node2": parse_nccl_tests(NODE),
                                          "node3": slow, "node4": parse_nccl_tests(NODE)})
    assert verdicts["node1"] == verdicts["node2"] == verdicts["node4"] == []
    assert verdicts["node3"] == [
        "all-reduce bus bandwidth 117.7 GB/s over 8 GPU(s), under the 460 GB/s floor (Azure node health checks, "
        "ND H100 v5)",
        "all-reduce bus bandwidth 117.7 GB/s, under 75% of the nodes' median 470.7 GB/s"]


def test_wrong_values_fail_the_measurement():
    for fault in (NODE.replace("466.37      0", "466.37      3"), NODE.replace("values : 0 OK", "values : 2 FAILED")):
        found, _ = collective.judge_measurement("node1", parse_nccl_tests(fault), None)
        assert found == ["all-reduce over 8 rank(s) returned wrong values (nccl-tests)"]


def test_a_cluster_is_judged_by_its_node_type_only_where_it_is_known():
    measured = parse_nccl_tests(TWO_NODES)
    found, notes = collective.judge_cluster(measured, "p5.48xlarge", 8, "efa")
    assert found == ["all-reduce bus bandwidth 196.5 GB/s over 16 GPU(s), under the 240 GB/s floor "
                     "(60% of the ceiling of 3200 Gbps EFA per p5 node, aws.amazon.com/ec2/instance-types/p5)"]
    found, notes = collective.judge_cluster(measured, None, 8)
    assert found == [] and notes == [f"the cluster: no all-reduce floor for {H100} x 16, bus bandwidth 196.5 GB/s "
                                     "not judged"]


def test_a_p5_cluster_measured_over_sockets_is_told_its_efa_is_not_in_use():
    measured = parse_nccl_tests(TWO_NODES)
    found, _ = collective.judge_cluster(measured, "p5.48xlarge", 8)
    assert found[-1] == ("the all-reduce ran over TCP sockets where p5.48xlarge is held to 240 GB/s over EFA (60% "
                         "of the ceiling of 3200 Gbps EFA per p5 node, aws.amazon.com/ec2/instance-types/p5): the "
                         "nodes' EFA is not in use (kiln check's fabric column says why)")
    assert len(found) == 2 and found[0].startswith("all-reduce bus bandwidth 196.5 GB/s"), "and the figure itself"
    assert len(collective.judge_cluster(measured, "p5.48xlarge", 8, "efa")[0]) == 1, "over EFA: the figure alone"
    assert collective.judge_cluster(measured, "g6.xlarge", 1, "")[0] == [], "no floor: nothing to hold it to"


def test_what_is_not_an_all_reduce_report():
    with pytest.raises(collective.ParseError):
        parse_nccl_tests("all_reduce_perf: command not found\n")
    assert collective.read_probe({"tool": "nccl-tests", "output": "garbage"}) == (
        "unreadable all-reduce result: no all_reduce_perf result rows in the output")
    assert collective.read_probe({"error": "exited 1 without a result: boom"}) == "exited 1 without a result: boom"


def test_the_largest_message_fits_the_smallest_gpu():
    assert collective.max_bytes([81559] * 8) == 16 << 30
    assert collective.max_bytes([23034, 23034]) == (23034 << 20) // 4
    assert collective.max_bytes([None]) == 4 << 30


def test_a_nodes_report_carries_its_all_reduce_into_the_verdict_and_summary():
    h100 = host_facts((DATA / "h100-gather.txt").read_text())
    facts = {**h100, "gpus": h100["gpus"] * 8, "pci_gpus": h100["pci_gpus"] * 8}
    good = health.NodeReport("a", facts, None, {"tool": "nccl-tests", "output": NODE})
    bad = health.NodeReport("b", facts, None, {"tool": "nccl-tests", "output": NODE.replace("470.73", "200.00")})
    verdicts = health.judge_cluster([good, bad])
    assert not any("all-reduce" in problem for problem in verdicts["a"])
    assert any("all-reduce bus bandwidth 200.0 GB/s" in problem for problem in verdicts["b"])
    assert "all-reduce 471 GB/s bus bandwidth over 8 GPUs (nccl-tests)" in health.summary(good)


@pytest.fixture(scope="module")
def cpu_run() -> dict:
    """kiln.gpu.allreduce run for real on this machine's CPUs (two logical devices, no NCCL)."""
    done = subprocess.run([sys.executable, allreduce.__file__, "--device", "cpu", "--ranks", "2", "--max-bytes",
                           str(128 << 20), "--reps", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_framework_probe_measures_a_real_all_reduce(cpu_run):
    assert cpu_run["framework"].startswith("tensorflow ") and cpu_run["ranks"] == 2 and cpu_run["valid"]
    assert [size for size, _ in cpu_run["timings"]] == [64 << 20, 128 << 20]
    measured = collective.read_probe(cpu_run)
    assert isinstance(measured, collective.Measurement) and measured.ranks == 2
    size, seconds = cpu_run["timings"][-1]
    assert measured.peak == pytest.approx(size / seconds / 1e9)  # 2 (n - 1) / n is 1 for two ranks
    found, notes = collective.judge_measurement("cpu", measured, collective.floor_for("node", "CPU", 2))
    assert found == [] and "not judged" in notes[0]


def test_ring_pairs():
    assert collective.ring_pairs(1) == [] and collective.ring_pairs(2) == [(0, 1)]
    assert collective.ring_pairs(4) == [(0, 1), (1, 2), (2, 3), (3, 0)]


NAMES = ["node1", "node2", "node3", "node4"]


def test_a_node_in_only_slow_pairs_is_named():
    peaks = {(0, 1): 1.10, (1, 2): 0.21, (2, 3): 0.20, (3, 0): 1.06}
    assert collective.blame_pairs(NAMES, peaks) == {
        "node3": "all-reduce across nodes far below the others (with node2 0.21 GB/s, with node4 0.20 GB/s; "
                 "the other pairs' median 1.08 GB/s)"}
    three = {(0, 1): 1.1, (1, 2): 0.2, (2, 0): 0.19}  # three nodes, one slow: two of the three pairs are slow
    assert list(collective.blame_pairs(NAMES[:3], three)) == ["node3"]
    assert collective.blame_pairs(NAMES, {(0, 1): 1.1, (1, 2): 1.0, (2, 3): 1.05, (3, 0): 0.98}) == {}
    assert collective.blame_pairs(NAMES[:2], {(0, 1): 0.1}) == {}, "one pair: nobody can be told apart"


def test_rank_0s_result_is_found_in_horovodruns_output():
    text = ("[1]<stderr>:some warning\n"
            '[0]<stdout>:{"framework": "horovod 0.28.1 (gloo)", "ranks": 3, "devices": ["n1: CPU"], '
            '"timings": [[67108864, 0.5]], "valid": true, "rank": 0}\n')
    result = collective.read_horovod_output(text)
    assert result["ranks"] == 3
    measured = collective.read_probe(result)
    assert measured.peak == pytest.approx(67108864 / 0.5 / 1e9 * 4 / 3)
    assert collective.read_horovod_output("ssh: connect to host node2 port 22: Connection refused\n") == {
        "error": "horovodrun printed no result: ssh: connect to host node2 port 22: Connection refused"}


def test_the_verdict_across_nodes():
    def result(seconds):
        return {"framework": "horovod 0.28.1 (gloo)", "ranks": 2, "timings": [[64 << 20, seconds]], "valid": True}

    everyone = {**result(1.0), "ranks": 4}
    pairs = {(0, 1): result(0.06), (1, 2): result(0.3), (2, 3): result(0.31), (3, 0): result(0.061)}
    verdict = collective.judge_across(NAMES, everyone, pairs, None, 0)
    assert verdict.cluster == [] and verdict.nodes["node1"] == [] and len(verdict.nodes["node3"]) == 1
    assert verdict.lines[0] == "across 4 node(s): all-reduce over 4 rank(s) (horovod 0.28.1 (gloo)): 0.10 GB/s bus " \
                               "bandwidth"
    assert verdict.lines[1].startswith("pairs: node1+node2 1.12 GB/s, node2+node3 0.22 GB/s")
    broken = collective.judge_across(NAMES, {"error": "exited 1"}, {(0, 1): {"error": "timed out"}}, None, 0)
    assert broken.cluster == ["all-reduce across the nodes: exited 1"]
    assert broken.nodes["node1"] == ["all-reduce with node2: timed out"]


def test_pairs_are_measured_in_rounds_where_no_node_is_twice():
    assert collective.pair_rounds(collective.ring_pairs(3)) == [[(0, 1)], [(1, 2)], [(2, 0)]]
    assert collective.pair_rounds(collective.ring_pairs(4)) == [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]
    rounds = collective.pair_rounds(collective.ring_pairs(7))
    assert sorted(p for r in rounds for p in r) == sorted(collective.ring_pairs(7))
    assert all(len({n for p in r for n in p}) == 2 * len(r) for r in rounds) and len(rounds) == 3


def test_a_node_with_nothing_to_measure_the_all_reduce_with_is_noted_not_failed():
    h100 = host_facts((DATA / "h100-gather.txt").read_text())
    facts = {**h100, "gpus": h100["gpus"] * 8, "pci_gpus": h100["pci_gpus"] * 8}
    why = "/usr/bin/python3 has neither nccl-tests' all_reduce_perf nor tensorflow"
    report = health.NodeReport("a", facts, None, {"unavailable": why})
    assert not any("all-reduce" in problem for problem in health.judge_cluster([report])["a"])
    assert health.summary(report).endswith(f"; all-reduce not measured ({why})")


def test_a_fabrics_ceiling_is_what_an_all_reduce_can_move_through_each_nodes_network():
    """400 GB/s of EFA per p5 node: 750 GB/s of bus bandwidth on 2 nodes, 575 on 3, falling towards 400."""
    assert collective.ceiling(400.0, 2, 8) == pytest.approx(750.0)
    assert collective.ceiling(400.0, 3, 8) == pytest.approx(575.0)
    assert 400.0 < collective.ceiling(400.0, 1000, 8) < 401.0
    with pytest.raises(ValueError):
        collective.ceiling(400.0, 1, 8)


@pytest.mark.parametrize("nodes", [2, 3, 4, 8, 16, 64, 1024])
def test_every_cluster_floor_is_below_its_fabrics_ceiling_for_every_node_count(nodes):
    """A healthy cluster can meet its floor: none above what its fabric's line rate lets the all-reduce reach; each
    names a public source and its fabric."""
    floors = [floor for floor in collective.FLOORS if floor.scope == "cluster"]
    assert floors
    for floor in floors:
        assert floor.fabric and floor.line_rate > 0 and "aws.amazon.com" in floor.source
        # computed here from the line rate, apart from the module: a ring's bus bandwidth is at most the line rate,
        # a hierarchical all-reduce's at most line rate x (nM-1)/((n-1)M)
        ranks = nodes * floor.gpus
        hierarchical = floor.line_rate * (ranks - 1) / ((nodes - 1) * floor.gpus)
        assert 0 < floor.wanted(nodes) <= min(floor.line_rate, hierarchical), (floor, nodes)


def test_a_p5_cluster_is_held_to_what_a_ring_over_its_efa_can_reach_on_any_node_count():
    p5 = collective.floor_for("cluster", "p5.48xlarge", 8)
    assert (round(p5.wanted(2)), round(p5.wanted(3)), round(p5.wanted(64))) == (240, 240, 240)

    def measured(ranks: int, busbw: float):
        size = 16 << 30
        return collective.from_probe({"ranks": ranks, "devices": [H100], "timings": [
            [size, size / 1e9 * 2 * (ranks - 1) / ranks / busbw]]})

    assert collective.judge_cluster(measured(16, 480.0), "p5.48xlarge", 8, "efa")[0] == []
    assert collective.judge_cluster(measured(16, 230.0), "p5.48xlarge", 8, "efa")[0] == [
        "all-reduce bus bandwidth 230.0 GB/s over 16 GPU(s), under the 240 GB/s floor (60% of the ceiling of 3200 "
        "Gbps EFA per p5 node, aws.amazon.com/ec2/instance-types/p5)"]
    assert collective.judge_cluster(measured(24, 250.0), "p5.48xlarge", 8, "efa")[0] == []
