"""Local cluster: N sshd "nodes" built from Linux namespaces, standing in for cloud VMs.

usage: local-cluster up [N] [--name NAME] [--subnet CIDR] [--metadata] [--docker] [--start M]  # N=3, NAME=kiln
       local-cluster down [--name NAME]
       local-cluster add NODE... [--name NAME]    # boot slots (up --start M leaves N - M of them)
       local-cluster remove NODE... [--name NAME] # delete nodes as a cloud deletes machines; their slots stay
       local-cluster lose NODE [--name NAME]      # the node's machine is gone: processes, network, disk
       local-cluster replace NODE [--name NAME]   # a fresh machine in its place: same address, new host keys
       local-cluster interrupt NODE [--name NAME] # post a spot interruption notice on the node (--metadata)
       local-cluster exhaust [--name NAME] [--times N]  # its next N replacements find no capacity
       local-cluster exhaust --zone Z [--times 0]       # local zone Z has no capacity (0: has it again)
       local-cluster status [--name NAME] [--json]
       local-cluster env [--name NAME]    # set -a; eval "$(local-cluster env)"; set +a

Node i of cluster NAME: network namespace NAME-n{i} on bridge NAME-br (veth NAME-v{i}, eth0 inside), hostname
node{i}, private bind mounts over /etc/ssh, /etc/hosts, /etc/resolv.conf, /root/.ssh and /root/kiln, its own sshd
on port 22.
The operator reaches nodes with a per-cluster key and pinned host keys: `ssh -F STATE/ssh_config node2 hostname`.
State: /run/kiln/local/NAME/. `down` finds everything by name, so it also works after a crash or without the
state directory. With `up --metadata`, every node has its own stand-in metadata service of EC2, GCE and Azure (IMDSv2,
localcloud.imds) at 169.254.169.254 inside its network, where `interrupt` posts a spot interruption notice.
With `up --docker`, every node has its own Docker engine (dockerd in the node's namespaces, images under
/var/lib/kiln-local/NAME/NODE; sessions get DOCKER_HOST pointing at it) and the cluster has a registry, at
GATEWAY:5000 for the nodes and on a loopback port for this machine's engine to push to (status --json names
both); nothing of the host's iptables changes.
With `up --start M`, only nodes 1 to M are booted; the others are slots: planned (names, addresses) but not
made, until `add` boots them (a queue's nodes, made when jobs wait and removed when idle: `remove`).
A replaced node starts with an empty /root/kiln and new host keys (the operator's known_hosts in the state
directory pins them; the old ones are removed), as a cloud replacement would.
Needs root, iproute2, util-linux and openssh.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from kiln import proc
from kiln.errors import KilnError, UsageError, run_main
from kiln.hostkeys import without_hosts
from kiln.paths import PROJECT
from kiln.sshwait import probe_ssh, wait_for_ssh
from localcloud import engines
from localcloud import netns as plan  # the pure half: names, addresses, file texts
from localcloud.imds import AZURE_EVICTED, GCE_PREEMPTED, notice_text

TOOLS = ("ip", "unshare", "mount", "ssh", "ssh-keygen", plan.SSHD)
WORKERS = min(32, 4 * (os.cpu_count() or 1))  # bound for fan-outs that spawn processes
PROBES = 64  # bound for concurrent SSH probes (they mostly wait)


# ---------------------------------------------------------------- edges: processes, kernel, disk

def run(argv: list[str], *, stdin: str | None = None, timeout: float = 30, check: bool = True) -> str:
    """Run argv and return its stdout (kiln.proc.run: bounded, a failure names the command)."""
    return proc.run(argv, input=stdin, timeout=timeout, check=check, tail_lines=3).stdout


def find_netns(name: str) -> list[str]:
    """Namespaces of cluster name: exactly NAME-n<digits> (kiln never matches kiln2-n1)."""
    pattern = re.compile(rf"{re.escape(name)}-n[0-9]+")
    entries = json.loads(run(["ip", "-j", "netns", "list"]) or "[]")
    return sorted((e["name"] for e in entries if pattern.fullmatch(e["name"])), key=lambda ns: (len(ns), ns))


def find_links(name: str) -> list[str]:
    """Root-namespace links of cluster name: the bridge and host-side veths NAME-v<digits>."""
    pattern = re.compile(rf"{re.escape(name)}-(br|v[0-9]+)")
    links = json.loads(run(["ip", "-j", "link", "show"]) or "[]")
    return [link["ifname"] for link in links if pattern.fullmatch(link["ifname"])]


def used_networks() -> list[tuple[str, ipaddress.IPv4Network]]:
    """(device, network) of every IPv4 address in the root namespace."""
    links = json.loads(run(["ip", "-j", "-4", "addr", "show"]) or "[]")
    return [(link["ifname"], ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
            for link in links for a in link.get("addr_info", [])]


def namespace_pids(netns: list[str]) -> list[int]:
    """Pids whose network namespace is one of netns (what `ip netns pids` does, in one pass)."""
    wanted = {ns_id(f"/run/netns/{ns}") for ns in netns} - {None}
    return [int(pid) for pid in (os.listdir("/proc") if wanted else [])
            if pid.isdigit() and ns_id(f"/proc/{pid}/ns/net") in wanted]


def ns_id(path: str) -> tuple[int, int] | None:
    """Identity of the namespace a path refers to; None if it is gone (or a zombie's)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def kill_namespace_processes(netns: list[str], grace: float = 3.0, *, abrupt: bool = False) -> None:
    """SIGTERM every process in the namespaces, SIGKILL what is left after grace seconds (`abrupt`: SIGKILL at
    once, as a machine that loses its power). Each poll signals the processes forked since the last one (an sshd
    that accepts a connection between the listing and its own kill leaves a child no single pass sees)."""
    steps = ((signal.SIGTERM, grace),) if not abrupt else ()
    pids: list[int] = []
    for sig, wait in (*steps, (signal.SIGKILL, 10.0)):
        signalled: set[int] = set()
        deadline = time.monotonic() + wait
        while (pids := namespace_pids(netns)) and time.monotonic() < deadline:
            # a second SIGTERM may mean "now" to a program's handler: SIGTERM once each, SIGKILL every poll
            for pid in pids if sig == signal.SIGKILL else set(pids) - signalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            signalled.update(pids)
            time.sleep(0.1)
        if not pids:
            return
    raise UsageError(f"processes survived SIGKILL in {netns[0]}...: {describe_pids(pids[:10])}")


def describe_pids(pids: list[int]) -> str:
    """pid, state and name of each process, as /proc shows them (D: waits in the kernel, which no signal ends)."""
    described = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()[0]
        described.append(f"{pid} {state} {name}")
    return ", ".join(described) or "gone as this was written"


def teardown(name: str, timeout: float = 60) -> bool:
    """Remove everything cluster name made: processes, namespaces, links, state. Return whether any existed."""
    netns, state = find_netns(name), plan.STATE_ROOT / name
    kill_namespace_processes(netns)  # the nodes' Docker engines and containers too
    engines.stop_registries(name)
    links = sorted(find_links(name), key=lambda link: link.endswith("-br"))  # the bridge last
    existed = bool(netns or links or state.exists() or engines.engine_leftovers(name, netns))
    if netns or links:  # -force: go on past errors; what is left is checked below
        run(["ip", "-force", "-batch", "-"], stdin=plan.teardown_batch(netns, links), timeout=timeout, check=False)
    deadline = time.monotonic() + timeout  # veths of deleted namespaces vanish asynchronously
    while (left := find_netns(name) + find_links(name)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        raise KilnError(f"could not remove {', '.join(left[:5])} of cluster {name}")
    engines.remove_engine_files(name, netns)
    shutil.rmtree(state, ignore_errors=True)
    return existed


def write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


def make_mountpoints() -> None:
    """Where a node's private folders are mounted, on this machine (a node mounts over them)."""
    for mountpoint, mode in (("/root/.ssh", 0o700), ("/root/kiln", 0o755), ("/run/sshd", 0o755),
                             ("/run/munge", 0o755), ("/var/lib/kiln-slurm", 0o755)):
        os.makedirs(mountpoint, mode=mode, exist_ok=True)  # never touches what is there


def boot_node(cluster: plan.Cluster, node: plan.Node, node_dir: Path, operator_pub: str, *,
              docker: bool = False) -> plan.NodeBoot:
    """Write a node's keys and files, configure its network, start its sshd detached."""
    make_mountpoints()  # a replacement or a slot booted later: /run is emptied by a reboot
    for sub, mode in (("etc-ssh", 0o755), ("ssh", 0o700), ("kiln", 0o755), ("munge", 0o755), ("kiln-slurm", 0o755)):
        (node_dir / sub).mkdir(parents=True)
        (node_dir / sub).chmod(mode)
    etc = node_dir / "etc-ssh"
    for kind in ("ed25519", "ecdsa"):
        run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"root@{node.name}", "-f",
             str(etc / f"ssh_host_{kind}_key")])
    engine = plan.node_engine(cluster.name, node) if docker else None
    write(etc / "sshd_config", plan.sshd_config_text(node, engine.docker_host if engine else None))
    write(etc / "kiln-local-node", f"{cluster.name} {node.name}\n")  # node.py: powering off kills this node only
    if Path("/etc/ssh/ssh_config").is_file():  # the image's ssh client defaults
        shutil.copy2("/etc/ssh/ssh_config", etc / "ssh_config")
    write(node_dir / "hosts", plan.hosts_text(node))
    write(node_dir / "resolv.conf", plan.resolv_text())
    write(node_dir / "ssh" / "authorized_keys", operator_pub, 0o600)
    dotfiles = tuple(name for name in plan.NODE_DOTFILES if Path("/root", name).is_file())
    (node_dir / "dotfiles").mkdir()
    for name in dotfiles:
        skeleton = Path("/etc/skel", name)
        write(node_dir / "dotfiles" / name, skeleton.read_text() if skeleton.is_file() else "")
    write(node_dir / "fstab", plan.fstab_text(node_dir, dotfiles))
    run(["ip", "-n", node.netns, "-batch", "-"], stdin=plan.node_batch(cluster, node))
    with open(node_dir / "boot.log", "wb") as log:  # sshd itself logs to etc-ssh/sshd.log
        unified = Path("/sys/fs/cgroup/cgroup.controllers").exists()  # this machine's cgroups are v2
        proc = subprocess.Popen(plan.boot_argv(node, node_dir, unified=unified), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
    keys = [(etc / f"ssh_host_{kind}_key.pub").read_text() for kind in ("ed25519", "ecdsa")]
    return plan.NodeBoot(node, proc, plan.known_hosts_lines(node, keys))


def start_engines(cluster: plan.Cluster, boots: list[plan.NodeBoot], state: Path) -> None:
    """Start every booted node's Docker engine (inside its namespaces, entered through its sshd) and wait until
    each answers."""
    address = plan.registry_address(cluster)
    started = [(boot.node, plan.node_engine(cluster.name, boot.node), state / boot.node.name / "dockerd.log")
               for boot in boots]
    processes = [engines.start_engine(node, engine, boot.proc.pid, address, log)
                 for boot, (node, engine, log) in zip(boots, started, strict=True)]
    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(lambda item: engines.wait_engine(item[0][0], item[0][1], item[1], item[0][2]),
                      zip(started, processes, strict=True)))


