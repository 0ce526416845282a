"""Elastic Horovod through kiln on a real 3-node local cluster: horovodrun's elastic mode with kiln's host
discovery script (the nodes that answer, through the pinned-key shim); a node lost mid-run leaves the job
running on the other two, and the run finishes."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import KILN, ROOT, local_cluster_command, run_processes

pytestmark = pytest.mark.integration
CLUSTER_NAME = "ke"


@pytest.fixture
def project(tmp_path) -> Path:
    folder = tmp_path / "project"
    shutil.copytree(ROOT / "examples", folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def test_an_elastic_run_goes_on_without_a_lost_node_and_finishes(cluster, project):
    argv = [str(KILN), "-S", cluster.ssh_config, "-H", "node1,node2,node3", "train", "--min-np", "2",
            "--run-id", "elastic", "--stall-minimum", "300", "--", "python", "horovod_elastic.py",
            "--epochs", "200", "--batches", "10"]
    log = cluster.node_dir("node1") / "kiln" / "runs" / "elastic" / "horovodrun.log"
    with subprocess.Popen(argv, cwd=project, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as run:
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and "epoch 3 on 3 ranks" not in (
                    log.read_text(errors="replace") if log.exists() else ""):
                assert run.poll() is None, run.communicate()
                time.sleep(1)
            assert "epoch 3 on 3 ranks" in log.read_text(errors="replace"), "the run never got going on 3 ranks"
            lost = local_cluster_command("lose", "node3", "--name", CLUSTER_NAME)
            assert lost.returncode == 0, lost.stderr
            out, err = run.communicate(timeout=600)
        except BaseException:
            run.kill()
            raise
    assert run.returncode == 0, out[-4000:] + err[-4000:]
    assert "node3 (node3) stopped answering: the elastic run goes on without it" in out, out
    results = [json.loads(path.read_text())  # ranks renumber after a reset: read every rank's result
               for path in (cluster.runs / "elastic" / "hosts").glob("*/output/rank-*/result.json")]
    assert sorted(result["rank"] for result in results) == [0, 1], results
    assert all(result["size"] == 2 and 2 in result["sizes_seen"] and result["epochs"] == 200
               for result in results), results
    assert "on 2 ranks" in log.read_text(errors="replace")
    assert run_processes("elastic") == []


def test_elastic_options_are_refused_where_they_do_not_belong(cluster, project):
    for args, message in ((["--min-np", "2"], "--min-np runs a program written for elastic Horovod"),
                          (["--mode", "tf-config", "--min-np", "2", "--", "python", "x.py"],
                           "--min-np and --max-np belong to --mode horovod"),
                          (["--min-np", "5", "--", "python", "horovod_elastic.py"],
                           "--min-np 5: give 1 to the 3 processes")):
        done = subprocess.run([str(KILN), "-S", cluster.ssh_config, "-H", "node1,node2,node3", "train",
                               "--dry-run", *args], cwd=project, env=cluster.env(), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and message in done.stderr, done.stderr
