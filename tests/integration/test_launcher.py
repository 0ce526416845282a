"""The launcher against a real 3-node local cluster: mesh, preflight, training in
both modes, and the failures a user meets (bad hosts, dead hosts, dead processes,
changed host keys)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FAB, ROOT, run_processes

from bootstrap import launch
from bootstrap.cluster import Cluster
from bootstrap.commands import SshOptions
from bootstrap.errors import RunFailed
from bootstrap.hosts import parse_host_list
from bootstrap.mesh import default_cluster_name
from bootstrap.runs import record_run
from bootstrap.supervisor import Supervisor

pytestmark = [pytest.mark.integration]
CLUSTER_NAME = "kt"
HOSTS = "node1,node2,node3"
SHORT = "--epochs 2 --log-every 5"


def summary(cluster, run_id: str) -> dict:
    return json.loads((cluster.runs / run_id / "summary.json").read_text())


def meshed(cluster) -> None:
    """The module's nodes meshed as the unnamed cluster of HOSTS (as a user checks a meshed cluster), whatever the
    tests before did: mesh changes nothing where it is done."""
    cluster.fab("cluster.mesh", hosts=HOSTS, check=True)


def test_mesh_lets_every_node_reach_every_other_by_name(cluster):
    """A cluster of its own name (its own key, its own ssh config on each node): it meshes from nothing, whatever
    the module's other tests meshed before it."""
    first = cluster.fab("cluster.mesh", "--cluster", "kt-mesh", hosts=HOSTS, check=True)
    assert first.stdout.count("changed") == 3, first.stdout
    again = cluster.fab("cluster.mesh", "--cluster", "kt-mesh", hosts=HOSTS, check=True)
    assert again.stdout.count("ok (nothing to change)") == 3, again.stdout
    hop = cluster.ssh("node2", "ssh node3 hostname")
    assert hop.returncode == 0, hop.stderr
    assert hop.stdout.strip() == "node3"
    config = cluster.ssh("node2", "ssh -G node3")
    assert "stricthostkeychecking true" in config.stdout
    hosts = cluster.ssh("node1", "getent ahostsv4 node1 | awk '{print $1}' | sort -u").stdout.split()
    assert hosts == [cluster.nodes[0]["ip"]]


def test_cluster_key_is_the_clusters_own(cluster):
    meshed(cluster)
    name = default_cluster_name(parse_host_list(HOSTS), cluster.ssh_config)
    keys = list((cluster.kiln_home / "clusters" / name).glob("id_*.pub"))
    assert len(keys) == 1, keys
    public = keys[0].read_text().split()[1]
    authorized = cluster.ssh("node3", "cat ~/.ssh/authorized_keys").stdout
    assert public in authorized
    operator = (cluster.state / "operator_key.pub").read_text().split()[1]
    assert operator != public


def test_check_passes_and_shows_a_table(cluster):
    meshed(cluster)
    done = cluster.fab("cluster.check", "--ports", "23456", hosts=HOSTS)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["host", "reach", "hostname", "resolve", "versions", "ports", "mesh"]
    assert [line.split() for line in lines[1:4]] == [[n] + ["ok"] * 6 for n in ("node1", "node2", "node3")]


def test_check_gpu_fails_on_nodes_without_a_gpu_naming_each(cluster):
    meshed(cluster)
    done = cluster.fab("cluster.check", "--gpu", hosts=HOSTS)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[-1] == "gpu", done.stdout
    for node in HOSTS.split(","):
        row = next(line.split() for line in lines if line.startswith(node + " "))
        assert row[1:-1] == ["ok"] * (len(row) - 2) and row[-1] == "FAIL", done.stdout
        assert (f"{node}: gpu: no NVIDIA GPU: the PCI bus lists none (nvidia-smi: nvidia-smi is not installed)"
                in lines), done.stdout
        assert f"{node}: none" in lines, done.stdout
    assert "preflight failed" in done.stderr


