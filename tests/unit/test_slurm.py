"""bootstrap/slurm.py: a queue's slurm.conf and gres.conf, pure."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import threading
from dataclasses import replace

import pytest

from bootstrap import container, slurm, topology
from bootstrap.errors import UsageError
from bootstrap.slurm import (
    Job,
    Munge,
    Power,
    Queue,
    Shape,
    batch_script,
    expand,
    gres_conf,
    hostlist,
    job_exit,
    join_script,
    lost_lines,
    node_names,
    program_text,
    slurm_conf,
    tf_config_lines,
)

POWER = Power("/opt/kiln/resume", "/opt/kiln/suspend", "/opt/kiln/resume-fail")
GPU = Shape("gpu", cpus=192, memory_mib=2_000_000, max_nodes=4, gpus=8, gpu_type="h100")
CPU = Shape("cpu", cpus=4, memory_mib=15_000, max_nodes=2, min_nodes=1)


def queue(*shapes: Shape, **changes) -> Queue:
    return replace(Queue("kq", "head", "10.0.0.2", shapes or (GPU,), "/var/lib/kiln-slurm", "/var/spool/kiln-slurm",
                         "/run/kiln-munge/munge.socket", POWER), **changes)


def settings(text: str) -> dict[str, str]:
    """slurm.conf's KEY=VALUE lines (the node and partition lines apart)."""
    return dict(line.split("=", 1) for line in text.splitlines()
                if line and not line.startswith(("#", "NodeName=", "PartitionName=")))


@pytest.mark.parametrize(("indexes", "written"), [
    ([0, 1, 2, 3], "kq-gpu-[0-3]"), ([5], "kq-gpu-5"), ([0, 1, 3, 5, 6], "kq-gpu-[0-1,3,5-6]"), ([], "")])
def test_hostlist_is_slurms_compact_form_and_expand_reads_it_back(indexes, written):
    assert hostlist("kq-gpu-", indexes) == written
    assert expand(written) == [f"kq-gpu-{i}" for i in sorted(indexes)]


def test_expand_reads_what_slurmctld_hands_the_resume_program():
    assert expand("kq-gpu-[0-1,5],kq-cpu-1") == ["kq-gpu-0", "kq-gpu-1", "kq-gpu-5", "kq-cpu-1"]
    assert expand("n[08-10]") == ["n08", "n09", "n10"]


@pytest.mark.parametrize("bad", ["kq-cpu-[]", "kq-cpu-[1-x]", "kq-cpu-[3-1]", "kq-cpu-[1,,2]", "kq-cpu-[-2]"])
def test_expand_refuses_a_hostlist_it_cannot_read_naming_it(bad):
    """A range written backwards would stand for no node at all, and the others are no numbers: both are bad input
    (`kiln queue resume NAME --nodes ...`), named, never an empty list or a traceback."""
    with pytest.raises(UsageError, match=re.escape(f"hostlist {bad!r}: ")):
        expand(bad)


def test_each_partition_is_its_nodes_in_the_cloud_state_with_their_gpus():
    text = slurm_conf(queue(GPU, CPU))
    assert ("NodeName=kq-gpu-[0-3] CPUs=192 RealMemory=2000000 Gres=gpu:h100:8 State=CLOUD Feature=gpu"
            in text.splitlines())
    assert "NodeName=kq-cpu-[0-1] CPUs=4 RealMemory=15000 State=CLOUD Feature=cpu" in text.splitlines()
    assert "PartitionName=gpu Nodes=kq-gpu-[0-3] Default=YES MaxTime=INFINITE State=UP" in text.splitlines()
    assert "PartitionName=cpu Nodes=kq-cpu-[0-1] Default=NO MaxTime=INFINITE State=UP" in text.splitlines()
    assert node_names(queue(), GPU) == ["kq-gpu-0", "kq-gpu-1", "kq-gpu-2", "kq-gpu-3"]


