"""bootstrap.state: the records of clusters and runs round-trip through their files as parsed values."""

from __future__ import annotations

import json

import pytest

from bootstrap import state
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.mesh import ensure_cluster_key


@pytest.fixture(autouse=True)
def homes(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KILN_RUNS", str(tmp_path / "runs"))


def test_a_cluster_record_round_trips_with_its_hosts_parsed():
    record = state.ClusterRecord("exp1", (Host("10.0.0.5", 2222, "ubuntu", 4), Host("fe80::1")), "/v/bin/python",
                                 state.SshSettings(identity="/k/id"), region="us-east-1", user="ubuntu",
                                 instances=(state.Instance("i-1", "10.0.0.5", "console"),))
    state.save_cluster(record)
    assert state.load_cluster("exp1") == record
    saved = json.loads((state.cluster_dir("exp1") / "cluster.json").read_text())
    assert saved["hosts"][0] == {"address": "10.0.0.5", "port": 2222, "user": "ubuntu", "slots": 4}
    assert state.load_cluster("other") is None
    assert saved["controller"] is None


def test_a_queue_controller_round_trips_apart_from_the_nodes():
    record = state.ClusterRecord("exp1", (Host("10.0.0.5"),), "python3", instances=(
        state.Instance("i-1", "10.0.0.5", "console"),), controller=state.Instance("i-2", "10.0.0.9", "console"))
    state.save_cluster(record)
    assert state.load_cluster("exp1") == record and state.load_cluster("exp1").controller.address == "10.0.0.9"


def test_a_clusters_place_round_trips_and_an_older_aws_file_is_placed_by_its_region():
    record = state.ClusterRecord("trw", (Host("10.0.0.5"),), "python3", region="us-west-2", provider="aws",
                                 place=(("region", "us-west-2"),))
    state.save_cluster(record)
    assert state.load_cluster("trw") == record and state.load_cluster("trw").where == {"region": "us-west-2"}
    older = json.loads((state.cluster_dir("trw") / "cluster.json").read_text())
    del older["place"]
    (state.cluster_dir("trw") / "cluster.json").write_text(json.dumps(older))
    assert state.load_cluster("trw").where == {"region": "us-west-2"}
    state.save_cluster(state.ClusterRecord("hosts", (Host("h1"),), "python3", region="us-west-2"))
    assert state.load_cluster("hosts").where == {}  # hosts kiln was given: placed nowhere


def test_forgetting_a_cluster_removes_its_files():
    state.save_cluster(state.ClusterRecord("gone", (Host("h1"),), "python3"))
    state.save_cloud_state("gone", {"region": "r"})
    ensure_cluster_key("gone")
    assert state.has_cloud_state("gone")
    state.forget_cluster("gone")
    assert not state.cluster_dir("gone").exists()


def run(run_id: str, started: float) -> state.RunRecord:
    return state.RunRecord(run_id, "tf-config", "c1", "python3", (Host("node1", user="root"),), ("node1",),
                           "/root/kiln", (state.TaskRecord("node1", 0, "worker-0"),), ("worker-0",),
                           started=started)


def test_runs_are_found_by_id_or_as_the_newest():
    state.save_run(run("first", 1.0))
    state.save_run(run("second", 2.0))
    assert state.load_run("first") == run("first", 1.0)
    assert state.load_run(None).run_id == "second"
    with pytest.raises(UsageError, match="no run 'third'"):
        state.load_run("third")
    with pytest.raises(UsageError, match="run id '../x'"):
        state.load_run("../x")


def test_writers_side_by_side_never_take_each_others_file(tmp_path):
    """kiln commands side by side on one cluster each write its node names: every write lands whole, none fails
    for another's rename, and no temporary file is left."""
    import threading

    path, errors = tmp_path / "clusters" / "c" / "nodes.json", []

    def write(index: int) -> None:
        try:
            for step in range(150):
                state.write_json(path, [{"writer": index, "step": step}])
        except OSError as error:
            errors.append(error)

    threads = [threading.Thread(target=write, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert json.loads(path.read_text())[0]["step"] == 149
    assert [p.name for p in path.parent.iterdir()] == ["nodes.json"]
