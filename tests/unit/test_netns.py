"""localcloud.netns: a local cluster's names, addresses and file texts (exact output, no root needed)."""

from __future__ import annotations

import ipaddress
import shlex
import zlib
from pathlib import Path

import pytest

from kiln.errors import UsageError
from localcloud import netns as plan


def test_plan_names_and_addresses_follow_the_convention():
    cluster = plan.plan_cluster("kiln", 2, ipaddress.IPv4Network("10.9.0.0/16"))
    tag = zlib.crc32(b"kiln") & 0xFFFF
    mac = f"02:{tag >> 8:02x}:{tag & 255:02x}:00:00"
    assert (cluster.gateway, cluster.gateway_mac) == ("10.9.0.1", f"{mac}:00")
    assert cluster.nodes == (plan.Node(1, "node1", "10.9.0.2", "kiln-n1", "kiln-v1", f"{mac}:01"),
                             plan.Node(2, "node2", "10.9.0.3", "kiln-n2", "kiln-v2", f"{mac}:02"))


def test_default_subnet_is_derived_from_the_name():
    first = plan.candidate_subnets("kiln")[0]
    assert first == ipaddress.IPv4Network(f"10.{200 + zlib.crc32(b'kiln') % 50}.0.0/16")
    assert len(set(plan.candidate_subnets("kiln"))) == 50


def test_a_subnet_in_use_is_skipped():
    used = [("kiln-br", ipaddress.IPv4Network("10.201.0.0/16"))]
    candidates = [ipaddress.IPv4Network("10.201.0.0/16"), ipaddress.IPv4Network("10.202.0.0/16")]
    assert plan.pick_subnet(candidates, used) == candidates[1]
    with pytest.raises(UsageError, match="overlaps 10.201.0.0/16 on kiln-br"):
        plan.pick_subnet(candidates[:1], used)


def test_invalid_names_are_refused():
    for bad in ("Kiln", "1abc", "kiln-2", "toolong1", ""):
        with pytest.raises(UsageError):
            plan.check_name(bad)


def test_operator_ssh_config_pins_keys_and_names_every_node():
    cluster = plan.plan_cluster("kiln", 2, ipaddress.IPv4Network("10.9.0.0/16"))
    state = Path("/run/kiln/local/kiln")
    assert plan.ssh_config_text(cluster, state) == (
        "Host node1\n  HostName 10.9.0.2\nHost node2\n  HostName 10.9.0.3\n"
        "Host *\n  User root\n  IdentityFile /run/kiln/local/kiln/operator_key\n  IdentitiesOnly yes\n"
        "  UserKnownHostsFile /run/kiln/local/kiln/known_hosts\n  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n  ConnectTimeout 10\n")


def test_ip_batches_build_the_network_with_static_neighbours():
    cluster = plan.plan_cluster("kiln", 1, ipaddress.IPv4Network("10.9.0.0/16"))
    node, gw_mac = cluster.nodes[0], cluster.gateway_mac
    assert plan.root_batch(cluster).splitlines() == [
        f"link add kiln-br address {gw_mac} type bridge", "addr add 10.9.0.1/16 dev kiln-br", "link set kiln-br up",
        "netns add kiln-n1", f"link add kiln-v1 type veth peer name eth0 address {node.mac} netns kiln-n1",
        "link set kiln-v1 master kiln-br up", f"neigh replace 10.9.0.2 lladdr {node.mac} dev kiln-br nud permanent"]
    assert plan.node_batch(cluster, node).splitlines() == [
        "link set lo up", "addr add 10.9.0.2/16 dev eth0", "link set eth0 up", "route add default via 10.9.0.1",
        f"neigh replace 10.9.0.1 lladdr {gw_mac} dev eth0 nud permanent"]
    assert plan.teardown_batch(["kiln-n1"], ["kiln-v1", "kiln-br"]).splitlines() == [
        "netns del kiln-n1", "link del kiln-v1", "link del kiln-br"]


def test_a_cluster_with_slots_plugs_in_only_the_nodes_it_boots():
    """up --start 1 of 3: the bridge and node1; node2 and node3 keep their names and addresses for add."""
    cluster = plan.plan_cluster("kq", 3, ipaddress.IPv4Network("10.9.0.0/16"))
    batch = plan.root_batch(cluster, cluster.nodes[:1])
    assert "netns add kq-n1" in batch and "kq-n2" not in batch and "kq-n3" not in batch
    assert plan.root_batch(cluster, ()).splitlines() == plan.root_batch(cluster).splitlines()[:3]
    assert [n.ip for n in cluster.nodes] == ["10.9.0.2", "10.9.0.3", "10.9.0.4"]