def test_power_saving_runs_kiln_and_keeps_the_minimum_up():
    found = settings(slurm_conf(queue(GPU, CPU)))
    assert (found["ResumeProgram"], found["SuspendProgram"], found["ResumeFailProgram"]) == (
        "/opt/kiln/resume", "/opt/kiln/suspend", "/opt/kiln/resume-fail")
    assert (found["SuspendTime"], found["SuspendTimeout"], found["ResumeTimeout"]) == ("300", "120", "1800")
    assert found["SuspendExcNodes"] == "kq-cpu-0"  # min_nodes 1: never suspended
    assert "SuspendExcNodes" not in settings(slurm_conf(queue(GPU)))
    assert found["SlurmctldParameters"] == "idle_on_node_suspend" and found["PrivateData"] == "cloud"


def test_the_controller_its_state_and_munge_are_the_queues():
    found = settings(slurm_conf(queue()))
    assert found["SlurmctldHost"] == "head(10.0.0.2)" and found["ClusterName"] == "kq"
    assert found["StateSaveLocation"] == "/var/lib/kiln-slurm/state"  # survives the controller's restart
    assert found["AuthInfo"] == "socket=/run/kiln-munge/munge.socket,cred_expire=120"
    assert found["AuthType"] == "auth/munge"
    assert (found["SlurmdTimeout"], found["JobRequeue"]) == ("180", "1")  # a node silent 3 minutes is lost
    assert found["SlurmdSpoolDir"] == "/var/spool/kiln-slurm/%n/spool"  # one slurmd per node name
    assert (found["ProctrackType"], found["TaskPlugin"]) == ("proctrack/cgroup", "task/cgroup,task/affinity")
    shared = settings(slurm_conf(queue(cgroups=False)))
    assert (shared["ProctrackType"], shared["TaskPlugin"]) == ("proctrack/linuxproc", "task/none")


def test_gres_conf_names_each_gpu_nodes_devices():
    assert gres_conf(queue(GPU, CPU)).splitlines()[1:] == [
        "NodeName=kq-gpu-[0-3] Name=gpu Type=h100 File=/dev/nvidia[0-7]"]
    one = Shape("one", cpus=4, memory_mib=16_000, max_nodes=1, gpus=1, gpu_type="l4")
    assert gres_conf(queue(one)).splitlines()[1:] == ["NodeName=kq-one-0 Name=gpu Type=l4 File=/dev/nvidia0"]


@pytest.mark.parametrize(("shapes", "message"), [
    ((), "it needs at least one partition"),
    ((replace(GPU, name="GPU"),), "queue partition 'GPU': a name of 1 to 16 lowercase letters"),
    ((replace(GPU, max_nodes=0),), "--max-nodes 0: give 1 to 1024"),
    ((replace(GPU, min_nodes=5),), "--min-nodes 5: give 0 to --max-nodes (4)"),
    ((replace(GPU, gpu_type=""),), "a GPU shape names its GPUs' count and type"),
    ((replace(CPU, gpu_type="h100"),), "a GPU shape names its GPUs' count and type"),
    ((replace(GPU, gpu_type="H100"),), "GPU type 'H100'"),
    ((GPU, replace(CPU, name="gpu")), "partition gpu is named twice"),
    ((replace(CPU, cpus=0),), "at least 1 CPU"),
])
def test_a_bad_queue_is_one_line_naming_what_is_wrong(shapes, message):
    with pytest.raises(UsageError) as raised:
        slurm_conf(replace(queue(), shapes=shapes))
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_every_machine_of_a_queue_runs_munged_at_the_clusters_own_paths():
    """The same paths on the controller and each node (one slurm.conf), apart from another cluster's munged."""
    munge = Munge("kq")
    assert (munge.socket, munge.key) == ("/run/munge/kiln-kq.socket", "/run/munge/kiln-kq.key")
    assert munge.argv()[:5] == ["runuser", "-u", "munge", "--", "munged"]
    assert f"--key-file={munge.key}" in munge.argv() and f"--socket={munge.socket}" in munge.argv()
    assert Munge("kr").socket != munge.socket
    assert settings(slurm_conf(queue(munge_socket=munge.socket)))["AuthInfo"].startswith(f"socket={munge.socket},")


