"""The node side's agent (bootstrap/node.py, as the operator starts it on every node): it answers one JSON
request per line and leaves at the end of its input or at the end of its lifetime; names the node's /etc/hosts
lists are looked up without threads."""

from __future__ import annotations

import io
import json
import marshal
import os
import subprocess
import sys
import threading
import urllib.error
from pathlib import Path

import pytest

from bootstrap import mesh
from bootstrap import node as node_side
from bootstrap.hosts import Host
from bootstrap.ssh import NODE_DIGEST, NODE_SCRIPT, NODE_SOURCE, agent_command

ROOT = Path(__file__).resolve().parents[2]


def agent(*lifetime: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-S", "-c", NODE_SCRIPT, "serve", *lifetime], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_agent_answers_each_request_and_leaves_at_the_end_of_its_input():
    process = agent("60")
    requests = b"".join(node_side.request_frame({"verb": verb, "args": args, "input": None})
                        for verb, args in (("facts", ["", "localhost", ""]), ("no-such-verb", [])))
    out, err = process.communicate(requests, timeout=60)
    assert process.returncode == 0, err
    facts, unknown = (json.loads(line) for line in out.decode().splitlines())
    assert facts["ok"] and facts["result"]["resolve"]["localhost"]
    assert not unknown["ok"] and "unknown verb 'no-such-verb'" in unknown["error"]


def test_a_request_carries_its_input_as_given():
    payload = {"cluster": "c", "hosts": [["10.0.0.2", "n2"]], "text": "é\n\"x\"\\"}
    process = agent("60")
    request = node_side.request_frame({"verb": "mesh", "args": ["nothing"], "input": payload})
    out, err = process.communicate(request, timeout=60)
    assert process.returncode == 0, err
    assert json.loads(out) == {"ok": True, "result": {"changed": []}}  # parts neither "ssh" nor "hosts"


def test_an_agent_whose_input_never_ends_leaves_at_the_end_of_its_lifetime():
    process = agent("1")
    try:
        code = process.wait(timeout=30)  # stdin stays open: only the lifetime can end it
    finally:
        process.kill()
        process.communicate()
    assert code == -14  # SIGALRM


def test_the_agents_inputs_end_when_the_operator_has_exited_not_one_by_one_before(tmp_path):
    """At its exit the operator hands the agents' inputs to a helper (bootstrap.ssh.hold_until_exit): closing its
    own copies ends no agent; its exit ends them all."""
    ended = tmp_path / "ended"
    script = (
        "import subprocess, time\n"
        "from bootstrap import ssh\n"
        f"agent = subprocess.Popen(['sh', '-c', 'read _; echo ended > {ended}'], stdin=subprocess.PIPE)\n"
        "ssh.hold_until_exit([agent.stdin.fileno()])\n"
        "agent.stdin.close()\n"
        "time.sleep(1)\n"
        f"print(__import__('os').path.exists({str(ended)!r}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"  # its input still open: the helper holds it
    for _ in range(300):
        if ended.exists():
            break
        threading.Event().wait(0.1)
    assert ended.read_text() == "ended\n"  # the operator gone, the helper went, and the input ended


def test_the_agents_inputs_are_held_past_the_operators_exit_for_the_linger_asked(tmp_path):
    """Each agent's ssh is its node's shared connection: its input, held ControlPersist seconds past the operator's
    exit, keeps that connection for the next command meanwhile; then it ends."""
    ended = tmp_path / "ended"
    script = (
        "import subprocess\n"
        "from bootstrap import ssh\n"
        f"agent = subprocess.Popen(['sh', '-c', 'read _; echo ended > {ended}'], stdin=subprocess.PIPE,\n"
        "                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"  # run() waits on no agent
        "ssh.hold_until_exit([agent.stdin.fileno()], 4)\n"
        "agent.stdin.close()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    threading.Event().wait(1)
    assert not ended.exists()  # the operator gone a second ago: its input still held
    for _ in range(300):
        if ended.exists():
            break
        threading.Event().wait(0.1)
    assert ended.read_text() == "ended\n"


def test_the_names_in_a_hosts_file_are_read_past_comments_and_aliases(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n# 10.0.0.9 commented\n10.0.0.2 node2 node2.cluster  # kiln\n\n"
                     "::1 ip6-localhost ip6-loopback\n")
    monkeypatch.setattr(node_side, "HOSTS_FILE", str(hosts))
    assert node_side.hosts_file_names() == {"localhost", "node2", "node2.cluster", "ip6-localhost", "ip6-loopback"}
    monkeypatch.setattr(node_side, "HOSTS_FILE", str(tmp_path / "missing"))
    assert node_side.hosts_file_names() == set()


def test_every_name_gets_an_answer_in_order_and_one_that_does_not_resolve_gets_none():
    found = node_side.resolve_all(["localhost", "kiln-no-such-node.invalid", "localhost"], budget=5)
    assert list(found) == ["localhost", "kiln-no-such-node.invalid"]
    assert "127.0.0.1" in found["localhost"] and found["kiln-no-such-node.invalid"] == []


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2**70, 1.5, -0.0, 1e300, float("inf"), float("-inf"), "", "plain",
    "quote \" and back\\slash", "\x00\x01\x1f\x7f\n\r\t\b\f", "é ü 漢字", "emoji 🚀 𝄞", "lone \udcff surrogate",
    [], [1, "a", None, [2.5, {"k": False}]], (1, 2), {}, {"a": {"b": ["c", 1]}, "ünï": "x"},
    {1: "one", 2.5: "x", False: "f", None: "n"},
])
def test_the_agents_json_is_what_json_dumps_writes(value):
    assert node_side.dumps(value) == json.dumps(value)


def test_the_agents_json_says_what_it_cannot_write():
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        node_side.dumps({1, 2})
    assert node_side.dumps(float("nan")) == "NaN" and json.loads(node_side.dumps([float("nan")]))[0] != 0


@pytest.mark.parametrize(("body", "said"), [
    (b'{"error": {"code": "AuthorizationFailed", "message": "The client\\n  may not."}}',
     "could not go: HTTP 403 AuthorizationFailed: The client may not."),
    (b'{"error": "invalid_request", "error_description": "Identity not found"}',
     "could not go: HTTP 403 invalid_request: Identity not found"),
    (b"null", "could not go: HTTP 403"), (b"[1]", "could not go: HTTP 403"), (b"<html>", "could not go: HTTP 403"),
    (b"", "could not go: HTTP 403"),
])
def test_a_refused_azure_call_is_one_line_whatever_its_body(body, said):
    refused = urllib.error.HTTPError("https://x", 403, "Forbidden", {}, io.BytesIO(body))
    assert "could not go: HTTP 403" + node_side.said_by(refused) == said


def written(path, text: str) -> None:
    """`text` in `path` whole at once, as the node's wrappers write their files (a rename): a look never reads it
    half written."""
    path.with_suffix(".tmp").write_text(text)
    os.replace(path.with_suffix(".tmp"), path)


def running_task(run_dir, task: str) -> None:
    (run_dir / f"{task}.pid").write_text(str(os.getpid()))  # this process: alive for the test's length


@pytest.mark.timeout(30)  # a look that waited its whole minute fails here
def test_a_waiting_look_answers_when_a_task_ends_there(tmp_path):
    running_task(tmp_path, "worker-0")
    running_task(tmp_path, "worker-1")
    threading.Timer(0.3, written, [tmp_path / "worker-1.exit", "0\n"]).start()
    answer = node_side.look(str(tmp_path), 60.0, ["worker-0", "worker-1"])
    assert answer["tasks"]["worker-1"] == {"state": "exited", "code": 0}
    assert answer["tasks"]["worker-0"]["state"] == "running" and answer["notice"] is None


@pytest.mark.timeout(30)  # a look that waited its whole minute fails here
def test_a_waiting_look_answers_when_a_notice_comes(tmp_path):
    running_task(tmp_path, "worker-0")
    threading.Timer(0.3, written, [tmp_path / "notice.json", '{"action": "terminate"}']).start()
    answer = node_side.look(str(tmp_path), 60.0, ["worker-0"])
    assert answer["notice"] == {"action": "terminate"} and answer["tasks"]["worker-0"]["state"] == "running"


def test_a_look_with_nothing_changing_gives_the_states_it_found(tmp_path):
    running_task(tmp_path, "worker-0")
    (tmp_path / "worker-1.exit").write_text("3\n")
    answer = node_side.look(str(tmp_path), 0.2, ["worker-0", "worker-1", "worker-2"])
    assert answer["tasks"] == {"worker-0": {"state": "running", "pid": os.getpid()},
                               "worker-1": {"state": "exited", "code": 3}, "worker-2": {"state": "starting"}}


@pytest.mark.timeout(30)  # a look that waited its whole minute fails here
def test_a_node_with_nothing_running_answers_a_waiting_look_at_once(tmp_path):
    """Its processes ended, or it has none of its own (a horovod run's other nodes): the watch's look round
    waits on the nodes where processes run, not on this one."""
    (tmp_path / "worker-1.exit").write_text("0\n")
    assert node_side.look(str(tmp_path), 60.0, ["worker-1"])["tasks"] == {"worker-1": {"state": "exited", "code": 0}}
    assert node_side.look(str(tmp_path), 60.0, []) == {"tasks": {}, "notice": None}


@pytest.mark.parametrize(("flags", "asked"), [((), True), (("bare",), False), (("signs", "bare"), False)])
def test_progress_asks_docker_for_the_runs_container_only_where_the_run_may_have_one(tmp_path, flags, asked):
    """A run without containers (`bare`, as the supervisor says of one) is found in /proc alone: no docker call on
    every node at every look. The docker on PATH here only notes that it was called."""
    (tmp_path / "bin").mkdir()
    calls = tmp_path / "calls"
    docker = tmp_path / "bin" / "docker"
    docker.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexit 1\n")
    docker.chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    done = subprocess.run([sys.executable, "-S", "-c", NODE_SCRIPT, "progress", "r-bare", str(run_dir), *flags],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["stopped"] == [] and ("activity" in answer) == ("signs" in flags)
    assert calls.exists() == asked, calls.read_text() if calls.exists() else "docker was not called"
    if asked:
        assert calls.read_text().split()[:1] == ["inspect"]


def test_a_container_runs_access_is_written_authorized_for_the_run_alone_and_taken_away_at_its_stop(tmp_path,
                                                                                                    monkeypatch):
    """node.py container_access beside the cluster's own authorized key, then revoke (stop): the run's line and
    folder go, the cluster's line stays."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh" / "kiln").mkdir(parents=True)
    cluster_line = "from=\"10.0.0.1\" ssh-ed25519 AAAAcluster kiln-c1"
    (tmp_path / ".ssh" / "authorized_keys").write_text(cluster_line + "\n")
    node_side.container_access({"run_id": "r1", "private_key": "PRIVATE\n", "known_hosts": "node1 ssh-ed25519 AAAAn1\n",
                           "ssh_config": "Host node1\n", "authorized": "restrict,command=\"x\" ssh-ed25519 AAAAr1 "
                                                                        "kiln-run-r1"})
    folder = tmp_path / ".ssh" / "kiln-runs" / "r1"
    assert (folder / "id_ed25519").read_text() == "PRIVATE\n"
    assert oct((folder / "id_ed25519").stat().st_mode & 0o777) == "0o600"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert (tmp_path / ".ssh" / "authorized_keys").read_text().splitlines() == [
        cluster_line, 'restrict,command="x" ssh-ed25519 AAAAr1 kiln-run-r1']
    node_side.revoke_container_access("r1")
    assert (tmp_path / ".ssh" / "authorized_keys").read_text().splitlines() == [cluster_line]
    assert not folder.exists()
    node_side.revoke_container_access("r1")  # again, or on a node that never had it: nothing to do


# /proc/self/mountinfo as a cgroup v1 machine (systemd's mounts, net_cls with net_prio) and a cgroup v2 one show it.
MOUNTINFO_V1 = """\
24 29 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 24 0:24 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
33 26 0:31 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec shared:15 - cgroup cgroup rw,net_cls,net_prio
34 26 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,memory
"""
MOUNTINFO_V2 = "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_the_net_cls_hierarchy_is_found_where_it_is_mounted_and_nowhere_else():
    assert node_side.cgroup_v1_mount(MOUNTINFO_V1, "net_cls") == "/sys/fs/cgroup/net_cls,net_prio"
    assert node_side.cgroup_v1_mount(MOUNTINFO_V1, "memory") == "/sys/fs/cgroup/memory"
    assert node_side.cgroup_v1_mount(MOUNTINFO_V2, "net_cls") is None
    assert node_side.cgroup_v1_mount(MOUNTINFO_V1, "net_prio") == "/sys/fs/cgroup/net_cls,net_prio"
    assert node_side.cgroup_v1_mount(MOUNTINFO_V1, "net") is None  # a controller, not a prefix of one


def test_every_metadata_address_is_rejected_for_the_containers_cgroup_ipv6_by_ip6tables():
    rules = node_side.guard_rules("kiln-containers", ["--cgroup", "1263271937"])
    assert [(tool, rule[2]) for tool, rule in rules] == [
        ("iptables", "169.254.169.254"), ("iptables", "168.63.129.16"), ("ip6tables", "fd00:ec2::254")]
    assert rules[0][1] == ["OUTPUT", "-d", "169.254.169.254", "-m", "cgroup", "--cgroup", "1263271937",
                           "-m", "comment", "--comment", "kiln-containers", "-j", "REJECT"]
    assert node_side.GUARD_CLASSID == 1263271937


def test_rules_of_a_slice_since_removed_are_the_ones_taken_out():
    """Under cgroup v2 a rule holds the cgroup it was made for: one made for an earlier kiln.slice (another inode)
    matches nothing now and goes; the current one, the v1 class rule and others' rules stay."""
    listing = ('-P OUTPUT ACCEPT\n'
               '-A OUTPUT -d 169.254.169.254/32 -m cgroup --path "/kiln.slice" -m comment --comment '
               'kiln-containers-11 -j REJECT --reject-with icmp-port-unreachable\n'
               '-A OUTPUT -d 169.254.169.254/32 -m cgroup --path "/kiln.slice" -m comment --comment '
               'kiln-containers-12 -j REJECT --reject-with icmp-port-unreachable\n'
               '-A OUTPUT -d 169.254.169.254/32 -m cgroup --cgroup 1263271937 -m comment --comment kiln-containers '
               '-j REJECT --reject-with icmp-port-unreachable\n'
               '-A OUTPUT -d 10.0.0.1/32 -m comment --comment "theirs" -j DROP\n')
    assert node_side.stale_rules(listing, "kiln-containers-12") == [
        ["-D", "OUTPUT", "-d", "169.254.169.254/32", "-m", "cgroup", "--path", "/kiln.slice", "-m", "comment",
         "--comment", "kiln-containers-11", "-j", "REJECT", "--reject-with", "icmp-port-unreachable"]]


def loaded_agent(home, *requests: tuple[str, list[str]]) -> list[dict]:
    """Start the agent as the operator does (bootstrap.ssh.agent_command: the loader, node.py's source on its
    input ahead of the requests) with `home` as its home; its answers."""
    command = agent_command(sys.executable, 60)
    frames = b"".join(node_side.request_frame({"verb": verb, "args": args, "input": None}) for verb, args in requests)
    done = subprocess.run(["sh", "-c", command], input=NODE_SOURCE + frames, capture_output=True, timeout=60,
                          env={**os.environ, "HOME": str(home)})
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def test_the_agent_keeps_its_compiled_code_in_the_users_cache_and_runs_it_on_its_next_start(tmp_path):
    folder = tmp_path / ".cache" / "kiln" / "agent"
    folder.mkdir(parents=True)
    (folder / "0123456789abcdef0123.cpython-30-0").write_bytes(b"another kiln's")
    first, = loaded_agent(tmp_path, ("facts", ["", "", ""]))
    assert first["ok"] and first["result"]["home"] == str(tmp_path)
    kept, = folder.iterdir()  # the other version's file is gone
    assert kept.name.startswith(NODE_DIGEST) and kept.stat().st_mode & 0o777 == 0o600
    # the next start runs what it kept, not the source it is sent: a kept program that answers otherwise shows it
    kept.write_bytes(marshal.dumps(compile("print('{\"kept\": 1}')", "kept", "exec")))
    assert loaded_agent(tmp_path, ("facts", ["", "", ""])) == [{"kept": 1}]


def test_an_unreadable_kept_file_is_compiled_again_and_an_unwritable_folder_costs_only_the_compile(tmp_path):
    folder = tmp_path / ".cache" / "kiln" / "agent"
    folder.mkdir(parents=True)
    name = f"{NODE_DIGEST}.{sys.implementation.cache_tag}-{sys.hexversion:x}"
    (folder / name).write_bytes(b"\x00not marshal")
    answer, = loaded_agent(tmp_path, ("facts", ["", "", ""]))
    assert answer["ok"]
    assert marshal.loads((folder / name).read_bytes()).co_filename == "node.py"
    home = tmp_path / "file-home"  # a home where nothing can be written (root writes through modes: a file)
    home.write_text("")
    answer, = loaded_agent(home, ("facts", ["", "", ""]))
    assert answer["ok"] and answer["result"]["home"] == str(home)


AUDITED = ("open", "os.listdir", "os.scandir", "subprocess.Popen", "os.posix_spawn", "socket.getaddrinfo",
           "socket.gethostbyname", "socket.connect")


def test_one_nodes_facts_cost_no_more_than_their_budget():
    """What gathering one node's facts costs, counted by Python's audit events (files opened, folders listed,
    processes started, names looked up): every kiln command pays it on every node, so a fact that adds any fails
    here, to be weighed in review rather than found at 1000 nodes. The budget is what the facts read on any node
    (fixed), and what grows with the node: its site folders, host keys, PCI devices (three reads for each NVIDIA
    GPU's), RDMA devices."""
    def listed(folder):
        return sorted(os.listdir(folder)) if os.path.isdir(folder) else []

    pci = listed(node_side.PCI_DEVICES)
    nvidia = [name for name in pci
              if node_side.read_text(f"{node_side.PCI_DEVICES}/{name}/vendor").strip() == node_side.NVIDIA_PCI_VENDOR]
    sites = node_side.site_dirs()
    keys = [name for name in listed("/etc/ssh") if name.startswith("ssh_host_") and name.endswith("_key.pub")]
    rdma = listed(node_side.RDMA_DEVICES)
    venv = os.path.exists(os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "pyvenv.cfg"))
    budget = {"open": 4 + venv + len(keys) + len(pci) + 2 * len(nvidia) + 2 * len(rdma),
              "os.listdir": 4 + len(sites), "socket.getaddrinfo": 1}
    script = ("import collections, json, sys\n"
              "from bootstrap import node\n"
              "node.facts([], [], None)\n"  # the modules it imports, imported once as the agent has them
              "counted = collections.Counter()\n"
              f"sys.addaudithook(lambda event, args: counted.update([event]) if event in {AUDITED!r} else None)\n"
              "node.facts([], [], None)\n"
              "print(json.dumps(counted))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    counted = json.loads(done.stdout)
    over = {event: (count, budget.get(event, 0)) for event, count in counted.items() if count > budget.get(event, 0)}
    assert not over, f"one node's facts cost more than their budget (counted, budget): {over}"


def test_the_mesh_asks_a_node_for_what_it_reads_and_the_node_gathers_those_alone():
    """`kiln mesh` asks each node for mesh.FACTS only (a round of 1000 nodes need not read their packages, GPUs and
    devices): the node answers those, reading no site folder, PCI or RDMA device, and the mesh makes its nodes from
    them as from every fact."""
    gathered = node_side.facts([], [], None, list(mesh.FACTS))
    assert set(gathered) == set(mesh.FACTS)
    everything = node_side.facts([], [], None)
    assert {key: everything[key] for key in mesh.FACTS} == gathered
    host = Host("node1")
    [few], [every] = mesh.nodes_from_facts({host: gathered}), mesh.nodes_from_facts({host: everything})
    assert (few.name, few.address, few.iface) == (every.name, every.address, every.iface)
    script = ("import collections, json, sys\n"
              "from bootstrap import mesh, node\n"
              "node.facts([], [], None)\n"
              "counted = collections.Counter()\n"
              "sys.addaudithook(lambda event, args: counted.update([str(args[0])])\n"
              "                 if event == 'os.listdir' else None)\n"
              "node.facts([], [], None, list(mesh.FACTS))\n"
              "print(json.dumps(counted))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert not {node_side.PCI_DEVICES, node_side.RDMA_DEVICES, *node_side.site_dirs()} & set(listed), listed


def test_the_memlock_limit_is_the_kernels_hard_limit(tmp_path):
    import resource

    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    assert node_side.memlock_limit() == (-1 if hard == resource.RLIM_INFINITY else hard)
    table = tmp_path / "limits"
    table.write_text("Limit                     Soft Limit           Hard Limit           Units     \n"
                     "Max locked memory         65536                unlimited            bytes     \n")
    assert node_side.memlock_limit(str(table)) == -1
    table.write_text(table.read_text().replace("unlimited ", "8388608   "))
    assert node_side.memlock_limit(str(table)) == 8388608


def test_a_stop_of_the_run_is_not_one_of_its_processes_the_watcher_still_is():
    """The interruption watcher becomes `node.py stop RUN` on a notice: a second stop (the operator's) leaves it to
    finish and report; the watcher itself is one of the run's helpers."""
    stopping = b"\0".join([b"/opt/kiln/venv/bin/python", b"-S", b"/root/kiln/lib/node.py", b"stop", b"run-1", b"90"])
    watching = b"\0".join([b"/opt/kiln/venv/bin/python", b"/root/kiln/lib/shim/interruption.py", b"--source", b"any"])
    training = b"\0".join([b"python", b"train.py", b"--stop", b"3"])
    assert node_side.is_stopping(stopping) and not node_side.is_helper(stopping)
    assert node_side.is_helper(watching) and not node_side.is_stopping(watching)
    assert not node_side.is_stopping(training) and not node_side.is_helper(training)


def test_a_fact_asked_for_by_a_name_the_node_does_not_know_is_an_error_not_a_silence():
    with pytest.raises(ValueError, match="no fact named hostnme"):
        node_side.facts([], [], None, ["hostname", "hostnme"])
