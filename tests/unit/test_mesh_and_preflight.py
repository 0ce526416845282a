
import pytest

from bootstrap import mesh, preflight
from bootstrap import node as node_side
from bootstrap.errors import KilnError
from bootstrap.hosts import Host
from bootstrap.ssh import Result, describe_failure


def facts(hostname, address, *, resolve=None, tf="2.18.1", ports=None, connection=True):
    return {
        "hostname": hostname, "uid": 0, "home": "/root", "python": "3.11.2", "executable": "/v/bin/python",
        "ssh_connection": f"10.9.0.1 5000 {address} 22" if connection else "",
        "packages": {"tensorflow": tf, "tf-keras": "2.18.0", "horovod": "0.28.1"},
        "addresses": [{"iface": "eth1", "address": "172.17.0.9", "prefix": 16},
                      {"iface": "eth0", "address": address, "prefix": 16}],
        "host_keys": [f"ssh-ed25519 KEY{hostname}"],
        "resolve": resolve if resolve is not None else {hostname: [address]},
        "ports": ports or {},
    }


def three_nodes(**overrides):
    data = {Host("n1"): facts("node1", "10.9.0.2"), Host("n2", 2222): facts("node2", "10.9.0.3"),
            Host("n3"): facts("node3", "10.9.0.4")}
    data.update(overrides)
    return mesh.nodes_from_facts(data)


def test_cluster_address_is_the_one_the_operator_reached():
    assert mesh.choose_address(facts("node1", "10.9.0.2")) == ("10.9.0.2", "eth0")
    public = facts("node1", "10.9.0.2", connection=False)
    public["ssh_connection"] = "1.2.3.4 5000 54.1.2.3 22"  # NAT: the public address is not on the node
    assert mesh.choose_address(public) == ("172.17.0.9", "eth1")


def test_duplicate_hostnames_are_refused():
    with pytest.raises(KilnError, match="n2 and n1 both have the hostname 'node1'"):
        mesh.nodes_from_facts({Host("n1"): facts("node1", "10.9.0.2"), Host("n2"): facts("node1", "10.9.0.3")})


def test_known_hosts_pin_every_name_a_node_is_reached_by():
    nodes = three_nodes()
    assert mesh.known_hosts_text(nodes) == (
        "node1,10.9.0.2,n1 ssh-ed25519 KEYnode1\n"
        "[node2]:2222,[10.9.0.3]:2222,[n2]:2222 ssh-ed25519 KEYnode2\n"
        "node3,10.9.0.4,n3 ssh-ed25519 KEYnode3\n"
    )


def test_the_mesh_pins_a_nodes_ed25519_key_and_every_key_of_a_node_without_one():
    both = {**facts("node1", "10.9.0.2"), "host_keys": ["ecdsa-sha2-nistp256 ECDSA1", "ssh-ed25519 ED1"]}
    old = {**facts("node2", "10.9.0.3"), "host_keys": ["ecdsa-sha2-nistp256 ECDSA2", "ssh-rsa RSA2"]}
    nodes = mesh.nodes_from_facts({Host("n1"): both, Host("n2"): old})
    assert mesh.known_hosts_text(nodes) == (
        "node1,10.9.0.2,n1 ssh-ed25519 ED1\n"
        "node2,10.9.0.3,n2 ecdsa-sha2-nistp256 ECDSA2\n"
        "node2,10.9.0.3,n2 ssh-rsa RSA2\n"
    )


def test_a_replaced_node_loses_its_old_pins_and_gets_the_providers():
    from bootstrap.providers import Replacement

    nodes = three_nodes()
    pinned = mesh.known_hosts_text(nodes)
    swapped = [Replacement(Host("n2", 2222), Host("n2", 2222), ("ssh-ed25519 NEW2",)),
               Replacement(Host("n3"), Host("n9"), ("ssh-ed25519 NEW9", "ecdsa-sha2-nistp256 NEW9E"))]
    assert mesh.replaced_known_hosts(pinned, nodes, swapped) == (
        "node1,10.9.0.2,n1 ssh-ed25519 KEYnode1\n"
        "[n2]:2222 ssh-ed25519 NEW2\n"
        "n9 ssh-ed25519 NEW9\nn9 ecdsa-sha2-nistp256 NEW9E\n")


def test_node_ssh_config_uses_the_cluster_key_and_pins():
    text = mesh.node_ssh_config("demo", three_nodes())
    assert text == (
        "# kiln cluster demo: written by `fab cluster.mesh`\n"
        "Host node2 10.9.0.3\n  Port 2222\n"
        "Host node1 10.9.0.2 node2 10.9.0.3 node3 10.9.0.4\n"
        "  IdentityFile ~/.ssh/kiln/demo/id_ed25519\n  IdentitiesOnly yes\n"
        "  UserKnownHostsFile ~/.ssh/kiln/demo/known_hosts\n  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n  ConnectTimeout 10\n"
    )