def start_metadata(node: plan.Node, node_dir: Path, timeout: float = 30) -> None:
    """Serve the node's stand-in metadata service at the clouds' address in its network (a fresh instance id); wait
    until it listens."""
    run(["ip", "-n", node.netns, "addr", "add", f"{plan.METADATA_ADDRESS}/32", "dev", "lo"])
    argv = plan.metadata_argv(sys.executable, node, node_dir, f"i-{secrets.token_hex(8)}")
    with open(node_dir / "imds.log", "wb") as log:
        server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                  cwd=PROJECT)
    deadline = time.monotonic() + timeout
    while not (node_dir / "imds.ready").exists():
        if server.poll() is not None or time.monotonic() > deadline:
            said = (node_dir / "imds.log").read_text(errors="replace").strip().splitlines()
            raise KilnError(f"{node.name}: the stand-in metadata service did not start: "
                            f"{said[-1] if said else f'exit {server.poll()}'}")
        time.sleep(0.02)


def wait_for_sshd(boots: list[plan.NodeBoot], state: Path, timeout: float) -> None:
    """Wait until every node's sshd sends its banner; name the node whose sshd died or never answered."""
    by_endpoint = {(boot.node.ip, 22): boot for boot in boots}
    silent = wait_for_ssh(list(by_endpoint), timeout, attempt_timeout_s=1.0, retry_s=0.05,
                          alive=lambda endpoint: by_endpoint[endpoint].proc.poll() is None)
    if not silent:
        return
    pending = [by_endpoint[(ip, 22)] for ip in (endpoint.rsplit(":", 1)[0] for endpoint in silent)]
    for boot in pending:
        if boot.proc.poll() is not None:
            logs = [state / boot.node.name / log for log in ("boot.log", "etc-ssh/sshd.log")]
            lines = [line for log in logs if log.exists() for line in log.read_text(errors="replace").splitlines()]
            raise KilnError(f"{boot.node.name}: sshd exited with {boot.proc.returncode}: "
                            f"{lines[-1] if lines else 'no output'}")
    node = pending[0].node
    raise KilnError(f"{node.name} ({node.ip}) did not accept ssh connections within {timeout:.0f} s "
                    f"({len(pending)} of {len(boots)} nodes not answering)")


