"""Reaching a cluster from the operator (I/O): the hosts and ssh settings a command names (-H, --hostfile, a
cluster file, Fabric's own flags), the cluster opened over them, connected (every node's facts) and meshed, and
its idle agents armed. The tasks and a managed run's move (recovery) begin here; `c` is Fabric's context, read for
its configuration alone."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from bootstrap import autostop as autostop_plan
from bootstrap import hosts as hostlists
from bootstrap import mesh, providers, state
from bootstrap.cluster import Cluster
from bootstrap.commands import SshOptions
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.timeline import Timeline


def host_list(c, hostfile: str | None, slots: int | None, saved: state.ClusterRecord | None = None) -> list[Host]:
    """Hosts from -H, from --hostfile, or from the cluster file of --cluster."""
    given = c.config.get("kiln_hosts")
    if given and hostfile:
        raise UsageError("give hosts either with -H or with --hostfile, not both")
    if hostfile:
        try:
            text = Path(hostfile).read_text()
        except OSError as error:
            raise UsageError(f"cannot read hostfile {hostfile}: {error.strerror}") from None
        found = hostlists.parse_hostfile(text, source=hostfile)
        return hostlists.with_slots(found, slots) if slots else found
    if given:
        found = hostlists.parse_host_list(given)
        return hostlists.with_slots(found, slots) if slots else found
    if saved:
        return hostlists.with_slots(saved.hosts, slots) if slots else list(saved.hosts)
    raise UsageError("no hosts: give them with -H h1,h2,..., --hostfile FILE, or --cluster NAME "
                     "of a cluster that kiln mesh has set up")


def ssh_options(c, saved: state.ClusterRecord | None = None) -> SshOptions:
    """Fabric's own flags (-S ssh config, -i identity, -t connect timeout), else the cluster file's."""
    config = c.config
    key = config.connect_kwargs.get("key_filename")
    if isinstance(key, (list, tuple)):
        key = key[0] if key else None
    ssh_config = config.get("ssh_config_path") or getattr(config, "_runtime_ssh_path", None)
    timeout = config.connect_kwargs.get("timeout") or config.timeouts.connect or 10
    recorded = saved.ssh if saved else state.SshSettings()
    return SshOptions(config_file=ssh_config or recorded.config_file, identity=key or recorded.identity,
                      connect_timeout=int(timeout))


@dataclass
class Target:
    hosts: list[Host]
    name: str
    options: SshOptions
    python: str


def target(c, *, hostfile: str | None, cluster: str | None, slots: int | None, python: str | None) -> Target:
    """Parse what the user named: hosts, the cluster's name, ssh settings, the nodes' Python."""
    saved = state.load_cluster(mesh.validate_cluster_name(cluster)) if cluster else None
    if cluster and saved is None and not (hostfile or c.config.get("kiln_hosts")):
        raise UsageError(f"no cluster {cluster!r} in {state.kiln_home()}/clusters: set it up with kiln mesh "
                         "(with -H) or kiln up")
    hosts = host_list(c, hostfile, slots, saved)
    options = ssh_options(c, saved)
    name = cluster or mesh.default_cluster_name(hosts, options.config_file)
    return Target(hosts, name, options, python or (saved.python if saved else sys.executable))


def open_cluster(c, goal: Target, *, fanout: int, accept_new_host_keys: bool = False) -> Cluster:
    return Cluster.connect(goal.name, goal.hosts, goal.options, python=goal.python, fanout=int(fanout),
                           timeout=float(c.config.timeouts.command or 300), accept_new=accept_new_host_keys)


def connect_and_mesh(c, goal: Target, timeline: Timeline, *, fanout: int,
                     accept_new_host_keys: bool) -> tuple[Cluster, list[mesh.Node]]:
    """What every run begins with, timed: connect (the nodes' facts), then the mesh."""
    with timeline.phase("connect"):
        group = open_cluster(c, goal, fanout=fanout, accept_new_host_keys=accept_new_host_keys)
        nodes = group.require_facts("connect")
    with timeline.phase("mesh"):
        group.apply_mesh()
    return group, nodes


def arm(c, cluster: str, idle_minutes: float, *, fanout: int = 64, accept_new_host_keys: bool = False) -> None:
    """Start (or cancel) the idle agents on every node of the cluster, and remember it in the cluster file."""
    record = state.load_cluster(mesh.validate_cluster_name(cluster))
    if record is None or record.provider is None:
        raise UsageError(f"autostop needs a cluster that kiln started (kiln up NAME ...); {cluster} is not one")
    goal = target(c, hostfile=None, cluster=cluster, slots=None, python=None)
    group = open_cluster(c, goal, fanout=fanout, accept_new_host_keys=accept_new_host_keys)
    provider = providers.for_cluster(record, cluster)
    if idle_minutes:
        provider.arm_autostop(record.name)
    group.autostop(autostop_plan.agent_args(idle_minutes, provider.shutdown))
    state.save_cluster(replace(record, idle_minutes=idle_minutes or None))
    print(autostop_plan.describe(idle_minutes, [h.label for h in goal.hosts]))
