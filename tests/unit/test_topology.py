import pytest

from bootstrap.errors import TopologyError
from bootstrap.topology import (
    Process,
    Topology,
    common_interface,
    finishing_tasks,
    horovod_hostfile,
    horovod_rank_hosts,
    plan_tf_config,
    tf_config,
)

NAMES = ("node1", "node2", "node3")


def test_multiworker_places_one_worker_per_slot():
    topo = plan_tf_config(NAMES, [1, 1, 1])
    assert topo == Topology(NAMES, (
        Process("worker", 0, 0, 23456),
        Process("worker", 1, 1, 23456),
        Process("worker", 2, 2, 23456),
    ))
    assert [p.task for p in finishing_tasks(topo)] == ["worker-0", "worker-1", "worker-2"]


def test_tf_config_of_each_worker_is_the_documented_shape():
    topo = plan_tf_config(NAMES, [1, 1, 1])
    cluster = {"worker": ["node1:23456", "node2:23456", "node3:23456"]}
    assert [tf_config(topo, p) for p in topo.processes] == [
        {"cluster": cluster, "task": {"type": "worker", "index": 0}},
        {"cluster": cluster, "task": {"type": "worker", "index": 1}},
        {"cluster": cluster, "task": {"type": "worker", "index": 2}},
    ]


def test_parameter_servers_add_a_chief_and_spread_over_hosts():
    topo = plan_tf_config(NAMES, [1, 2, 1], ps=2, base_port=5000)
    assert topo.processes == (
        Process("chief", 0, 0, 5000),
        Process("worker", 0, 0, 5001),
        Process("worker", 1, 1, 5000),
        Process("worker", 2, 1, 5001),
        Process("worker", 3, 2, 5000),
        Process("ps", 0, 0, 5002),
        Process("ps", 1, 1, 5002),
    )
    chief = topo.processes[0]
    assert tf_config(topo, chief) == {
        "cluster": {
            "chief": ["node1:5000"],
            "worker": ["node1:5001", "node2:5000", "node2:5001", "node3:5000"],
            "ps": ["node1:5002", "node2:5002"],
        },
        "task": {"type": "chief", "index": 0},
    }
    assert tf_config(topo, topo.processes[6])["task"] == {"type": "ps", "index": 1}
    assert [p.task for p in finishing_tasks(topo)] == ["chief-0"]


def test_evaluator_is_not_part_of_the_cluster():
    topo = plan_tf_config(("a", "b"), [1, 1], chief=True, evaluator=True)
    evaluator = topo.processes[-1]
    assert evaluator == Process("evaluator", 0, 0, 23458)
    assert tf_config(topo, evaluator) == {
        "cluster": {"chief": ["a:23456"], "worker": ["a:23457", "b:23456"]},
        "task": {"type": "evaluator", "index": 0},
    }
    assert [p.task for p in finishing_tasks(topo)] == ["chief-0", "worker-0", "worker-1", "evaluator-0"]


def test_ipv6_names_are_bracketed_in_addresses():
    topo = plan_tf_config(("fd00::2",), [1])
    assert topo.cluster_spec() == {"worker": ["[fd00::2]:23456"]}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"names": [], "slots": []}, "no hosts to place processes on"),
        ({"names": ["a"], "slots": [1, 1]}, "every host needs a slot count"),
        ({"names": ["a"], "slots": [1], "ps": -1}, "--ps must be 0 or more, got -1"),
        ({"names": ["a"], "slots": [1], "base_port": 70000}, "base port 70000 is out of range"),
        ({"names": ["a"], "slots": [3], "base_port": 65534}, "too many processes on a above port 65534"),
    ],
)
def test_impossible_layouts_are_refused(kwargs, message):
    with pytest.raises(TopologyError) as error:
        plan_tf_config(**kwargs)
    assert str(error.value) == message


def test_horovod_hostfile_and_rank_placement():
    assert horovod_hostfile(NAMES, [2, 1, 1]) == "node1 slots=2\nnode2 slots=1\nnode3 slots=1\n"
    assert horovod_rank_hosts(NAMES, [2, 1, 1]) == ["node1", "node1", "node2", "node3"]


def test_common_interface_or_a_clear_refusal():
    assert common_interface({"node1": "eth0", "node2": "eth0"}) == "eth0"
    with pytest.raises(TopologyError) as error:
        common_interface({"node1": "eth0", "node2": "ens5"})
    assert str(error.value) == (
        "nodes reach each other over differently named interfaces (node1=eth0, node2=ens5); "
        "pass --nic to name the one to use"
    )


def test_a_run_that_finds_its_ports_held_moves_past_them_and_says_by_whom():
    from bootstrap.topology import describe_reserved, next_base_port

    assert next_base_port([23456, 23457]) == 23458
    assert describe_reserved({"node2": {"23457": "runA", "23456": "runA"}, "node1": {"23456": "runB"}}) == (
        "port(s) 23456 on node1 reserved by run runB; port(s) 23456, 23457 on node2 reserved by run runA")


def test_port_reservations_on_a_node(tmp_path):
    """bootstrap/node.py's reserve and release, run here for real: all or none, another run's holds while it has
    a process or is recent, a stale one is taken over, reserving again refreshes."""
    import os
    import subprocess
    import sys
    import time

    from bootstrap import node

    root = str(tmp_path)
    assert node.reserve("runA", root, [5001, 5002]) == {"conflicts": {}}
    assert node.reserve("runB", root, [5002, 5003]) == {"conflicts": {"5002": "runA"}}
    assert not (tmp_path / "ports" / "5003").exists(), "all or none"
    old = time.time() - node.RESERVATION_GRACE - 5
    for port in (5001, 5002):
        os.utime(tmp_path / "ports" / str(port), (old, old))
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            env={**os.environ, "KILN_RUN_ID": "runA"})
    try:
        time.sleep(0.2)
        assert node.reserve("runB", root, [5002]) == {"conflicts": {"5002": "runA"}}, "runA still has a process"
    finally:
        live.kill()
        live.wait()
    assert node.reserve("runB", root, [5002, 5003]) == {"conflicts": {}}, "stale: taken over"
    assert (tmp_path / "ports" / "5002").read_text() == "runB\n"
    assert node.release("runB", root) == {"released": [5002, 5003]}
    assert node.release("runA", root) == {"released": [5001]}
