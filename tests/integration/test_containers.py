"""`kiln train --image` and `kiln run --image` on a real 3-node local cluster with a real dockerd per node and a
real registry on its bridge, inside the container image `make image PROVIDER=docker MATRIX=matrices/pytorch-jax.yml`
bakes (TensorFlow, Horovod, PyTorch and JAX): the public examples of every mode from a user's own folder, each
process in its node's container, restarts, sharding, and the refusals that come before anything starts; after every
run no container is left on any node."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    KILN,
    ROOT,
    LocalCluster,
    can_make_namespaces,
    local_cluster_command,
    needs_slurm,
    run_processes,
)

from bootstrap import launch
from bootstrap.cluster import Cluster
from bootstrap.commands import SshOptions
from bootstrap.container import ContainerRuntime
from bootstrap.errors import RunFailed
from bootstrap.hosts import parse_host_list
from bootstrap.mesh import default_cluster_name
from bootstrap.runs import record_run
from bootstrap.supervisor import Supervisor
from bootstrap.timeline import Timeline
from localcloud import engines

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]  # the first test waits for the container bake
NAME = "kc"
PROGRAMS = Path(__file__).parent / "programs"
NODES = ("node1", "node2", "node3")
KILN_PYTHON = "/opt/kiln/venv/bin/python3"


@pytest.fixture(scope="module")
def baked(container_bake):
    """The cpu container image, baked for real once for the session (conftest): its image.json."""
    return container_bake[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, baked):
    """Three nodes (kiln up --provider local --docker: each with its own Docker engine, the cluster a registry),
    and the baked image in the cluster's registry (its layers copied from the session's registry, as the bake
    pushed them)."""
    reason = can_make_namespaces()
    if reason:
        pytest.skip(reason)
    local_cluster_command("down", "--name", NAME)
    state = Path("/run/kiln/local") / NAME
    made = LocalCluster(NAME, state, [], tmp_path_factory.mktemp("kiln-home"), tmp_path_factory.mktemp("runs"))
    try:
        up = subprocess.run([str(KILN), "up", NAME, "--provider", "local", "--count", "3", "--docker"], cwd=ROOT,
                            env=made.env(), capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        made.nodes = json.loads((state / "nodes.json").read_text())
        made.image = engines.push_to_cluster(NAME, baked["image"], copy_from=baked.get("pushed"))
        yield made
    finally:
        subprocess.run([str(KILN), "down", NAME], cwd=ROOT, env=made.env(), capture_output=True, timeout=300)
        local_cluster_command("down", "--name", NAME)


@pytest.fixture
def project(tmp_path) -> Path:
    """A user's project: the public examples and a program that says where it runs."""
    folder = tmp_path / "project"
    shutil.copytree(ROOT / "examples", folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "where.py").write_text(
        "import json, os, socket, sys\n"
        "out = os.environ['KILN_OUTPUT_DIR']\n"
        "os.makedirs(out, exist_ok=True)\n"
        "manifest = json.load(open('/etc/kiln/manifest.json')) if os.path.exists('/etc/kiln/manifest.json') "
        "else {}\n"
        "name = socket.gethostname()\n"
        "json.dump({'hostname': name, 'address': socket.gethostbyname(name), 'python': sys.executable,\n"
        "           'uid': os.getuid(), 'target': manifest.get('target'), 'task': os.environ['KILN_TASK'],\n"
        "           'container': os.environ.get('KILN_CONTAINER')}, open(os.path.join(out, 'where.json'), 'w'))\n")
    return folder


def containers(cluster, nodes=NODES) -> dict[str, list[str]]:
    """The containers (running or not) on each node's engine."""
    return {node: cluster.ssh(node, "docker ps -aq").stdout.split() for node in nodes}


def no_containers(cluster, nodes=NODES) -> None:
    left = {node: found for node, found in containers(cluster, nodes).items() if found}
    assert not left, f"containers left on the nodes: {left}"


def outputs(cluster, run_id: str, name: str = "result.json") -> dict[str, dict]:
    found = {}
    for path in sorted((cluster.runs / run_id / "hosts").glob(f"*/output/*/{name}")):
        found[f"{path.parts[-4]}/{path.parts[-2]}"] = json.loads(path.read_text())
    return found