def test_a_node_joins_with_the_key_from_stdin_and_the_controllers_configuration():
    joined = queue(CPU, node_dir="/root/kiln/slurm", munge_socket=Munge("kq").socket)
    script = join_script(joined, "kq-cpu-1")
    assert "base64 -d > /run/munge/kiln-kq.key.new" in script and "chmod 400 /run/munge/kiln-kq.key.new" in script
    assert slurm_conf(joined) in script and gres_conf(joined) in script  # the controller's, as they are
    lines = script.splitlines()
    assert lines[0] == "set -e" and lines[-1] == "slurmd -N kq-cpu-1 -b -f /root/kiln/slurm/slurm.conf"
    assert script.index("munged --socket") < script.rindex("slurmd -N")
    # a machine that joins again: its node's slurmd (by the node's pid file, if it is slurmd) stopped before the new one
    assert script.index("old=$(cat /root/kiln/slurm/kq-cpu-1/slurmd.pid") < script.index('kill "$old"') < \
        script.rindex("slurmd -N")


def test_slurmctlds_programs_are_kiln_with_its_settings_and_none_of_slurmctlds_descriptors():
    text = program_text(["/venv/bin/python", "-m", "bootstrap.programs"], "resume", "kq", "/q/resume.log",
                        {"KILN_HOME": "/home/a b/.kiln", "PATH": "/usr/bin"})
    assert text.startswith("#!/bin/sh\n")
    assert text.splitlines()[-1] == ("exec env KILN_HOME='/home/a b/.kiln' PATH=/usr/bin /venv/bin/python -m "
                                     "bootstrap.programs resume kq \"$1\" </dev/null >>/q/resume.log 2>&1")


def test_a_torchrun_job_is_an_agent_per_node_meeting_on_the_first_with_kilns_environment():
    script = batch_script(Job("kq", "r1", "gpu", 2, "torchrun", ("train.py", "--epochs", "2"), "/venv/bin/python",
                              "/runs/r1", nproc_per_node=8))
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --wait-all-nodes=1" in script and "#SBATCH --output=/runs/r1/slurm-%j.out" in script
    srun = script.splitlines()[-1]
    assert srun.startswith("srun --kill-on-bad-exit=1 bash -c ")
    assert srun.endswith("kiln /venv/bin/python -m torch.distributed.run --nnodes 2 --nproc-per-node 8 "
                         '--rdzv-backend c10d --rdzv-endpoint "$KILN_COORDINATOR" --rdzv-id "$SLURM_JOB_ID" train.py '
                         "--epochs 2 || lost $?")
    for each in ("KILN_OUTPUT_DIR=/runs/r1/output/torchrun-$SLURM_NODEID",
                 "KILN_CHECKPOINT_DIR=/runs/r1/checkpoints/torchrun-$SLURM_NODEID", "PET_LOCAL_ADDR=$addr",
                 "is_host=$([ \"$SLURM_NODEID\" = 0 ]"):
        assert each in srun
    plain = batch_script(Job("kq", "r2", "cpu", 3, "run", ("/venv/bin/python", "where.py"), "/venv/bin/python",
                             "/runs/r2"))
    assert plain.splitlines()[-1].endswith("kiln /venv/bin/python where.py || lost $?") and "PET_" not in plain
    assert "KILN_OUTPUT_DIR=/runs/r2/output/node-$SLURM_NODEID" in plain
    assert "export KILN_COORDINATOR=$addr:$((29400 + SLURM_JOB_ID % 1000))" in script
    jax = batch_script(Job("kq", "r3", "cpu", 2, "jax", ("/py", "sum.py"), "/py", "/runs/r3"))
    assert "JAX_COORDINATOR_ADDRESS=$KILN_COORDINATOR" in jax.splitlines()[-1] and "PET_" not in jax