def test_check_collective_measures_all_reduce_across_the_nodes(cluster):
    """A real horovodrun of kiln.gpu.allreduce over the mesh (Gloo on these CPU nodes): all three at once, then
    each ring pair side by side."""
    meshed(cluster)
    done = cluster.fab("cluster.check", "--collective", hosts=HOSTS, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert "collective over eth0:" in done.stdout, done.stdout
    assert any(line.startswith("across 3 node(s): all-reduce over 3 rank(s) (horovod 0.28.1 (gloo)):")
               for line in lines), done.stdout
    pairs = next(line for line in lines if line.startswith("pairs: "))
    assert [part.split()[0] for part in pairs[len("pairs: "):].split(", ")] == [
        "node1+node2", "node2+node3", "node3+node1"], pairs
    assert not any(cluster.ssh(node, "ls ~/kiln/checks").stdout.strip() for node in HOSTS.split(","))


def test_check_collective_names_the_node_behind_a_slow_link(cluster):
    """node3's link throttled on this machine's side of its veth (tc's token bucket): the pairs with node3 slow
    down and node3 alone is named. 100 Mbit/s holds node3's pairs to 0.0125 GB/s of bus bandwidth, under half the
    0.04-0.05 GB/s Gloo's pair of CPU processes makes on a 2-core machine busy with other tests (at 400 Mbit/s, the
    0.05 GB/s cap did not bind there: every pair read alike)."""
    meshed(cluster)
    veth = cluster.nodes[2]["veth"]
    subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", "100mbit", "burst", "64kb",
                    "latency", "400ms"], check=True, timeout=30)
    try:
        done = cluster.fab("cluster.check", "--collective", hosts=HOSTS, timeout=600)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False, timeout=30)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "collective check failed: node3: all-reduce across nodes far below the others (with node2" in done.stderr
    assert "node1:" not in done.stderr and "node2: all-reduce" not in done.stderr, done.stderr


def test_malformed_host_list_names_the_bad_item(cluster):
    done = cluster.fab("cluster.train", hosts="node1,node2:99999")
    assert done.returncode == 2
    assert "node2:99999" in done.stderr and "port '99999'" in done.stderr
    assert "Traceback" not in done.stderr


def test_unreachable_host_is_named_and_nothing_starts(cluster):
    subnet = cluster.nodes[0]["ip"].rsplit(".", 1)[0]
    dead = f"{subnet}.250"  # in the cluster's own subnet, on no node: nothing answers, no packet leaves
    run_id = "unreachable-run"
    started = time.monotonic()
    done = cluster.fab("-t", "3", "cluster.train", "--run-id", run_id, hosts=f"node1,node2,{dead}", timeout=60)
    assert done.returncode != 0
    assert dead in done.stderr and "unreachable" in done.stderr, done.stderr
    assert time.monotonic() - started < 45, "the connect timeout was not honoured"
    assert run_processes(run_id) == []
    for node in ("node1", "node2"):
        assert cluster.ssh(node, f"test ! -e ~/kiln/runs/{run_id}").returncode == 0


def test_horovod_ranks_agree_and_loss_falls(cluster):
    done = cluster.fab("cluster.train", "--mode", "horovod", "--run-id", "hvd", "--args", SHORT, hosts=HOSTS)
    assert done.returncode == 0, done.stdout + done.stderr
    data = summary(cluster, "hvd")
    assert data["status"] == "ok"
    ranks = {task: result for task, result in data["results"].items() if task.startswith("rank-")}
    assert sorted(ranks) == ["rank-0", "rank-1", "rank-2"]
    assert {r["host"] for r in ranks.values()} == {"node1", "node2", "node3"}
    assert len({r["weights_sha256"] for r in ranks.values()}) == 1
    assert all(r["final_loss"] < r["first_loss"] for r in ranks.values())
    assert run_processes("hvd") == []
    assert "horovod" in done.stdout and "ok" in done.stdout
    assert (cluster.runs / "hvd" / "loss.png").stat().st_size > 0
    assert (cluster.runs / "hvd" / "throughput.png").stat().st_size > 0