def verify_login(nodes: tuple[plan.Node, ...], state: Path) -> None:
    """One real login on the first node, which also checks that it reaches the last over the bridge."""
    first, target = nodes[0].name, nodes[-1].ip
    probe = f"import socket; print(socket.gethostname()); socket.create_connection(({target!r}, 22), 5)"
    argv = ["ssh", "-F", str(state / "ssh_config"), first, shlex.join(["python3", "-c", probe])]
    try:
        out = run(argv, timeout=30).strip()
    except KilnError as exc:
        raise KilnError(f"login to {first}, or {first} -> {target}:22 over the cluster's bridge, failed: {exc} "
                           "(bridged traffic filtered? see /proc/sys/net/bridge/bridge-nf-call-iptables "
                           "and the iptables FORWARD chain)") from None
    if out != first:
        raise KilnError(f"{first} reports hostname {out!r}, not {first}")


@contextlib.contextmanager
def nodes_lock(name: str):
    """Held by one loss or replacement of cluster name's nodes at a time: a loss still waiting for the kernel to
    free a namespace asks it again to delete that name, which would delete a replacement booted under it meanwhile
    (kiln's recovery replaces a node the moment it stops answering, while the loss that took it may still run)."""
    with open(plan.STATE_ROOT / name / ".nodes.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def lose_node(name: str, node: plan.Node, timeout: float = 60) -> None:
    """Take a node away as a lost machine goes: its processes killed at once, its network and disk removed."""
    with nodes_lock(name):
        remove_node(name, node, timeout)


def remove_node(name: str, node: plan.Node, timeout: float) -> None:
    kill_namespace_processes([node.netns], abrupt=True)
    batch = plan.teardown_batch([node.netns], [node.veth])
    run(["ip", "-force", "-batch", "-"], stdin=batch, timeout=timeout, check=False)
    engine = plan.node_engine(name, node)  # its disk is gone with it: the engine's images too
    shutil.rmtree(engine.data_root, ignore_errors=True)
    shutil.rmtree(engine.exec_root, ignore_errors=True)
    for left in (engine.pidfile, engine.socket):
        left.unlink(missing_ok=True)
    deadline = time.monotonic() + timeout
    while left := [x for x, found in ((node.netns, find_netns(name)), (node.veth, find_links(name))) if x in found]:
        if time.monotonic() > deadline:
            held = namespace_pids([node.netns])
            raise KilnError(f"could not remove {' and '.join(left)} of cluster {name}: still there after "
                            f"{timeout:g}s ({'held by ' + describe_pids(held) if held else 'no process in it'})")
        time.sleep(0.5)  # the kernel frees a namespace's devices in its own time; ask again meanwhile
        run(["ip", "-force", "-batch", "-"], stdin=batch, timeout=timeout, check=False)
    shutil.rmtree(plan.STATE_ROOT / name / node.name, ignore_errors=True)


class NoCapacity(KilnError):
    """The local cloud has no machine for a replacement now (`exhaust`): as a cloud's zone that preemption
    emptied."""

    code = "NoLocalCapacity"


def exhausted_path(name: str) -> Path:
    return plan.STATE_ROOT / name / "exhausted"


ZONE = re.compile(r"[a-z0-9][a-z0-9-]{0,30}")


def zone_path(zone: str) -> Path:
    if not ZONE.fullmatch(zone):
        raise UsageError(f"--zone {zone!r}: lowercase letters, digits and '-'")
    return plan.STATE_ROOT / ".zones" / zone


def zone_empty(zone: str) -> bool:
    return zone_path(zone).exists()


def take_capacity(name: str) -> None:
    """Refuse this replacement where the cluster's zone has no capacity, or where the cluster was exhausted: one
    refusal fewer left (taken under the nodes lock)."""
    zone_file = plan.STATE_ROOT / name / "zone"
    zone = zone_file.read_text().strip() if zone_file.is_file() else ""
    if zone and zone_empty(zone):
        raise NoCapacity(f"no capacity for a replacement in local zone {zone} (local-cluster exhaust --zone {zone})")
    path = exhausted_path(name)
    text = path.read_text().strip() if path.is_file() else ""
    left = int(text) if text.isdigit() else 0
    if left <= 0:
        return
    if left == 1:
        path.unlink()
    else:
        write(path, str(left - 1))
    raise NoCapacity(f"no capacity for a replacement in the local cloud of cluster {name} (exhausted: "
                     f"{left - 1} more refusal(s) to come)")


def replace_node(name: str, node: plan.Node, timeout: float = 60) -> list[str]:
    """Boot a fresh node in `node`'s place (lost first if still there): same name and address, empty disk, new
    host keys, pinned in the operator's known_hosts instead of the old ones. Its known_hosts lines. Where the
    cluster was exhausted (`exhaust`), NoCapacity instead, and the old node stays as it is."""
    with nodes_lock(name):
        take_capacity(name)
        remove_node(name, node, timeout)
        return boot_nodes(name, [node], timeout)[node.name]


def add_nodes(name: str, slots: list[plan.Node], timeout: float = 60) -> dict[str, list[str]]:
    """Boot the cluster's slots `slots` (planned by `up --start`, or taken away by `remove_nodes`): each a fresh
    machine with an empty disk and new host keys, pinned in the operator's known_hosts. Each one's known_hosts
    lines, by name. A slot that is up is refused by name; where the cluster's zone, or the cluster, has no
    capacity (`exhaust`), NoCapacity, and nothing is booted."""
    with nodes_lock(name):
        up = [node.name for node in slots if node_is_up(name, node)]
        if up:
            raise UsageError(f"cluster {name}: {', '.join(up)} {'is' if len(up) == 1 else 'are'} up already")
        take_capacity(name)
        try:
            return boot_nodes(name, slots, timeout)
        except BaseException:  # a slot half booted is taken away again: nothing is left running
            for node in slots:
                with contextlib.suppress(KilnError):
                    remove_node(name, node, timeout)
            forget_hosts(name, slots)
            mark_up(name, {node.name: False for node in slots})
            raise


def remove_nodes(name: str, nodes: list[plan.Node], timeout: float = 60) -> None:
    """Take the nodes away as a machine deleted goes (processes, network, disk), their pins out of the operator's
    known_hosts; their slots stay planned, for `add_nodes` (safe to repeat)."""
    with nodes_lock(name):
        for node in nodes:
            remove_node(name, node, timeout)
        forget_hosts(name, nodes)
        mark_up(name, {node.name: False for node in nodes})


def node_is_up(name: str, node: plan.Node) -> bool:
    return next(entry.get("up", True) for entry in load_nodes(name) if entry["name"] == node.name)


def mark_up(name: str, changed: dict[str, bool]) -> None:
    """Record which slots are up in nodes.json (under the nodes lock)."""
    nodes = [dict(entry, up=changed.get(entry["name"], entry.get("up", True))) for entry in load_nodes(name)]
    path = plan.STATE_ROOT / name / "nodes.json"
    write(path.with_suffix(".json.new"), json.dumps(nodes, indent=1) + "\n")
    path.with_suffix(".json.new").replace(path)


def forget_hosts(name: str, nodes: list[plan.Node]) -> None:
    known = plan.STATE_ROOT / name / "known_hosts"
    write(known, without_hosts(known.read_text(), [word for node in nodes for word in (node.name, node.ip)]))


def boot_nodes(name: str, nodes: list[plan.Node], timeout: float) -> dict[str, list[str]]:
    """Boot each node (its namespace absent) as `up` booted the cluster's: with its metadata service and Docker
    engine where the cluster's nodes have them; wait for its sshd and pin its keys (under the nodes lock). Each
    one's known_hosts lines, by name."""
    entries, state = load_nodes(name), plan.STATE_ROOT / name
    cluster = plan.cluster_from_nodes(name, entries)
    docker, metadata = bool(entries[0].get("docker")), bool(entries[0].get("metadata"))
    run(["ip", "-batch", "-"], stdin="".join(plan.node_root_batch(cluster, node) for node in nodes), timeout=timeout)
    operator_pub = (state / "operator_key.pub").read_text()
    boots = [boot_node(cluster, node, state / node.name, operator_pub, docker=docker) for node in nodes]
    if metadata:
        for node in nodes:
            start_metadata(node, state / node.name)
    wait_for_sshd(boots, state, timeout)
    if docker:
        start_engines(cluster, boots, state)
    forget_hosts(name, nodes)  # read and written under the lock: replacements side by side keep theirs
    known = state / "known_hosts"
    write(known, known.read_text() + "".join(line for boot in boots for line in boot.known_hosts))
    mark_up(name, {node.name: True for node in nodes})
    return {boot.node.name: boot.known_hosts for boot in boots}


# ---------------------------------------------------------------- sub-commands

def preflight() -> None:
    if os.geteuid() != 0:
        raise KilnError("must run as root (namespaces, bridges and mounts need it)")
    if missing := [tool for tool in TOOLS if not shutil.which(tool)]:
        raise UsageError(f"required tools missing: {', '.join(missing)}")


@contextlib.contextmanager
def network_lock():
    """Held by one `up` at a time from choosing its subnet until its bridge holds it."""
    with open(plan.STATE_ROOT / ".network.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def make_cluster(name: str, count: int, subnet: str | None = None, *, metadata: bool = False,
                 docker: bool = False, zone: str | None = None, start: int | None = None) -> plan.Cluster:
    """Create a cluster of `count` nodes and wait until each one's sshd answers (with `metadata`, each with its
    stand-in metadata service; with `docker`, each with its Docker engine, and the cluster's registry); on any
    failure remove it all. `zone`: the local zone it is in, a label whose capacity `exhaust --zone` takes away
    (NoCapacity here, and for its replacements). `start`: boot only the first `start` nodes; the others are slots,
    planned (their names and addresses kept) but not made, that `add_nodes` boots later (a queue's nodes)."""
    state = plan.STATE_ROOT / name
    if not 1 <= count <= plan.MAX_NODES:
        raise UsageError(f"N must be between 1 and {plan.MAX_NODES}, not {count}")
    start = count if start is None else start
    if not 0 <= start <= count:
        raise UsageError(f"--start {start}: give 0 to N ({count})")
    if zone and zone_empty(zone):
        raise NoCapacity(f"no capacity in local zone {zone} (local-cluster exhaust --zone {zone})")
    if find_netns(name) or find_links(name) or state.exists():
        raise UsageError(f"cluster {name} already exists (run: local-cluster down --name {name})")
    if docker:
        engines.check_tools()
    candidates = [plan.parse_subnet(subnet, count)] if subnet else plan.candidate_subnets(name)
    plan.STATE_ROOT.mkdir(parents=True, exist_ok=True)
    state.mkdir(mode=0o700)  # atomic: a concurrent `up` of the same name stops here
    try:
        with network_lock():  # a concurrent `up` of another name sees this one's subnet taken
            cluster = plan.plan_cluster(name, count, plan.pick_subnet(candidates, used_networks()))
            run(["ip", "-batch", "-"], stdin=plan.root_batch(cluster, cluster.nodes[:start]), timeout=60 + count / 10)
        build(cluster, state, metadata=metadata, docker=docker, start=start)
        if zone:
            write(state / "zone", zone)
    except BaseException as exc:
        try:
            teardown(name)
        except KilnError as cleanup:
            raise UsageError(f"{exc}; cleaning up also failed: {cleanup}") from None
        raise
    return cluster


def cmd_up(args: argparse.Namespace) -> int:
    """Create a cluster of N nodes and wait until each one's sshd answers."""
    started, name, state = time.monotonic(), args.name, plan.STATE_ROOT / args.name
    cluster = make_cluster(name, args.count, args.subnet, metadata=args.metadata, docker=args.docker,
                           start=args.start)
    registries = engines.registry_addresses(name)
    slots = "" if args.start is None or args.start == args.count else f" ({args.count - args.start} of them slots)"
    print(f"cluster {name}: {args.count} nodes{slots} up on {cluster.bridge} {cluster.subnet} "
          f"in {time.monotonic() - started:.1f} s\n"
          f"  state: {state}\n  ssh:   ssh -F {state / 'ssh_config'} node1\n"
          f"  fab:   {plan.fab_command(state, cluster)}\n"
          f"  env:   eval \"$(local-cluster env --name {name})\"\n  down:  local-cluster down --name {name}"
          + (f"\n  registry: {registries['nodes']} (nodes), {registries['operator']} (this machine: docker push)"
             if registries else ""))
    return 0


def build(cluster: plan.Cluster, state: Path, *, metadata: bool = False, docker: bool = False,
          start: int | None = None) -> None:
    """On the cluster's bridge: make the operator key and the first `start` nodes (default all; the rest are
    slots); wait for every sshd; log in once; with `docker`, start the registry and every node's engine."""
    key = state / "operator_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"kiln-operator@{cluster.name}", "-f", str(key)])
    make_mountpoints()
    booted = cluster.nodes[:start]
    timeout = 60 + len(booted) / 10
    operator_pub = key.with_suffix(".pub").read_text()
    with ThreadPoolExecutor(WORKERS) as pool:
        boots = list(pool.map(lambda n: boot_node(cluster, n, state / n.name, operator_pub, docker=docker),
                              booted))
    write(state / "known_hosts", "".join(line for boot in boots for line in boot.known_hosts))
    write(state / "ssh_config", plan.ssh_config_text(cluster, state))
    write(state / "hostfile", "".join(f"{n.name}\n" for n in cluster.nodes))
    nodes = [dict(asdict(n), subnet=str(cluster.subnet), state_dir=str(state / n.name), metadata=metadata,
                  docker=docker, up=n in booted) for n in cluster.nodes]
    write(state / "nodes.json", json.dumps(nodes, indent=1) + "\n")
    if metadata:
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lambda n: start_metadata(n, state / n.name), booted))
    wait_for_sshd(boots, state, timeout)
    if booted:
        verify_login(booted, state)
    if docker:
        engines.start_registries(cluster)
        start_engines(cluster, boots, state)


