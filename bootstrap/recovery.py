"""Putting a run back on its feet after a node is lost (I/O): the cluster's provider replaces the node, its new
host keys are pinned in place of the old ones, the mesh and the code are brought to the new machine, and the run
is planned again on the hosts it now has. The supervisor then restarts it from the last checkpoint."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bootstrap import autostop, launch, mesh
from bootstrap.cluster import Cluster
from bootstrap.hosts import Host
from bootstrap.launch import NodePaths, Program, RunPlan, RunSpec
from bootstrap.providers import Provider, Replacement


def recoverer(group: Cluster, provider: Provider, spec: RunSpec, paths: NodePaths, program: Program,
              folder: Path | None, idle_minutes: float | None = None, *, check_on_nodes: bool = True):
    """The supervisor's `recover`: lost hosts in, (replacements, the run's new plan) out. A cluster with
    autostop (idle_minutes) gets its agent on the new machines too. `check_on_nodes` false: the program is not
    checked on the new machine itself (it runs in a container image, which the restart brings there)."""

    def recover(lost: list[Host]) -> tuple[list[Replacement], RunPlan]:
        replaced = [provider.replace(group.name, host) for host in lost]
        mesh.pin_replacements(group.name, group.nodes, replaced)
        group.remote.reset([r.old for r in replaced] + [r.new for r in replaced])
        fresh = {r.old: r.new for r in replaced}
        group.hosts = [fresh.get(host, host) for host in group.hosts]
        nodes = group.require_facts("re-mesh")
        group.apply_mesh()
        group.sync_lib(paths.lib)
        if folder:
            group.sync(str(folder), paths.code)
            if check_on_nodes:
                group.check_program(launch.program_check(program, group.python, paths))
        if idle_minutes:
            group.autostop(autostop.agent_args(idle_minutes, provider.shutdown), [r.new for r in replaced])
        return replaced, launch.plan_run(replace(spec, names=tuple(n.name for n in nodes),
                                                 gpus=mesh.gpu_counts(nodes)))

    return recover
