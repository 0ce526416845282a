"""Per-cluster keys, pinned host keys and the node-to-node SSH mesh."""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bootstrap import state
from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host
from bootstrap.state import cluster_dir
from kiln.hostkeys import known_hosts_lines, without_hosts

# What the mesh reads of each node (nodes_from_facts, choose_address, apply_mesh): `kiln mesh` asks for these alone
FACTS = ("hostname", "uid", "addresses", "ssh_connection", "host_keys")


@dataclass(frozen=True)
class Node:
    """A host as the cluster sees it: its hostname, routable address and facts."""

    host: Host
    name: str
    address: str
    iface: str
    facts: dict


def gpu_counts(nodes: Sequence[Node]) -> tuple[int, ...]:
    """Each node's GPU count, from its facts (/dev/nvidiaN; 0 without)."""
    return tuple(int(node.facts.get("gpus", 0)) for node in nodes)


def default_cluster_name(hosts: Sequence[Host], ssh_config: str | None) -> str:
    """A stable name for an unnamed cluster, from its host list and ssh config."""
    identity = "\n".join([ssh_config or "", *(h.endpoint() for h in hosts)])
    return "h-" + hashlib.sha256(identity.encode()).hexdigest()[:10]


def validate_cluster_name(name: str) -> str:
    if not name or not all(ch.isalnum() or ch in "-_" for ch in name) or len(name) > 40:
        raise UsageError(f"cluster name {name!r}: use letters, digits, '-' and '_' (at most 40)")
    return name


def ensure_cluster_key(cluster: str) -> tuple[str, str]:
    """The cluster's own ed25519 key pair, made once; (private key text, public key line). Runs started together
    on the same hosts share it: the first makes it while the others wait on the folder's lock, then read it."""
    folder = cluster_dir(cluster)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = folder / "id_ed25519"
    with open(folder / ".key.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not key.exists():
            try:
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"kiln-{cluster}", "-f",
                                str(key)], check=True, capture_output=True, timeout=30)
            except (OSError, subprocess.SubprocessError) as error:
                raise KilnError(f"could not generate the cluster key in {folder}: {error}") from None
        return key.read_text(), (folder / "id_ed25519.pub").read_text().strip()


def new_key(comment: str) -> tuple[str, str]:
    """A fresh ed25519 key pair, kept nowhere here: (private key text, public key line)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        key = Path(folder) / "id_ed25519"
        try:
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
                           check=True, capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as error:
            raise KilnError(f"could not generate a key: {error}") from None
        return key.read_text(), key.with_suffix(".pub").read_text().strip()


def choose_address(facts: dict) -> tuple[str, str]:
    """The node's cluster address and interface: the one the operator reached if
    the node owns it, else its first private (then any) global IPv4 address."""
    addresses = facts.get("addresses", [])
    connection = (facts.get("ssh_connection") or "").split()
    if len(connection) >= 3:
        for entry in addresses:
            if entry["address"] == connection[2]:
                return entry["address"], entry["iface"]
    ipv4 = [e for e in addresses if ":" not in e["address"]]
    ranked = sorted(ipv4, key=lambda e: not ipaddress.ip_address(e["address"]).is_private)
    if not ranked:
        raise KilnError("no global IPv4 address on the node")
    return ranked[0]["address"], ranked[0]["iface"]


def nodes_from_facts(facts_by_host: dict[Host, dict]) -> list[Node]:
    """Node records in host-list order; hostnames must be unique."""
    nodes = []
    seen: dict[str, Host] = {}
    for host, facts in facts_by_host.items():
        name = facts["hostname"]
        if name in seen:
            raise KilnError(f"{host.label} and {seen[name].label} both have the hostname {name!r}: "
                            "every node needs its own hostname")
        seen[name] = host
        try:
            address, iface = choose_address(facts)
        except KilnError as error:
            raise KilnError(f"{host.label}: {error}") from None
        nodes.append(Node(host, name, address, iface, facts))
    return nodes


def known_hosts_text(nodes: Sequence[Node]) -> str:
    """Every node's host key under its hostname, its address, and the name the operator uses."""
    return "".join(line for node in nodes for line in known_hosts_lines(
        [node.name, node.address, node.host.address], pinned_keys(node.facts["host_keys"]), node.host.port))


def pinned_keys(keys: Sequence[str]) -> list[str]:
    """The host keys of a node the mesh pins: its Ed25519 key where it has one, else every key it has. ssh asks a
    host for the key type pinned for it, and one key per node keeps every node's known_hosts (each node holds the
    whole cluster's) a third of the size at any cluster size."""
    return [key for key in keys if key.split()[0] == "ssh-ed25519"] or list(keys)


def replaced_known_hosts(text: str, nodes: Sequence[Node], replaced: Sequence) -> str:
    """The cluster's pinned known_hosts with each replaced machine's old keys gone (under every name the mesh
    gave it) and the keys its provider vouches for pinned under the new host's name (pure)."""
    for item in replaced:
        old_names = [item.old.address] + [name for node in nodes if node.host == item.old
                                          for name in (node.name, node.address)]
        text = without_hosts(text, old_names, item.old.port)
        text += "".join(known_hosts_lines([item.new.address], item.host_keys, item.new.port))
    return text


def pin_replacements(cluster: str, nodes: Sequence[Node], replaced: Sequence) -> None:
    """Pin the replacements' keys instead of the old machines' (also out of the keys trusted on first contact)."""
    state.write_known_hosts(cluster, replaced_known_hosts(state.read_known_hosts(cluster), nodes, replaced))
    if state.known_hosts_path(cluster, first_contact=True).exists():
        state.write_known_hosts(cluster, replaced_known_hosts(state.read_known_hosts(cluster, first_contact=True),
                                                              nodes, [replace(r, host_keys=()) for r in replaced]),
                                first_contact=True)


def node_ssh_config(cluster: str, nodes: Sequence[Node], base: str | None = None) -> str:
    """The ssh config every node includes: the cluster key and pinned keys (in `base`, the cluster's folder under
    ~/.ssh/kiln by default) for cluster names only."""
    base = base or f"~/.ssh/kiln/{cluster}"
    blocks = []
    for node in nodes:
        extra = "".join([f"  Port {node.host.port}\n" if node.host.port else "",
                         f"  User {node.host.user}\n" if node.host.user else ""])
        if extra:
            blocks.append(f"Host {node.name} {node.address}\n{extra}")
    names = " ".join(f"{n.name} {n.address}" for n in nodes)
    blocks.append(
        f"Host {names}\n"
        f"  IdentityFile {base}/id_ed25519\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {base}/known_hosts\n"
        "  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n"
        "  ConnectTimeout 10\n"
    )
    return f"# kiln cluster {cluster}: written by `fab cluster.mesh`\n" + "".join(blocks)


def mesh_payload(cluster: str, nodes: Sequence[Node], private_key: str, public_key: str) -> dict:
    return {
        "cluster": cluster,
        "private_key": private_key,
        "public_key": public_key,
        "known_hosts": known_hosts_text(nodes),
        "ssh_config": node_ssh_config(cluster, nodes),
        "hosts": [[node.address, node.name] for node in nodes],
    }