def test_every_process_runs_in_its_nodes_container_seeing_the_nodes_name_and_address(cluster, project):
    done = cluster.kiln("run", "--image", cluster.image, "--run-id", "where", "--", "python", "where.py",
                        cwd=project, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    found = outputs(cluster, "where", "where.json")
    assert set(found) == {"node1/shard-0", "node2/shard-1", "node3/shard-2"}
    addresses = {node["name"]: node["ip"] for node in cluster.nodes}
    for key, seen in found.items():
        node = key.split("/")[0]
        assert seen["hostname"] == node and seen["address"] == addresses[node], seen
        assert seen["python"] == KILN_PYTHON and seen["target"] == "container", seen
        assert seen["container"] == "kiln-where" and seen["uid"] == 0, seen
    written = cluster.node_dir("node2") / "kiln" / "runs" / "where" / "output" / "shard-1" / "where.json"
    assert written.stat().st_uid == 0, "the output is not the login user's"
    data = json.loads((cluster.runs / "where" / "summary.json").read_text())
    assert {"pull", "container"} <= {span["phase"] for span in data["phases"]}
    no_containers(cluster)


# What a program asks the clouds' metadata services for a token (EC2's IMDSv2 session token, GCE's and Azure's
# identity tokens): each answer's HTTP status, or "refused: ..." where no connection is made.
ASK_METADATA = """\
import urllib.error, urllib.request
def ask(path, method="GET", **headers):
    try:
        with urllib.request.urlopen(urllib.request.Request("http://169.254.169.254" + path, method=method,
                                                           headers=headers), timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return "refused: " + str(error)
def ask_metadata():
    return {"ec2": ask("/latest/api/token", "PUT", **{"X-aws-ec2-metadata-token-ttl-seconds": "60"}),
            "gce": ask("/computeMetadata/v1/instance/service-accounts/default/token",
                       **{"Metadata-Flavor": "Google"}),
            "azure": ask("/metadata/identity/oauth2/token?api-version=2018-02-01"
                         "&resource=https://management.azure.com/", Metadata="true")}
"""

KEYS = """\
import json, os, subprocess
out = os.environ["KILN_OUTPUT_DIR"]
os.makedirs(out, exist_ok=True)
found = {}
for top in sorted({os.path.expanduser("~"), "/root", "/home"}):
    for folder, _, files in os.walk(top):
        for name in files:
            try:
                text = open(os.path.join(folder, name), errors="replace").read(1 << 16)
            except OSError:
                continue
            if text.startswith("-----BEGIN ") and "PRIVATE KEY-----" in text.splitlines()[0]:
                found[os.path.join(folder, name)] = text
""" + ASK_METADATA + """\
other = {"0": "node2", "1": "node1"}[os.environ["KILN_SHARD_INDEX"]]
where = subprocess.run(["ssh", other, "tr '\\\\0' ' ' </proc/1/cmdline; echo; hostname; ls -a ~/.ssh"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
json.dump({"keys": found, "ssh": where.stdout, "ssh_error": where.stderr, "code": where.returncode,
           "metadata": ask_metadata()},
          open(os.path.join(out, "keys.json"), "w"))
"""


def test_a_container_reads_no_cluster_key_and_its_own_key_opens_only_the_runs_containers(cluster, project):
    """A program in the run's containers looks for private keys everywhere its home and mounts reach: it finds
    the run's own key alone, never the cluster's (which each node keeps in its ~/.ssh); with it, ssh to the other
    node lands in that node's container of the run (its first process is the container's init), not on the node;
    after the run the key is authorized nowhere. It asks the metadata service for a token and reaches none, though
    the same ask made on the node is answered."""
    (project / "keys.py").write_text(KEYS)
    done = cluster.kiln("run", "--image", cluster.image, "--run-id", "ckeys", "--", "python", "keys.py",
                        cwd=project, hosts="node1,node2", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    cluster_keys = {path.read_text() for path in cluster.kiln_home.glob("clusters/*/id_ed25519")}
    assert cluster_keys, "the cluster key kiln made"
    for shard, seen in outputs(cluster, "ckeys", "keys.json").items():
        assert not set(seen["keys"].values()) & cluster_keys, (shard, sorted(seen["keys"]))
        assert sorted(seen["keys"]) == ["/root/.ssh/id_ed25519"], (shard, sorted(seen["keys"]))
        assert seen["code"] == 0, seen
        init, hostname, *listing = seen["ssh"].split("\n")
        assert "docker-init" in init or "sleep infinity" in init, seen  # the container's, not the node's
        assert "kiln" not in " ".join(listing).split(), seen  # no ~/.ssh/kiln: the node's ~/.ssh is not there
        refused = {cloud: str(said).startswith("refused: ") for cloud, said in seen["metadata"].items()}
        assert refused == {"ec2": True, "gce": True, "azure": True}, seen["metadata"]
    on_node = cluster.ssh("node1", f"python3 -c {shlex.quote(ASK_METADATA + 'print(ask_metadata())')}")
    assert "'ec2': 200" in on_node.stdout, on_node.stdout + on_node.stderr  # the stand-in answers the node itself
    for node in ("node1", "node2"):
        authorized = cluster.ssh(node, "cat ~/.ssh/authorized_keys").stdout
        assert "kiln-run-ckeys" not in authorized and cluster.ssh(node, "test -e ~/.ssh/kiln-runs/ckeys").returncode
    no_containers(cluster)


def test_an_image_only_this_machine_has_is_shipped_to_the_nodes_once(cluster, project):
    """Any image runs, not only kiln's: the Debian base, which only this machine's engine has (no registry holds
    it), goes to every node over kiln's connections; a second run finds it there and ships nothing."""
    base = subprocess.run([sys.executable, "-m", "bake.container_base", "--print"], capture_output=True, text=True,
                          cwd=ROOT, timeout=900).stdout.strip()
    first = cluster.kiln("run", "--image", base, "--run-id", "cship", "--", "python", "where.py", cwd=project,
                         timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    for node in NODES:
        assert f"{node}: shipped {base} from this machine" in first.stdout, first.stdout
    assert {seen["python"] for seen in outputs(cluster, "cship", "where.json").values()} == {"/usr/bin/python3"}
    again = cluster.kiln("run", "--image", base, "--run-id", "cship2", "--", "python", "where.py", cwd=project,
                         timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "shipped" not in again.stdout and "pulled" not in again.stdout, again.stdout
    for node in NODES:
        cluster.ssh(node, f"docker rmi {base}")
    no_containers(cluster)


@pytest.mark.parametrize(("run_id", "program", "tasks", "world"), [
    ("cmwms", ("--mode", "tf-config", "--", "python", "keras_multiworker.py", "--epochs", "2", "--steps", "5"),
     {"node1/worker-0", "node2/worker-1", "node3/worker-2"}, "replicas"),
    ("chvd", ("--", "python", "horovod_keras.py", "--epochs", "2"),
     {"node1/rank-0", "node2/rank-1", "node3/rank-2"}, "size"),
], ids=["keras-multiworker", "horovod"])
def test_the_example_trains_in_the_image_across_the_nodes_containers(cluster, project, run_id, program, tasks, world):
    """The Keras multi-worker example (TF_CONFIG) and the Horovod one: every node's process trains in its
    container and sees all 3 (`world`: how its result says so)."""
    done = cluster.kiln("train", "--image", cluster.image, "--run-id", run_id, *program, cwd=project, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    results = outputs(cluster, run_id)
    assert set(results) == tasks
    assert {r[world] for r in results.values()} == {3}
    assert run_processes(run_id) == []
    no_containers(cluster)


def test_the_parameter_server_example_trains_in_the_image(cluster, project):
    done = cluster.kiln("train", "--image", cluster.image, "--mode", "tf-config", "--ps", "1", "--run-id", "cps",
                        "--", "python", "parameter_server.py", "--epochs", "2", "--steps", "5", cwd=project,
                        timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    results = outputs(cluster, "cps")
    assert results["node1/chief-0"]["workers"] == 3 and results["node1/chief-0"]["ps"] == 1
    assert run_processes("cps") == []
    no_containers(cluster)


def test_a_pytorch_ddp_program_trains_through_torchrun_in_the_image(cluster, project):
    """torchrun is the image's (PyTorch's CPU build beside TensorFlow): one agent in each node's container, the
    c10d rendezvous on node1's address, Gloo between the containers over the nodes' network."""
    done = cluster.kiln("train", "--image", cluster.image, "--mode", "torchrun", "--slots", "2", "--run-id", "cddp",
                        "--", "python", "torch_ddp.py", "--epochs", "2", cwd=project, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    found = outputs(cluster, "cddp", "rank-*.json")
    assert set(found) == {"node1/torchrun-0", "node2/torchrun-1", "node3/torchrun-2"}, found
    ranks = [json.loads(path.read_text()) for path in (cluster.runs / "cddp" / "hosts").glob("*/output/*/rank-*.json")]
    assert sorted(r["rank"] for r in ranks) == list(range(6)) and {r["world"] for r in ranks} == {6}, ranks
    assert len({round(r["loss"], 6) for r in ranks}) == 1, ranks  # DDP kept every replica in step
    assert len(list((cluster.runs / "cddp" / "hosts").glob("*/ranks/*/*/attempt_0/*/stdout.log"))) == 6
    assert json.loads((cluster.runs / "cddp" / "summary.json").read_text())["mode"] == "torchrun"
    assert run_processes("cddp") == []
    no_containers(cluster)


def test_a_jax_program_sums_across_the_nodes_containers(cluster, project):
    done = cluster.kiln("train", "--image", cluster.image, "--mode", "jax", "--run-id", "cjax", "--", "python",
                        "jax_sum.py", cwd=project, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    found = outputs(cluster, "cjax")
    assert set(found) == {"node1/jax-0", "node2/jax-1", "node3/jax-2"}, found
    assert {(r["processes"], r["devices"], r["sum"]) for r in found.values()} == {(3, 3, 6.0)}  # 1 + 2 + 3
    assert run_processes("cjax") == []
    no_containers(cluster)


def test_a_keras_3_program_trains_across_the_nodes_containers_on_the_jax_backend(cluster, project):
    done = cluster.kiln("train", "--image", cluster.image, "--mode", "jax", "--run-id", "ckjax", "--", "python",
                        "keras_jax.py", "--epochs", "2", cwd=project, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    found = outputs(cluster, "ckjax")
    assert {(r["backend"], r["processes"], r["devices"]) for r in found.values()} == {("jax", 3, 3)}, found
    [losses] = {tuple(round(x, 5) for x in r["loss"]) for r in found.values()}  # one model, kept in step
    assert losses[-1] < losses[0], losses
    assert run_processes("ckjax") == []
    no_containers(cluster)


def test_run_shards_a_hundred_items_over_three_nodes_in_the_image_each_exactly_once(cluster, project):
    items = [f"item-{n:03d}" for n in range(100)]
    (project / "items.txt").write_text("\n".join(items) + "\n")
    done = cluster.kiln("run", "--image", cluster.image, "--run-id", "cshard", "--shard-input", "items.txt", "--",
                        "python", "process_shard.py", cwd=project, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    processed = sorted((cluster.runs / "cshard" / "hosts").glob("*/output/shard-*/processed.tsv"))
    assert {f"{path.parts[-4]}/{path.parts[-2]}" for path in processed} == {
        "node1/shard-0", "node2/shard-1", "node3/shard-2"}
    seen = [line.split("\t")[0] for path in processed for line in path.read_text().splitlines()]
    assert sorted(seen) == items
    no_containers(cluster)


def test_a_killed_process_in_a_container_is_restarted(cluster, project):
    argv = [str(KILN), "-S", cluster.ssh_config, "-H", ",".join(NODES), "train", "--image", cluster.image,
            "--mode", "tf-config", "--run-id", "crestart", "--max-restarts", "1", "--", "python",
            "keras_multiworker.py", "--epochs", "4", "--steps", "5", "--pause", "2"]
    with subprocess.Popen(argv, cwd=project, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as train:
        try:
            log = cluster.node_dir("node2") / "kiln" / "runs" / "crestart" / "worker-1.log"
            end = time.monotonic() + 300
            while time.monotonic() < end and "epoch 1 done" not in (log.read_text() if log.exists() else ""):
                time.sleep(0.5)
            inside = [pid for pid in run_processes("crestart") if python_in_container(pid, "worker-1")]
            assert inside, "worker-1 never finished its second epoch in its container"
            os.kill(inside[0], signal.SIGKILL)
            out, err = train.communicate(timeout=600)
        finally:
            if train.poll() is None:
                train.kill()
    assert train.returncode == 0, out + err
    [restart] = json.loads((cluster.runs / "crestart" / "summary.json").read_text())["restarts"]
    assert "worker-1 on node2 exited with status 137" in restart["failure"], restart
    assert run_processes("crestart") == []
    no_containers(cluster)


def python_in_container(pid: int, task: str) -> bool:
    """Whether the process is the image's Python running `task` (not the docker exec that started it)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        executable = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return f"KILN_TASK={task}".encode() in environ and "docker" not in executable and "python" in executable


def test_a_detached_run_stopped_leaves_no_container(cluster, project):
    (project / "sleepy.py").write_text("import time\ntime.sleep(600)\n")
    started = cluster.kiln("run", "--image", cluster.image, "--run-id", "cstop", "--detach", "--", "python",
                           "sleepy.py", cwd=project, timeout=900)
    assert started.returncode == 0, started.stdout + started.stderr
    assert all(found for found in containers(cluster).values()), "a node has no container of the run"
    stopped = cluster.kiln("stop", "--run-id", "cstop", cwd=project, hosts=None)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert run_processes("cstop") == []
    no_containers(cluster)


def test_a_node_whose_image_differs_is_refused_before_anything_starts(cluster, project):
    """node3's engine holds another image under the same reference (a tag moved between pulls)."""
    base = subprocess.run([sys.executable, "-m", "bake.container_base", "--print"], capture_output=True, text=True,
                          cwd=ROOT, timeout=900).stdout.strip()
    kept = f"{cluster.image}-kept"  # the real image stays under another tag: no later test pulls it again (GBs)
    assert cluster.ssh("node3", f"docker tag {cluster.image} {kept} && docker rmi {cluster.image}").returncode == 0
    ship = f"docker save {base} | ssh -F {cluster.ssh_config} node3 docker load -q"
    assert subprocess.run(["sh", "-c", ship], capture_output=True, timeout=300).returncode == 0
    assert cluster.ssh("node3", f"docker tag {base} {cluster.image}").returncode == 0
    try:
        done = cluster.kiln("run", "--image", cluster.image, "--run-id", "codd", "--", "python", "where.py",
                            cwd=project, timeout=900)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"image {cluster.image}: node3 has sha256:" in done.stderr, done.stderr
        assert "nothing was started" in done.stderr
        assert run_processes("codd") == []
        no_containers(cluster)
    finally:  # node3 as it was: the image under its reference, not the base (a later test ships it to every node)
        cluster.ssh("node3", f"docker rmi {cluster.image} {base}; docker tag {kept} {cluster.image} && "
                             f"docker rmi {kept}")
    ids = {cluster.ssh(node, "docker image inspect -f '{{.Id}}' " + cluster.image).stdout.strip() for node in NODES}
    assert len(ids) == 1 and "" not in ids, ids  # node3 has the image again, without pulling it


def test_a_missing_image_is_refused_naming_the_nodes_and_the_reference(cluster, project):
    missing = f"{cluster.image.rsplit('/', 1)[0]}/nosuch:1"
    done = cluster.kiln("run", "--image", missing, "--run-id", "cmissing", "--", "python", "where.py", cwd=project,
                        timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"image {missing} is missing and could not be pulled" in done.stderr, done.stderr
    for node in NODES:
        assert f"{node}:" in done.stderr
    assert "nothing was started" in done.stderr
    no_containers(cluster)


def test_a_bad_image_reference_is_bad_input(cluster, project):
    done = cluster.kiln("run", "--image", "bad ref", "--", "python", "where.py", cwd=project)
    assert done.returncode == 2 and "--image 'bad ref'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.after_the_rest("node2 is replaced: the cluster's ssh config, which the other tests use, pins the "
                             "machine it replaces")
def test_a_lost_node_is_replaced_and_joins_the_elastic_torchrun_run_in_the_image(cluster, project):
    """Elastic torchrun with --managed and --image: node2 is lost mid-run (local-cluster lose), the agents left
    gather again; its replacement, a fresh machine with an empty engine, pulls the same image, and its agent, in
    the run's container, joins the rendezvous; the workers start again at 3 from the newest checkpoint and the run
    finishes. (test_managed recovers a tf-config run from its checkpoint without an image.) From here on the tests
    use --cluster NAME, whose pins follow the replacement."""
    shutil.copy(PROGRAMS / "torch_regrow.py", project)
    argv = [str(KILN), "train", "--cluster", NAME, "--mode", "torchrun", "--image", cluster.image, "--min-np", "2",
            "--managed", "--run-id", "cjoin", "--", "python", "torch_regrow.py", "--size", "3"]
    env = {**cluster.env(), "KILN_PROGRESS_SECONDS": "5"}  # the replacement's pull: a line every 5 s, not 30
    with subprocess.Popen(argv, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as train:
        try:
            log = cluster.node_dir("node1") / "kiln" / "runs" / "cjoin" / "torchrun-0.log"
            end = time.monotonic() + 400
            while "epoch 3 on 3 ranks" not in (log.read_text(errors="replace") if log.exists() else ""):
                assert train.poll() is None and time.monotonic() < end, train.communicate()
                time.sleep(0.5)
            lost = local_cluster_command("lose", "node2", "--name", NAME)
            assert lost.returncode == 0, lost.stderr
            out, err = train.communicate(timeout=900)
        finally:
            if train.poll() is None:
                train.kill()
    assert train.returncode == 0, out[-4000:] + err[-4000:]
    assert "node2 (node2) stopped answering: the elastic run goes on without it" in out, out
    assert "recovery 1 of 3: replacing node2 to join the elastic run" in out and "node2: pulled" in out, out
    # the pull's progress, as a log shows it: a line on the start, then bytes, rate and seconds every 5 s
    assert f"pulling {cluster.image} on node2" in out, out
    assert re.search(rf"pulling {re.escape(cluster.image)}: node2 [\d.]+ (bytes|kB|MB|GB) of [\d.]+ (kB|MB|GB) "
                     r"\(\d+ s, [\d.]+ (kB|MB|GB)/s\)", out), out
    assert re.search(rf"node2: pulled {re.escape(cluster.image)} \([\d.]+ (MB|GB) downloaded\) in [\d.]+ s", out), out
    [join] = json.loads((cluster.runs / "cjoin" / "summary.json").read_text())["restarts"]
    assert join["kind"] == "join" and join["replaced"] == [{"old": "node2", "new": "node2"}], join
    results = [json.loads(path.read_text())
               for path in (cluster.runs / "cjoin" / "hosts").glob("*/output/torchrun-*/rank-*.json")]
    assert sorted(r["rank"] for r in results) == [0, 1, 2], results
    assert all(r["size"] == 3 and r["sizes"][-1] == 3 and len(r["sizes"]) > 1 for r in results), results
    assert list((cluster.runs / "cjoin" / "hosts" / "node2" / "output").glob("torchrun-*/rank-*.json"))
    assert run_processes("cjoin") == []
    no_containers(cluster)


@pytest.mark.after_the_rest("node2's engine stays stopped")
def test_a_node_without_a_working_docker_is_refused_naming_it(cluster, project):
    """node2's engine stays stopped after this test."""
    pidfile = Path(f"/run/kiln-docker/{NAME}-n2.pid")
    os.kill(int(pidfile.read_text()), signal.SIGTERM)
    end = time.monotonic() + 60
    while time.monotonic() < end and cluster.ssh("node2", "docker info").returncode == 0:
        time.sleep(0.5)
    done = cluster.kiln("run", "--cluster", NAME, "--image", cluster.image, "--run-id", "cnodocker", "--",
                        "python", "where.py", cwd=project, hosts=None, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "node2: docker does not answer to root" in done.stderr, done.stderr
    assert run_processes("cnodocker") == []
    no_containers(cluster, ("node1", "node3"))


def test_a_rekeyed_node_stops_horovodrun_running_in_the_containers(cluster, project, monkeypatch):
    """Re-key node3 behind kiln's back once its container runs: horovodrun in node1's container reaches node3
    through the shim's ssh, checked against the cluster's pins, and fails; nothing is left (node3 gets its own keys
    back afterwards). On node1 and node3: node2 may have been replaced and its engine stopped already."""
    hosts = parse_host_list("node1,node3")
    for key in ("KILN_HOME", "KILN_RUNS"):  # the supervisor below writes the run where the cluster's kiln does
        monkeypatch.setenv(key, cluster.env()[key])
    group = Cluster.connect(default_cluster_name(hosts, cluster.ssh_config), hosts,
                            SshOptions(config_file=cluster.ssh_config), python=sys.executable, fanout=8,
                            timeout=120, accept_new=True)
    group.require_facts("connect")
    group.apply_mesh()
    paths = launch.NodePaths(group.remote_root(hosts[0]))
    group.sync_lib(paths.lib)
    group.sync(str(project), paths.code)
    runtime = ContainerRuntime(group, cluster.image, paths, "crekeyed")
    runtime.prepare(hosts, Timeline())
    with cluster.rekeyed("node3"):
        plan = launch.plan_horovod("crekeyed", [n.name for n in group.nodes], [1, 1],
                                   python=runtime.python_path(hosts[0]), paths=paths,
                                   program=launch.Program(("python", "horovod_keras.py")), nic="eth0")
        supervisor = Supervisor(group, plan, paths, runtime=runtime)
        record = record_run(group, plan, paths)
        supervisor.start()
        with pytest.raises(RunFailed, match="crekeyed failed"):
            supervisor.run(record, timeout=180)
        log = (cluster.runs / "crekeyed" / "hosts" / "node1" / "horovodrun.log").read_text()
        assert "Host key verification failed" in log or "HOST IDENTIFICATION HAS CHANGED" in log, log[-2000:]
        assert run_processes("crekeyed") == []
        no_containers(cluster, ("node1",))
        group.remote.disconnect(hosts)


QUEUE = "kcq"
# A torchrun worker that says where it ran: its rank, the sum of an all-reduce across the job, its machine, its
# Python, the image's manifest and its container's first process
WHERE_DDP = """\
import json, os, socket, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
out = os.environ["KILN_OUTPUT_DIR"]
os.makedirs(out, exist_ok=True)
manifest = json.load(open("/etc/kiln/manifest.json")) if os.path.exists("/etc/kiln/manifest.json") else {}
json.dump({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": total.item(),
           "host": socket.gethostname(), "python": sys.executable, "target": manifest.get("target"),
           "init": open("/proc/1/cmdline").read(), "task": os.environ["KILN_TASK"], "uid": os.getuid()},
          open(os.path.join(out, f"rank-{dist.get_rank()}.json"), "w"))
dist.destroy_process_group()
"""


@needs_slurm()
def test_a_queue_job_runs_each_task_in_the_image_on_nodes_made_for_it(baked, tmp_path_factory, tmp_path):
    """`kiln queue up --docker` (each node made with its own engine, as a cloud image has one), then `kiln submit
    --image` of a torchrun job from zero nodes: the queue makes two nodes, each pulls the image once, and each
    task runs in its node's container (the image's Python, its init first), the two meeting through the node's
    network; then Horovod's Keras example, whose ranks reach their node's PMIx server from their containers. A
    task killed outright (its docker client, as at the end of Slurm's KillWait) leaves its container, which the
    queue's epilog removes once the job is cancelled."""
    reason = can_make_namespaces()
    if reason:
        pytest.skip(reason)
    home = tmp_path_factory.mktemp("kiln-home")
    env = {**os.environ, "KILN_HOME": str(home), "KILN_RUNS": str(tmp_path_factory.mktemp("runs"))}
    ssh_config = Path("/run/kiln/local") / QUEUE / "ssh_config"

    def kiln(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(KILN), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def on(node: str, command: str) -> str:
        return subprocess.run(["ssh", "-F", str(ssh_config), node, command], capture_output=True, text=True,
                              timeout=60).stdout

    local_cluster_command("down", "--name", QUEUE)
    try:
        up = kiln("queue", "up", QUEUE, "--docker", "--max-nodes", "2", "--idle-minutes", "0.5")
        assert up.returncode == 0, up.stdout + up.stderr
        image = engines.push_to_cluster(QUEUE, baked["image"], copy_from=baked.get("pushed"))
        project = tmp_path / "project"
        project.mkdir()
        (project / "where_ddp.py").write_text(WHERE_DDP)
        done = kiln("submit", QUEUE, "--image", image, "--mode", "torchrun", "--nodes", "2", "--wait", "--",
                    "python", "where_ddp.py", cwd=project, timeout=1200)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert f"the job's tasks run in {image}, sha256:" in done.stdout, done.stdout[-3000:]
        folder = Path(done.stdout.split("its folder ", 1)[1].split(",", 1)[0])
        results = [json.loads(path.read_text()) for path in sorted(folder.glob("output/torchrun-*/rank-*.json"))]
        assert [r["rank"] for r in results] == [0, 1] and all(r["sum"] == 3.0 for r in results), results
        assert {r["host"] for r in results} == {"node1", "node2"}, results
        for seen in results:
            assert seen["python"] == KILN_PYTHON and seen["target"] == "container", seen
            assert "docker-init" in seen["init"] and seen["uid"] == 0, seen
        # Horovod's Keras example, its ranks started by srun --mpi=pmix, each in its container (the nodes are up
        # and have the image: the queue keeps an idle node 30 s)
        shutil.copy(ROOT / "examples" / "horovod_keras.py", project)
        done = kiln("submit", QUEUE, "--image", image, "--mode", "horovod", "--nodes", "2", "--wait", "--",
                    "python", "horovod_keras.py", "--epochs", "1", cwd=project, timeout=900)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        folder = Path(done.stdout.split("its folder ", 1)[1].split(",", 1)[0])
        ranks = {path.parent.name: json.loads(path.read_text()) for path in folder.glob("output/*/*.json")}
        assert sorted(ranks) == ["rank-0", "rank-1"] and {r["size"] for r in ranks.values()} == {2}, ranks
        deadline = time.monotonic() + 60  # removed as they ended (--rm)
        while any(on(node, "docker ps -aq").split() for node in ("node1", "node2")):
            assert time.monotonic() < deadline, "a task's container was left"
            time.sleep(1)

        sleeper = kiln("submit", QUEUE, "--image", image, "--", "python", "-c", "import time; time.sleep(900)",
                       cwd=project)
        assert sleeper.returncode == 0, sleeper.stdout + sleeper.stderr
        job = sleeper.stdout.split()[1]
        deadline = time.monotonic() + 600

        def running() -> str:
            return next((node for node in ("node1", "node2")
                         if on(node, f"docker ps -q --filter label=kiln.slurm-job={job}").strip()), "")
        while not running():
            assert time.monotonic() < deadline, kiln("queue", "status", QUEUE).stdout
            time.sleep(2)
        node = running()
        assert subprocess.run(["pkill", "-KILL", "-f", f"docker run --rm --init --name kiln-{job}-"],
                              timeout=30).returncode == 0
        time.sleep(2)
        assert on(node, f"docker ps -q --filter label=kiln.slurm-job={job}").strip(), "the container went with it"
        assert kiln("queue", "cancel", QUEUE, "--job", job).returncode == 0
        deadline = time.monotonic() + 120
        while on(node, f"docker ps -aq --filter label=kiln.slurm-job={job}").strip():
            assert time.monotonic() < deadline, "the epilog left the killed task's container"
            time.sleep(2)
    finally:
        kiln("down", QUEUE)
        local_cluster_command("down", "--name", QUEUE)
