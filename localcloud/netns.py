"""A local cluster's plan: names, addresses, and the text of every file and batch it writes (pure).

Nothing here touches the system; localcloud.cluster does the I/O.
"""
from __future__ import annotations

import ipaddress
import re
import shlex
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import UsageError
from kiln.hostkeys import known_hosts_lines as pinned_lines

STATE_ROOT = Path("/run/kiln/local")  # STATE_ROOT/NAME: mode 700
SSHD = "/usr/sbin/sshd"
NAME_RE = re.compile(r"[a-z][a-z0-9]{0,5}")
MAX_NODES = 1000
# (path in the node's state dir, mountpoint). /tmp stays shared: the project and its
# virtual environment may live there (a CI clone), and nodes share this machine's Python. /run/munge is each
# machine's own, as on a VM: a queue's munged (bootstrap/slurm.py Munge) keeps its key and socket there, and its
# slurmd its configuration, spool and PMIx folders in /var/lib/kiln-slurm (bootstrap/queue.py NODE_DIR).
NODE_MOUNTS = (("etc-ssh", "/etc/ssh"), ("hosts", "/etc/hosts"), ("resolv.conf", "/etc/resolv.conf"),
               ("ssh", "/root/.ssh"), ("kiln", "/root/kiln"), ("munge", "/run/munge"),
               ("kiln-slurm", "/var/lib/kiln-slurm"))
# A node's root gets a fresh VM's shell start-up files (Debian's /etc/skel), not this machine's,
# which may run slow tools (pyenv init, ...) on every ssh command.
NODE_DOTFILES = (".bashrc", ".profile")
IAM_FILE = "iam.json"  # the EC2 identity a node's metadata service serves (a launch's instance profile)
METADATA_ADDRESS = "169.254.169.254"  # EC2's and GCE's instance metadata service; with --metadata each node has its own
# With --docker: each node's Docker engine keeps its images on disk (they are GBs), its sockets and state under
# /run; the cluster's registry listens on the bridge at REGISTRY_PORT.
ENGINE_DATA_ROOT = Path("/var/lib/kiln-local")
ENGINE_RUN_ROOT = Path("/run/kiln-docker")
REGISTRY_PORT = 5000
# The cgroup v1 hierarchies dockerd needs, and net_cls (as systemd mounts it on a cgroup v1 machine: kiln's node
# side keeps run containers from the metadata service by class): `ip netns exec` remounted /sys, hiding the host's.
CGROUP_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "net_cls")


@dataclass(frozen=True)
class Node:
    index: int
    name: str   # node1: hostname and ssh alias
    ip: str
    netns: str  # kiln-n1
    veth: str   # kiln-v1 (host side; eth0 inside the namespace)
    mac: str    # eth0's, fixed so that neighbour entries can be static


@dataclass(frozen=True)
class Cluster:
    name: str
    subnet: ipaddress.IPv4Network
    gateway: str  # the bridge's address
    gateway_mac: str
    nodes: tuple[Node, ...]

    @property
    def bridge(self) -> str:
        return f"{self.name}-br"


@dataclass(frozen=True)
class NodeBoot:
    node: Node
    proc: subprocess.Popen  # ip netns exec ... exec sshd: becomes the node's sshd
    known_hosts: list[str]


def check_name(name: str) -> str:
    """Return name if it is a valid cluster name (it becomes part of interface names)."""
    if not NAME_RE.fullmatch(name):
        raise UsageError(f"invalid cluster name {name!r}: must match [a-z][a-z0-9]{{0,5}}")
    return name


def candidate_subnets(name: str) -> list[ipaddress.IPv4Network]:
    """Default subnets for a cluster, best first: 10.{200 + crc32(name) % 50}.0.0/16, then the next."""
    start = zlib.crc32(name.encode()) % 50
    return [ipaddress.IPv4Network(f"10.{200 + (start + k) % 50}.0.0/16") for k in range(50)]


