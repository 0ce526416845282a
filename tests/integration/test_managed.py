"""Managed runs on the local provider: `kiln up --provider local` makes a 3-node cluster whose nodes can be lost
(localcloud.cluster `lose`: processes killed at once, network and disk gone) and replaced by fresh machines with new
host keys; `kiln train --managed` replaces a lost node and finishes the run from the last checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import KILN, ROOT, can_make_namespaces, run_processes

from bootstrap.shim import interruption
from bootstrap.ssh import probe_verdict
from localcloud import netns

pytestmark = pytest.mark.integration
NAME = "km"
STATE = netns.STATE_ROOT / NAME
# 6 epochs of 23 steps: the loss lands at step 12 with some 120 steps to go (seconds of training, where the watcher
# looks every 2 s), as test_launcher's restarts do. 12 epochs cost 8 CPU-s more a run on 3 nodes (23 against 15
# for 12 and 4, measured here), and 30 trained a minute longer after each recovery; neither proved more.
EPOCHS, CHECKPOINT_EVERY = 6, 5
PROGRAMS = Path(__file__).parent / "programs"


class Managed:
    def __init__(self, home: Path, runs: Path, project: Path):
        self.home, self.runs, self.project = home, runs, project

    def kiln(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = {**os.environ, "KILN_HOME": str(self.home), "KILN_RUNS": str(self.runs)}
        return subprocess.run([str(KILN), *args], cwd=self.project, env=env, capture_output=True, text=True,
                              timeout=timeout)

    def summary(self, run_id: str) -> dict:
        return json.loads((self.runs / run_id / "summary.json").read_text())


def remove_local(name: str) -> None:
    """Whatever a test left of a local cluster, gone (its namespaces, nodes and state)."""
    subprocess.run([sys.executable, "-m", "localcloud.cluster", "down", "--name", name], capture_output=True,
                   timeout=120)


@pytest.fixture
def once(tmp_path):
    """A kiln home of its own, for a test that makes (and removes) its own local cluster; its project is tmp_path."""
    if reason := can_make_namespaces():
        pytest.skip(reason)
    return Managed(tmp_path / "home", tmp_path / "runs", tmp_path)


def local_cluster(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcloud.cluster", *args, "--name", NAME], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def managed(tmp_path_factory):
    if reason := can_make_namespaces():
        pytest.skip(reason)
    local_cluster("down")
    made = Managed(tmp_path_factory.mktemp("kiln-home"), tmp_path_factory.mktemp("runs"),
                   tmp_path_factory.mktemp("project"))
    try:
        up = made.kiln("up", NAME, "--provider", "local", "--count", "3", "--zones", "a,b")  # zones: labels
        assert up.returncode == 0, up.stdout + up.stderr
        meshed = made.kiln("mesh", "--cluster", NAME)
        assert meshed.returncode == 0, meshed.stdout + meshed.stderr
        yield made
    finally:
        down = made.kiln("down", NAME)
        local_cluster("down")
        assert down.returncode == 0, down.stdout + down.stderr


def last_step(metrics: Path) -> int:
    try:
        lines = metrics.read_text().strip().splitlines()
        return json.loads(lines[-1])["step"] if lines else -1
    except (OSError, ValueError, KeyError):
        return -1


def train_and_lose(managed: Managed, run_id: str, *options: str, min_step: int = 2 * CHECKPOINT_EVERY + 2,
                   how: str = "lose", node: str = "node2", cloud: str = "ec2",
                   before_loss=None) -> tuple[subprocess.CompletedProcess, float]:
    """Start a tf-config run (`options`: --managed...); once node2's worker has logged `min_step`, call
    `before_loss` (if given) and lose `node` (`how`: or post a spot interruption notice on it, as `cloud` does).
    (result, when)"""
    argv = [str(KILN), "train", "--cluster", NAME, "--mode", "tf-config", "--run-id", run_id, *options,
            "--args", f"--epochs {EPOCHS} --log-every 1 --checkpoint-every {CHECKPOINT_EVERY}"]
    env = {**os.environ, "KILN_HOME": str(managed.home), "KILN_RUNS": str(managed.runs)}
    metrics = STATE / "node2" / "kiln" / "runs" / run_id / "metrics.worker-1.jsonl"
    with subprocess.Popen(argv, cwd=managed.project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as train:
        try:
            deadline = time.monotonic() + 180
            while last_step(metrics) < min_step:
                if train.poll() is not None or time.monotonic() > deadline:
                    train.kill()
                    out, err = train.communicate()
                    raise AssertionError(f"node2 never got to training: {out[-3000:]}{err[-3000:]}")
                time.sleep(0.3)
            if before_loss:
                before_loss()
            lost_at = time.time()  # the loss begins: kiln may see it before the command returns
            lost = local_cluster(how, node, *(["--cloud", cloud] if how == "interrupt" else []))
            assert lost.returncode == 0, lost.stderr
            out, err = train.communicate(timeout=400)
        finally:
            if train.poll() is None:
                train.kill()
    return subprocess.CompletedProcess(argv, train.returncode, out, err), lost_at


def pinned_keys(managed: Managed, name: str) -> set[str]:
    text = (managed.home / "clusters" / NAME / "known_hosts").read_text()
    return {" ".join(line.split()[1:3]) for line in text.splitlines() if name in line.split()[0].split(",")}


def test_a_lost_node_is_replaced_and_the_run_finishes_from_its_last_checkpoint(managed):
    """With a task file's setup, which runs on every node first and again on the replacement, a fresh machine."""
    before = pinned_keys(managed, "node2")
    (managed.project / "setup.yaml").write_text("setup: echo \"$MARK\" > ~/kiln/setup-done.txt\nenvs:\n  MARK: set\n")
    done, lost_at = train_and_lose(managed, "lose-node2", "--managed", "--task", "setup.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recovery 1 of 3: replacing node2" in done.stdout
    assert "setup on node2: echo" in done.stdout, done.stdout
    for node in ("node1", "node2", "node3"):
        assert (STATE / node / "kiln" / "setup-done.txt").read_text() == "set\n", node
    assert (managed.runs / "lose-node2" / "setup-node2.log").is_file()
    data = managed.summary("lose-node2")
    assert data["status"] == "ok"
    [recovery] = data["restarts"]
    assert recovery["kind"] == "recovery" and recovery["lost"] == ["node2"]
    assert recovery["replaced"] == [{"old": "node2", "new": "node2"}]
    # As a lost machine looks (ssh.probe_verdict): gone (unreachable), or going in the middle of kiln's look (the
    # connection ends: with no word, or reset as its sshd is killed), not a node that answered.
    [reason] = [line.split(": ", 1)[1] for line in recovery["failure"].splitlines()
                if line.strip().startswith("node2:")]
    assert probe_verdict(reason) in ("lost", "unclear"), recovery["failure"]
    assert lost_at < recovery["detected_at"] < recovery["restarted_at"]
    assert 0 < recovery["resumed_from_step"] <= recovery["at_step"]
    assert recovery["steps_redone"] <= CHECKPOINT_EVERY
    workers = {task: result for task, result in data["results"].items() if task.startswith("worker-")}
    assert sorted(workers) == ["worker-0", "worker-1", "worker-2"]
    steps = workers["worker-0"]["steps"]
    assert steps == EPOCHS * (steps // EPOCHS) and all(r["steps"] == steps and r["status"] == "ok"
                                                       for r in workers.values())
    assert len({r["weights_sha256"] for r in workers.values()}) == 1
    # The replacement is a fresh machine: new host keys, pinned in place of the old ones, and it did the work.
    after = pinned_keys(managed, "node2")
    assert after and not after & before
    resumed = STATE / "node2" / "kiln" / "runs" / "lose-node2" / "metrics.worker-1.jsonl"
    first = json.loads(resumed.read_text().splitlines()[0])
    assert first["step"] > recovery["resumed_from_step"]
    assert run_processes("lose-node2") == []


def test_a_spot_interruption_notice_on_the_chief_replaces_it_and_the_run_finishes(managed):
    """The chief's machine is the one to go: its checkpoints are collected before it does, and its successor
    resumes from them."""
    before = pinned_keys(managed, "node1")
    done, posted_at = train_and_lose(managed, "notice-node1", "--managed", how="interrupt", node="node1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in done.stderr, done.stderr
    data = managed.summary("notice-node1")
    assert data["status"] == "ok"
    [recovery] = data["restarts"]
    assert recovery["kind"] == "recovery" and recovery["interrupted"] == ["node1"] and recovery["lost"] == []
    assert recovery["failure"].startswith("spot interruption notice (node1: terminate at ")
    assert posted_at < recovery["detected_at"] < recovery["restarted_at"]
    assert recovery["resumed_from_step"] > 0 and recovery["steps_redone"] <= CHECKPOINT_EVERY
    # node1's watcher saw the notice, wrote it for kiln and stopped the worker there (SIGTERM, nothing left);
    # the replaced machine's files are kept apart from its successor's.
    replaced = managed.runs / "notice-node1" / "replaced" / "node1-1"
    notice = json.loads((replaced / "notice.json").read_text())
    assert notice["action"] == "terminate" and notice["seen"] >= posted_at
    assert (replaced / "worker-0.exit").read_text().strip() == "143"  # 128 + SIGTERM
    said = (replaced / "interruption.log").read_text().splitlines()
    assert json.loads(said[0])["action"] == "terminate" and json.loads(said[-1]) == {"left": []}, said
    assert not (managed.runs / "notice-node1" / "hosts" / "node1" / "notice.json").exists()
    workers = {task: result for task, result in data["results"].items() if task.startswith("worker-")}
    steps = workers["worker-0"]["steps"]
    assert steps == EPOCHS * (steps // EPOCHS) and all(r["steps"] == steps for r in workers.values())
    assert workers["worker-0"]["resumed_from_step"] == recovery["resumed_from_step"]
    assert not pinned_keys(managed, "node1") & before
    assert run_processes("notice-node1") == []


@pytest.mark.parametrize("cloud", ["gce", "azure"])
def test_a_preemption_of_a_worker_replaces_it_within_the_clouds_notice(managed, cloud):
    """GCE's metadata server says instance/preempted TRUE, Azure's Scheduled Events list a Preempt event, about
    30 s before the VM goes: the node's watcher sees it and stops the worker there with that cloud's grace, well
    within the notice, and kiln replaces the node."""
    run_id = f"preempt-{cloud}"
    done, posted_at = train_and_lose(managed, run_id, "--managed", how="interrupt", node="node2", cloud=cloud)
    assert done.returncode == 0, done.stdout + done.stderr
    data = managed.summary(run_id)
    assert data["status"] == "ok"
    [recovery] = data["restarts"]
    assert recovery["interrupted"] == ["node2"] and recovery["lost"] == []
    assert recovery["failure"].startswith("spot interruption notice (node2: preempt at "), recovery["failure"]
    replaced = managed.runs / run_id / "replaced" / "node2-1"
    notice = json.loads((replaced / "notice.json").read_text())
    lead, grace = interruption.SOURCES[cloud]
    assert (notice["source"], notice["grace_s"]) == (cloud, grace)
    stopped_at = (replaced / "worker-1.exit").stat().st_mtime  # the worker's exit, as the node wrote it
    assert posted_at < notice["seen"] < stopped_at < posted_at + lead, (posted_at, notice, stopped_at)
    assert (replaced / "worker-1.exit").read_text().strip() == "143"  # SIGTERM: it had its chance to checkpoint
    workers = {task: result for task, result in data["results"].items() if task.startswith("worker-")}
    assert len({r["steps"] for r in workers.values()}) == 1 and all(r["status"] == "ok" for r in workers.values())
    assert run_processes(run_id) == []


def test_without_managed_a_notice_ends_the_run_naming_the_node(managed):
    done, _ = train_and_lose(managed, "notice-plain", how="interrupt", node="node3")
    assert done.returncode == 1
    assert "spot interruption notice (node3: terminate at " in done.stderr, done.stderr
    data = managed.summary("notice-plain")
    assert data["status"] == "failed" and data["restarts"] == []
    assert run_processes("notice-plain") == []
    again = local_cluster("replace", "node3")  # the machine would go: the next test needs a node3
    assert again.returncode == 0, again.stderr


def test_a_lost_node_whose_zone_has_no_capacity_moves_the_cluster_to_another_zone_and_the_run_finishes(managed):
    """--managed --relocate, the cluster made in local zones a,b (`kiln up --zones`) and its zone then emptied
    (`exhaust --zone`: no machine for a replacement there, nor for a new cluster, as a zone that preemption
    emptied): node2 is lost and its replacement refused, so kiln keeps the first node's checkpoints, takes the
    cluster down, brings it up again in the other zone, and the run resumes there from its last checkpoint and
    finishes, on three new machines."""
    cluster_file = managed.home / "clusters" / NAME / "cluster.json"
    zone = json.loads(cluster_file.read_text())["region"]
    other = {"a": "b", "b": "a"}[zone]
    before = {name: pinned_keys(managed, name) for name in ("node1", "node2", "node3")}
    try:
        exhausted = local_cluster("exhaust", "--zone", zone)
        assert exhausted.returncode == 0, exhausted.stderr
        done, lost_at = train_and_lose(managed, "relocate", "--managed", "--relocate")
    finally:
        local_cluster("exhaust", "--zone", zone, "--times", "0")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "recovery 1 of 3: no capacity to replace node2 where cluster km is" in done.stdout, done.stdout
    assert f"no capacity for a replacement in local zone {zone}" in done.stdout, done.stdout
    assert f"cluster km is up again at local {other} " in done.stdout, done.stdout
    assert json.loads(cluster_file.read_text())["region"] == other
    data = managed.summary("relocate")
    assert data["status"] == "ok"
    [moved] = data["restarts"]
    assert moved["kind"] == "move" and moved["lost"] == ["node2"] and moved["moved_to"].startswith(f"local {other} ")
    assert lost_at < moved["detected_at"] < moved["restarted_at"]
    assert 0 < moved["resumed_from_step"] <= moved["at_step"], moved
    workers = {task: result for task, result in data["results"].items() if task.startswith("worker-")}
    assert sorted(workers) == ["worker-0", "worker-1", "worker-2"]
    assert all(r["status"] == "ok" for r in workers.values()) and len({r["weights_sha256"]
                                                                      for r in workers.values()}) == 1
    after = {name: pinned_keys(managed, name) for name in before}
    assert all(after[name] and not after[name] & before[name] for name in before), "three new machines"
    assert run_processes("relocate") == []


def test_a_move_whose_checkpoints_cannot_be_kept_here_first_leaves_the_cluster_as_it_is(managed):
    """--managed --relocate with the cluster's zone emptied, as above, but the copy of the first node's checkpoints
    to this machine fails (where they go in the run's folder here, a file stands): kiln does not take the cluster
    down without them; it says why, the run fails, and the cluster file names the same machines where they were."""
    cluster_file = managed.home / "clusters" / NAME / "cluster.json"
    before = json.loads(cluster_file.read_text())
    folder = managed.runs / "keep-failed"

    def block_the_copy():
        (folder / "checkpoints").write_text("not a folder\n")

    try:
        exhausted = local_cluster("exhaust", "--zone", before["region"])
        assert exhausted.returncode == 0, exhausted.stderr
        done, _ = train_and_lose(managed, "keep-failed", "--managed", "--relocate", before_loss=block_the_copy)
    finally:
        local_cluster("exhaust", "--zone", before["region"], "--times", "0")
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-4000:]
    assert "the cluster was not moved, as the first node's checkpoints could not be kept here first" in said, said
    assert "it is left as it is" in said, said
    assert json.loads(cluster_file.read_text()) == before
    assert managed.summary("keep-failed")["status"] == "failed"
    assert run_processes("keep-failed") == []
    again = local_cluster("replace", "node2")  # what a later `kiln up` would do; the next test needs node2
    assert again.returncode == 0, again.stderr


def test_with_no_recovery_left_a_lost_node_fails_the_run_and_leaves_nothing_running(managed):
    done, _ = train_and_lose(managed, "no-recovery", "--managed", "--max-recoveries", "0")
    assert done.returncode != 0
    assert "lost: node2 (all 0 recoveries of --max-recoveries used)" in done.stderr, done.stderr
    assert managed.summary("no-recovery")["status"] == "failed"
    assert run_processes("no-recovery") == []
    again = local_cluster("replace", "node2")  # what a later `kiln up` would do; the next test needs node2
    assert again.returncode == 0, again.stderr


def run_and_lose_node3(managed: Managed, argv: list[str], project: Path, log: Path):
    """Start an elastic run (`argv`); once its first node's `log` says epoch 3 ran on 3 ranks, lose node3; wait
    for the run's end: (the process, its stdout, its stderr, when node3 was lost)."""
    env = {**os.environ, "KILN_HOME": str(managed.home), "KILN_RUNS": str(managed.runs)}
    with subprocess.Popen(argv, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as run:
        try:
            deadline = time.monotonic() + 240
            while "epoch 3 on 3 ranks" not in (log.read_text(errors="replace") if log.exists() else ""):
                assert run.poll() is None and time.monotonic() < deadline, "the run never got going on 3 ranks"
                time.sleep(0.5)
            lost_at = time.time()
            lost = local_cluster("lose", "node3")
            assert lost.returncode == 0, lost.stderr
            out, err = run.communicate(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
    return run, out, err, lost_at


def node3_joined(managed: Managed, run_id: str, run: subprocess.Popen, out: str, err: str) -> dict:
    """What every elastic run that lost node3 (run_and_lose_node3) did: it finished, went on without node3 and
    replaced it, and the replacement joined: its one restart, the join."""
    assert run.returncode == 0, out[-4000:] + err[-4000:]
    assert "node3 (node3) stopped answering: the elastic run goes on without it" in out, out
    assert "recovery 1 of 3: replacing node3 to join the elastic run" in out, out
    [join] = managed.summary(run_id)["restarts"]
    assert join["kind"] == "join" and join["lost"] == ["node3"] and join["replaced"] == [{"old": "node3",
                                                                                          "new": "node3"}]
    return join


def test_an_elastic_run_goes_on_without_a_lost_node_and_its_replacement_joins(managed, tmp_path):
    """Elastic Horovod with --managed: node3 is lost mid-run, the ranks left go on at 2, kiln replaces node3 while
    the job runs, horovodrun adds the new machine, and the run finishes at 3 ranks without a restart. The program
    trains until its world has grown back (a fixed epoch count could end before the replacement joins)."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(PROGRAMS / "elastic_regrow.py", project)
    argv = [str(KILN), "train", "--cluster", NAME, "--min-np", "2", "--managed", "--run-id", "elastic-join",
            "--stall-minimum", "300", "--", "python", "elastic_regrow.py", "--size", "3", "--after", "5"]
    log = STATE / "node1" / "kiln" / "runs" / "elastic-join" / "horovodrun.log"
    run, out, err, lost_at = run_and_lose_node3(managed, argv, project, log)
    join = node3_joined(managed, "elastic-join", run, out, err)
    assert lost_at < join["detected_at"] < join["joined_at"]
    text = log.read_text(errors="replace")
    assert "on 2 ranks" in text and text.rindex("on 3 ranks") > text.index("on 2 ranks"), text[-3000:]
    results = [json.loads(path.read_text())  # ranks renumber after a reset: read every rank's result
               for path in (managed.runs / "elastic-join" / "hosts").glob("*/output/rank-*/result.json")]
    assert sorted(result["rank"] for result in results) == [0, 1, 2], results
    [epochs] = {result["epochs"] for result in results}
    assert all(result["size"] == 3 and result["shrunk"] and result["regrown_at"] == epochs - 5 for result in results)
    # The replacement did work: its rank wrote its result on the new machine.
    assert list((managed.runs / "elastic-join" / "hosts" / "node3" / "output").glob("rank-*/result.json"))
    assert run_processes("elastic-join") == []


def test_an_elastic_torchrun_run_goes_on_without_a_lost_node_and_its_replacement_joins(managed, tmp_path):
    """Elastic torchrun with --managed: node3 is lost mid-run, the workers left fail and torchrun's agents gather
    again (with 2 nodes at least), kiln replaces node3 and starts an agent there, which joins the rendezvous; the
    workers start again at 3 from the newest checkpoint and the run finishes. The program trains until its world
    has been formed again at 3 (torchrun waits a while for more nodes first: the replacement may be in at once)."""
    frameworks = ROOT / ".venv-frameworks" / "bin" / "python"
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(PROGRAMS / "torch_regrow.py", project)
    argv = [str(KILN), "train", "--cluster", NAME, "--mode", "torchrun", "--python", str(frameworks), "--min-np",
            "2", "--managed", "--run-id", "torch-join", "--", "python", "torch_regrow.py", "--size", "3"]
    log = STATE / "node1" / "kiln" / "runs" / "torch-join" / "torchrun-0.log"
    run, out, err, _ = run_and_lose_node3(managed, argv, project, log)
    node3_joined(managed, "torch-join", run, out, err)
    text = log.read_text(errors="replace")
    assert "sizes so far [3, " in text, text[-3000:]  # the workers started again after the loss
    results = [json.loads(path.read_text())
               for path in (managed.runs / "torch-join" / "hosts").glob("*/output/torchrun-*/rank-*.json")]
    assert sorted(result["rank"] for result in results) == [0, 1, 2], results
    assert all(result["size"] == 3 and result["sizes"][-1] == 3 and len(result["sizes"]) > 1
               for result in results), results
    # The replacement did work: its rank wrote its result on the new machine.
    assert list((managed.runs / "torch-join" / "hosts" / "node3" / "output").glob("torchrun-*/rank-*.json"))
    assert run_processes("torch-join") == []
    recorded = json.loads((managed.home / "clusters" / NAME / "cluster.json").read_text())["python"]
    assert recorded != str(frameworks), "a run's --python is its own: the cluster keeps its nodes' Python"


def test_elastic_options_are_refused_where_they_do_not_belong(managed, tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "project", ignore=shutil.ignore_patterns("__pycache__"))
    for args, message in ((["--min-np", "2"], "--min-np runs a program written for elastic Horovod"),
                          (["--mode", "tf-config", "--min-np", "2", "--", "python", "x.py"],
                           "--min-np and --max-np belong to --mode horovod"),
                          (["--min-np", "5", "--", "python", "horovod_elastic.py"],
                           "--min-np 5: give 1 to the 3 processes"),
                          (["--min-np", "2", "--max-restarts", "1", "--", "python", "horovod_elastic.py"],
                           "--max-restarts does not go with it")):
        done = subprocess.run([str(KILN), "train", "--cluster", NAME, "--dry-run", *args], cwd=tmp_path / "project",
                              env={**os.environ, "KILN_HOME": str(managed.home), "KILN_RUNS": str(managed.runs)},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_managed_needs_a_cluster_whose_provider_can_replace_nodes(managed, tmp_path):
    done = managed.kiln("-S", str(STATE / "ssh_config"), "-H", "node1,node2", "train", "--managed")
    assert done.returncode == 2, done.stderr
    assert "--managed and --down-after need a cluster that kiln started" in done.stderr, done.stderr
    detached = managed.kiln("train", "--cluster", NAME, "--managed", "--detach")
    assert detached.returncode == 2 and "cannot --detach" in detached.stderr, detached.stderr
    again = managed.kiln("up", NAME, "--provider", "local", "--count", "2")
    assert again.returncode == 2 and f"cluster {NAME} already exists" in again.stderr, again.stderr


def test_launch_removes_the_cluster_when_the_run_fails(once, tmp_path):
    """up, train, down in one go: the program fails, and the cluster goes all the same."""
    (tmp_path / "fail.py").write_text("import sys\nprint('failing on purpose')\nsys.exit(3)\n")
    try:
        done = once.kiln("launch", "--name", "kl", "--provider", "local", "--count", "2", "--mode", "tf-config",
                         "--run-id", "fails", "--", "python", "fail.py")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "exited with status 3" in done.stderr, done.stderr
        assert "launch: removing cluster kl" in done.stdout and "cluster kl: local nodes removed" in done.stdout
        assert once.summary("fails")["status"] == "failed"
        assert "failing on purpose" in (once.runs / "fails" / "hosts" / "node1" / "worker-0.log").read_text()
        assert not (netns.STATE_ROOT / "kl").exists()
        assert not [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                timeout=30).stdout.split() if ns.startswith("kl-")]
        assert not (once.home / "clusters" / "kl" / "cluster.json").exists()
    finally:
        remove_local("kl")


def test_down_after_removes_the_cluster_once_the_run_is_collected(once, tmp_path):
    (tmp_path / "ok.py").write_text("import os, pathlib\n"
                                    "pathlib.Path(os.environ['KILN_OUTPUT_DIR'], 'made.txt').write_text('kept')\n")
    try:
        up = once.kiln("up", "kd", "--provider", "local", "--count", "1")
        assert up.returncode == 0, up.stderr
        done = once.kiln("train", "--cluster", "kd", "--mode", "tf-config", "--run-id", "then-down", "--down-after",
                         "--", "python", "ok.py")
        assert done.returncode == 0, done.stdout + done.stderr
        assert once.summary("then-down")["status"] == "ok"
        assert (once.runs / "then-down" / "hosts" / "node1" / "output" / "worker-0" / "made.txt").read_text() == "kept"
        assert "--down-after: removing cluster kd" in done.stdout
        assert not (netns.STATE_ROOT / "kd").exists() and not (once.home / "clusters" / "kd").exists()
    finally:
        remove_local("kd")


def test_down_after_with_ctrl_c_stops_and_collects_the_run_before_the_cluster_goes(once, tmp_path):
    """Ctrl-C (SIGINT) while a --down-after run is watched: the run is stopped and what its node holds collected
    (summary: stopped), and only then is the cluster removed."""
    (tmp_path / "long.py").write_text("import os, pathlib, time\n"
                                      "pathlib.Path(os.environ['KILN_OUTPUT_DIR'], 'made.txt').write_text('kept')\n"
                                      "print('written', flush=True)\n"
                                      "time.sleep(600)\n")
    try:
        assert once.kiln("up", "kx", "--provider", "local", "--count", "1").returncode == 0
        env = {**os.environ, "KILN_HOME": str(once.home), "KILN_RUNS": str(once.runs)}
        train = subprocess.Popen([str(KILN), "train", "--cluster", "kx", "--mode", "tf-config", "--run-id",
                                  "cut-short", "--down-after", "--", "python", "long.py"], cwd=tmp_path, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        said = []
        for line in train.stdout:
            said.append(line)
            if line.startswith("run cut-short started"):
                break
        log = once.runs / "cut-short"
        time.sleep(5)  # the program writes its file as it starts, then sleeps
        train.send_signal(signal.SIGINT)
        rest, _ = train.communicate(timeout=180)
        said.append(rest)
        output = "".join(said)
        assert train.returncode == 130, output
        assert "interrupted: stopping run cut-short and collecting its nodes' folders before its cluster goes" in output
        assert once.summary("cut-short")["status"] == "stopped"
        assert (log / "hosts" / "node1" / "output" / "worker-0" / "made.txt").read_text() == "kept"
        assert output.index("stopped run cut-short") < output.index("--down-after: removing cluster kx")
        assert not (netns.STATE_ROOT / "kx").exists() and not (once.home / "clusters" / "kx").exists()
    finally:
        remove_local("kx")


def reachable(node: str, name: str) -> bool:
    return subprocess.run(["ssh", "-F", str(netns.STATE_ROOT / name / "ssh_config"), node, "true"],
                          capture_output=True, timeout=30).returncode == 0


def autostop_state(name: str, node: str) -> dict:
    try:
        return json.loads((netns.STATE_ROOT / name / node / "kiln" / "autostop.json").read_text())
    except (OSError, ValueError):
        return {}


def test_idle_nodes_power_off_but_never_during_a_run(once, tmp_path):
    """up --idle-minutes 0.25: a run longer than the idle window keeps both nodes on; once it ends, each node's
    agent powers it off (a local node: its processes, sshd too, killed) within the window and a check."""
    (tmp_path / "busy.py").write_text("import time\ntime.sleep(25)\nprint('worked 25 s')\n")
    try:
        up = once.kiln("up", "ka", "--provider", "local", "--count", "2", "--idle-minutes", "0.25")
        assert up.returncode == 0, up.stdout + up.stderr
        assert "autostop: node1, node2 power off after 0.25 minute(s) without a kiln run" in up.stdout, up.stdout
        assert json.loads((once.home / "clusters" / "ka" / "cluster.json").read_text())["idle_minutes"] == 0.25
        started = time.time()
        done = once.kiln("train", "--cluster", "ka", "--mode", "tf-config", "--run-id", "longer-than-idle", "--",
                         "python", "busy.py")
        ended = time.time()
        assert done.returncode == 0, done.stdout + done.stderr
        assert once.summary("longer-than-idle")["status"] == "ok"
        for node in ("node1", "node2"):
            seen = autostop_state("ka", node)
            assert seen["shutdown"] == "namespace" and seen["idle_s"] == 15
            assert seen.get("last_busy", 0) > started + 15, seen  # the run's processes were seen late in the run
        deadline = time.time() + 90
        while time.time() < deadline and any(reachable(n, "ka") for n in ("node1", "node2")):
            time.sleep(2)
        for node in ("node1", "node2"):
            assert not reachable(node, "ka"), f"{node} still answers 90 s after the run ended"
            last = autostop_state("ka", node)  # a whole idle window after the run's last sign there
            assert last["powering_off"] >= last["last_busy"] + last["idle_s"] > ended - 10, last
        down = once.kiln("down", "ka")
        assert down.returncode == 0, down.stderr
    finally:
        remove_local("ka")


def test_autostop_is_cancelled_with_zero_and_refuses_what_it_cannot_stop(once):
    try:
        up = once.kiln("up", "kb", "--provider", "local", "--count", "1", "--idle-minutes", "0.1")
        assert up.returncode == 0, up.stdout + up.stderr
        armed = autostop_state("kb", "node1")["pid"]
        cancel = once.kiln("autostop", "--cluster", "kb", "--idle-minutes", "0")
        assert cancel.returncode == 0 and "autostop cancelled on node1" in cancel.stdout, cancel.stderr
        assert autostop_state("kb", "node1")["replaced"] == armed
        time.sleep(15)  # well past the 6 s it had
        assert reachable("node1", "kb")
        assert json.loads((once.home / "clusters" / "kb" / "cluster.json").read_text())["idle_minutes"] is None
        bad = once.kiln("autostop", "--cluster", "kb", "--idle-minutes", "-1")
        assert bad.returncode == 2 and "--idle-minutes -1: give 0 (cancel) to 10080 minutes" in bad.stderr
        given = once.kiln("-S", str(netns.STATE_ROOT / "kb" / "ssh_config"), "-H", "node1", "mesh",
                          "--cluster", "handmade")
        assert given.returncode == 0, given.stderr
        refused = once.kiln("autostop", "--cluster", "handmade", "--idle-minutes", "5")
        assert refused.returncode == 2 and "autostop needs a cluster that kiln started" in refused.stderr
        once.kiln("down", "kb")
    finally:
        remove_local("kb")