def cmd_down(args: argparse.Namespace) -> int:
    """Remove the cluster: its processes, namespaces, links and state (idempotent)."""
    if teardown(args.name):
        print(f"cluster {args.name}: down")
    return 0


def cmd_lose(args: argparse.Namespace) -> int:
    """Take NODE away as a lost machine goes: its processes killed at once, its network and disk removed."""
    node = plan.find_node(plan.cluster_from_nodes(args.name, load_nodes(args.name)), args.node)
    lose_node(args.name, node)
    print(f"cluster {args.name}: {node.name} lost")
    return 0


def cmd_interrupt(args: argparse.Namespace) -> int:
    """Post a spot interruption notice on NODE's metadata service (the cluster was made with --metadata), as
    EC2 or GCE posts it."""
    nodes = load_nodes(args.name)
    node = plan.find_node(plan.cluster_from_nodes(args.name, nodes), args.node)
    if not nodes[node.index - 1].get("metadata"):
        raise UsageError(f"cluster {args.name} has no metadata services (make it with: local-cluster up --metadata)")
    text = {"gce": json.dumps(GCE_PREEMPTED), "azure": json.dumps(AZURE_EVICTED)}.get(args.cloud) or notice_text(
        args.action, args.lead)
    notice = plan.STATE_ROOT / args.name / node.name / "notice.json"
    write(notice.with_suffix(".tmp"), text)
    notice.with_suffix(".tmp").rename(notice)
    print(f"cluster {args.name}: {node.name} has a notice: {text}")
    return 0


