"""How a run goes on a connected cluster, as the tasks call it: ports reserved for the run alone, the runtime
chosen (the nodes' own Python, or a container image), preflight, sync, the processes started and watched to their
end (with restarts and recoveries), and the all-reduce across the nodes judged. The tasks (bootstrap/tasks/) parse,
connect and print; this does the work through the cluster, the supervisor and the runtimes."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from invoke.exceptions import Exit

from bootstrap import interconnect, launch, mesh, preflight, runs, state, topology, watchdog
from bootstrap.cluster import Cluster
from bootstrap.container import ContainerRuntime, HostRuntime, Runtime
from bootstrap.errors import KilnError
from bootstrap.live import Recoverer
from bootstrap.runs import record_run
from bootstrap.supervisor import Supervisor
from bootstrap.timeline import Timeline
from kiln.gpu import collective as gpu_collective
from kiln.shield import shielded

CPU_ALLREDUCE_BYTES = 32 << 20  # across CPU-only nodes (Gloo over TCP): the network's pace shows at this size
PORT_TRIES = 20  # base ports tried, each past the last, before a run gives up finding free ones


def check_collective(group: Cluster, nic: str | None, record: state.ClusterRecord | None, *,
                     asked: bool = True) -> None:
    """Measure and judge the all-reduce across the nodes (Cluster.allreduce_across); print what was measured;
    fail naming the nodes far below the others, or the cluster under its node type's floor. It runs through
    Horovod: without it on every node, `--collective` (`asked`) fails and `--gpu` notes it."""
    if len(group.hosts) < 2:
        print("collective: one node, nothing to measure across nodes")
        return
    missing = [node.name for node in group.nodes if not node.facts.get("packages", {}).get("horovod")]
    if missing:
        why = f"no Horovod in {group.python} on {', '.join(missing)}"
        if asked:
            raise KilnError(f"--collective measures through Horovod: {why}")
        print(f"\ncollective: not measured across nodes ({why})")
        return
    paths = launch.NodePaths(same_root(group))
    group.sync_lib(paths.lib)
    interface = nic or topology.common_interface({n.name: n.iface for n in group.nodes})
    gpus = mesh.gpu_counts(group.nodes)
    size = gpu_collective.max_bytes([]) if any(gpus) else CPU_ALLREDUCE_BYTES
    fabric = interconnect.for_nodes(group.nodes)
    everyone, pairs = group.allreduce_across(paths, interface, max_bytes=size, min_bytes=min(size, 64 << 20),
                                             env=dict(fabric.env))
    names = [node.name for node in group.nodes]
    verdict = gpu_collective.judge_across(names, everyone, pairs, record.node_type if record else None,
                                          max(gpus), fabric.kind)
    print(f"\ncollective over {interface}" + (f" ({fabric.note})" if fabric.note else "") + ":")
    for line in [*verdict.lines, *verdict.notes]:
        print(f"  {line}")
    found = [f"{name}: {problem}" for name, problems in verdict.nodes.items() for problem in problems]
    found += [f"the cluster: {problem}" for problem in verdict.cluster]
    if found:
        raise KilnError("collective check failed: " + "; ".join(found))


def reserve_run_ports(group: Cluster, spec: launch.RunSpec, *, moveable: bool) -> launch.RunSpec:
    """The run's spec with ports reserved on every node for it alone (runs side by side on the same hosts):
    where another run holds some, a `moveable` run (no --base-port given) moves past them; otherwise it is
    refused naming the run that holds them."""
    for _ in range(PORT_TRIES):
        ports = launch.plan_run(spec).ports
        taken = group.reserve_ports(spec.run_id, spec.root, ports)
        if not taken:
            return spec
        group.release_ports(spec.run_id, spec.root)
        if not moveable:
            raise KilnError(f"--base-port {spec.base_port}: {topology.describe_reserved(taken)}; give another "
                            "--base-port, or leave it out and kiln finds free ones")
        print(f"ports: {topology.describe_reserved(taken)}; trying from {topology.next_base_port(ports)}",
              flush=True)
        spec = replace(spec, base_port=topology.next_base_port(ports))
    raise KilnError(f"no free ports for the run after {PORT_TRIES} tries from {topology.DEFAULT_BASE_PORT}")


def choose_runtime(group: Cluster, image: str | None, paths: launch.NodePaths, run_id: str, program: launch.Program,
                   python: str | None, timeline: Timeline) -> tuple[Runtime, str]:
    """Where the run's processes run, and the Python they run with: the nodes' own (the default), or, with
    `image`, that image on every node (resolved to one image id now, so the plan names the image's Python)."""
    if not image:
        return HostRuntime(), group.python
    runtime = ContainerRuntime(group, image, paths, run_id, checkpoint_dir=program.checkpoint_dir, python=python)
    with timeline.phase("pull"):
        runtime.resolve(group.hosts)
    return runtime, runtime.python_path(group.hosts[0])


def ready_and_start(group: Cluster, plan: launch.RunPlan, paths: launch.NodePaths, program: launch.Program,
                    folder: Path | None, *, timeline: Timeline, runtime: Runtime, python: str | None,
                    stall_factor: float, stall_minimum: float, timeout: float,
                    notice_source: str = "any", watched: bool = True,
                    stall_busy: float = watchdog.BUSY_LIMIT_S) -> tuple[state.RunRecord, Supervisor]:
    """Preflight, sync, the runtime made ready and checked, the program checked, the run recorded, every
    process started: (the run's record, its supervisor)."""
    # In a container image, the image's frameworks are checked instead. The mesh is proved by a login between
    # nodes (an SSH handshake, most of a preflight's time) only where the run logs in between nodes.
    with timeline.phase("preflight"):
        table, passed = group.preflight(ports=plan.ports, frameworks=runtime.needs_node_frameworks,
                                        required=plan.frameworks,
                                        probes=preflight.MESH_PROBES if plan.logs_in_between_nodes else 0)
    if not passed:
        print(table)
        raise KilnError("preflight failed (see the table above); nothing was started")
    with timeline.phase("sync"):
        group.sync_run(paths.lib, str(folder) if folder else None, paths.code)
    runtime.prepare(group.hosts, timeline)
    runtime.check(group.hosts)
    if folder:
        group.check_program(runtime.wrap_check(launch.program_check(program, python or group.python, paths),
                                               plan.run_id))
    record = record_run(group, plan, paths, watched=watched)
    supervisor = Supervisor(group, plan, paths, stall_factor=stall_factor, stall_minimum=stall_minimum,
                            stall_busy=stall_busy,
                            timeline=timeline, notice_watch=timeout, notice_source=notice_source, runtime=runtime)
    with timeline.phase("start"):
        supervisor.start()
    return record, supervisor


def start_and_watch(group: Cluster, plan: launch.RunPlan, paths: launch.NodePaths, program: launch.Program,
                    folder: Path | None, *, detach: bool, timeout: float, max_restarts: int, stall_factor: float,
                    stall_minimum: float, timeline: Timeline, recovery: Recoverer | None = None,
                    max_recoveries: int = 0, runtime: Runtime | None = None, python: str | None = None,
                    notice_source: str = "any", stop_if_interrupted: bool = False,
                    stall_busy: float = watchdog.BUSY_LIMIT_S) -> None:
    """Preflight, sync, make the runtime ready (the run's containers), start every process of the plan (with
    `python`, default the nodes'), then (unless detached) watch it to its end. Until the processes have
    started, a failure stops what was made ready and gives up the run's port reservations. A Ctrl-C while it is
    watched leaves the run going, or with `stop_if_interrupted` (its cluster goes next: --down-after) stops it and
    collects what its nodes hold first."""
    runtime = runtime or HostRuntime()
    try:
        record, supervisor = ready_and_start(group, plan, paths, program, folder, timeline=timeline,
                                             runtime=runtime, python=python, stall_factor=stall_factor,
                                             stall_minimum=stall_minimum, timeout=timeout, stall_busy=stall_busy,
                                             notice_source=notice_source, watched=not detach)
    except BaseException:
        group.remote.map(group.hosts, lambda h: group.remote.node(h, group.python, "stop", plan.run_id, "5"))
        group.release_ports(plan.run_id, paths.root)
        raise
    print(f"run {plan.run_id} started: {len(plan.launches)} process(es) on {len(group.hosts)} host(s)", flush=True)
    if plan.placement:
        print(plan.placement, flush=True)
    if detach:
        print(f"follow it with: kiln status --run-id {plan.run_id} / kiln logs --run-id {plan.run_id}")
        return
    try:
        supervisor.run(record, timeout, max_restarts=max_restarts, recovery=recovery, max_recoveries=max_recoveries)
    except KeyboardInterrupt:
        if not stop_if_interrupted:
            print(f"\ninterrupted: the run goes on; stop it with kiln stop --run-id {plan.run_id}")
            raise Exit(code=130) from None
        print(f"\ninterrupted: stopping run {plan.run_id} and collecting its nodes' folders before its cluster goes",
              flush=True)
        stop_and_collect(supervisor, paths)
        raise Exit(code=130) from None


def stop_and_collect(supervisor: Supervisor, paths: launch.NodePaths) -> None:
    """Stop every process of a run, collect its nodes' folders and write its summary (stopped), a Ctrl-C while it
    does told to wait: what the nodes hold is gone once the cluster is. The supervisor's cluster and record are
    the run's of now (a managed run may have moved)."""
    group, record = supervisor.group, supervisor.record
    with shielded(f"stopping run {record.run_id} and collecting its nodes' folders",
                  "loses what is not collected yet when the cluster goes"):
        left = supervisor.stop()
        folder = supervisor.collect()
        if not supervisor.released:
            group.release_ports(record.run_id, paths.root)
        state.save_summary(record.run_id, runs.summary(
            record, status="stopped", failure="interrupted (Ctrl-C)" + (
                f"; could not stop: {', '.join(left)}" if left else ""), folder=folder,
            wall=time.time() - record.started))
    print(f"stopped run {record.run_id}; run folder: {folder}", flush=True)


def same_root(group: Cluster) -> str:
    roots = {group.remote_root(h) for h in group.hosts}
    if len(roots) != 1:
        raise KilnError(f"nodes have different home folders ({', '.join(sorted(roots))}); "
                        "horovodrun needs the same path everywhere: use the same user on every node")
    return roots.pop()
