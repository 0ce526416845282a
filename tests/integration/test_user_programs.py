"""`kiln train -- CMD` with programs written the way public examples are written (examples/), run from a user's
own project folder across a real 3-node local cluster: TF_CONFIG, ParameterServerStrategy with a chief, Horovod;
the environment contract, the synced project, outputs collected, and the errors a user meets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, run_processes

pytestmark = pytest.mark.integration
CLUSTER_NAME = "ku"
NODES = ("node1", "node2", "node3")


@pytest.fixture
def project(tmp_path) -> Path:
    """A user's project: the examples, a .gitignore'd data folder, and nothing of kiln."""
    folder = tmp_path / "project"
    shutil.copytree(ROOT / "examples", folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / ".gitignore").write_text("data/\n*.tmp\n")
    (folder / "data").mkdir()
    (folder / "data" / "big.bin").write_bytes(b"\0" * 1024)
    (folder / "scratch.tmp").write_text("left out")
    return folder


def outputs(cluster, run_id: str) -> dict[str, dict]:
    """Every result.json a process wrote to its KILN_OUTPUT_DIR, by node and process: {'node2/worker-1': {...}}."""
    found = {}
    for path in sorted((cluster.runs / run_id / "hosts").glob("*/output/*/result.json")):
        found[f"{path.parts[-4]}/{path.parts[-2]}"] = json.loads(path.read_text())
    return found


def test_a_keras_multiworker_script_trains_on_three_nodes_from_the_users_folder(cluster, project):
    done = cluster.kiln("train", "--mode", "tf-config", "--run-id", "mwms", "--",
                        "python", "keras_multiworker.py", "--epochs", "2", "--steps", "5", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    results = outputs(cluster, "mwms")
    assert set(results) == {"node1/worker-0", "node2/worker-1", "node3/worker-2"}
    assert {r["replicas"] for r in results.values()} == {3}
    assert {r["batches"] for r in results.values()} == {10}
    listing = cluster.ssh("node2", "cd ~/kiln/code && ls -a").stdout.split()
    assert "keras_multiworker.py" in listing and ".gitignore" in listing
    assert "data" not in listing and "scratch.tmp" not in listing
    assert run_processes("mwms") == []


def test_a_parameter_server_script_runs_with_a_chief(cluster, project):
    done = cluster.kiln("train", "--mode", "tf-config", "--ps", "1", "--run-id", "psrun", "--",
                        "python", "parameter_server.py", "--epochs", "2", "--steps", "5", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    results = outputs(cluster, "psrun")
    assert results["node1/chief-0"] == {**results["node1/chief-0"], "workers": 3, "ps": 1, "epochs": 2}
    servers = {key for key, value in results.items() if value.get("serving")}
    assert servers == {"node1/worker-0", "node2/worker-1", "node3/worker-2", "node1/ps-0"}
    assert run_processes("psrun") == []


def test_a_horovod_keras_script_runs_on_every_rank(cluster, project):
    done = cluster.kiln("train", "--run-id", "hvdrun", "--", "python", "horovod_keras.py", "--epochs", "2",
                        cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    results = outputs(cluster, "hvdrun")
    assert set(results) == {"node1/rank-0", "node2/rank-1", "node3/rank-2"}
    assert {r["size"] for r in results.values()} == {3}
    assert sum(r["examples"] for r in results.values()) == 3072 * 2
    assert run_processes("hvdrun") == []


def test_a_missing_script_or_command_is_named_and_nothing_starts(cluster, project):
    missing = cluster.kiln("train", "--run-id", "nofile", "--", "python", "nosuch.py", cwd=project)
    assert missing.returncode == 2
    assert f"nosuch.py: no such file in {project}" in missing.stderr
    unknown = cluster.kiln("train", "--mode", "tf-config", "--run-id", "nocmd", "--", "no-such-tool", "--x",
                           cwd=project)
    assert unknown.returncode == 1, unknown.stdout + unknown.stderr
    for node in NODES:
        assert f"{node}: no-such-tool: command not found" in unknown.stderr
    assert "nothing was started" in unknown.stderr
    assert not (cluster.runs / "nocmd").exists()
    assert run_processes("nocmd") == []
