"""`kiln train -- CMD` with programs written the way public examples are written (examples/), run from a user's
own project folder across a real 3-node local cluster: TF_CONFIG, ParameterServerStrategy with a chief, Horovod;
the environment contract, the synced project, outputs collected, and the errors a user meets."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import KILN, ROOT, run_processes

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


def test_a_classic_between_graph_program_runs_unchanged_with_placeholders(cluster, project):
    """TensorFlow 1's distributed-MNIST shape: --job_name/--task_index/--ps_hosts/--worker_hosts filled per
    process, workers that stop on their own at the global step (at different times), a server that never ends."""
    done = cluster.kiln("train", "--mode", "tf-config", "--ps", "1", "--no-chief", "--run-id", "classic", "--",
                        "python", "ps_worker_classic.py", "--job_name={kiln:task_type}",
                        "--task_index={kiln:task_index}", "--ps_hosts={kiln:ps_hosts}",
                        "--worker_hosts={kiln:worker_hosts}", "--train-steps", "300", cwd=project, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    results = outputs(cluster, "classic")
    assert set(results) == {"node1/worker-0", "node2/worker-1", "node3/worker-2"}, results
    # a worker's step is fetched in the run that updates it, before or after that update and the other workers'
    # in flight: the last one seen may be one per worker short of where training stopped (a run of CI saw 298)
    assert max(r["global_step"] for r in results.values()) >= 300 - len(results)
    assert sum(r["steps_here"] for r in results.values()) >= 299, "the workers shared one global step"
    data = json.loads((cluster.runs / "classic" / "summary.json").read_text())
    assert data["status"] == "ok", data
    assert run_processes("classic") == [], "the parameter server was stopped once the workers were done"


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


SILENT_WORKER = """\
import json, os, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
for tick in range(2000):
    if task["index"] != 1:  # worker-1 (on node2) hangs without a word
        print(tick, flush=True)
    time.sleep(0.5)
"""


def test_a_program_that_prints_nothing_is_stopped_by_the_watchdog_naming_its_host(cluster, project):
    (project / "silent.py").write_text(SILENT_WORKER)
    done = cluster.kiln("train", "--mode", "tf-config", "--run-id", "silent", "--stall-minimum", "6", "--",
                        "python", "silent.py", cwd=project, timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "for over 6s from worker-1@node2; stalled: node2" in done.stderr, done.stderr
    assert json.loads((cluster.runs / "silent" / "summary.json").read_text())["status"] == "failed"
    assert run_processes("silent") == []


SLOW_TO_LEAVE = """\
import json, os, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("trained", flush=True)
if task["index"] == 1:  # worker-1 (on node2) takes a while to leave, without a word, as a MultiWorkerMirroredStrategy
    time.sleep(15)      # worker waits on the coordination service of a chief that left first
"""


def test_a_worker_quiet_on_its_way_out_after_the_others_finished_is_not_stalled(cluster, project):
    (project / "slow_exit.py").write_text(SLOW_TO_LEAVE)
    done = cluster.kiln("train", "--mode", "tf-config", "--run-id", "slow-exit", "--stall-minimum", "5", "--",
                        "python", "slow_exit.py", cwd=project, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((cluster.runs / "slow-exit" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["durations"]["worker-1"] >= 15, summary


def worker_pid(run_id: str, task: str) -> int | None:
    """The Python of the user's program running as `task` in this run."""
    for pid in run_processes(run_id):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"KILN_TASK={task}".encode() in environ and b"keras_multiworker.py" in argv:
            return pid
    return None


