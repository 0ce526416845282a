"""localcloud.cluster (scripts/local-cluster): real namespaces, bridges and sshds, always torn down."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localcloud import cluster as cli
from localcloud import netns as plan

pytestmark = [pytest.mark.integration, pytest.mark.quick]

ROOT = Path(__file__).resolve().parents[2]
STATE_ROOT = Path("/run/kiln/local")
NAME = "lct"         # the module's cluster
SCRATCH = "lcd"      # clusters that tests take down themselves


def _namespaces_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "needs iproute2 and util-linux"
    probe = subprocess.run(["unshare", "--net", "--mount", "--uts", "ip", "link", "show", "lo"],
                           capture_output=True, text=True, timeout=10)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    if probe.returncode or listed.returncode:
        return f"network namespaces do not work here: {probe.stderr.strip() or listed.stderr.strip()}"
    return None


NAMESPACES_UNAVAILABLE = _namespaces_unavailable()
needs_namespaces = pytest.mark.skipif(bool(NAMESPACES_UNAVAILABLE), reason=str(NAMESPACES_UNAVAILABLE))


def local_cluster(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcloud.cluster", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def ssh(name: str, node: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(STATE_ROOT / name / "ssh_config"), node, command],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def netns_of(name: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{name}-n")]


def links_of(name: str) -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]
    return [link for link in names if link == f"{name}-br" or link.startswith(f"{name}-v")]


def pids_in(netns_inodes: set[tuple[int, int]]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            st = os.stat(entry / "ns" / "net")
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and (st.st_dev, st.st_ino) in netns_inodes:
            pids.append(int(entry.name))
    return pids


def host_files() -> dict[str, tuple[int, bytes]]:
    """Mode and content of the host files the nodes' bind mounts cover."""
    found = {}
    for top in (Path("/etc/hosts"), Path("/etc/resolv.conf"), Path("/etc/ssh"), Path("/root/.ssh")):
        for path in [top, *top.rglob("*")] if top.exists() else []:
            st = path.lstat()
            found[str(path)] = (st.st_mode, path.read_bytes() if path.is_file() else b"")
    return found


@pytest.fixture(scope="module")
def cluster():
    """A 3-node cluster `lct`: yields (nodes.json, host files before up); always taken down."""
    if NAMESPACES_UNAVAILABLE:
        pytest.skip(NAMESPACES_UNAVAILABLE)
    local_cluster("down", "--name", NAME)
    before = host_files()
    up = local_cluster("up", "3", "--name", NAME)
    try:
        assert up.returncode == 0, f"up failed:\n{up.stdout}\n{up.stderr}"
        nodes = json.loads((STATE_ROOT / NAME / "nodes.json").read_text())
        yield nodes, before
    finally:
        local_cluster("down", "--name", NAME)


# ---------------------------------------------------------------- a running cluster

def test_each_node_answers_ssh_with_its_own_hostname(cluster):
    for i in (1, 2, 3):
        done = ssh(NAME, f"node{i}", "hostname")
        assert (done.returncode, done.stdout.strip()) == (0, f"node{i}"), done.stderr


def test_each_node_has_its_own_work_directory(cluster):
    assert ssh(NAME, "node1", "echo hello > /root/kiln/only-on-node1").returncode == 0
    assert ssh(NAME, "node1", "cat /root/kiln/only-on-node1").stdout == "hello\n"
    assert ssh(NAME, "node2", "test -e /root/kiln/only-on-node1").returncode == 1
    assert not Path("/root/kiln/only-on-node1").exists()


def test_node_hosts_file_maps_its_hostname_to_loopback_only(cluster):
    hosts = ssh(NAME, "node2", "cat /etc/hosts").stdout
    assert "127.0.1.1 node2" in hosts.splitlines()
    assert "node1" not in hosts and "node3" not in hosts


def test_a_nodes_resolver_is_its_own_loopback_and_a_name_not_in_its_hosts_file_is_not_found(cluster):
    """This machine's nameserver is out of the nodes' network (each lookup waited 10 s for it): a node asks its
    own loopback, where nothing answers, and a name /etc/hosts lacks is not found."""
    resolv = ssh(NAME, "node2", "cat /etc/resolv.conf").stdout
    assert [line for line in resolv.splitlines() if line.startswith("nameserver")] == ["nameserver 127.0.0.1"]
    assert ssh(NAME, "node2", "getent hosts nosuch.kiln.invalid").returncode == 2  # getent: not found
    assert ssh(NAME, "node2", "getent hosts node2").stdout.split() == ["127.0.1.1", "node2"]


