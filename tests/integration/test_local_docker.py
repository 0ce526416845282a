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
from localcloud import netns as plan

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
    pushed = subprocess.run(["docker", "push", f"{operator}/base:test"], capture_output=True, text=True, timeout=300)
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
