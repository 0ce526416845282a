"""The local provider: a cluster of sshd nodes in network namespaces on this machine (localcloud.cluster, as root),
whose nodes can be lost and replaced by fresh ones with new host keys; kiln's tests and `make demo` run on it.
Host keys come from the key files the local cloud wrote for each node; a node's stand-in metadata service
(localcloud.imds) posts EC2-style spot notices and GCE-style preemptions; autostop's power-off kills a node's
processes. The local cloud (localcloud/) is imported here alone, once this provider is chosen (bootstrap.providers.KINDS
imports it then)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bootstrap import state
from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host
from bootstrap.providers import Added, Gone, Made, Notice, Replacement
from bootstrap.providers.common import validate_count
from bootstrap.providers.failover import CloudError
from kiln.hostkeys import public_key
from localcloud import cluster as local
from localcloud import netns


@dataclass(frozen=True)
class LocalRequest:
    name: str
    count: int
    docker: bool
    zone: str | None = None  # a local zone: a label whose capacity local-cluster exhaust --zone takes away
    start: int | None = None  # a queue's: the nodes made now; the others are slots that `grow` makes later


class LocalProvider:
    kind = "local"
    host_keys = "the key files localcloud.cluster writes for each node"
    shutdown = "namespace"
    notice = Notice("any", "EC2's spot/instance-action or GCE's instance/preempted, from the node's stand-in "
                    "metadata service")
    up_options = frozenset({"docker"})
    volumes = False
    where = ("zone",)
    scope = None  # every local cluster is on this machine
    prices = ""
    on_demand_from = ""

    def __init__(self, zone: str | None = None):
        self.zone = zone

    def request(self, name: str, count: int, options: Mapping[str, Any], idle_minutes: float | None) -> LocalRequest:
        count = validate_count(count, "node")
        if self.zone:
            local.zone_path(self.zone)  # refused here where it is no zone name
        start = options.get("start")
        return LocalRequest(netns.check_name(name), count, bool(options.get("docker")), self.zone,
                            None if start is None else int(start))

    def plan(self, request: LocalRequest) -> list[str]:
        engines = ", each with its own Docker engine, and a registry" if request.docker else ""
        zone = f" (local zone {request.zone})" if request.zone else ""
        return [f"cluster {request.name}: {request.count} node(s) in network namespaces on this machine{zone}"
                f"{engines}; their host keys pinned from the files the local cloud writes"]

    def up(self, request: LocalRequest, say: Callable[[str], None] | None = None, python: str = sys.executable) -> Made:
        """Start the nodes (they share this machine's Python) and write the cluster file."""
        if state.load_cluster(request.name) is not None:
            raise UsageError(f"cluster {request.name} already exists (kiln down {request.name} first)")
        local.preflight()
        try:
            made = local.make_cluster(request.name, request.count, metadata=True, docker=request.docker,
                                      zone=request.zone, start=request.start)
        except local.NoCapacity as error:  # a cloud's capacity error: failover tries the next candidate
            raise CloudError(f"cluster {request.name}: {error}; nothing was made", code=local.NoCapacity.code) \
                from None
        record = state.ClusterRecord(
            request.name, tuple(Host(node.name) for node in made.nodes[:request.start]), python,
            state.SshSettings(config_file=str(netns.STATE_ROOT / request.name / "ssh_config")), region=request.zone,
            provider=self.kind, place=(("zone", request.zone),) if request.zone else ())
        state.save_cluster(record)
        return Made(request.name, (f"cluster {request.name}: {len(record.hosts)} local node(s) up: "
                                   f"{', '.join(h.label for h in record.hosts)}; next: kiln check --cluster "
                                   f"{request.name}",))

    def down(self, name: str, *, snapshot_ttl_days: float | None = None) -> Gone:
        if snapshot_ttl_days is not None:
            raise UsageError(f"--snapshot: cluster {name} is local; its nodes have no data volumes")
        local.teardown(name)
        state.forget_cluster(name)
        return Gone((f"cluster {name}: local nodes removed",))

    def list(self) -> list[str]:
        return [f"{record.name}: {len(record.hosts)} local node(s): {', '.join(h.label for h in record.hosts)}"
                for record in state.list_clusters() if record.provider == self.kind]

    def sweep(self, *, dry_run: bool = False) -> list[str]:
        return []  # local clusters carry no expiry: kiln down removes them

    def places(self, every: bool = False) -> list[str | None]:
        return [None]

    def replace(self, cluster: str, host: Host) -> Replacement:
        try:
            node = netns.find_node(netns.cluster_from_nodes(cluster, local.load_nodes(cluster)), host.address)
            lines = local.replace_node(cluster, node)
        except local.NoCapacity as error:  # a cloud's capacity error, for the recovery to tell apart
            raise CloudError(f"could not replace {host.label}: {error}", code=local.NoCapacity.code) from None
        except KilnError as error:
            raise KilnError(f"could not replace {host.label}: {error}") from None
        return Replacement(host, host, tuple(public_key(line.split(maxsplit=1)[1]) for line in lines))

    def grow(self, cluster: str, count: int) -> list[Added]:
        """Boot `count` of the cluster's slots (those `up` planned with start, or `shrink` freed), the lowest
        first, and add them to its cluster file."""
        record = state.load_cluster(cluster)
        if record is None:
            raise UsageError(f"no cluster {cluster!r} in {state.kiln_home()}/clusters")
        entries = local.load_nodes(cluster)
        plan = netns.cluster_from_nodes(cluster, entries)
        free = [node for node, entry in zip(plan.nodes, entries, strict=True)
                if not entry.get("up", True)]
        if len(free) < count:
            raise CloudError(f"cluster {cluster}: {count} node(s) wanted, {len(free)} slot(s) free",
                             code=local.NoCapacity.code)
        chosen = free[:count]
        try:
            lines = local.add_nodes(cluster, chosen)
        except local.NoCapacity as error:
            raise CloudError(f"cluster {cluster}: {error}; nothing was made", code=local.NoCapacity.code) from None
        added = [Added(Host(node.name), node.ip, tuple(public_key(line.split(maxsplit=1)[1])
                                                       for line in lines[node.name])) for node in chosen]
        hosts = {host.label: host for host in (*record.hosts, *(a.host for a in added))}
        state.save_cluster(replace(record, hosts=tuple(hosts[n.name] for n in plan.nodes if n.name in hosts)))
        return added

    def shrink(self, cluster: str, hosts: Sequence[Host]) -> None:
        """Remove the nodes as a deleted machine goes, and take them out of the cluster file (their slots stay)."""
        plan = netns.cluster_from_nodes(cluster, local.load_nodes(cluster))
        local.remove_nodes(cluster, [netns.find_node(plan, host.address) for host in hosts])
        record = state.load_cluster(cluster)
        if record is not None:
            gone = {host.label for host in hosts}
            state.save_cluster(replace(record, hosts=tuple(h for h in record.hosts if h.label not in gone)))

    def controller(self, cluster: str) -> tuple[str, str]:
        """Where a queue's controller runs: on this machine (its host name, as slurmctld requires), reached by the
        nodes at the cluster's bridge."""
        return socket.gethostname(), netns.cluster_from_nodes(cluster, local.load_nodes(cluster)).gateway

    def arm_autostop(self, cluster: str) -> None:
        pass  # a node's processes are killed in place: nothing to arm

    def spot_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        """None: a local cluster costs nothing."""
        return {}

    def on_demand_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        """None: a local cluster costs nothing."""
        return {}


PROVIDERS = {"local": LocalProvider}
