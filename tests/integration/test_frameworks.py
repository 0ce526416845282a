"""PyTorch and JAX across a real 3-node local cluster, with programs written as their frameworks' docs write them
(examples/): `kiln train --mode torchrun` (one torchrun per node, a c10d rendezvous on the first, Gloo on CPUs) and
`kiln train --mode jax` (jax.distributed.initialize() with no arguments, Keras 3 on the JAX backend). They run with
the frameworks' environment scripts/setup makes (.venv-frameworks: PyTorch's CPU build, the CPU jaxlib)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import KILN, ROOT, can_make_namespaces, run_processes

from localcloud import netns

pytestmark = pytest.mark.integration
CLUSTER_NAME = "kf"
FRAMEWORKS = ROOT / ".venv-frameworks" / "bin" / "python"


@pytest.fixture
def project(tmp_path) -> Path:
    if not FRAMEWORKS.exists():
        pytest.fail(f"{FRAMEWORKS} is missing: make setup makes it (PyTorch, JAX and Keras for these tests)")
    folder = tmp_path / "project"
    shutil.copytree(ROOT / "examples", folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def results(cluster, run_id: str, pattern: str) -> dict[str, dict]:
    """What each process wrote under its node's KILN_OUTPUT_DIR, by `node/task/file`."""
    found = {}
    for path in sorted((cluster.runs / run_id / "hosts").glob(f"*/output/*/{pattern}")):
        found[f"{path.parts[-4]}/{path.parts[-2]}/{path.name}"] = json.loads(path.read_text())
    return found


def test_a_pytorch_ddp_program_trains_on_three_nodes_through_torchrun(cluster, project):
    done = cluster.kiln("train", "--mode", "torchrun", "--slots", "2", "--python", str(FRAMEWORKS), "--run-id",
                        "ddp", "--", "python", "torch_ddp.py", "--epochs", "3", cwd=project, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    found = results(cluster, "ddp", "rank-*.json")
    assert sorted(r["rank"] for r in found.values()) == list(range(6)), found
    assert {r["world"] for r in found.values()} == {6} and {r["backend"] for r in found.values()} == {"gloo"}
    assert {key.split("/")[0] for key in found} == {"node1", "node2", "node3"}  # two ranks on every node
    [loss] = {round(r["loss"], 6) for r in found.values()}  # DDP kept every replica in step
    assert loss < 1.0, found
    # every rank's output came back: torchrun's per-rank files, and its agents' logs with every rank's lines
    logs = list((cluster.runs / "ddp" / "hosts").glob("*/ranks/*/*/attempt_0/*/stdout.log"))
    assert len(logs) == 6, logs
    agent = (cluster.runs / "ddp" / "hosts" / "node1" / "torchrun-0.log").read_text()
    assert "epoch 3/3 loss" in (cluster.runs / "ddp" / "hosts").joinpath(
        *next(p for p in logs if "epoch 3/3" in p.read_text()).relative_to(cluster.runs / "ddp" / "hosts").parts
    ).read_text()
    assert "world 6 (gloo on cpu)" in "".join(
        (cluster.runs / "ddp" / "hosts" / node / f"torchrun-{i}.log").read_text()
        for i, node in enumerate(("node1", "node2", "node3"))), agent
    summary = json.loads((cluster.runs / "ddp" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["mode"] == "torchrun", summary
    assert run_processes("ddp") == []


def test_a_jax_program_sums_across_processes_on_every_node(cluster, project):
    done = cluster.kiln("train", "--mode", "jax", "--python", str(FRAMEWORKS), "--run-id", "jaxsum", "--",
                        "python", "jax_sum.py", cwd=project, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = results(cluster, "jaxsum", "result.json")
    assert set(found) == {"node1/jax-0/result.json", "node2/jax-1/result.json", "node3/jax-2/result.json"}, found
    assert {(r["processes"], r["devices"], r["sum"]) for r in found.values()} == {(3, 3, 6.0)}  # 1 + 2 + 3
    assert sorted(r["process"] for r in found.values()) == [0, 1, 2]
    assert run_processes("jaxsum") == []


def test_a_keras_3_program_trains_across_nodes_on_the_jax_backend(cluster, project):
    done = cluster.kiln("train", "--mode", "jax", "--python", str(FRAMEWORKS), "--run-id", "kjax", "--",
                        "python", "keras_jax.py", "--epochs", "3", cwd=project, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    found = results(cluster, "kjax", "result.json")
    assert sorted(r["process"] for r in found.values()) == [0, 1, 2], found
    assert {(r["backend"], r["processes"], r["devices"]) for r in found.values()} == {("jax", 3, 3)}
    [losses] = {tuple(round(x, 5) for x in r["loss"]) for r in found.values()}  # one model, kept in step
    assert losses[-1] < losses[0], losses
    assert run_processes("kjax") == []


def test_modes_without_their_framework_or_a_program_are_refused_before_anything_starts(cluster, project):
    done = cluster.kiln("train", "--mode", "torchrun", "--run-id", "notorch", "--", "python", "torch_ddp.py",
                        cwd=project, timeout=120)  # kiln's own .venv has TensorFlow, not PyTorch
    assert done.returncode == 1, done.stdout + done.stderr
    assert "torch is not installed for" in done.stdout + done.stderr
    assert "preflight failed" in done.stderr and run_processes("notorch") == []
    done = cluster.kiln("train", "--mode", "jax", cwd=project, timeout=60)
    assert done.returncode == 2 and "--mode jax runs your program: give it after --" in done.stderr, done.stderr
    done = cluster.kiln("train", "--mode", "torchrun", "--dry-run", "--", "python", "-u", "torch_ddp.py",
                        cwd=project, timeout=60)
    assert done.returncode == 2 and "torchrun runs a Python script" in done.stderr, done.stderr


def test_kiln_launch_runs_the_torchrun_task_file_on_local_nodes_and_removes_them(project, tmp_path):
    """examples/task-torchrun.yaml as a user runs it: two local nodes made, the setup once on each with the task's
    envs, torchrun across both, the run folder collected, the nodes removed."""
    if reason := can_make_namespaces():
        pytest.skip(reason)
    env = {**os.environ, "KILN_HOME": str(tmp_path / "home"), "KILN_RUNS": str(tmp_path / "runs")}
    try:
        done = subprocess.run([str(KILN), "launch", "task-torchrun.yaml", "--python", str(FRAMEWORKS), "--run-id",
                               "tddp"], cwd=project, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        setups = [path.read_text() for path in (tmp_path / "runs").glob("*/hosts/node*/shard-*.log")]
        assert len(setups) == 2 and all("OMP_NUM_THREADS=1" in log for log in setups), setups
        found = {path.name: json.loads(path.read_text())
                 for path in (tmp_path / "runs" / "tddp" / "hosts").glob("*/output/*/rank-*.json")}
        assert sorted(r["rank"] for r in found.values()) == [0, 1] and {r["world"] for r in found.values()} == {2}
        assert json.loads((tmp_path / "runs" / "tddp" / "summary.json").read_text())["status"] == "ok"
        assert "launch: removing cluster ddp" in done.stdout
        assert not (netns.STATE_ROOT / "ddp").exists()
        assert run_processes("tddp") == []
    finally:
        subprocess.run([sys.executable, "-m", "localcloud.cluster", "down", "--name",
                        "ddp"], capture_output=True, timeout=120)