def cmd_exhaust(args: argparse.Namespace) -> int:
    """Run the cluster's local cloud out of machines: its next TIMES replacements find no capacity (a new cluster
    still comes up); with --zone Z, the local zone Z has none, for new clusters there and their replacements, until
    `exhaust --zone Z --times 0` (as a zone that preemption emptied)."""
    if args.times < 0:
        raise UsageError(f"--times {args.times}: give 0 or more")
    if args.zone:
        path = zone_path(args.zone)
        if args.times:
            path.parent.mkdir(parents=True, exist_ok=True)
            write(path, "")
        else:
            path.unlink(missing_ok=True)
        print(f"local zone {args.zone}: {'no capacity' if args.times else 'capacity again'}")
        return 0
    load_nodes(args.name)
    with nodes_lock(args.name):
        write(exhausted_path(args.name), str(args.times))
    print(f"cluster {args.name}: its next {args.times} replacement(s) find no capacity")
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    """Boot slots NODE...: fresh machines, empty disks, new host keys (pinned in the cluster's known_hosts)."""
    cluster = plan.cluster_from_nodes(args.name, load_nodes(args.name))
    added = add_nodes(args.name, [plan.find_node(cluster, node) for node in args.node])
    print(f"cluster {args.name}: {', '.join(added)} up; their host keys:\n"
          + "".join(line for lines in added.values() for line in lines), end="")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    """Delete NODE... as a cloud deletes machines (processes, network, disk); their slots stay, for add."""
    cluster = plan.cluster_from_nodes(args.name, load_nodes(args.name))
    nodes = [plan.find_node(cluster, node) for node in args.node]
    remove_nodes(args.name, nodes)
    print(f"cluster {args.name}: {', '.join(node.name for node in nodes)} removed")
    return 0