def test_horovod_over_mpi(cluster):
    done = cluster.fab("cluster.train", "--mode", "horovod", "--mpi", "--run-id", "hvd-mpi", "--args",
                       "--epochs 1", hosts=HOSTS)
    assert done.returncode == 0, done.stdout + done.stderr
    results = summary(cluster, "hvd-mpi")["results"]
    assert len({r["weights_sha256"] for r in results.values()}) == 1 and len(results) == 3


def test_multiworker_tf_config_workers_agree(cluster):
    done = cluster.fab("cluster.train", "--mode", "tf-config", "--run-id", "mw", "--args", SHORT, hosts=HOSTS)
    assert done.returncode == 0, done.stdout + done.stderr
    data = summary(cluster, "mw")
    workers = {t: r for t, r in data["results"].items() if t.startswith("worker-")}
    assert sorted(workers) == ["worker-0", "worker-1", "worker-2"]
    assert len({r["weights_sha256"] for r in workers.values()}) == 1
    assert all(r["final_loss"] < r["first_loss"] for r in workers.values())
    plan = json.loads((cluster.runs / "mw" / "run.json").read_text())
    assert [t["task"] for t in plan["tasks"]] == ["worker-0", "worker-1", "worker-2"]


def test_parameter_server_run_trains_and_stops_its_servers(cluster):
    done = cluster.fab("cluster.train", "--mode", "tf-config", "--ps", "1", "--run-id", "ps", "--args", SHORT,
                       hosts=HOSTS)
    assert done.returncode == 0, done.stdout + done.stderr
    data = summary(cluster, "ps")
    chief = data["results"]["chief-0"]
    assert chief["final_loss"] < chief["first_loss"]
    assert data["exit_codes"]["node1"]["chief-0"] == 0
    assert run_processes("ps") == []


def last_step(metrics: Path) -> int:
    try:
        return json.loads(metrics.read_text().strip().splitlines()[-1])["step"]
    except (OSError, IndexError, ValueError, KeyError):
        return 0


MARKERS = {"worker-1": b'"type":"worker","index":1}', "rank-1": b"HOROVOD_RANK=1\0"}


def kill_when_training(cluster, run_id: str, node: str, task: str, deadline: float = 120, signal: str = "-9",
                       min_step: int = 1, training_s: float = 0.0) -> None:
    """Once `task` on `node` has logged `min_step` and trained `training_s` seconds more, send `signal` to its
    Python (not the wrapper around it)."""
    metrics = cluster.node_dir(node) / "kiln" / "runs" / run_id / f"metrics.{task}.jsonl"
    end, training = time.monotonic() + deadline, None
    while time.monotonic() < end:
        if last_step(metrics) >= min_step:
            training = training or time.monotonic()
        if training and time.monotonic() - training >= training_s:
            for pid in run_processes(run_id):
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    environ = Path(f"/proc/{pid}/environ").read_bytes() + b"\0"
                except OSError:
                    continue
                if b"trainer" in argv and MARKERS[task] in environ:
                    subprocess.run(["kill", signal, str(pid)], check=False)
                    return
        time.sleep(0.5)
    raise AssertionError(f"{task} on {node} never started training")


