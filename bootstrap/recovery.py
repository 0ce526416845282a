"""Putting a run back on its feet after a node is lost (I/O): the cluster's provider replaces the node, its new
host keys are pinned in place of the old ones, the mesh and the code are brought to the new machine, and the run
is planned again on the hosts it now has. The supervisor then restarts it from the last checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bootstrap import autostop, interconnect, launch, mesh, providers, state, topology
from bootstrap.cluster import Cluster
from bootstrap.errors import KilnError
from bootstrap.hosts import Host
from bootstrap.launch import NodePaths, Program, RunPlan, RunSpec
from bootstrap.orchestration import same_root
from bootstrap.providers import Provider, Replacement, failover
from bootstrap.providers.common import SNAPSHOT_TTL_DAYS
from bootstrap.supervisor import Move


@dataclass
class Recovery:
    """A managed run's recoveries on one cluster, which a move replaces whole (`group` is the cluster of now).
    `recover`: lost hosts in, (replacements, the run's new plan) out; a cluster with autostop (idle_minutes) gets
    its agent on the new machines too; `check_on_nodes` false: the program is not checked on the new machine
    itself (it runs in a container image, which the restart brings there). With `up_again` and `reopen`, a
    `move` as well (the supervisor's Move)."""

    group: Cluster
    provider: Provider
    spec: RunSpec
    paths: NodePaths
    program: Program
    folder: Path | None
    idle_minutes: float | None = None
    check_on_nodes: bool = True
    up_again: Callable[[dict], str] | None = None  # capacity.json in, where the cluster came up again out
    reopen: Callable[[], tuple[Cluster, list[mesh.Node]]] | None = None  # the cluster of that name, meshed
    nic: str | None = None  # as the user asked (--nic): else found again on a moved cluster
    fabric: str = "auto"  # as the user asked (--fabric)

    def recover(self, lost: list[Host]) -> tuple[list[Replacement], RunPlan]:
        group = self.group
        replaced = [self.provider.replace(group.name, host) for host in lost]
        mesh.pin_replacements(group.name, group.nodes, replaced)
        group.remote.reset([r.old for r in replaced] + [r.new for r in replaced])
        fresh = {r.old: r.new for r in replaced}
        group.hosts = [fresh.get(host, host) for host in group.hosts]
        nodes = group.require_facts("re-mesh")
        group.apply_mesh()
        self.bring_code(group)
        if self.idle_minutes:
            group.autostop(autostop.agent_args(self.idle_minutes, self.provider.shutdown), [r.new for r in replaced])
        return replaced, launch.plan_run(replace(self.spec, names=tuple(n.name for n in nodes),
                                                 gpus=mesh.gpu_counts(nodes)))

    def bring_code(self, group: Cluster) -> None:
        """kiln's node part and the project on the (new) machines, and the program checked there."""
        group.sync_run(self.paths.lib, str(self.folder) if self.folder else None, self.paths.code)
        if self.folder and self.check_on_nodes:
            group.check_program(launch.program_check(self.program, group.python, self.paths))

    def as_move(self) -> Move:
        return Move(self.wanted, self.move, self.possible)

    def wanted(self, failure: KilnError) -> bool:
        """Whether a replacement failed for want of capacity where the cluster is (failover.classify)."""
        return failover.classify(self.provider.kind, getattr(failure, "code", "") or "",
                                  str(failure)) == "capacity"

    def move(self, gone: Sequence[Host] = ()) -> tuple[Cluster, RunPlan, str]:
        """The whole cluster taken down and brought up again as its `kiln up` was asked (`up_again`, given its
        capacity.json: its other candidates first), reached and meshed (`reopen`), given kiln's code and the
        project, and the run planned on it: (the new cluster, the run's new plan, where it came up). Refused,
        before anything goes, where another run has processes on the cluster (the down would end it too)."""
        old = self.group
        capacity = self.possible()  # read before the down forgets it
        if others := self.other_runs([host for host in self.group.hosts if host not in gone]):
            raise KilnError(f"cluster {old.name} also runs {', '.join(others)}: kiln does not take it down under "
                            f"{'that run' if len(others) == 1 else 'those runs'}")
        old.remote.reset(old.hosts)
        keep = SNAPSHOT_TTL_DAYS if capacity["asked"].get("volume") and self.provider.volumes else None
        gone_now = self.provider.down(old.name, snapshot_ttl_days=keep)  # data volumes kept as snapshots
        print("\n".join(gone_now.lines), flush=True)
        if gone_now.kept:
            raise KilnError(f"cluster {old.name}: its machines are gone, but data volumes could not be snapshotted "
                            f"and are kept ({'; '.join(gone_now.kept)}): kiln does not bring it up elsewhere without "
                            f"them (kiln down {old.name} --snapshot tries again)")
        try:
            where = self.up_again(capacity)
        except KilnError as error:
            raise KilnError(f"cluster {old.name} was taken down, and could not be brought up again: {error}") \
                from None
        record = state.load_cluster(old.name)
        self.provider = providers.for_cluster(record, old.name)  # the new place's (another region, cloud)
        try:
            return (*self.settle(record), where)
        except KilnError as error:
            raise KilnError(f"cluster {old.name} is up again at {where}, but the run cannot go on there: {error} "
                            f"(kiln down {old.name} removes it)") from None

    def possible(self) -> dict:
        """The cluster's capacity.json, where it can move at all: KilnError (nothing done) where kiln cannot know
        what its up asked, or the up named no place but the one that has just refused."""
        name = self.group.name
        capacity = state.load_capacity(name)
        if not capacity or not capacity.get("asked") or not self.up_again or not self.reopen:
            raise KilnError(f"cluster {name} has no record of what its kiln up asked: it cannot be brought up "
                            "elsewhere")
        came_up = failover.candidates_of(capacity)[1]
        if not failover.moved_order(*failover.candidates_of(capacity)):
            raise KilnError(f"cluster {name} has no place to move to but {came_up.describe()}, which has just "
                            f"refused a machine (its kiln up named no other: --zones, --regions, --provider): kiln "
                            f"does not take it down; it is left as it is")
        return capacity

    def settle(self, record: state.ClusterRecord) -> tuple[Cluster, RunPlan]:
        """The cluster brought up again, reached, meshed, armed (autostop), given the code, and the run planned on
        it (its interface and fabric found again, as the user asked them)."""
        group, nodes = self.reopen()
        if same_root(group) != self.paths.root:
            raise KilnError(f"its home folder is {same_root(group)}, where the run's is {self.paths.root}")
        self.group = group
        self.bring_code(group)
        if self.idle_minutes:
            self.provider.arm_autostop(group.name)
            group.autostop(autostop.agent_args(self.idle_minutes, self.provider.shutdown), group.hosts)
            state.save_cluster(replace(record, idle_minutes=self.idle_minutes))
        self.spec = replace(self.spec, names=tuple(n.name for n in nodes), gpus=mesh.gpu_counts(nodes),
                            nic=self.nic or topology.common_interface({n.name: n.iface for n in nodes}),
                            fabric=interconnect.for_nodes(nodes, self.fabric))
        plan = launch.plan_run(self.spec)
        group.reserve_ports(plan.run_id, self.paths.root, plan.ports)  # new machines: nothing else holds them
        return group, plan

    def other_runs(self, hosts: Sequence[Host]) -> list[str]:
        """Other runs with processes on `hosts` (the cluster's that still answer: a lost one would only time out)."""
        found, _ = self.group.remote.map(hosts, lambda host: self.group.remote.node(
            host, self.group.python, "runs", timeout=30)["runs"])
        return sorted({run for runs in found.values() for run in runs} - {self.spec.run_id})