def test_a_horovod_job_is_its_ranks_under_srun_with_pmix_each_named_by_its_rank():
    script = batch_script(Job("kq", "r5", "gpu", 2, "horovod", ("/py", "hvd.py"), "/py", "/runs/r5", nproc_per_node=8))
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=8" in script
    srun = script.splitlines()[-1]
    assert srun.startswith("srun --mpi=pmix --kill-on-bad-exit=1 bash -c ")
    assert srun.endswith("kiln /py hvd.py || lost $?")
    assert "KILN_OUTPUT_DIR=/runs/r5/output/rank-$SLURM_PROCID" in srun and "KILN_NODE_RANK=$SLURM_NODEID" in srun
    plain = batch_script(Job("kq", "r6", "gpu", 2, "run", ("/py", "x.py"), "/py", "/runs/r6", nproc_per_node=8))
    assert "#SBATCH --ntasks-per-node=1" in plain and "--mpi=pmix" not in plain  # one process a node


@pytest.mark.parametrize(("shown", "said"), [
    ("NodeName=kq-cpu-1 State=ALLOCATED+CLOUD+NOT_RESPONDING Reason=None", "requeue 42\nexit 3\n"),
    ("NodeName=kq-cpu-1 State=ALLOCATED+CLOUD Reason=None", "exit 3\n"),  # the program's own failure
])
def test_a_failed_program_puts_its_job_back_in_the_queue_only_where_a_node_of_it_no_longer_answers(shown, said):
    """The batch script's `lost`, run under bash with scontrol a stand-in that shows the job's nodes."""
    job = replace(Job("kq", "r7", "cpu", 2, "run", ("/py", "x.py"), "/py", "/runs/r7"), slurmd_timeout_s=0)
    assert "\n".join(lost_lines(job)) in batch_script(job)
    scontrol = (f"scontrol() {{ if [ \"$1\" = show ]; then echo '{shown}'; else echo \"$1 $2\"; fi; }}; "
                "sleep() { :; }")
    shell = "\n".join([scontrol, "SLURM_JOB_ID=42 SLURM_JOB_NODELIST='kq-cpu-[0-1]'", *lost_lines(job),
                       "trap 'echo exit $?' EXIT", "lost 3"])
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=10)
    assert (done.stdout, done.returncode) == (said, 3), done.stderr


def test_shards_are_an_array_job_of_one_node_tasks_each_told_its_shard_and_its_inputs():
    script = batch_script(Job("kq", "r8", "cpu", 1, "run", ("/py", "p.py"), "/py", "/runs/r8", shards=3,
                              shard_inputs=True))
    assert "#SBATCH --array=0-2" in script and "#SBATCH --output=/runs/r8/slurm-%A_%a.out" in script
    assert "KILN_SHARD_COUNT=3" in script
    srun = script.splitlines()[-1]
    for each in ("KILN_SHARD_INDEX=$SLURM_ARRAY_TASK_ID",
                 "KILN_SHARD_INPUTS=/runs/r8/shard-$SLURM_ARRAY_TASK_ID.inputs",
                 "KILN_OUTPUT_DIR=/runs/r8/output/shard-$SLURM_ARRAY_TASK_ID", "KILN_TASK=shard-$SLURM_ARRAY_TASK_ID"):
        assert each in srun
    plain = batch_script(Job("kq", "r9", "cpu", 1, "run", ("/py", "p.py"), "/py", "/runs/r9", shards=2))
    assert "KILN_SHARD_INPUTS" not in plain and "#SBATCH --array=0-1" in plain
    assert "--array" not in batch_script(Job("kq", "r0", "cpu", 1, "run", ("/py", "p.py"), "/py", "/runs/r0"))


