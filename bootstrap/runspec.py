"""What a `kiln train` may ask together, and the run it asks for (pure): each rule broken is a UsageError that
names the options; what passes becomes the run's RunSpec, planned on the hosts as named until the nodes' facts
(names, GPUs, interface, fabric) replace them at run time."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from bootstrap import interconnect, launch, state, topology
from bootstrap.cluster import REMOTE_ROOT
from bootstrap.container import check_reference
from bootstrap.errors import UsageError
from bootstrap.hosts import Host


@dataclass(frozen=True)
class TrainAsk:
    """A `kiln train`'s options, as given (numbers already parsed by the command line)."""

    command: tuple[str, ...] = ()
    mode: str = "horovod"
    ps: int = 0
    chief: bool = False
    no_chief: bool = False
    evaluator: bool = False
    mpi: bool = False
    nic: str | None = None
    min_np: int = 0
    max_np: int = 0
    base_port: int = 0
    args: str = ""
    checkpoint_dir: str | None = None
    run_id: str | None = None
    detach: bool = False
    max_restarts: int = 0
    managed: bool = False
    max_recoveries: int = 3
    relocate: bool = False
    down_after: bool = False
    image: str | None = None
    fabric: str = "auto"
    env: tuple[tuple[str, str], ...] = ()
    setup: str | None = None  # a task file's setup: run on every node first, and on a managed run's new machines
    setup_folder: str | None = None  # the folder the setup runs from (synced to every node)


def check_train(ask: TrainAsk) -> None:
    """Every rule of what a train may ask together; the first broken one, as a UsageError."""
    command = list(ask.command)
    launch.validate_mode(ask.mode, ps=ask.ps, evaluator=ask.evaluator, mpi=ask.mpi)
    interconnect.validate(ask.fabric)
    if command and ask.args:
        raise UsageError("--args is for kiln's reference trainer; give your program's arguments after --")
    launch.check_placeholders(command, ask.mode)
    launch.validate_elastic(ask.mode, min_np=ask.min_np, max_np=ask.max_np, mpi=ask.mpi)
    if ask.min_np and ask.max_restarts:
        raise UsageError("an elastic run (--min-np) goes on without lost nodes instead of restarting: "
                         "--max-restarts does not go with it (--managed replaces lost nodes while it runs)")
    if ask.mode in ("torchrun", "jax") and not command:
        raise UsageError(f"--mode {ask.mode} runs your program: give it after --, e.g. kiln train --mode {ask.mode} "
                         "-- python train.py (kiln's reference trainer is TensorFlow: --mode horovod or tf-config)")
    if ask.no_chief and not command:
        raise UsageError("--no-chief is for a between-graph program whose workers lead themselves (give it "
                         "after --); kiln's reference trainer needs its chief")
    if ask.min_np and not command:
        raise UsageError("--min-np runs a program written for elastic Horovod (hvd.elastic.run, as "
                         "examples/horovod_elastic.py) or torchrun; kiln's reference trainer is not: give your "
                         "command after --")
    if ask.no_chief and not ask.ps:
        raise UsageError("--no-chief goes with --ps: without parameter servers there is no chief to leave out")
    check_watch(ask)
    if ask.image:
        check_reference(ask.image)


def check_watch(ask: TrainAsk) -> None:
    """The rules of watching, recovering and removing the run's cluster."""
    if ask.managed and ask.detach:
        raise UsageError("--managed watches the run to replace lost nodes: it cannot --detach")
    if ask.relocate and not ask.managed:
        raise UsageError("--relocate moves a managed run's cluster: give --managed too")
    if ask.relocate and ask.min_np:
        raise UsageError("--relocate restarts the run on a cluster brought up again; an elastic run (--min-np) goes "
                         "on without a node that cannot be replaced instead")
    if ask.down_after and ask.detach:
        raise UsageError("--down-after waits for the run to end: it cannot --detach")
    if ask.max_recoveries < 0:
        raise UsageError(f"--max-recoveries {ask.max_recoveries}: give 0 or more")


def split_args(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:
        raise UsageError(f"--args {text!r}: {error}") from None


def train_spec(ask: TrainAsk, hosts: Sequence[Host], python: str, new_run_id: str) -> launch.RunSpec:
    """The run a train asks for (check_train's rules first), on `hosts` as named; `new_run_id` where it names
    none."""
    check_train(ask)
    program = launch.Program(tuple(ask.command), tuple(split_args(ask.args)), ask.checkpoint_dir, ask.env)
    return launch.RunSpec(
        run_id=state.validate_run_id(ask.run_id) if ask.run_id else new_run_id, mode=ask.mode,
        names=tuple(h.address for h in hosts), slots=tuple(h.slots for h in hosts), python=python,
        root=f"~/{REMOTE_ROOT}", program=program, nic=ask.nic or "(found at run time)", ps=ask.ps,
        chief=ask.chief, no_chief=ask.no_chief, evaluator=ask.evaluator, mpi=ask.mpi,
        base_port=ask.base_port or topology.DEFAULT_BASE_PORT, min_np=ask.min_np, max_np=ask.max_np,
        fabric=interconnect.planned(ask.fabric))
