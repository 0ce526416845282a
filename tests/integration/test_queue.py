"""`kiln queue` on the local provider, through the CLI, with Debian's real slurmctld, slurmd and munged: a queue
with no node up; a two-node job makes slurmctld call kiln's ResumeProgram, which makes two machines (local nodes,
their host keys pinned) and joins them over SSH (the cluster's MUNGE key, slurmd); the job runs on both; once idle
past SuspendTime, kiln's SuspendProgram removes them and the queue is back to zero. A node that cannot be made is
marked down with the provider's reason; `kiln down` leaves no daemon, key or namespace."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import KILN, ROOT, can_make_namespaces, local_cluster_command, needs_slurm

NAME = "kqt"
pytestmark = [
    pytest.mark.integration, pytest.mark.timeout(900),
    needs_slurm(),
    pytest.mark.in_written_order("the queue's nodes come, go, then cannot be made"),
]
IDLE_MINUTES = 0.25  # SuspendTime 15 s
FRAMEWORKS = ROOT / ".venv-frameworks" / "bin" / "python"  # PyTorch (make setup)


class Queue:
    def __init__(self, home: Path):
        self.home = home
        # the queue's configuration is this machine's, for every user (bootstrap/queue.py SHARED_ROOT)
        self.env = {**os.environ, "KILN_HOME": str(home), "SLURM_CONF": f"/run/kiln/queues/{NAME}/slurm.conf"}

    def kiln(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(KILN), *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def slurm(self, *argv: str) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        return done.stdout

    def nodes_shown(self) -> str:
        return self.slurm("sinfo", "--all", "--noheader", "--format=%D %t %N").strip()

    def namespaces(self) -> list[str]:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
        return sorted(line.split()[0] for line in listed.splitlines() if line.startswith(f"{NAME}-n"))

    def wait(self, what: str, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            logs = self.home / "clusters" / NAME / "queue"
            said = "".join(p.read_text() for p in sorted(logs.glob("*.log"))) if logs.is_dir() else ""
            assert time.monotonic() < deadline, f"{what} within {timeout} s: {self.nodes_shown()}\n{said[-3000:]}"
            time.sleep(1)


@pytest.fixture(scope="module")
def queue(tmp_path_factory):
    reason = can_make_namespaces()
    if reason:
        pytest.skip(reason)
    made = Queue(tmp_path_factory.mktemp("kiln-home"))
    local_cluster_command("down", "--name", NAME)
    try:
        up = made.kiln("queue", "up", NAME, "--max-nodes", "2", "--idle-minutes", str(IDLE_MINUTES))
        assert up.returncode == 0, up.stdout + up.stderr
        yield made
    finally:
        if (made.home / "clusters" / NAME / "cluster.json").exists():  # the last test did not take it down
            made.kiln("down", NAME)
        local_cluster_command("down", "--name", NAME)


def test_the_queue_starts_with_no_node_up(queue):
    assert queue.nodes_shown() == f"2 idle~ {NAME}-cpu-[0-1]"  # ~: powered down, no machine
    assert queue.namespaces() == []
    env = queue.kiln("queue", "env", NAME)
    assert env.returncode == 0 and env.stdout == f"export SLURM_CONF={queue.env['SLURM_CONF']}\n"
    key = queue.home / "clusters" / NAME / "queue" / "munge.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_size == 1024


def test_a_job_brings_its_nodes_up_and_runs_on_both(queue, tmp_path):
    out = tmp_path / "job.out"
    job = queue.slurm("sbatch", "--parsable", "--nodes=2", f"--output={out}",
                      "--wrap=srun sh -c 'echo $SLURMD_NODENAME $(hostname) $(hostname -I)'").strip()
    queue.wait("the job ends", lambda: not queue.slurm("squeue", "--noheader", "--jobs", job).strip(), 240)
    ran = sorted(out.read_text().splitlines())
    assert [line.split()[:2] for line in ran] == [[f"{NAME}-cpu-0", "node1"], [f"{NAME}-cpu-1", "node2"]], ran
    addresses = {line.split()[2] for line in ran}
    assert len(addresses) == 2 and not addresses & {"127.0.0.1"}, ran  # each on its own machine
    resumed = (queue.home / "clusters" / NAME / "queue" / "resume.log").read_text()
    assert f"{NAME}-cpu-0: node1" in resumed and f"{NAME}-cpu-1: node2" in resumed, resumed


def test_a_node_asked_for_again_before_its_suspend_came_joins_again_on_the_machine_kiln_holds(queue):
    """A long resume holds the queue's lock (here the test holds it) while slurmctld powers a node down and, a job
    asking for that node once SuspendTimeout has passed, asks for it again: the suspend and the resume both wait.
    The resume joins the machine kiln still holds again (its slurmd started anew), so the node comes up at once
    rather than wait ResumeTimeout (300 s here) for a boot that never comes, and the suspend leaves it be."""
    node = f"{NAME}-cpu-0"

    def state() -> str:
        return queue.slurm("sinfo", "--all", "--noheader", "--format=%t", f"--nodes={node}").strip()

    with open(queue.home / "clusters" / NAME / "queue" / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a resume of other nodes would, while it makes and joins them
        try:
            queue.slurm("scontrol", "update", f"NodeName={node}", "State=POWER_DOWN_FORCE")  # as if idle long
            job = queue.slurm("sbatch", "--parsable", f"--nodelist={node}", "--output=/dev/null",
                              "--wrap=true").strip()
            queue.wait("slurmctld asking for the node again", lambda: state().endswith("#"), 120)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    queue.wait("the node up again", lambda: state() in ("idle", "alloc", "mix", "comp"), 120)
    queue.wait("the job run", lambda: not queue.slurm("squeue", "--noheader", "--jobs", job).strip(), 120)
    assert "JobState=COMPLETED" in queue.slurm("scontrol", "show", "job", job)
    resumed = (queue.home / "clusters" / NAME / "queue" / "resume.log").read_text()
    assert re.search(rf": {node}: node1 \([0-9.]+\), joined again$", resumed, re.MULTILINE), resumed


def test_idle_nodes_go_and_the_queue_is_back_to_zero(queue):
    """Idle past SuspendTime, kiln's SuspendProgram removes both machines (the one that joined again too)."""
    log = queue.home / "clusters" / NAME / "queue" / "suspend.log"  # written once the suspend program has ended

    def removed() -> bool:
        said = log.read_text() if log.is_file() else ""
        return all(f"{NAME}-cpu-{index}: suspended, node{index + 1} removed" in said for index in (0, 1))
    queue.wait("both nodes removed, as the suspend program says", removed, 120)
    assert queue.namespaces() == []
    queue.wait("both nodes powered down", lambda: queue.nodes_shown() == f"2 idle~ {NAME}-cpu-[0-1]", 120)
    status = queue.kiln("queue", "status", NAME)
    assert status.returncode == 0 and status.stdout.rstrip().endswith("nodes up: none"), status.stdout
    record = json.loads((queue.home / "clusters" / NAME / "cluster.json").read_text())
    assert record["hosts"] == []
    assert (Path("/run/kiln/local") / NAME / "known_hosts").read_text() == ""  # no pin of a machine gone