def test_a_tf_config_job_gives_each_nodes_worker_the_tf_config_the_launcher_would():
    """Run the job's own lines under bash, with srun a stand-in that answers for three nodes in another order: each
    node's TF_CONFIG is topology.tf_config's for one worker per node at the job's port, indexed by the node."""
    script = batch_script(Job("kq", "r4", "cpu", 3, "tf-config", ("/py", "mw.py"), "/py", "/runs/r4"))
    assert "\n".join(tf_config_lines()) in script
    srun = script.splitlines()[-1]
    per_task = shlex.split(srun)[4]
    tf_config = per_task.split("TF_CONFIG=", 1)[1].split(" ;", 1)[0]
    fake_srun = "srun() { printf '2 10.0.0.9\\n0 10.0.0.7\\n1 10.0.0.8\\n'; }"
    shell = "\n".join([fake_srun, "SLURM_JOB_ID=1042", *tf_config_lines(),
                       *(f"SLURM_NODEID={node}; echo {tf_config}" for node in range(3))])
    said = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=10, check=True).stdout
    plan = topology.plan_tf_config(["10.0.0.7", "10.0.0.8", "10.0.0.9"], [1, 1, 1], base_port=23456 + 42)
    assert [json.loads(line) for line in said.splitlines()] == [topology.tf_config(plan, p) for p in plan.processes]
    assert "KILN_OUTPUT_DIR=/runs/r4/output/worker-$SLURM_NODEID" in srun


@pytest.mark.parametrize(("shown", "status"), [
    ("JobId=7 JobName=r1 JobState=RUNNING Reason=None ExitCode=0:0", None),
    ("JobId=7 JobState=PENDING Reason=BeginTime ExitCode=0:0", None),
    ("JobId=7 JobState=REQUEUED ExitCode=0:0", None),  # a node was lost: the job goes on
    ("JobId=7 JobState=COMPLETED ExitCode=0:0", 0),
    ("JobId=7 JobState=FAILED ExitCode=3:0", 3),
    ("JobId=7 JobState=CANCELLED ExitCode=0:15", 1),  # never 0 unless it completed
    ("JobId=7 JobState=NODE_FAIL Requeue=0 ExitCode=0:0", 1),
    # slurmctld shows a job it requeues PENDING at once: a NODE_FAIL or PREEMPTED it shows has ended, Requeue=1 or
    # not (requeued too often, or not a batch job)
    ("JobId=7 JobState=NODE_FAIL Requeue=1 Restarts=5 ExitCode=0:0", 1),
    ("JobId=7 JobState=PREEMPTED Requeue=1 ExitCode=0:15", 1),
])
def test_a_job_has_ended_only_in_slurms_final_states_and_only_completed_is_0(shown, status):
    assert job_exit(shown) == status


@pytest.mark.parametrize(("shown", "status"), [
    ("JobId=9 ArrayTaskId=0 JobState=COMPLETED ExitCode=0:0\nJobId=9 ArrayTaskId=1-2 JobState=PENDING ExitCode=0:0",
     None),  # tasks still pending: not ended
    ("JobId=9 ArrayTaskId=0 JobState=COMPLETED ExitCode=0:0\nJobId=10 ArrayTaskId=1 JobState=COMPLETED ExitCode=0:0",
     0),
    ("JobId=9 ArrayTaskId=0 JobState=COMPLETED ExitCode=0:0\nJobId=10 ArrayTaskId=1 JobState=FAILED ExitCode=4:0", 4),
    ("", None),
])
def test_an_array_job_has_ended_once_every_task_has_with_the_first_failure(shown, status):
    assert job_exit(shown) == status


IMAGE = "10.9.0.1:5000/kiln@sha256:" + "ab" * 32


def fake_docker(folder, said: str) -> dict[str, str]:
    """A `docker` first on PATH that writes its arguments, one a line, and the environment it was given into
    `said` (a stand-in for the node's engine: the argv is what this test reads)."""
    docker = folder / "docker"
    docker.write_text(f"#!/bin/sh\n{{ printf '%s\\n' \"$@\"; echo DOCKER_HOST=$DOCKER_HOST; }} >> {said}\n")
    docker.chmod(0o755)
    return {"PATH": f"{folder}:/usr/bin:/bin", "HOME": "/home/ada"}