def parse_subnet(text: str, count: int) -> ipaddress.IPv4Network:
    """Parse --subnet; it must be private IPv4 with room for the bridge and count nodes."""
    try:
        subnet = ipaddress.IPv4Network(text, strict=False)
    except ValueError as exc:
        raise UsageError(f"invalid --subnet {text!r}: {exc}") from None
    if not subnet.is_private:
        raise UsageError(f"--subnet {subnet} is not a private range")
    if subnet.num_addresses - 2 < count + 1:
        raise UsageError(f"--subnet {subnet} is too small for a bridge and {count} nodes")
    return subnet


def mac_address(name: str, index: int) -> str:
    """A locally administered MAC for node index of cluster name (0: the bridge)."""
    tag = zlib.crc32(name.encode()) & 0xFFFF
    return "02:" + ":".join(f"{b:02x}" for b in (tag >> 8, tag & 255, index >> 16, (index >> 8) & 255, index & 255))


def plan_cluster(name: str, count: int, subnet: ipaddress.IPv4Network) -> Cluster:
    """Names and addresses: the bridge takes the first host address, node i the (i+1)-th."""
    base = subnet.network_address
    nodes = (Node(i, f"node{i}", str(base + 1 + i), f"{name}-n{i}", f"{name}-v{i}", mac_address(name, i))
             for i in range(1, count + 1))
    return Cluster(name, subnet, str(base + 1), mac_address(name, 0), tuple(nodes))


def pick_subnet(candidates: list[ipaddress.IPv4Network],
                used: list[tuple[str, ipaddress.IPv4Network]]) -> ipaddress.IPv4Network:
    """The first candidate overlapping no (device, network) in use."""
    for subnet in candidates:
        clash = [(dev, net) for dev, net in used if net.overlaps(subnet)]
        if not clash:
            return subnet
    raise UsageError(f"subnet {subnet} overlaps {clash[0][1]} on {clash[0][0]}; choose another with --subnet")


def root_batch(cluster: Cluster, nodes: tuple[Node, ...] | None = None) -> str:
    """`ip -batch` input creating the bridge, and the namespaces, veth pairs and static neighbour entries of
    `nodes` (default: every node of the plan; a node left out is a slot `add` boots later).

    Static entries keep operator <-> node traffic out of the ARP cache, whose size limit (gc_thresh3, 1024
    by default) counts dynamic entries of all namespaces together: with hundreds of nodes it overflows.
    """
    br = cluster.bridge
    lines = [f"link add {br} address {cluster.gateway_mac} type bridge",
             f"addr add {cluster.gateway}/{cluster.subnet.prefixlen} dev {br}", f"link set {br} up"]
    booted = cluster.nodes if nodes is None else nodes
    return "\n".join(lines) + "\n" + "".join(node_root_batch(cluster, n) for n in booted)


def node_root_batch(cluster: Cluster, node: Node) -> str:
    """`ip -batch` input plugging one node into the cluster's bridge: its namespace, veth pair, neighbour entry."""
    return (f"netns add {node.netns}\n"
            f"link add {node.veth} type veth peer name eth0 address {node.mac} netns {node.netns}\n"
            f"link set {node.veth} master {cluster.bridge} up\n"
            f"neigh replace {node.ip} lladdr {node.mac} dev {cluster.bridge} nud permanent\n")


def cluster_from_nodes(name: str, nodes: list[dict]) -> Cluster:
    """The plan of a running cluster again, from the nodes.json its `up` wrote (names, addresses and MACs are
    derived from the name, the subnet and the count, so they come out the same)."""
    if not nodes:
        raise UsageError(f"cluster {name} has no nodes")
    cluster = plan_cluster(name, len(nodes), ipaddress.IPv4Network(nodes[0]["subnet"]))
    recorded = [(n["name"], n["ip"]) for n in nodes]
    if recorded != [(n.name, n.ip) for n in cluster.nodes]:
        raise UsageError(f"cluster {name}: its nodes.json does not match its plan; take it down and up again")
    return cluster


def find_node(cluster: Cluster, name: str) -> Node:
    for node in cluster.nodes:
        if name in (node.name, node.ip):
            return node
    raise UsageError(f"cluster {cluster.name} has no node {name!r} (it has {', '.join(n.name for n in cluster.nodes)})")


