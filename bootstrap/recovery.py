"""Putting a run back on its feet after a node is lost (I/O): the cluster's provider replaces the node, its new
host keys are pinned in place of the old ones, the mesh and the code are brought to the new machine, and the run
is planned again on the hosts it now has. The supervisor then restarts it from the last checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bootstrap import autostop, checkpoints, commands, interconnect, launch, mesh, providers, runs, state, topology
from bootstrap.cluster import Cluster
from bootstrap.errors import KilnError
from bootstrap.hosts import Host
from bootstrap.launch import NodePaths, Program, RunPlan, RunSpec
from bootstrap.live import Ended, Live
from bootstrap.orchestration import same_root
from bootstrap.providers import Provider, Replacement, failover
from bootstrap.providers.common import SNAPSHOT_TTL_DAYS
from bootstrap.ssh import HostFailure

SETUP_TIMEOUT_S = 1800  # a task's setup on a new machine (packages, a dataset) may take this long


@dataclass
class Recovery:
    """A managed run's recoveries on one cluster, which a move replaces whole (`group` is the cluster of now).
    `recover`: lost hosts in, (replacements, the run's new plan) out; a cluster with autostop (idle_minutes) gets
    its agent on the new machines too; `check_on_nodes` false: the program is not checked on the new machine
    itself (it runs in a container image, which the restart brings there). With `up_again` and `reopen`, a
    `move` as well (with `relocate`, where the place has no capacity for a replacement)."""

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
    relocate: bool = False  # where no replacement can be had for want of capacity, move the whole cluster
    setup: str | None = None  # a task's setup: run on every new machine before the run restarts
    setup_folder: Path | None = None  # the folder it runs from (the project's, also where the run is kiln's trainer)
    setup_timeout_s: float = SETUP_TIMEOUT_S

    def recover(self, lost: list[Host]) -> tuple[list[Replacement], RunPlan]:
        group = self.group
        replaced = [self.provider.replace(group.name, host) for host in lost]
        mesh.pin_replacements(group.name, group.nodes, replaced)
        group.remote.reset([r.old for r in replaced] + [r.new for r in replaced])
        fresh = {r.old: r.new for r in replaced}
        group.hosts = [fresh.get(host, host) for host in group.hosts]
        nodes = group.require_facts("re-mesh")
        group.apply_mesh()
        self.bring_code(group, [r.new for r in replaced])
        if self.idle_minutes:
            group.autostop(autostop.agent_args(self.idle_minutes, self.provider.shutdown), [r.new for r in replaced])
        return replaced, launch.plan_run(replace(self.spec, names=tuple(n.name for n in nodes),
                                                 gpus=mesh.gpu_counts(nodes)))

    def bring_code(self, group: Cluster, new: Sequence[Host]) -> None:
        """kiln's node part and the project on the (new) machines, the task's setup run on the `new` ones (as it
        ran on the first ones before the run started), and the program checked there."""
        project = self.folder or (self.setup_folder if self.setup else None)
        group.sync_run(self.paths.lib, str(project) if project else None, self.paths.code)
        if self.setup:
            self.run_setup(group, new)
        if self.folder and self.check_on_nodes:
            group.check_program(launch.program_check(self.program, group.python, self.paths))

    def run_setup(self, group: Cluster, hosts: Sequence[Host]) -> None:
        """The task's setup on `hosts`, side by side, from the project's folder with what every process gets
        (the user's variables among it); its output kept in the run's folder here, setup-HOST.log. A setup that
        fails fails the recovery, naming the machine and the log's last line."""
        argv = ("sh", "-c", self.setup)
        env = launch.process_env(self.spec.run_id, group.python, self.paths,
                                 Program(argv, env=self.program.env))  # as the first setup had
        command = commands.remote_command(argv, cwd=self.paths.code, env=env)
        print(f"setup on {', '.join(host.label for host in hosts)}: {self.setup}", flush=True)

        def one(host: Host) -> None:
            done = group.remote.run(host, command, timeout=self.setup_timeout_s)
            log = state.run_folder(self.spec.run_id) / f"setup-{host.label}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(done.stdout + done.stderr)
            if done.code != 0:
                said = (done.stdout + done.stderr).strip().splitlines()
                raise HostFailure(f"the setup exited {done.code}: {said[-1] if said else 'no output'} ({log})")

        group.remote.map_or_raise("setup", hosts, one)

    def answer(self, live: Live, ended: Ended, number: int, of: int, entry: dict) -> str | None:
        """The `number`th recovery of `of`: the attempt's lost and noticed hosts replaced where the cluster is,
        or, with `relocate` where that place has no capacity, the whole cluster brought up again elsewhere;
        summary.json's `entry` filled in. The failure, where the run cannot go on."""
        why = self.replace_nodes(live, ended, number, of, entry)
        if why is None:
            return None
        if self.relocate and self.wanted(why):
            return self.move_cluster(live, ended, why, number, of, entry)
        return f"recovery failed: {why}"

    def replace_nodes(self, live: Live, ended: Ended, number: int, of: int, entry: dict) -> KilnError | None:
        """Replace the attempt's lost and noticed hosts, keeping the chief's checkpoints and each old machine's
        files apart; the run's new plan and record. The failure, if the replacement could not be made."""
        going = ended.going
        names = {h: live.name(h) for h in going}
        print(f"recovery {number} of {of}: replacing {', '.join(h.label for h in going)}", flush=True)
        checkpoints.keep_chiefs(live, going)
        checkpoints.keep_apart(live, list(names.values()), number)
        try:
            with live.timeline.phase("replace"):
                replaced, live.plan = self.recover(going)
        except KilnError as failure:
            return failure
        live.record = runs.record_run(live.group, live.plan, live.paths)
        entry.update(kind="recovery", lost=[names[h] for h in live.lost], detected_at=round(ended.detected, 3),
                     interrupted=[names[h] for h in going if h not in live.lost],
                     replaced=[{"old": r.old.label, "new": r.new.label} for r in replaced])
        return None

    def move_cluster(self, live: Live, ended: Ended, why: KilnError, number: int, of: int,
                     entry: dict) -> str | None:
        """Move the run to the whole cluster brought up again elsewhere, as the lost nodes could not be replaced
        where it is (`why`): the first node's checkpoints are kept here first (the restart gives them to every
        new node); the failure, if the move could not be made."""
        names = {h: live.name(h) for h in ended.going}
        print(f"recovery {number} of {of}: no capacity to replace {', '.join(names.values())} where cluster "
              f"{live.group.name} is ({why}); bringing the whole cluster up again elsewhere, the run to resume from "
              "its last checkpoint", flush=True)
        try:
            self.possible()
        except KilnError as failure:
            return f"recovery failed: {why}; the cluster could not move: {failure}"
        try:
            checkpoints.keep_before_move(live)
        except KilnError as failure:  # the machines that hold them would go with the cluster
            return (f"recovery failed: {why}; the cluster was not moved, as the first node's checkpoints could not "
                    f"be kept here first ({failure}): it is left as it is")
        before = [h.label for h in live.group.hosts]
        lost = [name for h, name in names.items() if h in live.lost]
        interrupted = [name for h, name in names.items() if h not in live.lost]
        try:
            with live.timeline.phase("move"):
                group, plan, where = self.move(live.lost)
        except KilnError as failure:
            now = state.load_cluster(live.group.name)
            if now is None or [h.label for h in now.hosts] != before:
                live.released = True  # the old machines are gone: no ports to release there
            return f"recovery failed: {why}; the cluster could not move: {failure}"
        checkpoints.keep_apart(live, live.plan.names, number)  # every old machine's, after a move
        live.group, live.plan, live.lost, live.gone = group, plan, [], []
        live.runtime.moved(group)
        live.notice_source = providers.notice_source(state.load_cluster(group.name))
        live.record = runs.record_run(group, plan, live.paths)
        entry.update(kind="move", lost=lost, interrupted=interrupted, detected_at=round(ended.detected, 3),
                     moved_to=where,
                     replaced=[{"old": old, "new": new.label} for old, new in zip(before, group.hosts, strict=False)])
        print(f"cluster {group.name} is up again at {where}: {', '.join(h.label for h in group.hosts)}", flush=True)
        return None

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
        self.bring_code(group, group.hosts)
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