def test_a_task_in_an_image_is_its_program_in_a_container_with_the_tasks_environment_and_the_jobs_folder(tmp_path):
    """Run a torchrun job's task line under bash, srun's part stood in: `docker run` of the image on the node's
    network and IPC, the job's folder at the same path, the task's environment passed by name (kiln's, Slurm's,
    torchrun's agents'), labelled with the job, the node's engine as its join found it."""
    nodes = tmp_path / "slurm"
    nodes.mkdir()
    (nodes / "docker-host").write_text("unix:///run/kiln-docker/n1.sock\n")
    job = Job("kq", "r1", "cpu", 2, "torchrun", ("train.py",), "python3", "/runs/r1", image=IMAGE,
              node_dir=str(nodes))
    script = batch_script(job).splitlines()
    exported, srun = next(line for line in script if line.startswith("export KILN_RUN_ID=")), script[-1]
    said = tmp_path / "said"
    env = {**fake_docker(tmp_path, str(said)), "SLURM_JOB_ID": "42", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
           "KILN_COORDINATOR": "10.9.0.2:29442", "UNRELATED": "x"}
    shell = "\n".join(["ulimit -l 64",  # KiB: the node's limit on locked memory, which docker takes in bytes
                       'srun() { while [[ $1 == --* ]]; do shift; done; "$@"; }', "lost() { exit $1; }", exported,
                       srun.replace("mkdir -p", ": mkdir -p")])  # the job's folder is not on this machine
    done = subprocess.run(["bash", "-c", shell], env=env, capture_output=True, text=True, timeout=10, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    removed, argv = said.read_text().splitlines()[:4], said.read_text().splitlines()[4:]
    # a container of the same name left by the job's earlier run (requeued) goes first
    assert removed == ["rm", "-f", "kiln-42-torchrun-1", "DOCKER_HOST=unix:///run/kiln-docker/n1.sock"]
    assert argv[:3] == ["run", "--rm", "--init"] and argv[-1] == "DOCKER_HOST=unix:///run/kiln-docker/n1.sock"
    at = argv.index(IMAGE)
    assert argv[at + 1:-1] == ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.9.0.2:29442", "--rdzv-id", "42",
                               "train.py"]
    options = argv[:at]
    pairs = set(zip(options, options[1:], strict=False))
    for pair in [("--network", "host"), ("--ipc", "host"), ("--name", "kiln-42-torchrun-1"),
                 ("--label", "kiln.slurm-job=42"), ("-v", "/runs/r1:/runs/r1"), ("-w", str(tmp_path)),
                 ("-v", "/etc/hosts:/etc/hosts:ro"), ("-e", "HOME=/home/ada"), ("-v", f"{nodes}:{nodes}"),
                 ("--user", f"{os.getuid()}:{os.getgid()}"), ("--ulimit", "memlock=65536:65536")]:
        assert pair in pairs, pair
    passed = {value for key, value in pairs if key == "-e"}
    assert {"KILN_RUN_ID", "KILN_TASK", "KILN_OUTPUT_DIR", "KILN_CHECKPOINT_DIR", "SLURM_JOB_ID", "PET_LOCAL_ADDR",
            "PET_RDZV_CONF", "NCCL_SOCKET_IFNAME", "PYTHONPATH", "PYTHONUNBUFFERED"} <= passed, passed
    assert "UNRELATED" not in passed and "PATH" not in passed  # the image's own PATH finds its Python
    plain = batch_script(replace(job, image=""))
    assert "docker" not in plain and plain.splitlines()[-1].count('exec "$@"') == 1