def cmd_replace(args: argparse.Namespace) -> int:
    """Put a fresh machine in NODE's place: same name and address, empty disk, new host keys."""
    node = plan.find_node(plan.cluster_from_nodes(args.name, load_nodes(args.name)), args.node)
    lines = replace_node(args.name, node)
    print(f"cluster {args.name}: {node.name} replaced; its host keys:\n" + "".join(lines), end="")
    return 0


def load_nodes(name: str) -> list[dict]:
    path = plan.STATE_ROOT / name / "nodes.json"
    if not path.is_file():
        raise KilnError(f"cluster {name} is not up (no {path})")
    return json.loads(path.read_text())


def cmd_status(args: argparse.Namespace) -> int:
    """Show each node's address, namespace and whether its sshd answers; exit 1 unless all are up."""
    present = find_netns(args.name)
    try:
        nodes = load_nodes(args.name)
    except KilnError:  # state lost (a crash?): show what the name convention finds
        nodes = [{"name": "node" + ns.rsplit("-n", 1)[1], "ip": None, "netns": ns} for ns in present]
    with ThreadPoolExecutor(PROBES) as pool:
        answering = list(pool.map(lambda n: bool(n["ip"]) and probe_ssh(n["ip"], 22, 1.0) is not None, nodes))
    rows = [{"node": n["name"], "ip": n["ip"], "netns": n["netns"], "netns_present": n["netns"] in present,
             "sshd": up, "slot": not n.get("up", True)} for n, up in zip(nodes, answering, strict=True)]
    healthy = bool(rows) and all(r["netns_present"] and r["sshd"] for r in rows if not r["slot"])
    if args.json:
        print(json.dumps({"cluster": args.name, "up": healthy, "nodes": rows,
                          "registry": engines.registry_addresses(args.name) or None}, indent=1))
    else:
        print(f"{'NODE':<10}{'IP':<16}{'NETNS':<8}SSHD" if rows else f"cluster {args.name}: not up")
        for r in rows:
            print(f"{r['node']:<10}{r['ip'] or '-':<16}{'yes' if r['netns_present'] else 'no':<8}"
                  f"{'up' if r['sshd'] else 'down'}{' (a slot: local-cluster add boots it)' if r['slot'] else ''}")
    return 0 if healthy else 1


