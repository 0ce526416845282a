"""GPU-aware placement (pure): one process per GPU in horovod mode and kiln run, one per node in tf-config mode,
each process told its node's GPU count and its local rank; the GPU counts come from nodes' facts (here the GPU
list of the facts recorded on a real H100 host, repeated to make 8- and 4-GPU nodes)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bootstrap import launch, topology
from bootstrap.hosts import Host
from bootstrap.launch import NodePaths, Program, RunSpec, plan_processes, plan_run
from bootstrap.mesh import Node, gpu_counts
from kiln.gpu.facts import host_facts
from trainer import devices

ROOT = Path(__file__).resolve().parents[2]
SHIM = str(ROOT / "bootstrap" / "shim" / "kiln-rank")
BASE = {"PATH": "/usr/bin:/bin"}
GATHERED = (Path(__file__).parent / "data" / "gpu" / "h100-gather.txt").read_text()
H100 = host_facts(GATHERED)
PY = "/v/bin/python"
ROOTDIR = "/home/u/kiln"
NAMES = ("node1", "node2", "node3")


def node(name: str, copies: int) -> Node:
    """A node whose facts count the recorded H100's GPU list repeated `copies` times."""
    return Node(Host(name), name, "10.0.0.1", "eth0", {"gpus": len(H100["gpus"] * copies)})


NODES = [node("node1", 8), node("node2", 4), node("node3", 0)]


def spec(mode: str, slots=(None, None, None), gpus=None, **extra) -> RunSpec:
    return RunSpec("r1", mode, NAMES, tuple(slots), PY, ROOTDIR, nic="ens5", gpus=gpus, **extra)


def test_the_recording_is_one_h100_and_the_counts_come_from_the_facts():
    assert len(H100["gpus"]) == 1 and "H100" in H100["gpus"][0]["name"]
    assert gpu_counts(NODES) == (8, 4, 0)


def test_horovod_runs_one_rank_per_gpu_and_one_on_a_node_without():
    plan = plan_run(spec("horovod", gpus=gpu_counts(NODES)))
    (only,) = plan.launches
    assert only.files[f"{ROOTDIR}/runs/r1/hostfile"] == "node1 slots=8\nnode2 slots=4\nnode3 slots=1\n"
    assert only.argv[only.argv.index("-np") + 1] == "13"
    assert plan.rank_hosts == ("node1",) * 8 + ("node2",) * 4 + ("node3",)
    assert {key: only.env[key] for key in ("KILN_NUM_NODES", "KILN_HOST_SLOTS", "KILN_HOST_GPUS")} == {
        "KILN_NUM_NODES": "3", "KILN_HOST_SLOTS": "8,4,1", "KILN_HOST_GPUS": "8,4,0"}
    assert plan.placement.splitlines() == [
        "placement: 8 process(es) on node1, 8 GPU(s) (one per GPU); 4 process(es) on node2, 4 GPU(s) (one per GPU); "
        "1 process(es) on node3, no GPUs",
        "  the nodes differ: each gets its own count (the hostfile's slots)"]


def test_slots_given_still_override_the_gpus():
    plan = plan_run(spec("horovod", slots=(2, None, 3), gpus=gpu_counts(NODES)))
    assert plan.launches[0].files[f"{ROOTDIR}/runs/r1/hostfile"] == "node1 slots=2\nnode2 slots=4\nnode3 slots=3\n"
    assert "2 process(es) on node1, 8 GPU(s) (as given)" in plan.placement


@pytest.mark.parametrize(("rank", "expected"), [
    (0, "0 8 0 8"), (7, "7 8 0 8"), (8, "0 4 1 4"), (11, "3 4 1 4"), (12, "0 1 2 0")])