def test_node_mounts_cover_the_private_paths_and_hide_the_state():
    assert plan.fstab_text(Path("/run/kiln/local/kiln/node1")).splitlines() == [
        "/run/kiln/local/kiln/node1/etc-ssh /etc/ssh none bind 0 0",
        "/run/kiln/local/kiln/node1/hosts /etc/hosts none bind 0 0",
        "/run/kiln/local/kiln/node1/resolv.conf /etc/resolv.conf none bind 0 0",
        "/run/kiln/local/kiln/node1/ssh /root/.ssh none bind 0 0",
        "/run/kiln/local/kiln/node1/kiln /root/kiln none bind 0 0",
        "/run/kiln/local/kiln/node1/munge /run/munge none bind 0 0",
        "/run/kiln/local/kiln/node1/kiln-slurm /var/lib/kiln-slurm none bind 0 0",
        "kiln-hidden /run/kiln tmpfs size=64k,mode=755 0 0"]


def test_known_hosts_lines_carry_name_and_address():
    node = plan.Node(1, "node1", "10.9.0.2", "kiln-n1", "kiln-v1", "02:00:00:00:00:01")
    assert plan.known_hosts_lines(node, ["ssh-ed25519 AAAA root@node1\n"]) == ["node1,10.9.0.2 ssh-ed25519 AAAA\n"]


def test_a_running_cluster_is_planned_again_from_its_nodes_file():
    cluster = plan.plan_cluster("kt", 3, ipaddress.IPv4Network("10.9.0.0/16"))
    nodes = [dict(name=n.name, ip=n.ip, netns=n.netns, subnet="10.9.0.0/16") for n in cluster.nodes]
    assert plan.cluster_from_nodes("kt", nodes) == cluster
    assert plan.find_node(cluster, "node2") == plan.find_node(cluster, "10.9.0.3") == cluster.nodes[1]
    with pytest.raises(UsageError, match="has no node 'node4'"):
        plan.find_node(cluster, "node4")
    with pytest.raises(UsageError, match="does not match its plan"):
        plan.cluster_from_nodes("kt", nodes[:1] + [dict(nodes[1], ip="10.9.0.99")] + nodes[2:])
    one = plan.plan_cluster("kt", 1, ipaddress.IPv4Network("10.9.0.0/16"))
    assert plan.node_root_batch(one, one.nodes[0]) == "".join(
        line + "\n" for line in plan.root_batch(one).splitlines()[3:])


def test_a_docker_node_engine_lives_apart_per_node_and_its_sessions_find_it():
    cluster = plan.plan_cluster("kiln", 2, ipaddress.IPv4Network("10.9.0.0/16"))
    node = cluster.nodes[1]
    engine = plan.node_engine("kiln", node)
    assert engine.data_root == Path("/var/lib/kiln-local/kiln/node2")
    assert engine.exec_root == Path("/run/kiln-docker/kiln-n2")
    assert engine.docker_host == "unix:///run/kiln-docker/kiln-n2.sock"
    assert engine.pidfile == Path("/run/kiln-docker/kiln-n2.pid")
    assert "SetEnv DOCKER_HOST=unix:///run/kiln-docker/kiln-n2.sock" in plan.sshd_config_text(node, engine.docker_host)
    assert "SetEnv" not in plan.sshd_config_text(node)
    assert plan.registry_address(cluster) == f"{cluster.gateway}:5000"


@pytest.mark.parametrize("unified", [False, True])
def test_a_node_boots_with_its_cgroups_mounted_before_its_sshd_starts(unified):
    """dockerd and slurmd need them; `ip netns exec` mounted a /sys without them."""
    node = plan.plan_cluster("kiln", 1, ipaddress.IPv4Network("10.9.0.0/16")).nodes[0]
    script = plan.boot_argv(node, Path("/run/kiln/local/kiln/node1"), unified=unified)[-1]
    mounted = "-t cgroup2 cgroup2 /sys/fs/cgroup" if unified else "-t tmpfs -o mode=755 cgroup /sys/fs/cgroup"
    assert script.index("mount --all --fstab") < script.index(mounted) < script.index("exec /usr/sbin/sshd")
    for controller in ("memory", "devices", "pids", "cpuset"):
        assert (f"-o {controller} cgroup /sys/fs/cgroup/{controller}" in script) is not unified


def test_a_node_engine_starts_in_the_nodes_namespaces_and_leaves_iptables_alone():
    cluster = plan.plan_cluster("kiln", 1, ipaddress.IPv4Network("10.9.0.0/16"))
    engine = plan.node_engine("kiln", cluster.nodes[0])
    argv = plan.dockerd_argv(4242, engine, "10.9.0.1:5000")
    assert argv[:7] == ["nsenter", "--target", "4242", "--net", "--uts", "--mount", "--"]
    dockerd = shlex.join(argv[7:])
    assert argv[7] == "dockerd"
    for flag in ("--iptables=false", "--ip-masq=false", "--bridge=none", "--insecure-registry 10.9.0.1:5000",
                 "--data-root /var/lib/kiln-local/kiln/node1", "-H unix:///run/kiln-docker/kiln-n1.sock"):
        assert flag in dockerd
