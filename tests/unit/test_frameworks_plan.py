"""torchrun and JAX launch plans (pure): exact argv and environment for each process."""

import pytest

from bootstrap.errors import UsageError
from bootstrap.launch import (
    NodePaths,
    Program,
    RunSpec,
    jax_env,
    nodes_range,
    plan_jax,
    plan_run,
    plan_torchrun,
    torchrun_entry,
)

PATHS = NodePaths("/root/kiln")
NAMES = ("node1", "node2", "node3")
PY = "/v/bin/python"
DDP = Program(("python", "train.py", "--epochs", "3"))


def test_torchrun_starts_one_agent_per_node_meeting_on_the_first():
    plan = plan_torchrun("r1", NAMES, [2, 2, 2], python=PY, paths=PATHS, program=DDP, nic="eth0", port=29400)
    assert [item.task for item in plan.launches] == ["torchrun-0", "torchrun-1", "torchrun-2"]
    assert [item.host for item in plan.launches] == [0, 1, 2]
    assert plan.launches[1].argv == (
        PY, "-m", "torch.distributed.run", "--nnodes", "3", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "node1:29400", "--rdzv-id", "r1", "--local-addr", "node2", "--max-restarts", "0",
        "--log-dir", "/root/kiln/runs/r1/ranks/node2", "--tee", "3", "train.py", "--epochs", "3")
    env = plan.launches[1].env
    assert {key: env[key] for key in ("KILN_TASK", "KILN_COORDINATOR", "KILN_NODE_RANK", "KILN_NUM_NODES",
                                      "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "PYTHONUNBUFFERED",
                                      "KILN_OUTPUT_DIR")} == {
        "KILN_TASK": "torchrun-1", "KILN_COORDINATOR": "node1:29400", "KILN_NODE_RANK": "1", "KILN_NUM_NODES": "3",
        "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1",
        "KILN_OUTPUT_DIR": "/root/kiln/runs/r1/output/torchrun-1"}
    assert "LOCAL_RANK" not in env  # torchrun gives each worker its own
    assert plan.ports == (29400,) and plan.finishing == ("torchrun-0", "torchrun-1", "torchrun-2")
    assert plan.frameworks == ("torch",) and not plan.elastic and plan.watch_output


def test_torchrun_runs_modules_and_other_commands_as_torchrun_takes_them():
    assert torchrun_entry(Program(("python", "-m", "pkg.train", "--lr", "1")), PY) == [
        "--module", "pkg.train", "--lr", "1"]
    assert torchrun_entry(Program(("train.py",)), PY) == ["train.py"]
    assert torchrun_entry(Program(("./run.sh", "a")), PY) == ["--no-python", "./run.sh", "a"]
    with pytest.raises(UsageError, match="torchrun runs a Python script or `python -m MODULE`"):
        torchrun_entry(Program(("python", "-u", "train.py")), PY)


def test_elastic_torchrun_counts_whole_nodes_and_restarts_its_workers():
    assert nodes_range(None, [4, 4]) == "2"
    assert nodes_range((4, 12), [4, 4, 4]) == "1:3"
    with pytest.raises(UsageError, match="give multiples of 4"):
        nodes_range((6, 12), [4, 4, 4])
    with pytest.raises(UsageError, match="the same --slots on every node"):
        nodes_range((1, 3), [1, 2])
    plan = plan_torchrun("r1", NAMES, [1, 1, 1], python=PY, paths=PATHS, program=DDP, nic=None, port=29400,
                         elastic=(2, 3))
    argv = plan.launches[0].argv
    assert argv[argv.index("--nnodes") + 1] == "2:3" and argv[argv.index("--max-restarts") + 1] == "100"
    assert plan.elastic and not plan.watch_output
    assert plan.launches[2].env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # so a replacement can join
    # the first agent holds the rendezvous and ends the run; the others may end before it (or join late)
    assert plan.finishing == ("torchrun-0",) and plan.may_finish == {"torchrun-1", "torchrun-2"}


def test_torchrun_placeholders_name_the_rendezvous():
    program = Program(("python", "train.py", "--master", "{kiln:coordinator}", "--node", "{kiln:node_rank}"))
    plan = plan_torchrun("r1", NAMES[:2], [1, 1], python=PY, paths=PATHS, program=program, nic=None, port=29500)
    assert plan.launches[1].argv[-4:] == ("--master", "node1:29500", "--node", "1")


def test_torchrun_needs_a_program():
    with pytest.raises(UsageError, match="--mode torchrun runs your PyTorch program"):
        plan_torchrun("r1", NAMES, [1, 1, 1], python=PY, paths=PATHS, program=Program(), nic=None, port=1)