def test_each_rank_learns_its_place_from_the_rank_shim(tmp_path, rank, expected):
    """bootstrap/shim/kiln-rank, which horovodrun starts every rank through, run for real with the plan's env."""
    (only,) = plan_run(spec("horovod", gpus=gpu_counts(NODES))).launches
    env = {key: only.env[key] for key in ("KILN_HOST_SLOTS", "KILN_HOST_GPUS")}
    done = subprocess.run(["sh", SHIM, "sh", "-c",
                           "echo $LOCAL_RANK $LOCAL_WORLD_SIZE $KILN_NODE_RANK $KILN_NUM_GPUS_PER_NODE"],
                          env={**BASE, **env, "HOROVOD_RANK": str(rank), "KILN_OUTPUT_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=10, check=True)
    assert done.stdout.split() == expected.split()
    assert (tmp_path / f"rank-{rank}").is_dir()


def test_the_rank_shim_prefers_horovods_own_local_rank(tmp_path):
    done = subprocess.run(["sh", SHIM, "sh", "-c", "echo $LOCAL_RANK $LOCAL_WORLD_SIZE"],
                          env={**BASE, "HOROVOD_RANK": "9", "HOROVOD_LOCAL_RANK": "5", "HOROVOD_LOCAL_SIZE": "6",
                               "KILN_HOST_SLOTS": "8,4", "KILN_OUTPUT_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=10, check=True)
    assert done.stdout.split() == ["5", "6"]


def test_tf_config_stays_one_worker_per_node_and_says_so():
    plan = plan_run(spec("tf-config", gpus=gpu_counts(NODES)))
    assert [item.task for item in plan.launches] == ["worker-0", "worker-1", "worker-2"]
    envs = [item.env for item in plan.launches]
    assert [(e["KILN_NODE_RANK"], e["KILN_NUM_GPUS_PER_NODE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"])
            for e in envs] == [("0", "8", "0", "1"), ("1", "4", "0", "1"), ("2", "0", "0", "1")]
    assert all(e["NCCL_SOCKET_IFNAME"] == e["GLOO_SOCKET_IFNAME"] == "ens5" and e["KILN_NUM_NODES"] == "3"
               for e in envs)
    assert "MultiWorkerMirroredStrategy uses every GPU of its node" in plan.placement


def test_tf_config_local_ranks_count_every_process_on_a_node():
    plan = plan_run(spec("tf-config", slots=(2, 1, 1), gpus=(8, 8, 8), ps=1, chief=True))
    seen = {(item.task, plan.names[item.host]): (item.env["LOCAL_RANK"], item.env["LOCAL_WORLD_SIZE"])
            for item in plan.launches}
    assert seen == {("chief-0", "node1"): ("0", "4"), ("worker-0", "node1"): ("1", "4"),
                    ("worker-1", "node1"): ("2", "4"), ("worker-2", "node2"): ("0", "1"),
                    ("worker-3", "node3"): ("0", "1"), ("ps-0", "node1"): ("3", "4")}
    assert json.loads(plan.launches[0].env["TF_CONFIG"])["task"] == {"type": "chief", "index": 0}


def test_kiln_run_places_one_process_per_gpu_with_its_local_rank():
    plan = plan_processes("r1", NAMES, (None, None, None), python=PY, paths=NodePaths(ROOTDIR),
                          program=Program(("python", "x.py")), gpus=gpu_counts(NODES))
    assert len(plan.launches) == 13
    node2 = [item.env for item in plan.launches if item.host == 1]
    assert [e["LOCAL_RANK"] for e in node2] == ["0", "1", "2", "3"]
    assert {e["LOCAL_WORLD_SIZE"] for e in node2} == {"4"} and {e["KILN_NUM_GPUS_PER_NODE"] for e in node2} == {"4"}
    assert [e["KILN_SHARD_INDEX"] for e in node2] == ["8", "9", "10", "11"]


def test_cpu_nodes_run_as_before_with_counts_of_zero():
    for mode in ("horovod", "tf-config"):
        plan = plan_run(spec(mode, gpus=(0, 0, 0)))
        assert "NCCL" not in json.dumps([item.env for item in plan.launches if mode == "horovod"])
        assert sum(1 for item in plan.launches if item.task.startswith(("worker", "horovodrun"))) == (
            1 if mode == "horovod" else 3)
    (only,) = plan_run(spec("horovod", gpus=(0, 0, 0))).launches
    assert only.files[f"{ROOTDIR}/runs/r1/hostfile"] == "node1 slots=1\nnode2 slots=1\nnode3 slots=1\n"
    assert only.env["KILN_HOST_GPUS"] == "0,0,0"
    run = plan_processes("r1", NAMES, (None,) * 3, python=PY, paths=NodePaths(ROOTDIR), program=Program(("x",)),
                         gpus=(0, 0, 0))
    assert [(e.env["LOCAL_RANK"], e.env["KILN_NUM_GPUS_PER_NODE"]) for e in run.launches] == [("0", "0")] * 3


def test_a_dry_run_plans_one_per_node_and_says_the_gpus_decide_later():
    plan = plan_run(spec("horovod"))
    assert plan.launches[0].env["KILN_HOST_SLOTS"] == "1,1,1"
    assert "GPUs counted when the nodes connect" in plan.placement
    text = launch.describe_plan(plan, [Host(name) for name in NAMES])
    assert "placement: 1 process(es) on node1, node2, node3" in text


def test_resolve_slots_refuses_a_count_per_host_mismatch():
    with pytest.raises(Exception, match="every host needs a GPU count"):
        topology.resolve_slots("horovod", (None, None), (8,))


@pytest.mark.parametrize("gpus", [8, 4, 0])
def test_the_trainers_and_the_examples_gpu_for_ranks_0_to_7(gpus):
    import importlib.util
    spec_ = importlib.util.spec_from_file_location("horovod_keras", ROOT / "examples" / "horovod_keras.py")
    example = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(example)
    expected = {8: [0, 1, 2, 3, 4, 5, 6, 7], 4: [0, 1, 2, 3, 0, 1, 2, 3], 0: [None] * 8}[gpus]
    assert [devices.visible_gpu(rank, gpus) for rank in range(8)] == expected
    assert [example.visible_gpu(rank, gpus) for rank in range(8)] == expected


def test_multiworker_collectives_are_nccl_only_with_the_nodes_gpus_to_itself():
    assert devices.collective_implementation(8) == "NCCL" and devices.collective_implementation(0) == "AUTO"
    assert devices.collective_implementation(8, workers_here=2) == "AUTO"
    one = {"cluster": {"worker": ["n1:1", "n2:1"]}, "task": {"type": "worker", "index": 1}}
    two = {"cluster": {"chief": ["n1:1"], "worker": ["n1:2", "n2:1"]}, "task": {"type": "worker", "index": 0}}
    assert devices.workers_on_host(one) == 1 and devices.workers_on_host(two) == 2 and devices.workers_on_host({}) == 1


def test_the_all_reduce_check_runs_one_horovodrun_through_kilns_shims():
    command = launch.allreduce_command(PY, NodePaths(ROOTDIR), ["node1", "node2"], [8, 4], "ens5", tag="t1",
                                       max_bytes=1 << 30, min_bytes=64 << 20)
    hosts = f"{ROOTDIR}/checks/allreduce-t1.hosts"
    assert command.startswith(f"mkdir -p {ROOTDIR}/checks && printf %s 'node1 slots=8\nnode2 slots=4\n' > {hosts}")
    assert (f"{PY} {ROOTDIR}/lib/shim/horovodrun.py -np 12 --hostfile {hosts} --gloo --start-timeout 60 "
            f"--gloo-timeout-seconds 60 --network-interfaces ens5 {PY} {ROOTDIR}/lib/allreduce.py "
            "--horovod") in command
    assert f"PATH={ROOTDIR}/lib/shim:/v/bin:" in command and f"rm -f {hosts}" in command


def test_the_all_reduce_check_gives_every_rank_the_fabric_a_run_would_use():
    command = launch.allreduce_command(PY, NodePaths(ROOTDIR), ["node1", "node2"], [8, 8], "ens5", tag="t2",
                                       max_bytes=1 << 30, min_bytes=64 << 20,
                                       env={"NCCL_NET": "AWS Libfabric", "FI_PROVIDER": "efa"})
    assert "'NCCL_NET=AWS Libfabric' FI_PROVIDER=efa" in command