def test_nodes_have_distinct_host_keys_and_see_this_machines_python(cluster):
    keys = {ssh(NAME, f"node{i}", "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1] for i in (1, 2, 3)}
    assert len(keys) == 3
    assert ssh(NAME, "node2", f"test -x {sys.executable}").returncode == 0


def test_host_files_under_the_bind_mounts_are_unchanged(cluster):
    _, before = cluster
    after = host_files()
    if "/root/.ssh" not in before:  # up may create the empty mountpoint, nothing more
        assert after.pop("/root/.ssh") == (0o40700, b"")
    assert after == before


def test_each_node_authorizes_the_operator_key(cluster):
    operator_key = (STATE_ROOT / NAME / "operator_key.pub").read_text()
    assert ssh(NAME, "node2", "cat /root/.ssh/authorized_keys").stdout == operator_key


def test_node_mounts_do_not_propagate_to_the_host(cluster):
    assert str(STATE_ROOT / NAME) not in Path("/proc/self/mountinfo").read_text()


def test_nodes_cannot_see_the_cluster_state_or_operator_key(cluster):
    done = ssh(NAME, "node1", f"ls -A /run/kiln; test -e {STATE_ROOT / NAME / 'operator_key'}")
    assert (done.returncode, done.stdout) == (1, "")


def test_nodes_reach_each_other_over_the_bridge(cluster):
    nodes, _ = cluster
    node2_ip = nodes[1]["ip"]
    probe = f'python3 -c "import socket; socket.create_connection((\\"{node2_ip}\\", 22), 2)"'
    done = ssh(NAME, "node1", probe)
    assert done.returncode == 0, done.stderr
    assert ssh(NAME, "node3", f"bash -c 'exec 3<>/dev/tcp/{node2_ip}/22'").returncode == 0


def test_status_json_lists_every_node_up(cluster):
    done = local_cluster("status", "--name", NAME, "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["up"]
    assert [(n["node"], n["netns_present"], n["sshd"]) for n in report["nodes"]] == [
        ("node1", True, True), ("node2", True, True), ("node3", True, True)]


def test_env_names_the_ssh_config_and_hosts(cluster):
    done = local_cluster("env", "--name", NAME)
    assert done.stdout.splitlines() == [f"KILN_SSH_CONFIG={STATE_ROOT / NAME / 'ssh_config'}",
                                        "KILN_HOSTS=node1,node2,node3"]


def test_up_refuses_a_cluster_that_exists(cluster):
    done = local_cluster("up", "3", "--name", NAME)
    assert done.returncode == 2
    assert "already exists" in done.stderr and "down" in done.stderr
    assert ssh(NAME, "node1", "true").returncode == 0


def test_down_of_a_name_prefix_leaves_other_clusters_alone(cluster):
    assert local_cluster("down", "--name", "lc").returncode == 0
    assert len(netns_of(NAME)) == 3
    assert ssh(NAME, "node3", "hostname").stdout.strip() == "node3"


def test_up_with_an_invalid_name_exits_2_naming_it():
    done = local_cluster("up", "--name", "Bad-Name")
    assert done.returncode == 2
    assert done.stderr.startswith("local-cluster: error:") and "'Bad-Name'" in done.stderr


# ---------------------------------------------------------------- slots: nodes made and removed one by one

@needs_namespaces
def test_slots_are_booted_and_removed_one_by_one_each_time_with_new_pinned_keys():
    """up --start 0 plans two nodes and makes none (a queue's partition with no node up); add boots one, pinned
    in the cluster's known_hosts; remove takes it away with its pin; add boots it again as a fresh machine (new
    keys); a slot that is up, or one asked for while the cluster has no capacity, is refused and nothing is left."""
    local_cluster("down", "--name", SCRATCH)
    known = STATE_ROOT / SCRATCH / "known_hosts"
    try:
        made = local_cluster("up", "2", "--name", SCRATCH, "--start", "0")
        assert made.returncode == 0 and "2 of them slots" in made.stdout, made.stdout + made.stderr
        assert netns_of(SCRATCH) == [] and known.read_text() == ""
        status = json.loads(local_cluster("status", "--name", SCRATCH, "--json").stdout)
        assert [(row["node"], row["slot"]) for row in status["nodes"]] == [("node1", True), ("node2", True)]

        added = local_cluster("add", "node2", "--name", SCRATCH)
        assert added.returncode == 0, added.stderr
        assert netns_of(SCRATCH) == [f"{SCRATCH}-n2"] and ssh(SCRATCH, "node2", "hostname").stdout == "node2\n"
        first = known.read_text()
        assert first.startswith("node2,") and first in added.stdout
        assert local_cluster("env", "--name", SCRATCH).stdout.endswith("KILN_HOSTS=node2\n")
        again = local_cluster("add", "node2", "--name", SCRATCH)
        assert again.returncode == 2 and "node2 is up already" in again.stderr, again.stderr

        assert local_cluster("remove", "node2", "--name", SCRATCH).returncode == 0
        assert netns_of(SCRATCH) == [] and links_of(SCRATCH) == [f"{SCRATCH}-br"] and known.read_text() == ""
        assert local_cluster("status", "--name", SCRATCH).returncode == 0  # no node is up, and none should be

        assert local_cluster("exhaust", "--name", SCRATCH).returncode == 0
        refused = local_cluster("add", "node1", "node2", "--name", SCRATCH)
        assert refused.returncode == 1 and "no capacity" in refused.stderr, refused.stderr
        assert netns_of(SCRATCH) == [] and known.read_text() == ""

        assert local_cluster("add", "node2", "--name", SCRATCH).returncode == 0
        assert known.read_text().startswith("node2,") and known.read_text() != first  # a fresh machine's keys
        assert ssh(SCRATCH, "node2", "ls /root/kiln").stdout == ""
    finally:
        local_cluster("down", "--name", SCRATCH)
    assert netns_of(SCRATCH) == [] and links_of(SCRATCH) == []


# ---------------------------------------------------------------- teardown

@needs_namespaces
def test_down_removes_everything_and_is_idempotent():
    local_cluster("down", "--name", SCRATCH)
    try:
        assert local_cluster("up", "2", "--name", SCRATCH).returncode == 0
        started = ssh(SCRATCH, "node1", "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!")
        assert started.returncode == 0, started.stderr
        inodes = {(st.st_dev, st.st_ino) for st in (os.stat(f"/run/netns/{ns}") for ns in netns_of(SCRATCH))}
        assert len(inodes) == 2 and pids_in(inodes)

        assert local_cluster("down", "--name", SCRATCH).returncode == 0

        assert netns_of(SCRATCH) == [] and links_of(SCRATCH) == []
        assert not (STATE_ROOT / SCRATCH).exists()
        assert pids_in(inodes) == []
        again = local_cluster("down", "--name", SCRATCH)
        assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    finally:
        local_cluster("down", "--name", SCRATCH)


@needs_namespaces
def test_the_kill_reaches_processes_forked_while_it_runs():
    """A namespace whose process forks without pause, children ignoring SIGTERM: one pass of kills races the
    forks; the kill signals what each poll finds until nothing is left."""
    netns = f"{SCRATCH}-n9"
    subprocess.run(["ip", "netns", "delete", netns], capture_output=True, timeout=10)
    subprocess.run(["ip", "netns", "add", netns], check=True, timeout=10)
    forker = subprocess.Popen(["ip", "netns", "exec", netns, "bash", "-c",
                               "trap '' TERM; while :; do (exec sleep 60) & done"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        inode = os.stat(f"/run/netns/{netns}")
        while len(pids_in({(inode.st_dev, inode.st_ino)})) < 50:
            assert forker.poll() is None, "the forking shell ended by itself"

        cli.kill_namespace_processes([netns], grace=0.3)

        assert pids_in({(inode.st_dev, inode.st_ino)}) == []
    finally:
        forker.kill()
        forker.wait(timeout=10)
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True, timeout=10)


@needs_namespaces
def test_down_works_without_the_state_directory():
    local_cluster("down", "--name", SCRATCH)
    try:
        assert local_cluster("up", "2", "--name", SCRATCH).returncode == 0
        shutil.rmtree(STATE_ROOT / SCRATCH)  # as after a crash

        status = local_cluster("status", "--name", SCRATCH)
        assert status.returncode == 1 and "node1" in status.stdout
        assert local_cluster("down", "--name", SCRATCH).returncode == 0

        assert netns_of(SCRATCH) == [] and links_of(SCRATCH) == []
    finally:
        local_cluster("down", "--name", SCRATCH)


@needs_namespaces
def test_a_failed_up_names_the_node_and_removes_what_it_made(monkeypatch, capsys):
    real = plan.sshd_config_text
    monkeypatch.setattr(plan, "sshd_config_text",
                        lambda node, *rest: real(node, *rest) + "NoSuchOption yes\n" * (node.index == 2))
    try:
        assert cli.main(["up", "3", "--name", "lcf"]) == 1
        assert "node2: sshd exited" in capsys.readouterr().err
        assert netns_of("lcf") == [] and links_of("lcf") == [] and not (STATE_ROOT / "lcf").exists()
    finally:
        local_cluster("down", "--name", "lcf")