def test_jax_runs_one_process_per_node_told_what_jax_detects():
    spec = RunSpec(run_id="j1", mode="jax", names=NAMES, slots=(None, None, None), python=PY, root="/root/kiln",
                   program=Program(("python", "sum.py")), nic="eth0", base_port=29600, gpus=(0, 0, 0))
    plan = plan_run(spec)
    assert [(item.host, item.task) for item in plan.launches] == [(0, "jax-0"), (1, "jax-1"), (2, "jax-2")]
    assert plan.launches[2].argv == (PY, "sum.py")
    env = plan.launches[2].env
    assert {key: value for key, value in env.items() if key.startswith(("JAX_", "OMPI_", "KERAS_"))} == {
        "KERAS_BACKEND": "jax", "JAX_COORDINATOR_ADDRESS": "node1:29600", "JAX_NUM_PROCESSES": "3",
        "JAX_PROCESS_ID": "2",
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "node1:29600", "KERAS_DISTRIBUTION_NUM_PROCESSES": "3",
        "KERAS_DISTRIBUTION_PROCESS_ID": "2", "OMPI_MCA_orte_hnp_uri": "0.0;tcp://node1:29600",
        "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    assert plan.ports == (29600,) and plan.frameworks == ("jax",)
    assert "jax: one process per node" in plan.placement


def test_jax_gives_a_node_all_its_gpus_or_each_process_its_own():
    assert jax_env(coordinator="n:1", processes=2, process_id=0, local_rank=0, local_size=1,
                   gpus=8)["JAX_LOCAL_DEVICE_IDS"] == "0,1,2,3,4,5,6,7"
    assert jax_env(coordinator="n:1", processes=16, process_id=9, local_rank=1, local_size=8,
                   gpus=8)["JAX_LOCAL_DEVICE_IDS"] == "1"
    assert "JAX_LOCAL_DEVICE_IDS" not in jax_env(coordinator="n:1", processes=2, process_id=0, local_rank=0,
                                                 local_size=1, gpus=0)
    plan = plan_jax("j", NAMES[:2], [2, 2], python=PY, paths=PATHS, program=Program(("a.py",)), nic=None,
                    port=7, gpus=[2, 2])
    assert [item.env["JAX_LOCAL_DEVICE_IDS"] for item in plan.launches] == ["0", "1", "0", "1"]
    assert [item.env["JAX_PROCESS_ID"] for item in plan.launches] == ["0", "1", "2", "3"]


def test_jax_placeholders_fill_the_process_place():
    program = Program(("python", "t.py", "--id", "{kiln:process_id}/{kiln:num_processes}@{kiln:coordinator}"))
    plan = plan_jax("j", NAMES[:2], [1, 1], python=PY, paths=PATHS, program=program, nic=None, port=9)
    assert plan.launches[1].argv[-1] == "1/2@node1:9"


def test_each_mode_asks_the_nodes_for_its_own_framework():
    from bootstrap.launch import plan_processes

    run = plan_processes("r", NAMES, [None] * 3, python=PY, paths=PATHS, program=Program(("tool",)))
    assert run.frameworks == ()  # kiln run: any command
    jax = plan_jax("j", NAMES, [1, 1, 1], python=PY, paths=PATHS, program=Program(("a.py",)), nic=None, port=1)
    assert jax.frameworks == ("jax",)
    spec = RunSpec(run_id="h", mode="horovod", names=NAMES, slots=(1, 1, 1), python=PY, root="/root/kiln")
    assert plan_run(spec).frameworks == ("tensorflow",)


def test_a_reopened_elastic_torchrun_run_is_done_by_its_first_agent():
    """kiln status judges a run from its record: an elastic torchrun run's other agents may end first."""
    from bootstrap.hosts import Host
    from bootstrap.launch import judge
    from bootstrap.state import RunRecord, TaskRecord
    from bootstrap.tasks.runs import plan_from_record

    tasks = tuple(TaskRecord(f"node{i + 1}", i, f"torchrun-{i}") for i in range(3))
    record = RunRecord("t", "torchrun", "c", PY, tuple(Host(n) for n in NAMES), NAMES, "/k", tasks, ("torchrun-0",))
    states = {0: {"torchrun-0": {"state": "running"}}, 1: {"torchrun-1": {"state": "exited", "code": 0}},
              2: {"torchrun-2": {"state": "running"}}}
    assert judge(plan_from_record(record), states).failed == ()
    static = RunRecord("t", "torchrun", "c", PY, tuple(Host(n) for n in NAMES), NAMES, "/k", tasks,
                       tuple(t.task for t in tasks))
    assert judge(plan_from_record(static), states).done is False


def test_jax_refuses_more_processes_than_a_node_has_gpus():
    with pytest.raises(UsageError, match="--slots 4 on node2, which has 2 GPU"):
        plan_jax("j", NAMES[:2], [2, 4], python=PY, paths=PATHS, program=Program(("a.py",)), nic=None, port=1,
                 gpus=[2, 2])
    assert len(plan_jax("j", NAMES[:2], [3, 3], python=PY, paths=PATHS, program=Program(("a.py",)), nic=None,
                        port=1, gpus=[0, 0]).launches) == 6  # CPU nodes: as many as asked