def test_hosts_file_gets_the_block_on_top_and_loopback_mappings_commented():
    before = "127.0.0.1 localhost\n127.0.1.1 node1\n10.9.0.3 node2\n"
    entries = [("10.9.0.2", "node1"), ("10.9.0.3", "node2")]
    after = node_side.hosts_text(before, "kiln demo", entries)
    assert after == ("# BEGIN kiln demo\n10.9.0.2 node1\n10.9.0.3 node2\n# END kiln demo\n"
                     "127.0.0.1 localhost\n# kiln demo: 127.0.1.1 node1\n10.9.0.3 node2\n")
    assert node_side.hosts_text(after, "kiln demo", entries) == after


def test_preflight_passes_a_good_cluster():
    nodes = three_nodes()
    for node in nodes:
        node.facts["resolve"].update({n.name: [n.address] for n in nodes})
    assert preflight.check_nodes(nodes, ports=[23456]) == []


def test_preflight_names_loopback_names_version_skew_and_busy_ports():
    bad = facts("node2", "10.9.0.3", resolve={"node2": ["127.0.1.1"], "node3": []}, tf="2.17.0",
                ports={"23456": False})
    nodes = mesh.nodes_from_facts({Host("n1"): facts("node1", "10.9.0.2"), Host("n2"): bad,
                                   Host("n3"): facts("node3", "10.9.0.4")})
    found = preflight.check_nodes(nodes, ports=[23456])
    assert found == [
        preflight.Finding("n2", "resolve", "own hostname 'node2' resolves to loopback 127.0.1.1 (Gloo would bind "
                                           "there); run kiln mesh"),
        preflight.Finding("n2", "resolve", "'node3' resolves to nothing, expected 10.9.0.4"),
        preflight.Finding("n2", "ports", "port 23456 is in use"),
        preflight.Finding("n2", "versions", "tensorflow 2.17.0 differs from 2.18.1 on n1"),
    ]
    table = preflight.format_table(["n1", "n2", "n3", "n4"], found, {"n4": "unreachable: connection timed out"})
    assert table.splitlines()[:5] == [
        "host  reach     hostname  resolve   versions  ports     mesh",
        "n1    ok        ok        ok        ok        ok        ok",
        "n2    ok        ok        FAIL      FAIL      FAIL      ok",
        "n3    ok        ok        ok        ok        ok        ok",
        "n4    FAIL      -         -         -         -         -",
    ]
    assert "n4: reach: unreachable: connection timed out" in table


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@", "host key verification failed"),
        ("No ED25519 host key is known for node9 and you have requested strict checking.\n"
         "Host key verification failed.", "host key unknown"),
        ("Host key verification failed.", "host key verification failed"),
        ("root@node1: Permission denied (publickey).", "authentication refused (wrong key or user)"),
        ("ssh: connect to host 10.9.9.9 port 22: Connection timed out", "unreachable: connection timed out"),
        ("ssh: connect to host 10.9.0.2 port 22: Connection refused", "unreachable: connection refused"),
        ("ssh: Could not resolve hostname nowhere: Name or service not known", "unknown host name"),
    ],
)
def test_ssh_failures_become_one_readable_reason(stderr, reason):
    assert describe_failure(255, stderr).startswith(reason)


def test_other_failures_keep_the_last_line_and_code():
    assert describe_failure(3, "Traceback...\nValueError: boom\n") == "exit 3: ValueError: boom"


def test_an_ssh_that_ends_without_a_word_says_the_connection_ended():
    assert describe_failure(255, " \n").startswith("ssh failed: the connection ended with no reason given")
    assert describe_failure(1, "") == "exit 1: no output"  # the remote command's own silent failure


@pytest.mark.parametrize(("stdout", "stderr", "reason"), [
    ("", "warning\nexec: python: not found\n\n", "exec: python: not found"),
    ("OCI runtime exec failed: no such file\n", "", "OCI runtime exec failed: no such file"),
    ("", " \n", "exit 126 with no output"),
])
def test_a_failed_call_always_says_why(stdout, stderr, reason):
    assert Result(Host("h"), 126, stdout, stderr).reason() == reason


def test_ring_probes_spread_evenly_and_cover_small_clusters():
    assert preflight.ring_probes(3, 8) == [(0, 1), (1, 2), (2, 0)]
    assert preflight.ring_probes(16, 4) == [(0, 1), (4, 5), (8, 9), (12, 13)]
    assert preflight.ring_probes(1, 8) == []
    assert preflight.ring_probes(5, 0) == []