def train_and_signal(cluster, run_id: str, options: list[str], task: str, *, signal: str = "-9", min_step: int = 1,
                     training_s: float = 0.0, timeout: float = 300) -> tuple[int, str, str]:
    """Start cluster.train, send `signal` to `task` on node2 once it has logged `min_step` and trained `training_s`
    seconds more; (code, out, err)."""
    argv = [str(FAB), "-S", cluster.ssh_config, "-H", HOSTS, "cluster.train", "--run-id", run_id, *options]
    with subprocess.Popen(argv, cwd=ROOT, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as train:
        try:
            kill_when_training(cluster, run_id, "node2", task, signal=signal, min_step=min_step,
                               training_s=training_s)
            out, err = train.communicate(timeout=timeout)
        finally:
            if train.poll() is None:
                train.kill()
    return train.returncode, out, err


@pytest.mark.parametrize(("mode", "task"), [("tf-config", "worker-1"), ("horovod", "rank-1")])
def test_a_killed_process_fails_the_run_naming_its_host(cluster, mode, task):
    run_id = f"kill-{mode}"
    code, _, err = train_and_signal(cluster, run_id, ["--mode", mode, "--args", "--epochs 400 --log-every 1"], task)
    assert code != 0
    assert "node2" in err, err
    data = summary(cluster, run_id)
    assert data["status"] == "failed" and "node2" in data["failure"]
    if mode == "tf-config":
        assert f"{task} on node2 exited with status 137" in data["failure"]
    else:
        assert "rank 1 on node2 failed first" in data["failure"]
    assert run_processes(run_id) == []


@pytest.mark.parametrize(("mode", "task"), [("horovod", "rank-1"), ("tf-config", "worker-1")])
def test_a_frozen_process_stops_the_run_naming_its_host(cluster, mode, task):
    """Horovod's peers wait for a frozen rank (the watchdog ends it); TensorFlow's multi-worker peers fail
    on their own (kiln still names the frozen host). The process freezes after seconds of steps, which kiln's watch
    has seen move (a freeze at the first step, judged by the time to it, is tests/unit/test_launch.py's)."""
    run_id = f"stall-{mode}"
    options = ["--mode", mode, "--stall-factor", "5", "--stall-minimum", "5", "--args", "--epochs 400 --log-every 1"]
    code, _, err = train_and_signal(cluster, run_id, options, task, signal="-STOP", training_s=4)
    assert code != 0
    assert "stalled: node2 (a process there is stopped)" in err, err
    assert summary(cluster, run_id)["status"] == "failed"
    assert run_processes(run_id) == []


@pytest.mark.parametrize(("mode", "task"), [("tf-config", "worker-1"), ("horovod", "rank-1")])
def test_a_killed_run_restarts_from_its_last_checkpoint(cluster, mode, task):
    run_id = f"restart-{mode}"
    epochs, every = 6, 5  # the kill lands at step 10 with some 120 steps to go (test_managed's EPOCHS)
    options = ["--mode", mode, "--max-restarts", "1", "--args",
               f"--epochs {epochs} --log-every 1 --checkpoint-every {every}"]
    code, out, err = train_and_signal(cluster, run_id, options, task, min_step=2 * every)
    assert code == 0, out + err
    data = summary(cluster, run_id)
    assert data["status"] == "ok"
    [restart] = data["restarts"]
    assert "node2" in restart["hosts"] and "node2" in restart["failure"]
    assert 0 < restart["resumed_from_step"] <= restart["at_step"]
    assert restart["steps_redone"] <= every
    chief = data["results"]["worker-0" if mode == "tf-config" else "rank-0"]
    assert chief["resumed_from_step"] == restart["resumed_from_step"]
    assert chief["steps"] == epochs * (chief["steps"] // epochs) and chief["status"] == "ok"
    ranks = [r for t, r in data["results"].items() if t.startswith(("worker-", "rank-"))]
    assert len({r["weights_sha256"] for r in ranks}) == 1
    assert run_processes(run_id) == []


def test_detached_run_is_followed_and_stopped_from_its_run_id(cluster):
    run_id = "detached"
    started = cluster.fab("cluster.train", "--mode", "tf-config", "--detach", "--run-id", run_id, "--args",
                          "--epochs 400 --log-every 1", hosts=HOSTS)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "started" in started.stdout
    metrics = cluster.node_dir("node2") / "kiln" / "runs" / run_id / "metrics.worker-1.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.5)
    status = cluster.fab("cluster.status", "--run-id", run_id)
    assert status.returncode == 0, status.stderr
    assert [line.split()[:3] for line in status.stdout.splitlines()[:3]] == [
        ["node1", "worker-0", "running"], ["node2", "worker-1", "running"], ["node3", "worker-2", "running"]]
    assert status.stdout.splitlines()[-1] == f"run {run_id}: running"
    logs = cluster.fab("cluster.logs", "--run-id", run_id, "--host", "node2", "--lines", "5")
    assert logs.returncode == 0 and logs.stdout
    assert all(line.startswith("[node2] ") for line in logs.stdout.splitlines())
    stopped = cluster.fab("cluster.stop", "--run-id", run_id)
    assert stopped.returncode == 0, stopped.stderr
    assert run_processes(run_id) == []
    assert (cluster.runs / run_id / "hosts" / "node2" / "worker-1.log").exists()
    assert summary(cluster, run_id)["status"] == "stopped"
    after = cluster.fab("cluster.status", "--run-id", run_id)
    assert after.stdout.splitlines()[-1] == f"run {run_id}: stopped (kiln stop)", after.stdout


def test_two_runs_started_together_on_the_same_hosts_both_finish(cluster):
    """Each tf-config run reserves its ports on the nodes before it starts: the second, finding the first's
    held, moves past them instead of failing with `Could not start gRPC server`."""
    argv = [str(FAB), "-S", cluster.ssh_config, "-H", HOSTS, "cluster.train", "--mode", "tf-config", "--detach",
            "--args", SHORT]
    started = [subprocess.Popen([*argv, "--run-id", run_id], cwd=ROOT, env=cluster.env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE) for run_id in ("side-a", "side-b")]
    said = [process.communicate(timeout=300) for process in started]
    assert [process.returncode for process in started] == [0, 0], said
    assert any("trying from" in out for out, _ in said), said
    held = cluster.ssh("node1", "cd ~/kiln/ports && grep -H . [0-9]*").stdout.split()  # until status sees the end
    by_run: dict[str, set[str]] = {}
    for line in held:
        port, run_id = line.split(":")
        by_run.setdefault(run_id, set()).add(port)
    assert by_run.get("side-a") and by_run.get("side-b") and not by_run["side-a"] & by_run["side-b"], held
    deadline = time.monotonic() + 300
    lines = {}
    while time.monotonic() < deadline:
        lines = {run_id: cluster.fab("cluster.status", "--run-id", run_id).stdout.splitlines()[-1]
                 for run_id in ("side-a", "side-b")}
        if all(not line.endswith(": running") for line in lines.values()):
            break
        time.sleep(2)
    assert lines == {"side-a": "run side-a: done", "side-b": "run side-b: done"}, lines
    # the status that saw each detached run end settled it: summary.json written, its nodes' files collected, its
    # ports given back
    for run_id in ("side-a", "side-b"):
        data = summary(cluster, run_id)
        assert data["status"] == "ok" and data["exit_codes"]["node2"] == {"worker-1": 0}, data
        assert 0 < data["wall_time"] < time.time() - json.loads((cluster.runs / run_id / "run.json").read_text())[
            "started"], data
    assert cluster.ssh("node1", "grep -l side- ~/kiln/ports/[0-9]* || true").stdout == ""


def test_slots_place_several_ranks_per_host(cluster):
    plan = cluster.fab("cluster.train", "--slots", "2", "--dry-run", "--run-id", "slots", hosts="node1,node2")
    assert plan.returncode == 0, plan.stderr
    assert "node1 slots=2" in plan.stdout and "-np 4" in plan.stdout
    assert "ranks: 0=node1, 1=node1, 2=node2, 3=node2" in plan.stdout


def test_chief_and_evaluator_beside_workers(cluster):
    done = cluster.fab("cluster.train", "--mode", "tf-config", "--chief", "--evaluator", "--run-id", "eval",
                       "--args", SHORT, hosts=HOSTS)
    assert done.returncode == 0, done.stdout + done.stderr
    results = summary(cluster, "eval")["results"]
    assert {"chief-0", "worker-0", "worker-1", "worker-2", "evaluator-0"} <= set(results)
    assert results["evaluator-0"]["weights_sha256"] == results["chief-0"]["weights_sha256"]
    assert run_processes("eval") == []


def test_a_meshed_cluster_is_named_instead_of_listed(cluster):
    cluster.fab("cluster.mesh", "--cluster", "named", hosts=HOSTS, check=True)
    bare = [str(FAB), "cluster.check", "--cluster", "named"]
    done = subprocess.run(bare, cwd=ROOT, env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()[1:4]] == ["node1", "node2", "node3"]
    by_name = subprocess.run([*bare[:1], "cluster.train", "--cluster", "named", "--dry-run", "--run-id", "same"],
                             cwd=ROOT, env=cluster.env(), capture_output=True, text=True, timeout=60)
    by_list = cluster.fab("cluster.train", "--dry-run", "--run-id", "same", hosts=HOSTS)
    assert by_name.returncode == 0 and by_name.stdout == by_list.stdout
    missing = subprocess.run([*bare[:1], "cluster.check", "--cluster", "nosuch"], cwd=ROOT, env=cluster.env(),
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no cluster 'nosuch'" in missing.stderr and "kiln mesh" in missing.stderr


def test_unknown_host_keys_are_refused_unless_trusted_on_first_use(cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = tmp_path / "ssh_config"
    config.write_text("\n".join(f"  UserKnownHostsFile {empty}" if "UserKnownHostsFile" in line else line
                                for line in Path(cluster.ssh_config).read_text().splitlines()) + "\n")
    env = {**cluster.env(), "KILN_HOME": str(tmp_path / "home")}

    def fab(*args):
        return subprocess.run([str(FAB), "-S", str(config), "-H", HOSTS, *args, "--cluster", "tofu"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)

    refused = fab("cluster.mesh")
    assert refused.returncode == 1
    for node in ("node1", "node2", "node3"):
        assert f"{node}: host key unknown" in refused.stderr, refused.stderr
    trusted = fab("cluster.mesh", "--accept-new-host-keys")
    assert trusted.returncode == 0, trusted.stderr
    recorded = (tmp_path / "home" / "clusters" / "tofu" / "known_hosts.first-contact").read_text()
    assert {line.split()[0] for line in recorded.splitlines()} == {n["ip"] for n in cluster.nodes}
    assert empty.read_text() == "", "the user's own known_hosts must stay untouched"
    pinned = fab("cluster.check")
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr


def test_changed_host_key_is_refused_everywhere(cluster, monkeypatch):
    """Re-key node3 behind kiln's back: the operator, the other nodes and horovodrun all refuse it (node3 gets
    its own keys back afterwards)."""
    hosts = parse_host_list(HOSTS)
    options = SshOptions(config_file=cluster.ssh_config)
    name = default_cluster_name(hosts, cluster.ssh_config)
    env = cluster.env()
    for key in ("KILN_HOME", "KILN_RUNS"):  # the supervisor below writes the run where the cluster's kiln does
        monkeypatch.setenv(key, env[key])
    group = Cluster.connect(name, hosts, options, python=str(FAB.with_name("python")),
                            fanout=8, timeout=60)
    group.require_facts("connect")
    group.apply_mesh()
    with cluster.rekeyed("node3"):
        hop = cluster.ssh("node2", "ssh node3 hostname")
        assert hop.returncode != 0 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in hop.stderr

        paths = launch.NodePaths(group.remote_root(hosts[0]))
        group.sync_lib(paths.lib)
        plan = launch.plan_horovod("rekeyed", [n.name for n in group.nodes], [1, 1, 1], python=group.python,
                                   paths=paths, program=launch.Program(trainer_args=("--epochs", "1")), nic="eth0")
        record = record_run(group, plan, paths)
        supervisor = Supervisor(group, plan, paths)
        supervisor.start()
        with pytest.raises(RunFailed, match="rekeyed failed"):
            supervisor.run(record, timeout=120)
        log = (cluster.runs / "rekeyed" / "hosts" / "node1" / "horovodrun.log").read_text()
        assert "Host key verification failed" in log or "HOST IDENTIFICATION HAS CHANGED" in log
        assert run_processes("rekeyed") == []
        group.remote.disconnect(hosts)
        done = cluster.fab("cluster.check", hosts=HOSTS)
        assert done.returncode != 0
        assert "node3: reach: host key verification failed" in done.stdout, done.stdout
