"""A `kiln train` once its spec is checked (I/O): the cluster connected and meshed, the runtime chosen (the nodes'
own Python, or the run's container image), the spec completed from the nodes' facts, the run's ports reserved, a
managed run's recovery made ready (replacements, and with --relocate the move through the up's other places),
the run started and watched; with --down-after, the cluster removed wherever it then is."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bootstrap import interconnect, launch, mesh, providers, state, topology
from bootstrap.orchestration import choose_runtime, reserve_run_ports, same_root, start_and_watch
from bootstrap.providers import placement
from bootstrap.recovery import Recovery
from bootstrap.runspec import TrainAsk
from bootstrap.session import Target, connect_and_mesh, target
from bootstrap.timeline import Timeline


@dataclass(frozen=True)
class Watch:
    """How the run is watched: the limits of `kiln train` (timeout, restarts, the step watchdog's)."""

    timeout: float = 3600
    max_restarts: int = 0
    stall_factor: float = 20.0
    stall_minimum: float = 0.0
    stall_busy: float = 600.0


@dataclass(frozen=True)
class Reach:
    """How the cluster is reached: at most `fanout` nodes at once, new host keys trusted or not."""

    fanout: int = 64
    accept_new_host_keys: bool = False
    slots: int | None = None
    python: str | None = None  # --python as given: the nodes' Python, or with --image the image's


def owner_of(goal: Target, ask: TrainAsk, cluster: str | None) -> providers.Provider | None:
    """The provider of the cluster a managed run or --down-after needs (UsageError where kiln did not make it)."""
    if not (ask.managed or ask.down_after):
        return None
    return providers.for_cluster(state.load_cluster(goal.name), cluster)


def train(c, goal: Target, spec: launch.RunSpec, ask: TrainAsk, folder: Path | None, watch: Watch, reach: Reach,
          owner: providers.Provider | None, say) -> None:
    """Run `spec` on the cluster `goal` names, as `ask` asked (`owner`: its provider, for a managed run or
    --down-after); `say` prints a line."""
    record = state.load_cluster(goal.name)
    try:
        timeline = Timeline()
        group, nodes = connect_and_mesh(c, goal, timeline, fanout=reach.fanout,
                                        accept_new_host_keys=reach.accept_new_host_keys)
        paths = launch.NodePaths(same_root(group))
        runtime, processes_python = choose_runtime(group, ask.image, paths, spec.run_id, spec.program, reach.python,
                                                   timeline)
        spec = replace(spec, names=tuple(n.name for n in nodes), python=processes_python, root=paths.root,
                       nic=ask.nic or topology.common_interface({n.name: n.iface for n in nodes}),
                       gpus=mesh.gpu_counts(nodes), fabric=interconnect.for_nodes(nodes, ask.fabric))
        spec = reserve_run_ports(group, spec, moveable=not ask.base_port)
        recovery = Recovery(
            group, owner, spec, paths, spec.program, folder, record.idle_minutes if record else None,
            check_on_nodes=not ask.image,
            up_again=lambda capacity: placement.up_again(goal.name, capacity, say).describe(),
            reopen=lambda: connect_and_mesh(c, target(c, hostfile=None, cluster=goal.name, slots=reach.slots,
                                                      python=None if ask.image else reach.python), timeline,
                                            fanout=reach.fanout, accept_new_host_keys=reach.accept_new_host_keys),
            nic=ask.nic, fabric=ask.fabric, relocate=ask.relocate, setup=ask.setup,
            setup_folder=Path(ask.setup_folder) if ask.setup_folder else None) if ask.managed else None
        start_and_watch(group, launch.plan_run(spec), paths, spec.program, folder, detach=ask.detach,
                        timeout=watch.timeout, max_restarts=watch.max_restarts, stall_factor=watch.stall_factor,
                        stall_minimum=watch.stall_minimum, stall_busy=watch.stall_busy, timeline=timeline,
                        recovery=recovery, max_recoveries=ask.max_recoveries if recovery else 0, runtime=runtime,
                        python=processes_python, notice_source=providers.notice_source(record),
                        stop_if_interrupted=ask.down_after)
    finally:
        if ask.down_after:  # the provider of where the cluster is now (a managed run may have moved it)
            say(f"--down-after: removing cluster {goal.name}")
            now = state.load_cluster(goal.name)
            say("\n".join((providers.for_cluster(now, goal.name) if now else owner).down(goal.name).lines))