@pytest.mark.parametrize(("answers", "code", "said"), [
    ("echo 'kq-cpu-0 sha256:1'; echo 'kq-cpu-1 sha256:1'", 0, "tasks run in"),
    ("echo 'kq-cpu-0 sha256:1'; echo 'kq-cpu-1 sha256:2'", 1, "is not the same image on every node"),
    ("echo 'kq-cpu-0 sha256:1'; return 1", 1, "could not be pulled on every node"),
])
def test_an_images_job_pulls_it_once_a_node_and_stops_where_a_node_could_not_or_has_another(answers, code, said):
    """The batch script's pull lines under bash, srun stood in by what the nodes would answer."""
    job = Job("kq", "r1", "cpu", 2, "run", ("python3", "x.py"), "python3", "/runs/r1", image=IMAGE,
              node_dir="/root/kiln/slurm")
    lines = container.pull_lines(IMAGE, "/root/kiln/slurm")
    script = batch_script(job)
    assert "\n".join(lines) in script and script.index(lines[0]) < script.index("srun --kill-on-bad-exit=1 bash")
    assert "docker pull -q " + IMAGE in lines[0] and "--ntasks-per-node=1" in lines[0]
    shell = "\n".join([f"srun() {{ {answers}; }}", "lost() { exit $1; }", *lines, "echo reached"])
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=10)
    assert done.returncode == code and said in done.stdout + done.stderr, (done.stdout, done.stderr)
    assert ("reached" in done.stdout) == (code == 0)