def test_kiln_submit_trains_torchrun_ddp_on_two_nodes_made_for_it(queue, tmp_path):
    """PyTorch's DDP example from the user's folder, a torchrun agent per node under srun, from zero nodes."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples", project, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([str(KILN), "submit", NAME, "--mode", "torchrun", "--nodes", "2", "--wait", "--python",
                           str(FRAMEWORKS), "--", "python", "torch_ddp.py", "--epochs", "2", "--samples", "512"],
                          cwd=project, env=queue.env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    folder = Path(done.stdout.split("its folder ", 1)[1].split(",", 1)[0])
    results = [json.loads(path.read_text()) for path in sorted(folder.glob("output/torchrun-*/rank-*.json"))]
    assert sorted(r["rank"] for r in results) == [0, 1], results
    assert sorted(path.parent.name for path in folder.glob("output/*/rank-*.json")) == ["torchrun-0", "torchrun-1"]
    assert all(r["world"] == 2 and r["batches"] > 0 for r in results), results
    job = done.stdout.split()[1]
    logs = queue.kiln("queue", "logs", NAME, "--job", job)
    assert logs.returncode == 0 and logs.stdout == (folder / f"slurm-{job}.out").read_text(), logs.stderr
    assert queue.kiln("queue", "cancel", NAME, "--job", job).stdout == f"job {job} of queue {NAME} had already ended\n"


def test_kiln_submit_runs_a_bare_jax_initialize_across_two_nodes(queue, tmp_path):
    """JAX's own example code, jax.distributed.initialize() with no arguments: Slurm gives each process its id and
    the count, kiln the coordinator; on the nodes the last job left (idle until SuspendTime), or new ones."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples", project, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([str(KILN), "submit", NAME, "--mode", "jax", "--nodes", "2", "--wait", "--python",
                           str(FRAMEWORKS), "--", "python", "jax_sum.py"], cwd=project, env=queue.env,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    folder = Path(done.stdout.split("its folder ", 1)[1].split(",", 1)[0])
    results = [json.loads(path.read_text()) for path in sorted(folder.glob("output/jax-*/result.json"))]
    assert sorted(r["process"] for r in results) == [0, 1] and {r["processes"] for r in results} == {2}, results
    assert all(r["sum"] == r["expected"] for r in results), results


def test_kiln_submit_trains_tensorflows_multi_worker_example_with_each_nodes_tf_config(queue, tmp_path):
    """The tutorial's MultiWorkerMirroredStrategy program, TF_CONFIG alone: one worker per node, its address and
    the job's port in every worker's cluster, its index its node's place in the job."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples", project, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([str(KILN), "submit", NAME, "--mode", "tf-config", "--nodes", "2", "--wait", "--",
                           "python", "keras_multiworker.py", "--epochs", "2", "--steps", "5"], cwd=project,
                          env=queue.env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    folder = Path(done.stdout.split("its folder ", 1)[1].split(",", 1)[0])
    results = {path.parent.name: json.loads(path.read_text()) for path in folder.glob("output/*/result.json")}
    assert sorted(results) == ["worker-0", "worker-1"], results
    assert [results[name]["task"] for name in sorted(results)] == ["worker-0", "worker-1"]
    assert all(r["replicas"] == 2 and r["epochs"] == [0, 1] and r["batches"] == 10 for r in results.values()), results


def test_kiln_submit_runs_horovods_keras_example_on_ranks_that_srun_starts_with_pmix(queue, tmp_path):
    """Horovod's own Keras example, no horovodrun: its MPI reads rank and size from each node's PMIx server."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples", project, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([str(KILN), "submit", NAME, "--mode", "horovod", "--nodes", "2", "--wait", "--",
                           "python", "horovod_keras.py", "--epochs", "1"], cwd=project,
                          env=queue.env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    folder = Path(done.stdout.split("its folder ", 1)[1].split(",", 1)[0])
    results = {path.parent.name: json.loads(path.read_text()) for path in folder.glob("output/*/*.json")}
    assert sorted(results) == ["rank-0", "rank-1"], results
    assert sorted(r["rank"] for r in results.values()) == [0, 1] and {r["size"] for r in results.values()} == {2}


def test_kiln_submit_shards_an_input_list_as_an_array_job_each_item_handled_once(queue, tmp_path):
    """kiln run's --shard-input as a Slurm array job: three one-node tasks on a two-node partition, each given its
    contiguous share of the list, as kiln run splits it."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples", project, ignore=shutil.ignore_patterns("__pycache__"))
    items = [f"item-{number}" for number in range(7)]
    (project / "items.txt").write_text("\n".join(items) + "\n")
    done = subprocess.run([str(KILN), "submit", NAME, "--shards", "3", "--shard-input", "items.txt", "--wait", "--",
                           "python", "process_shard.py"], cwd=project, env=queue.env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    folder = Path(done.stdout.split("its folder ", 1)[1].split(",", 1)[0])
    made = sorted(folder.glob("output/shard-*/processed.tsv"))
    assert [path.parent.name for path in made] == ["shard-0", "shard-1", "shard-2"]
    assert [line.split("\t")[0] for path in made for line in path.read_text().splitlines()] == items
    for shard, count in ((0, 3), (1, 2), (2, 2)):
        assert f"shard {shard} of 3: {count} item(s)" in done.stdout, done.stdout[-3000:]


STAMP = """\
import os, pathlib, socket, sys, time
print("began", socket.gethostname(), time.time(), flush=True)
if len(sys.argv) > 2:  # a meeting place (the nodes share /tmp): wait, for a while, until every job has begun
    meet, jobs = pathlib.Path(sys.argv[2]), int(sys.argv[3])
    (meet / f"{socket.gethostname()}-{os.getpid()}").touch()
    deadline = time.time() + 150
    while len(list(meet.iterdir())) < jobs and time.time() < deadline:
        time.sleep(0.2)
time.sleep(float(sys.argv[1]))
print("ended", socket.gethostname(), time.time(), flush=True)
"""


def test_two_jobs_run_side_by_side_and_two_that_need_every_node_one_after_the_other(queue, tmp_path):
    """Two one-node jobs submitted together run at once, each on a node of its own (the queue makes what it
    lacks); two jobs that each need the partition's two nodes run back to back on them, the second once the first
    has ended."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "stamp.py").write_text(STAMP)

    meet = tmp_path / "meet"
    meet.mkdir()

    def submit(nodes: int, *meeting: str) -> tuple[str, Path]:
        done = subprocess.run([str(KILN), "submit", NAME, "--nodes", str(nodes), "--", "python", "stamp.py", "6",
                               *meeting],
                              cwd=project, env=queue.env, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.split()[1], Path(done.stdout.split("its log ", 1)[1].strip())

    def stamps(log: Path) -> dict[str, list[tuple[str, float]]]:
        said: dict[str, list[tuple[str, float]]] = {"began": [], "ended": []}
        for line in log.read_text().splitlines():
            word, host, at = (line.split() + ["", "", ""])[:3]
            if word in said:
                said[word].append((host, float(at)))
        return said

    def ended(job: str) -> bool:
        return "JobState=COMPLETED" in queue.slurm("scontrol", "show", "job", "--oneliner", job)

    # The partition's nodes may be idle or powered down (or going down) from the last test, so one job can begin
    # while the other's node is still being made: each waits for the other before its 6 s (run one after the
    # other, the first would wait 150 s alone and end before the second began).
    side = [submit(1, str(meet), "2"), submit(1, str(meet), "2")]
    queue.wait("both one-node jobs done", lambda: all(ended(job) for job, _ in side), 400)
    (first, second) = (stamps(log) for _, log in side)
    assert first["began"][0][0] != second["began"][0][0], (first, second)  # a node each
    assert max(first["began"][0][1], second["began"][0][1]) < min(first["ended"][0][1], second["ended"][0][1]), \
        (first, second)  # at once

    back = [submit(2), submit(2)]
    queue.wait("both two-node jobs done", lambda: all(ended(job) for job, _ in back), 240)
    (first, second) = (stamps(log) for _, log in back)
    assert len(first["began"]) == len(second["began"]) == 2, (first, second)
    assert max(at for _, at in first["ended"]) <= min(at for _, at in second["began"]), (first, second)


USER = "kilnq"  # a user of this machine who is not root
WHO = """\
import json, os, pwd, socket
out = os.environ["KILN_OUTPUT_DIR"]
os.makedirs(out, exist_ok=True)
json.dump({"user": pwd.getpwuid(os.getuid()).pw_name, "host": socket.gethostname(),
           "rank": os.environ["KILN_NODE_RANK"]}, open(os.path.join(out, "who.json"), "w"))
"""


def test_a_user_who_is_not_root_submits_with_their_own_kiln_and_the_job_runs_as_them(queue):
    """Another user of the machine, with their own kiln home and no SLURM_CONF set, finds the queue root made (its
    configuration is the machine's) and submits to it: the job runs as them on both nodes, from a folder of theirs;
    they see it in the queue and read its log; root sees it too."""
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True, timeout=60)
    home = Path(pwd.getpwnam(USER).pw_dir)
    shutil.rmtree(home / ".kiln", ignore_errors=True)
    project = home / "project"
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir()
    (project / "who.py").write_text(WHO)
    shutil.chown(project, USER, USER)
    shutil.chown(project / "who.py", USER, USER)
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "USER": USER, "LANG": "C.UTF-8"}

    def as_user(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                               str(KILN), *args], cwd=project, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    done = as_user("submit", NAME, "--nodes", "2", "--wait", "--", "python", "who.py", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    job, folder = done.stdout.split()[1], Path(done.stdout.split("its folder ", 1)[1].split(",", 1)[0])
    assert folder.is_relative_to(home / ".kiln" / "runs") and folder.stat().st_uid == pwd.getpwnam(USER).pw_uid
    ran = [json.loads(path.read_text()) for path in sorted(folder.glob("output/node-*/who.json"))]
    assert [(r["user"], r["rank"]) for r in ran] == [(USER, "0"), (USER, "1")], ran
    assert len({r["host"] for r in ran}) == 2, ran  # a machine each
    logs = as_user("queue", "logs", NAME, "--job", job)
    assert logs.returncode == 0 and logs.stdout == (folder / f"slurm-{job}.out").read_text(), logs.stderr
    shown = queue.slurm("scontrol", "show", "job", job)  # as root
    assert f"UserId={USER}(" in shown and "JobState=COMPLETED" in shown, shown
    status = as_user("queue", "status", NAME)
    assert status.returncode == 0 and "PARTITION" in status.stdout and "nodes up" not in status.stdout, status.stdout
    env_said = as_user("queue", "env", NAME)
    assert env_said.stdout == f"export SLURM_CONF={queue.env['SLURM_CONF']}\n", env_said.stdout + env_said.stderr
    assert not (home / ".kiln" / "clusters").exists()  # nothing of the queue in their home: it is root's
    refused = as_user("submit", NAME, "--image", "registry:5000/team/image:1", "--", "python", "who.py")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"kiln: kiln submit {NAME} --image: the queue's nodes have no Docker engine of their own (the local "
        f"provider's get one each with kiln queue up {NAME} --docker)"), refused.stderr


def test_a_job_that_loses_a_node_goes_back_in_the_queue_and_resumes_from_its_checkpoints(queue, tmp_path):
    """A node's machine lost mid-job: the task left fails at once (its collective breaks), the job goes back in the
    queue (not a failure, not a hang), slurmctld's trigger runs kiln's lost program, which powers the node down
    (the suspend program removes what is left of the machine), a new machine is made for the job's second run, and
    each task resumes from its checkpoint."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "tests" / "integration" / "programs" / "slurm_steps.py", project)
    done = subprocess.run([str(KILN), "submit", NAME, "--nodes", "2", "--", "python", "slurm_steps.py", "--steps",
                           "40"], cwd=project, env=queue.env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    job, folder = done.stdout.split()[1], Path(done.stdout.split("its folder ", 1)[1].split(",", 1)[0])
    steps = [folder / "checkpoints" / f"node-{index}" / "step" for index in (0, 1)]
    queue.wait("both tasks counting", lambda: all(p.is_file() and int(p.read_text() or 0) >= 4 for p in steps), 240)
    machine = re.search(rf"{NAME}-cpu-1 on (\w+)", queue.kiln("queue", "status", NAME).stdout).group(1)
    assert local_cluster_command("lose", "--name", NAME, machine).returncode == 0

    followed = queue.kiln("queue", "logs", NAME, "--job", job, "--follow", timeout=600)
    assert followed.returncode == 0 and "Node failure on" in followed.stdout, followed.stdout[-3000:]
    shown = queue.slurm("scontrol", "show", "job", job)
    assert "JobState=COMPLETED" in shown and "Restarts=1" in shown, shown
    results = [json.loads(path.read_text()) for path in sorted(folder.glob("output/node-*/result.json"))]
    assert [r["runs"] for r in results] == [2, 2] and all(r["started_at"] >= 4 for r in results), results
    said = (queue.home / "clusters" / NAME / "queue" / "lost.log").read_text()
    assert f"{NAME}-cpu-1: lost: powered down, its jobs back in the queue" in said, said


def test_a_node_that_cannot_be_made_is_marked_down_with_the_providers_reason(queue):
    queue.wait("the last jobs' nodes removed", lambda: queue.nodes_shown() == f"2 idle~ {NAME}-cpu-[0-1]", 180)
    assert local_cluster_command("exhaust", "--name", NAME).returncode == 0
    job = queue.slurm("sbatch", "--parsable", "--nodes=1", "--output=/dev/null", "--wrap=true").strip()
    try:
        def down_with_reason() -> bool:
            shown = queue.slurm("sinfo", "--all", "--noheader", "--format=%t %E")
            return "no capacity" in shown
        queue.wait("a node marked down with the reason", down_with_reason, 120)
        assert queue.namespaces() == []
        lost = queue.home / "clusters" / NAME / "queue" / "lost.log"  # slurmctld's trigger on a node going down

        def left_down() -> bool:
            return "kiln marked it down (it could not be made or joined): left as it is" in (
                lost.read_text() if lost.is_file() else "")
        queue.wait("kiln's lost program leaving the node kiln marked down", left_down, 90)
        assert down_with_reason()  # not powered down by force, its reason gone
        status = queue.kiln("queue", "status", NAME)
        assert f"{job} wrap PENDING 1" in status.stdout, status.stdout  # it waits for a node
    finally:
        cancelled = queue.kiln("queue", "cancel", NAME, "--job", job)
    assert cancelled.stdout == f"job {job} of queue {NAME} cancelled\n", cancelled.stdout + cancelled.stderr
    assert "CANCELLED" in queue.slurm("scontrol", "show", "job", job)


def test_down_leaves_no_daemon_key_or_namespace(queue):
    """... and a `kiln queue logs --follow` of a job still waiting then ends, naming why, rather than ask forever."""
    pids = Path(queue.home / "clusters" / NAME / "queue" / "ctl" / "slurmctld.pid").read_text().split()[0]
    held = queue.slurm("sbatch", "--parsable", "--hold", "--output=/dev/null", "--wrap=true").strip()
    with subprocess.Popen([str(KILN), "queue", "logs", NAME, "--job", held, "--follow"], cwd=ROOT, env=queue.env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL) as follow:
        try:
            time.sleep(2)
            assert follow.poll() is None, follow.communicate()  # following a job that waits
            down = queue.kiln("down", NAME)
            _, err = follow.communicate(timeout=120)
        finally:
            if follow.poll() is None:
                follow.kill()
    assert follow.returncode == 1 and "slurmctld answers no more about it" in err and "Traceback" not in err, err
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"queue {NAME}: slurmctld and munged stopped" in down.stdout
    assert not Path(f"/proc/{pids}").exists()
    assert list(Path("/run/munge").glob(f"kiln-{NAME}.*")) == []
    assert not (queue.home / "clusters" / NAME).exists() and queue.namespaces() == []


def test_bad_input_is_one_line_naming_it():
    for argv, named in ((("queue", "frob", NAME), "kiln queue frob"),
                        (("queue", "up", NAME, "--provider", "gcp"), "--provider gcp"),
                        (("queue", "up", NAME, "--provider", "aws", "--region", "us-east-1"), "--ssh-cidr"),
                        (("queue", "up", NAME, "--instance-type", "g5.xlarge"), "--instance-type"),
                        (("queue", "up", NAME, "--max-nodes", "0"), "--max-nodes 0"),
                        (("queue", "status", "nosuch"), "nosuch"),
                        (("queue", "logs", NAME), "--job"),
                        (("queue", "cancel", "nosuch", "--job", "7"), "nosuch"),
                        (("submit", NAME, "--image", "-i", "--", "python", "x.py"), "--image '-i'")):
        done = subprocess.run([str(KILN), *argv], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "KILN_HOME": "/nonexistent-kiln-home"}, stdin=subprocess.DEVNULL)
        assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
