"""local-cluster up --docker: a real dockerd per node inside the node's namespaces and a real registry on the
bridge; containers see their node's hostname, address and private files; the host's iptables are untouched;
down (and lose) leave nothing behind."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from test_local_cluster import local_cluster, needs_namespaces, ssh

from bake import container_base
from kiln.paths import cache_dir
from localcloud import engines
from localcloud import netns as plan
from localcloud.registry import serving

pytestmark = [pytest.mark.integration, needs_namespaces]

NAME = "ldk"


def forward_policy() -> str:
    return subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, timeout=10).stdout \
        .splitlines()[0] if shutil.which("iptables") else ""


@pytest.fixture(scope="module")
def docker_cluster():
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        pytest.fail("no Docker engine answers on this machine (make setup starts one: scripts/docker-engine)")
    base = container_base.ensure(cache_dir())
    before = forward_policy()
    local_cluster("down", "--name", NAME)
    made = local_cluster("up", "2", "--name", NAME, "--docker")
    assert made.returncode == 0, made.stderr
    try:
        status = json.loads(local_cluster("status", "--name", NAME, "--json").stdout)
        yield {"registry": status["registry"], "base": base, "forward": before}
    finally:
        local_cluster("down", "--name", NAME)


def test_each_node_has_its_own_engine_and_the_host_forward_policy_is_unchanged(docker_cluster):
    names = {node: ssh(NAME, node, "docker info --format '{{.DockerRootDir}}'").stdout.strip()
             for node in ("node1", "node2")}
    assert names == {"node1": f"/var/lib/kiln-local/{NAME}/node1", "node2": f"/var/lib/kiln-local/{NAME}/node2"}
    assert forward_policy() == docker_cluster["forward"]


def test_a_pushed_image_runs_on_a_node_in_the_nodes_network_and_files(docker_cluster):
    operator, nodes = docker_cluster["registry"]["operator"], docker_cluster["registry"]["nodes"]
    subprocess.run(["docker", "tag", docker_cluster["base"], f"{operator}/base:test"], check=True, timeout=60)
    try:
        pushed = subprocess.run(["docker", "push", f"{operator}/base:test"], capture_output=True, text=True,
                                timeout=300)
    finally:  # the tag names this cluster's registry: it would stay in this machine's engine, one per run
        subprocess.run(["docker", "rmi", f"{operator}/base:test"], capture_output=True, timeout=60)
    assert pushed.returncode == 0, pushed.stderr
    assert ssh(NAME, "node2", "echo private-to-node2 > /root/kiln/marker").returncode == 0
    probe = ("hostname; cat /root/kiln/marker; "
             "python3 -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'; "
             "cat /sys/class/net/eth0/address")
    ran = ssh(NAME, "node2", f"docker run --rm --network host -v /root/kiln:/root/kiln {nodes}/base:test "
                              f"sh -c \"{probe}\"", timeout=300)
    assert ran.returncode == 0, ran.stderr
    hostname, marker, _, mac = ran.stdout.split()
    assert (hostname, marker) == ("node2", "private-to-node2")
    nodes_file = json.loads((plan.STATE_ROOT / NAME / "nodes.json").read_text())
    node2 = plan.cluster_from_nodes(NAME, nodes_file).nodes[1]
    assert mac == node2.mac, "the container does not use node2's own interface"
    assert not ssh(NAME, "node1", "docker images -q").stdout.strip(), "node1's engine has node2's image"


def test_down_leaves_no_engine_registry_or_files():
    made = local_cluster("up", "1", "--name", "ldx", "--docker")
    assert made.returncode == 0, made.stderr
    registry = json.loads(local_cluster("status", "--name", "ldx", "--json").stdout)["registry"]
    down = local_cluster("down", "--name", "ldx")
    assert down.returncode == 0, down.stderr
    assert not (plan.ENGINE_DATA_ROOT / "ldx").exists()
    assert not list(plan.ENGINE_RUN_ROOT.glob("ldx-n*"))
    running = subprocess.run(["pgrep", "-af", "kiln-local/ldx|kiln-docker/ldx-"], capture_output=True, text=True)
    assert not running.stdout.strip(), running.stdout
    port = registry["operator"].rsplit(":", 1)[1]
    assert f":{port} " not in subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout


def manifest(registry: str, reference: str) -> dict:
    """The image manifest `registry` serves for `reference` (REPOSITORY:TAG)."""
    repository, tag = reference.rsplit(":", 1)
    found = subprocess.run(["curl", "-sf", "-H", "Accept: application/vnd.docker.distribution.manifest.v2+json",
                            f"http://{registry}/v2/{repository}/manifests/{tag}"], capture_output=True, text=True,
                           timeout=60)
    assert found.returncode == 0, f"{registry} has no {reference}"
    return json.loads(found.stdout)


def test_an_image_already_in_a_registry_is_copied_to_the_cluster_and_only_that_image(docker_cluster, tmp_path):
    """push_to_cluster(copy_from=...) copies the layers another registry holds as they are, where that reference
    is the very image; one that names another image is not copied: the image itself is pushed. The source's layers
    are compressed at gzip's level 9, where a push compresses at the default level, so their digests tell a copy
    from a push."""
    base = docker_cluster["base"]
    base_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", base], capture_output=True,
                             text=True, timeout=60, check=True).stdout.strip()
    (tmp_path / "bin").mkdir()
    shutil.copy2("/bin/busybox", tmp_path / "bin" / "busybox")
    other = "kiln-copy-test:other"
    subprocess.run(["sh", "-c", f"tar -C {tmp_path} -c bin | docker import - {other}"], check=True, timeout=120,
                   capture_output=True)
    operator = docker_cluster["registry"]["operator"]
    try:
        with serving(tmp_path / "source") as source:
            for image, name in ((base, "base:kept"), (other, "other:kept")):
                done = subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                                       "--dest-compress-level", "9", f"docker-daemon:{image}",
                                       f"docker://{source}/{name}"], capture_output=True, text=True, timeout=600)
                assert done.returncode == 0, done.stderr
            kept = manifest(source, "base:kept")
            assert kept["config"]["digest"] == base_id
            copied = engines.push_to_cluster(NAME, base, copy_from=f"{source}/base:kept")
            assert copied == f"{docker_cluster['registry']['nodes']}/{base}"
            assert manifest(operator, base)["layers"] == kept["layers"], "the layers were not copied as they are"
            subprocess.run(["docker", "tag", base, "kiln-copy-test:base"], check=True, timeout=60)
            engines.push_to_cluster(NAME, "kiln-copy-test:base", copy_from=f"{source}/other:kept")
            pushed = manifest(operator, "kiln-copy-test:base")
            assert pushed["config"]["digest"] == base_id, "another image was copied in the image's name"
    finally:
        subprocess.run(["docker", "rmi", other, "kiln-copy-test:base"], capture_output=True, timeout=120)
    pulled = ssh(NAME, "node1", f"docker pull {copied} >/dev/null && docker image inspect --format '{{{{.Id}}}}' "
                               f"{copied} && docker rmi {copied} >/dev/null", timeout=300)
    assert pulled.returncode == 0 and pulled.stdout.strip() == base_id, pulled.stdout + pulled.stderr