def test_a_killed_worker_is_restarted_and_resumes_from_backup_and_restore(cluster, project):
    argv = [str(KILN), "-S", cluster.ssh_config, "-H", "node1,node2,node3", "train", "--mode", "tf-config",
            "--run-id", "resume", "--max-restarts", "1", "--", "python", "keras_multiworker.py", "--epochs", "5",
            "--steps", "5", "--pause", "2"]
    with subprocess.Popen(argv, cwd=project, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as train:
        try:
            log = cluster.node_dir("node2") / "kiln" / "runs" / "resume" / "worker-1.log"
            end = time.monotonic() + 180
            while time.monotonic() < end and "epoch 1 done" not in (log.read_text() if log.exists() else ""):
                time.sleep(0.5)
            pid = worker_pid("resume", "worker-1")
            assert pid, "worker-1 never finished its second epoch"
            os.kill(pid, signal.SIGKILL)
            out, err = train.communicate(timeout=300)
        finally:
            if train.poll() is None:
                train.kill()
    assert train.returncode == 0, out + err
    data = json.loads((cluster.runs / "resume" / "summary.json").read_text())
    [restart] = data["restarts"]
    assert "worker-1 on node2 exited with status 137" in restart["failure"]
    results = outputs(cluster, "resume")
    assert set(results) == {"node1/worker-0", "node2/worker-1", "node3/worker-2"}
    for result in results.values():  # the second attempt began where BackupAndRestore left off, not at epoch 0
        assert result["epochs"][0] > 0 and result["epochs"][-1] == 4, result
    assert run_processes("resume") == []


def test_run_shards_a_hundred_items_over_three_nodes_each_exactly_once(cluster, project):
    items = [f"item-{n:03d}" for n in range(100)]
    (project / "items.txt").write_text("\n".join(items) + "\n")
    done = cluster.kiln("run", "--run-id", "sharded", "--processes", "5", "--shard-input", "items.txt", "--",
                        "python", "process_shard.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    processed = sorted((cluster.runs / "sharded" / "hosts").glob("*/output/shard-*/processed.tsv"))
    where = {f"{path.parts[-4]}/{path.parts[-2]}" for path in processed}
    assert where == {"node1/shard-0", "node2/shard-1", "node3/shard-2", "node1/shard-3", "node2/shard-4"}
    seen = [line.split("\t")[0] for path in processed for line in path.read_text().splitlines()]
    assert sorted(seen) == items
    table = done.stdout.splitlines()
    assert table[table.index(next(line for line in table if line.startswith("process"))) + 1].split()[:3] == [
        "shard-0", "node1", "0"]
    data = json.loads((cluster.runs / "sharded" / "summary.json").read_text())
    assert set(data["durations"]) == {f"shard-{n}" for n in range(5)}
    assert run_processes("sharded") == []


def test_run_shards_the_objects_under_an_s3_prefix(cluster, project):
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1", "KILN_AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        s3 = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                   region_name="us-east-1").client("s3", endpoint_url=aws["KILN_AWS_ENDPOINT_URL"])
        s3.create_bucket(Bucket="kiln-inputs")
        keys = [f"images/part-{n:02d}.jpg" for n in range(12)]
        for key in [*keys, "other/not-mine.jpg"]:
            s3.put_object(Bucket="kiln-inputs", Key=key, Body=b"x")
        done = cluster.kiln("run", "--run-id", "s3sharded", "--processes", "3", "--shard-input",
                            "s3://kiln-inputs/images/", "--", "python", "process_shard.py", cwd=project, env=aws)
        assert done.returncode == 0, done.stdout + done.stderr
        empty = cluster.kiln("run", "--run-id", "s3empty", "--shard-input", "s3://kiln-inputs/nothing/", "--",
                             "python", "process_shard.py", cwd=project, env=aws)
    finally:
        server.stop()
    processed = sorted((cluster.runs / "s3sharded" / "hosts").glob("*/output/shard-*/processed.tsv"))
    shares = [[line.split("\t")[0] for line in path.read_text().splitlines()] for path in processed]
    assert sorted(item for share in shares for item in share) == [f"s3://kiln-inputs/{key}" for key in keys]
    assert sorted(len(share) for share in shares) == [4, 4, 4]
    assert empty.returncode == 2
    assert "--shard-input s3://kiln-inputs/nothing/: no objects under it" in empty.stderr
    assert not (cluster.runs / "s3empty").exists()


def test_run_names_the_host_of_a_failing_process(cluster, project):
    done = cluster.kiln("run", "--run-id", "onefails", "--", "sh", "-c", 'test "$KILN_SHARD_INDEX" != 2',
                        cwd=project)
    assert done.returncode == 1
    assert "shard-2 on node3 exited with status 1" in done.stderr
    assert run_processes("onefails") == []


def test_fetch_brings_a_path_back_from_every_node_of_a_run(cluster, project):
    made = cluster.kiln("run", "--run-id", "fetchme", "--", "sh", "-c",
                        'mkdir -p "$KILN_MODEL_DIR" && echo "$KILN_SHARD_INDEX" > "$KILN_MODEL_DIR/weights.txt"',
                        cwd=project)
    assert made.returncode == 0, made.stdout + made.stderr
    folder = cluster.runs / "fetchme" / "hosts"
    for model in folder.glob("*/model"):
        shutil.rmtree(model)
    fetched = cluster.kiln("fetch", "--run-id", "fetchme", "model", cwd=project, hosts=None)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert {p.parts[-3]: p.read_text().strip() for p in folder.glob("*/model/weights.txt")} == {
        "node1": "0", "node2": "1", "node3": "2"}
    home = cluster.ssh("node2", "mkdir -p data && echo only-here > data/notes.txt && pwd").stdout.strip()
    one = cluster.kiln("fetch", "--run-id", "fetchme", "--host", "node2", f"{home}/data", cwd=project, hosts=None)
    assert one.returncode == 0, one.stdout + one.stderr
    assert (folder / "node2" / "fetched" / home.lstrip("/") / "data" / "notes.txt").read_text() == "only-here\n"
    missing = cluster.kiln("fetch", "--run-id", "fetchme", "nosuch", cwd=project, hosts=None)
    assert missing.returncode == 1 and "no node of run fetchme has" in missing.stderr and "nosuch" in missing.stderr
    assert "not on node1, node2, node3: " in missing.stdout, missing.stdout
    cluster.ssh("node2", "echo partial > kiln/runs/fetchme/only-node2.txt")
    some = cluster.kiln("fetch", "--run-id", "fetchme", "only-node2.txt", cwd=project, hosts=None)
    assert some.returncode == 0, some.stdout + some.stderr
    assert "not on node1, node3: " in some.stdout and "Broken pipe" not in some.stdout + some.stderr
    assert (folder / "node2" / "only-node2.txt").read_text() == "partial\n"


def test_a_large_project_is_synced_and_fetched_showing_each_nodes_bytes(cluster, project):
    """Where the output is not a terminal (a CI log), a sync that lasts prints each node's bytes of the whole every
    KILN_PROGRESS_SECONDS, then the project's size and how long it took; a fetch prints its bytes too. A small
    project's sync says nothing of it (the other tests)."""
    (project / "weights.bin").write_bytes(os.urandom(48 * 10**6))
    env = {"KILN_PROGRESS_SECONDS": "0.05"}
    done = cluster.kiln("run", "--run-id", "bigsync", "--", "sh", "-c",
                        'mkdir -p "$KILN_MODEL_DIR" && cp weights.bin "$KILN_MODEL_DIR/"', cwd=project, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(rf"^syncing {re.escape(str(project))}: (.*, )?node\d [\d.]+ (bytes|kB|MB) of [\d.]+ MB(, |$| \()",
                     done.stdout, re.MULTILINE), done.stdout
    assert re.search(rf"^synced {re.escape(str(project))} \(4[89]\.\d MB\) to 3 node\(s\) in [\d.]+ s$",
                     done.stdout, re.MULTILINE), done.stdout
    wanted = hashlib.sha256((project / "weights.bin").read_bytes()).hexdigest()
    assert cluster.ssh("node3", "sha256sum ~/kiln/code/weights.bin").stdout.split()[0] == wanted
    folder = cluster.runs / "bigsync" / "hosts"
    for model in folder.glob("*/model"):
        shutil.rmtree(model)
    fetched = cluster.kiln("fetch", "--run-id", "bigsync", "model", cwd=project, hosts=None, env=env)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert re.search(r"^fetching \S+/model: node\d [\d.]+ (bytes|kB|MB)", fetched.stdout, re.MULTILINE), fetched.stdout
    assert {hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.glob("*/model/weights.bin")} == {wanted}
    assert len(list(folder.glob("*/model/weights.bin"))) == 3


def test_tensorboard_is_forwarded_from_the_chief_and_ends_with_the_command(cluster, project):
    import socket
    import urllib.request

    made = cluster.kiln("run", "--run-id", "board", "--", "true", cwd=project)
    assert made.returncode == 0, made.stdout + made.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [str(KILN), "tensorboard", "--run-id", "board", "--port", str(port)]
    with subprocess.Popen(argv, cwd=project, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as board:
        try:
            page, end = "", time.monotonic() + 120
            while time.monotonic() < end and "TensorBoard" not in page:
                try:
                    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
                except OSError:
                    time.sleep(1)
            assert "TensorBoard" in page, board.stderr.read() if board.poll() is not None else "no page"
        finally:
            board.send_signal(signal.SIGINT)
            try:
                board.wait(timeout=30)
            except subprocess.TimeoutExpired:
                board.kill()
                raise AssertionError("kiln tensorboard did not end on Ctrl-C (SIGINT)") from None
    for _ in range(20):
        if cluster.ssh("node1", "pgrep -f '[t]ensorboard[.]main'").returncode != 0:
            break
        time.sleep(0.5)
    assert cluster.ssh("node1", "pgrep -f '[t]ensorboard[.]main'").returncode != 0, "TensorBoard outlived the command"