def test_failed_mesh_probe_is_a_finding():
    nodes = three_nodes()
    nodes[0].facts["probe"] = {"target": "node2", "answer": "node2", "error": None}
    nodes[1].facts["probe"] = {"target": "node3", "answer": None, "error": "Host key verification failed."}
    assert preflight.check_probes(nodes) == [
        preflight.Finding("n2:2222", "mesh", "ssh node3: Host key verification failed.")]


def test_each_node_resolves_a_bounded_window_of_names():
    assert preflight.neighbours(3, 0) == [1, 2]
    assert preflight.neighbours(3, 2) == [0, 1]
    assert preflight.neighbours(100, 97, size=4) == [98, 99, 0, 1]
    assert preflight.neighbours(1, 0) == []


def test_runs_started_together_share_one_cluster_key(tmp_path):
    """Four runs on the same hosts at once (kiln's integration test of busy programs did this): one key is made,
    every run reads it whole, none fails on another's half-written files."""
    import os
    import subprocess
    import sys
    import time

    home = tmp_path / "kiln-home"
    code = ("import sys, time; from bootstrap.mesh import ensure_cluster_key\n"
            "time.sleep(max(0.0, float(sys.argv[1]) - time.time()))  # all at once\n"
            "print(ensure_cluster_key('h-together')[1])")
    at = str(time.time() + 2)
    runs = [subprocess.Popen([sys.executable, "-c", code, at], env={**os.environ, "KILN_HOME": str(home)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            for _ in range(8)]
    answers = [run.communicate(timeout=60) for run in runs]
    assert [run.returncode for run in runs] == [0] * 8, answers
    assert len({out.strip() for out, _ in answers}) == 1 and answers[0][0].startswith("ssh-ed25519 "), answers


def test_preflight_compares_pytorch_and_jax_only_where_the_run_needs_them():
    nodes = three_nodes()
    for node in nodes:
        node.facts["resolve"].update({n.name: [n.address] for n in nodes})
    nodes[0].facts["packages"]["torch"] = "2.13.0+cpu"  # node1 has PyTorch, the others not
    assert preflight.check_nodes(nodes) == []  # a TensorFlow run does not care
    assert preflight.check_nodes(nodes, required=("torch",)) == [
        preflight.Finding("n2:2222", "versions", "torch is not installed for /v/bin/python"),
        preflight.Finding("n3", "versions", "torch is not installed for /v/bin/python"),
        preflight.Finding("n2:2222", "versions", "torch missing differs from 2.13.0+cpu on n1"),
        preflight.Finding("n3", "versions", "torch missing differs from 2.13.0+cpu on n1"),
    ]


def test_clusters_meshed_side_by_side_on_one_node_keep_each_others_keys_and_names(tmp_path):
    """Runs on overlapping hosts are clusters of their own, meshed at once on the same node (the watchdog's
    integration test lost one's Include, key or names this way, and its preflight failed): the shared
    ~/.ssh/config, authorized_keys and /etc/hosts end with every cluster's entries."""
    import os
    import subprocess
    import sys
    import time

    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    code = ("import sys, time; from bootstrap import node\n"
            "i = int(sys.argv[2]); name = f'c{i}'\n"
            "payload = {'cluster': name, 'private_key': 'key', 'public_key': f'ssh-ed25519 KEY{i} {name}',\n"
            "           'known_hosts': '', 'ssh_config': '', 'hosts': [[f'10.9.0.{i}', f'n{i}']]}\n"
            "time.sleep(max(0.0, float(sys.argv[1]) - time.time()))  # all at once\n"
            "node.mesh_ssh(payload)\n"
            f"node.mesh_hosts(name, [(f'10.9.0.{{i}}', f'n{{i}}')], path={str(hosts)!r})\n")
    at = str(time.time() + 2)
    runs = [subprocess.Popen([sys.executable, "-c", code, at, str(i)], env={**os.environ, "HOME": str(tmp_path)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            for i in range(8)]
    answers = [run.communicate(timeout=60) for run in runs]
    assert [run.returncode for run in runs] == [0] * 8, answers
    config = (tmp_path / ".ssh" / "config").read_text()
    authorized = (tmp_path / ".ssh" / "authorized_keys").read_text()
    names = hosts.read_text()
    for i in range(8):
        assert f"Include {tmp_path}/.ssh/kiln/c{i}/config" in config, config
        assert f"KEY{i}" in authorized, authorized
        assert f"10.9.0.{i} n{i}" in names, names
    assert "127.0.0.1 localhost" in names


def efa(state="4: ACTIVE", count=4):
    return [{"name": f"rdmap{i}s0", "driver": "efa", "link_layer": "Unspecified", "state": state} for i in range(count)]


def test_the_fabric_check_names_a_node_that_would_send_the_run_over_sockets():
    nodes = mesh.nodes_from_facts({Host("n1"): {**facts("node1", "10.9.0.2"), "rdma": efa()},
                                   Host("n2"): {**facts("node2", "10.9.0.3"), "rdma": efa()},
                                   Host("n3"): {**facts("node3", "10.9.0.4"), "rdma": efa("1: DOWN")}})
    found, line = preflight.check_fabric(nodes)
    assert found == [
        preflight.Finding("n3", "fabric", "no EFA device up where n1, n2 have it: NCCL would use TCP sockets on "
                                          "every node"),
        preflight.Finding("n3", "fabric", "rdmap0s0, rdmap1s0, rdmap2s0, rdmap3s0 down")]
    assert line.startswith("fabric: TCP sockets: n3 has no EFA device up where n1, n2 have")
    table = preflight.format_table(["n1", "n2", "n3"], found, {}, (*preflight.CHECKS, "fabric"))
    assert table.splitlines()[3].split() == ["n3", *["ok"] * 6, "FAIL"]


def test_the_fabric_check_passes_a_cluster_that_has_it_everywhere_and_skips_one_without():
    up = mesh.nodes_from_facts({Host("n1"): {**facts("node1", "10.9.0.2"), "rdma": efa()},
                                Host("n2"): {**facts("node2", "10.9.0.3"), "rdma": efa()}})
    assert preflight.check_fabric(up) == ([], "fabric: EFA (4 device(s) per node), NCCL over AWS Libfabric")
    assert preflight.check_fabric(three_nodes()) == ([], "")


def test_an_rsync_whose_files_vanished_meanwhile_copied_the_rest_and_did_not_fail(tmp_path):
    """rsync exits 24 when source files vanish while it runs (a stopped process's status file renamed into place):
    the rest was copied, so kiln goes on; any other failure is one."""
    from bootstrap.commands import SshOptions
    from bootstrap.ssh import HostFailure, Remote

    remote = Remote(SshOptions(control_path=str(tmp_path / "%C")))
    remote.rsync(Host("h"), ["sh", "-c", "echo 'file has vanished: \"/r/x.exit.tmp\"' >&2; exit 24"], timeout=10)
    with pytest.raises(HostFailure, match="exit 23: rsync error: some files could not be transferred"):
        remote.rsync(Host("h"), ["sh", "-c", "echo 'rsync error: some files could not be transferred' >&2; exit 23"],
                     timeout=10)


@pytest.mark.parametrize(("code", "stderr", "verdict"), [
    (0, "", "up"),
    (255, "ssh: connect to host 10.9.0.3 port 22: Connection refused", "lost"),
    (255, "ssh: connect to host 10.9.0.3 port 22: No route to host", "lost"),
    (255, "", "unclear"),  # the session was cut (LogLevel=ERROR says nothing)
    (255, "kex_exchange_identification: Connection closed by remote host", "unclear"),
    (255, "kex_exchange_identification: read: Connection reset by peer", "unclear"),
    (255, "root@node2: Permission denied (publickey).", "up"),  # it answered: not lost
    (255, "Host key verification failed.", "up"),
])
def test_a_fresh_connection_says_a_host_is_up_lost_or_unclear(code, stderr, verdict):
    from bootstrap.ssh import probe_verdict

    assert probe_verdict(describe_failure(code, stderr) if code else None) == verdict


def test_a_node_that_ends_a_connection_and_then_refuses_is_lost_and_one_that_stays_is_not(tmp_path):
    """As a machine goes down while kiln looks: its sshd accepts a fresh connection and is killed (the connection
    ends), then nothing listens (refused). A real ssh against a local socket that does just that."""
    import socket
    import threading

    from bootstrap.commands import SshOptions
    from bootstrap.ssh import Remote

    def going(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        conn.close()
        listener.close()

    def staying(listener: socket.socket) -> None:  # ends every connection, and keeps listening
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    listeners, hosts = [], []
    for serve in (going, staying):
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)
        hosts.append(Host("127.0.0.1", listener.getsockname()[1]))
        threading.Thread(target=serve, args=(listener,), daemon=True).start()
    remote = Remote(SshOptions(control_path="none", known_hosts=(str(tmp_path / "known_hosts"),)))
    try:
        assert remote.unreachable(hosts, probes=3, pause=0.2) == [hosts[0]]
    finally:
        for listener in listeners:
            listener.close()