def node_batch(cluster: Cluster, node: Node) -> str:
    """`ip -n NETNS -batch` input configuring a node's interfaces, default route and gateway neighbour."""
    return (f"link set lo up\naddr add {node.ip}/{cluster.subnet.prefixlen} dev eth0\nlink set eth0 up\n"
            f"route add default via {cluster.gateway}\n"
            f"neigh replace {cluster.gateway} lladdr {cluster.gateway_mac} dev eth0 nud permanent\n")


def metadata_argv(python: str, node: Node, node_dir: Path, instance_id: str) -> list[str]:
    """argv that serves a stand-in metadata service (localcloud.imds) at the clouds' address in the node's network."""
    return ["ip", "netns", "exec", node.netns, python, "-m", "localcloud.imds", "--host", METADATA_ADDRESS,
            "--port", "80", "--instance-id", instance_id, "--notice-file", str(node_dir / "notice.json"),
            "--ready-file", str(node_dir / "imds.ready"), "--iam-file", str(node_dir / IAM_FILE)]


def sshd_config_text(node: Node, docker_host: str | None = None) -> str:
    """The node's sshd_config (paths as seen inside the node); with `docker_host`, every session's docker
    client talks to the node's own engine (a VM's is at the default socket)."""
    return "\n".join([
        f"ListenAddress {node.ip}", "Port 22", "HostKey /etc/ssh/ssh_host_ed25519_key",
        "HostKey /etc/ssh/ssh_host_ecdsa_key", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "UseDNS no", "PidFile none", "MaxStartups 200:30:400",
        "MaxSessions 128", "LogLevel INFO", "Subsystem sftp /usr/lib/openssh/sftp-server",
        "AuthorizedKeysFile .ssh/authorized_keys", "PrintMotd no",
        *([f"SetEnv DOCKER_HOST={docker_host}"] if docker_host else []), ""])  # no AcceptEnv: nothing accepted


@dataclass(frozen=True)
class NodeEngine:
    """Where a node's own Docker engine keeps its things (--docker)."""

    data_root: Path  # images and containers, on disk
    exec_root: Path  # its state and containerd's, under /run
    socket: Path

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pidfile(self) -> Path:
        return self.exec_root.with_name(self.exec_root.name + ".pid")


def node_engine(cluster: str, node: Node) -> NodeEngine:
    return NodeEngine(ENGINE_DATA_ROOT / cluster / node.name, ENGINE_RUN_ROOT / node.netns,
                      ENGINE_RUN_ROOT / f"{node.netns}.sock")


def registry_address(cluster: Cluster) -> str:
    """Where the nodes reach the cluster's registry: on its bridge."""
    return f"{cluster.gateway}:{REGISTRY_PORT}"


def cgroup_mount_script(unified: bool = False) -> str:
    """Shell lines mounting the cgroups inside a node's mount namespace (private to it), as a machine has them
    mounted: the cgroup v1 hierarchies, or on a `unified` (cgroup v2) machine its one hierarchy."""
    if unified:
        return "mount -t cgroup2 cgroup2 /sys/fs/cgroup\n"
    lines = ["mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup"]
    for controller in CGROUP_CONTROLLERS:
        lines.append(f"mkdir -p /sys/fs/cgroup/{controller} && mount -t cgroup -o {controller} cgroup "
                     f"/sys/fs/cgroup/{controller}")
    lines.append("mkdir -p /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup "
                 "/sys/fs/cgroup/systemd")
    return "\n".join(lines) + "\n"


def dockerd_argv(sshd_pid: int, engine: NodeEngine, registry: str) -> list[str]:
    """argv that starts a node's Docker engine in the node's network, hostname and mount namespaces (entered
    through its sshd: bind mounts then resolve to the node's own /root/kiln, and its cgroups are mounted).
    No iptables rules and no bridge: the host's FORWARD policy stays as it is, and kiln's containers use the
    node's network. The cluster's registry speaks plain HTTP on the bridge."""
    dockerd = ["dockerd", "--data-root", str(engine.data_root), "--exec-root", str(engine.exec_root),
               "-H", engine.docker_host, "--pidfile", str(engine.pidfile), "--iptables=false", "--ip-masq=false",
               "--bridge=none", "--insecure-registry", registry]
    return ["nsenter", "--target", str(sshd_pid), "--net", "--uts", "--mount", "--", *dockerd]


