"""Where a cluster's machines come from. A provider makes a cluster (`up`), puts a fresh machine in a lost one's
place (`replace`), and removes it (`down`); `kiln up --provider` picks one and the cluster file remembers it, so
`kiln train --managed` can replace a node it lost.

local: the network-namespace cluster of testbed.cluster on this machine (root), whose nodes can be lost and
replaced by fresh ones with new host keys. aws: bootstrap.aws (a replacement is launched as `up` launched the
cluster, must show its host keys on its console, and the old instance is terminated).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol

from bootstrap import state
from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host
from kiln.hostkeys import public_key

KINDS = ("aws", "local")


@dataclass(frozen=True)
class Replacement:
    """A lost machine and the fresh one in its place, with the host keys the provider vouches for."""

    old: Host
    new: Host
    host_keys: tuple[str, ...]


class Provider(Protocol):
    kind: str

    def replace(self, host: Host) -> Replacement: ...

    def down(self) -> bool: ...


class LocalProvider:
    """Nodes of `local-cluster` (testbed.cluster) on this machine; their names are their hosts."""

    kind = "local"

    def __init__(self, name: str):
        from testbed import netns

        self.name = netns.check_name(name)

    def up(self, count: int, python: str = sys.executable, *, docker: bool = False) -> state.ClusterRecord:
        """Start `count` nodes (with `docker`, each with its own Docker engine) and write the cluster file (the
        nodes share this machine's Python)."""
        from testbed import cluster as local
        from testbed import netns

        if state.load_cluster(self.name) is not None:
            raise UsageError(f"cluster {self.name} already exists (kiln down {self.name} first)")
        local.preflight()
        made = local.make_cluster(self.name, count, metadata=True, docker=docker)
        record = state.ClusterRecord(
            self.name, tuple(Host(node.name) for node in made.nodes), python,
            state.SshSettings(config_file=str(netns.STATE_ROOT / self.name / "ssh_config")), provider=self.kind)
        state.save_cluster(record)
        return record

    def replace(self, host: Host) -> Replacement:
        from testbed import cluster as local
        from testbed import netns

        try:
            node = netns.find_node(netns.cluster_from_nodes(self.name, local.load_nodes(self.name)), host.address)
            lines = local.replace_node(self.name, node)
        except KilnError as error:
            raise KilnError(f"could not replace {host.label}: {error}") from None
        return Replacement(host, host, tuple(public_key(line.split(maxsplit=1)[1]) for line in lines))

    def down(self) -> bool:
        from testbed import cluster as local

        removed = local.teardown(self.name)
        state.forget_cluster(self.name)
        return removed


class AwsProvider:
    """The instances of a cluster `kiln up` made on AWS (bootstrap.aws.cloud)."""

    kind = "aws"

    def __init__(self, record: state.ClusterRecord):
        self.record = record

    def replace(self, host: Host) -> Replacement:
        from bootstrap.aws import cloud

        new, keys = cloud.replace(self.record.name, host.address, region=self.record.region)
        self.record = state.load_cluster(self.record.name) or self.record
        return Replacement(host, new, tuple(keys))

    def down(self) -> bool:
        from bootstrap.aws import cloud

        return bool(cloud.down(self.record.name, region=self.record.region))


def for_cluster(record: state.ClusterRecord | None, name: str | None) -> Provider:
    """The provider that can replace the nodes of a cluster, from its cluster file."""
    if record is None or record.provider is None:
        raise UsageError(f"--managed and --down-after need a cluster that kiln started (kiln up NAME --provider "
                         f"local|aws, then --cluster NAME); {name or 'these hosts'} {'is' if name else 'are'} "
                         "not one")
    if record.provider == "local":
        return LocalProvider(record.name)
    if record.provider == "aws":
        return AwsProvider(record)
    raise UsageError(f"cluster {record.name}: kiln cannot replace nodes of a {record.provider} cluster")