def cmd_env(args: argparse.Namespace) -> int:
    """Print KILN_SSH_CONFIG=... and KILN_HOSTS=... shell lines for the cluster."""
    hosts = ",".join(n["name"] for n in load_nodes(args.name) if n.get("up", True))
    config = plan.STATE_ROOT / args.name / "ssh_config"
    print(f"KILN_SSH_CONFIG={shlex.quote(str(config))}\nKILN_HOSTS={shlex.quote(hosts)}")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    title, usage, details = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(prog="local-cluster", usage=usage.removeprefix("usage: "),
                                     description=f"{title}\n\n{details}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for func in (cmd_up, cmd_down, cmd_add, cmd_remove, cmd_status, cmd_env, cmd_lose, cmd_replace, cmd_interrupt,
                 cmd_exhaust):
        cmd = sub.add_parser(func.__name__[4:], help=func.__doc__, description=func.__doc__)
        cmd.set_defaults(func=func)
        cmd.add_argument("--name", default="kiln", help="cluster name, [a-z][a-z0-9]{0,5} (default kiln)")
        if func is cmd_up:
            cmd.add_argument("count", type=int, nargs="?", default=3, metavar="N",
                             help=f"number of nodes, 1..{plan.MAX_NODES} (default 3)")
            cmd.add_argument("--subnet", help="private IPv4 CIDR (default: 10.x.0.0/16 derived from the name)")
            cmd.add_argument("--metadata", action="store_true",
                             help="give every node a stand-in metadata service (EC2's, GCE's and Azure's) at "
                                  "169.254.169.254")
            cmd.add_argument("--docker", action="store_true",
                             help="give every node its own Docker engine, and the cluster a registry")
            cmd.add_argument("--start", type=int, metavar="M",
                             help="boot only nodes 1 to M (0 to N); the others are slots that add boots")
        if func is cmd_status:
            cmd.add_argument("--json", action="store_true", help="print JSON")
        if func in (cmd_lose, cmd_replace, cmd_interrupt):
            cmd.add_argument("node", metavar="NODE", help="the node's name (node2) or address")
        if func in (cmd_add, cmd_remove):
            cmd.add_argument("node", metavar="NODE", nargs="+", help="the nodes' names (node2) or addresses")
        if func is cmd_exhaust:
            cmd.add_argument("--times", type=int, default=1, help="how many replacements to refuse (default 1); "
                                                                  "with --zone, 0 gives the zone its capacity back")
            cmd.add_argument("--zone", help="a local zone (kiln up --provider local --zones): none of its machines")
        if func is cmd_interrupt:
            cmd.add_argument("--cloud", default="ec2", choices=("ec2", "gce", "azure"),
                             help="post it as EC2 (spot/instance-action), GCE (instance/preempted) or Azure (a "
                                  "Preempt scheduled event) does")
            cmd.add_argument("--action", default="terminate", choices=("terminate", "stop", "hibernate"),
                             help="EC2's instance-action")
            cmd.add_argument("--lead", type=int, default=120, help="seconds until the instance goes (default 120)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def command() -> int:
        plan.check_name(args.name)
        preflight()
        return args.func(args)

    return run_main("local-cluster: error", command)


if __name__ == "__main__":
    sys.exit(main())