def hosts_text(node: Node) -> str:
    """A fresh cloud image's /etc/hosts: the hostname maps to loopback, no other nodes."""
    return f"127.0.0.1 localhost\n::1 localhost\n127.0.1.1 {node.name}\n"


def resolv_text() -> str:
    """A node's resolver settings. The local cloud has no DNS server: this machine's nameserver is out of a node's
    network, and each lookup /etc/hosts cannot answer (a reverse lookup of a peer's address, as PyTorch's c10d
    store makes of each client) waited two tries of 5 s there. A node's resolver is its own loopback, where
    nothing listens: such a lookup fails at once, as a cloud's resolver answers within milliseconds."""
    return "# the local cloud has no DNS server: names come from /etc/hosts (kiln mesh)\nnameserver 127.0.0.1\n"


def ssh_config_text(cluster: Cluster, state: Path) -> str:
    """The operator's ssh_config: one Host block per node, then the shared settings."""
    blocks = "".join(f"Host {n.name}\n  HostName {n.ip}\n" for n in cluster.nodes)
    return blocks + (f"Host *\n  User root\n  IdentityFile {state / 'operator_key'}\n  IdentitiesOnly yes\n"
                     f"  UserKnownHostsFile {state / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
                     "  BatchMode yes\n  ConnectTimeout 10\n")


def known_hosts_lines(node: Node, public_keys: list[str]) -> list[str]:
    """known_hosts lines pinning a node's host keys under its name and its address."""
    return pinned_lines([node.name, node.ip], public_keys)


def fstab_text(node_dir: Path, dotfiles: tuple[str, ...] = ()) -> str:
    """The node's private mounts, for `mount --all --fstab` inside its mount namespace.
    `dotfiles` are root's shell start-up files that the node gets fresh (see NODE_DOTFILES)."""
    binds = [f"{node_dir / src} {dst} none bind 0 0\n" for src, dst in NODE_MOUNTS]
    binds += [f"{node_dir / 'dotfiles' / name} /root/{name} none bind 0 0\n" for name in dotfiles]
    return "".join(binds) + f"kiln-hidden {STATE_ROOT.parent} tmpfs size=64k,mode=755 0 0\n"  # hide state


def boot_argv(node: Node, node_dir: Path, *, unified: bool = False) -> list[str]:
    """argv that starts a node's sshd in its netns with its own UTS and mount namespace, its cgroups mounted (`ip
    netns exec` mounts a /sys of the node's network without them; dockerd and slurmd need them): where they
    cannot be mounted, the node still boots, and what needs them says so."""
    cgroups = cgroup_mount_script(unified).rstrip("\n").replace("\n", " && ")
    script = (f"echo {node.name} > /proc/sys/kernel/hostname\n"
              f"mount --all --fstab {shlex.quote(str(node_dir / 'fstab'))}\n"
              f"{{ {cgroups}; }} || echo 'kiln: the cgroups could not be mounted' >&2\n"
              f"exec {SSHD} -D -E /etc/ssh/sshd.log -f /etc/ssh/sshd_config")
    return ["ip", "netns", "exec", node.netns, "unshare", "--uts", "--mount", "--propagation", "private",
            "--", "/bin/sh", "-ec", script]


def teardown_batch(netns: list[str], links: list[str]) -> str:
    """`ip -force -batch` input deleting namespaces (their eth0 and its veth peer go too), then links."""
    return "".join([f"netns del {ns}\n" for ns in netns] + [f"link del {link}\n" for link in links])


def fab_command(state: Path, cluster: Cluster) -> str:
    """The fab command line for this cluster (hostfile-based when the host list is long)."""
    short = len(cluster.nodes) <= 16
    hosts = ",".join(n.name for n in cluster.nodes) if short else f'"$(paste -sd, {state / "hostfile"})"'
    return f"fab -S {state / 'ssh_config'} -H {hosts} cluster.check"