def test_each_node_runs_the_epilog_that_removes_the_containers_a_killed_job_left(tmp_path):
    joined = queue(CPU, node_dir="/root/kiln/slurm", munge_socket=Munge("kq").socket)
    assert settings(slurm_conf(joined))["Epilog"] == "/root/kiln/slurm/epilog"
    script = join_script(joined, "kq-cpu-1")
    epilog = container.epilog_text("/root/kiln/slurm")
    assert f"cat > /root/kiln/slurm/epilog <<'KILN_SLURM_CONF'\n{epilog}KILN_SLURM_CONF" in script
    assert "chmod 755 /root/kiln/slurm/epilog" in script
    assert "printf '%s\\n' \"${DOCKER_HOST:-}\" > /root/kiln/slurm/docker-host" in script
    assert script.index("/root/kiln/slurm/epilog") < script.index("slurmd -N")
    said = tmp_path / "said"
    answer = tmp_path / "docker"
    answer.write_text(f"#!/bin/sh\necho \"$@\" >> {said}\n[ \"$1\" = ps ] && echo c1 && echo c2\nexit 0\n")
    answer.chmod(0o755)
    done = subprocess.run(["bash", "-c", epilog], env={"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ID": "42"},
                          capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    assert said.read_text().splitlines() == ["ps -aq --filter label=kiln.slurm-job=42", "rm -f c1 c2"]


NODE = ("NodeName=kqt-cpu-0 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=1 NodeAddr=kqt-cpu-0 "
        "NodeHostName=kqt-cpu-0 RealMemory=1 State={state} ThreadsPerCore=1 Partitions=cpu {reason}")


@pytest.mark.parametrize(("state", "reason", "silent", "kilns"), [
    ("DOWN+CLOUD+NOT_RESPONDING", "Reason=Not responding [slurm@2026-12-01T01:40:00]", True, False),  # lost
    ("DOWN+CLOUD+POWERED_DOWN+NOT_RESPONDING",
     "Reason=kiln could not make it: cluster kqt: no capacity [root@2026-12-01T01:40:00]", True, True),
    ("DOWN+CLOUD", "Reason=kiln's resume ended before it joined the node's machine [root@2026-12-01T01:40:00]",
     False, True),
    ("IDLE+CLOUD", "", False, False),
])
def test_a_node_kiln_marked_down_itself_is_told_from_one_that_was_lost(state, reason, silent, kilns):
    """kiln's lost program powers down by force a node slurmctld no longer hears from, but not one kiln's resume
    marked down (its reason would go, and a resume follow at once)."""
    shown = NODE.format(state=state, reason=reason)
    assert (slurm.not_responding(shown), slurm.down_by_kiln(shown)) == (silent, kilns)


def test_a_machine_that_joins_again_stops_its_nodes_slurmd_and_no_other(tmp_path):
    """The join script's first lines stop a slurmd of this node already running (the machine joins again), found by
    its pid file but only where that process is this node's slurmd: a pid file may outlive its process, and a local
    node's processes share the machine's pid numbers (another node's slurmd, kq-cpu-10, is left running)."""
    lines = join_script(queue(CPU, node_dir=str(tmp_path)), "kq-cpu-1").splitlines()
    begin = next(index for index, line in enumerate(lines) if line.startswith("old="))
    stop = "set -e\n" + "\n".join(lines[begin:begin + 3]) + "\necho stopped\n"
    (tmp_path / "kq-cpu-1").mkdir()
    pid_file = tmp_path / "kq-cpu-1" / "slurmd.pid"

    def slurmd(node: str) -> subprocess.Popen:  # a process whose command line is that node's slurmd's
        return subprocess.Popen(["perl", "-e", f'$0 = "slurmd -N {node} -b -f /x"; sleep 300'])

    ours, other = slurmd("kq-cpu-1"), slurmd("kq-cpu-10")
    try:
        threading.Event().wait(0.5)  # perl has set its name
        for pid in (other.pid, 999999999, ""):  # another node's slurmd, a pid gone, an empty file: nothing stopped
            pid_file.write_text(f"{pid}\n")
            done = subprocess.run(["sh", "-c", stop], capture_output=True, text=True, timeout=30)
            assert (done.returncode, done.stdout, done.stderr) == (0, "stopped\n", ""), pid
        assert other.poll() is None and ours.poll() is None
        pid_file.write_text(f"{ours.pid}\n")
        done = subprocess.run(["sh", "-c", stop], capture_output=True, text=True, timeout=30)
        assert (done.returncode, done.stdout) == (0, "stopped\n"), done.stderr
        assert ours.wait(timeout=15) == -signal.SIGTERM and other.poll() is None
    finally:
        for process in (ours, other):
            process.kill()
            process.wait()


def test_a_kiln_jobs_folder_and_nodes_come_from_what_slurmctld_gives_its_prolog_and_epilog():
    from bootstrap.slurm import job_place

    assert job_place("/root/kiln/controller/jobs/r1/code", "q-cpu-[0-1]") == ("/root/kiln/controller/jobs/r1",
                                                                              "q-cpu-[0-1]")
    assert job_place("/home/me", "q-cpu-0") is None  # a job kiln did not write: nothing of kiln's to carry
    assert job_place("/root/kiln/controller/jobs/r1/code", "") is None


@pytest.mark.parametrize(("state", "up"), [("IDLE+CLOUD", True), ("ALLOCATED+CLOUD", True), ("MIXED", True),
                                           ("ALLOCATED+CLOUD+POWERING_UP", False), ("IDLE+CLOUD+POWERED_DOWN", False),
                                           ("DOWN+CLOUD+NOT_RESPONDING", False), ("IDLE+NOT_RESPONDING", False)])
def test_a_node_is_up_for_its_job_once_it_answers_and_no_longer_powers_up(state, up):
    from bootstrap.slurm import node_up

    assert node_up(f"NodeName=q-cpu-0 Arch=x86_64 State={state} Partitions=cpu") is up


def test_a_clouds_queue_carries_each_jobs_folder_with_slurmctlds_prolog_and_epilog():
    from bootstrap.slurm import Munge, Power, Queue, Shape, slurm_conf

    power = Power("/q/bin/resume", "/q/bin/suspend", "/q/bin/resume-fail", "/q/bin/lost", "/q/bin/job-start",
                  "/q/bin/job-end")
    conf = slurm_conf(Queue("q", "ctl", "10.0.0.4", (Shape("cpu", 2, 1000, 2),), "/q/ctl", "/var/lib/kiln-slurm",
                            Munge("q").socket, power))
    assert "PrologSlurmctld=/q/bin/job-start\nEpilogSlurmctld=/q/bin/job-end\n" in conf
    text = program_text(["/usr/bin/python3", "-m", "bootstrap.programs"], "job-end", "q", "/q/job-end.log", {})
    assert text.splitlines()[-1].endswith('bootstrap.programs job-end q "$SLURM_JOB_ID" </dev/null >>/q/job-end.log '
                                          '2>&1')
