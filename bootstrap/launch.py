"""Launch plans (pure) and their execution: start, watch, stop, collect."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from bootstrap import commands, interconnect, topology
from bootstrap import node as node_side
from bootstrap.errors import UsageError
from bootstrap.hosts import Host

MODES = ("horovod", "tf-config", "torchrun", "jax")
HOROVOD_TASK = "horovodrun"
TORCHRUN_TASK = "torchrun"  # one agent per node: torchrun-0 (the rendezvous' host), torchrun-1, ...
JAX_TASK = "jax"  # one process per slot: jax-0 (the coordinator's), jax-1, ...
FRAMEWORKS = {"torchrun": ("torch",), "jax": ("jax",), "run": ()}  # else TensorFlow (the trainer's, Horovod's)
ELASTIC_AGENT_RESTARTS = 100  # an elastic torchrun agent restarts its workers on every change of the nodes
_HOROVOD_FAILED_RANK = re.compile(r"Terminating remaining workers after failure of Process (\d+)")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOTICE_INTERVAL = 2  # seconds between the watcher's looks at the metadata service (EC2 advises 5)
PLACEMENT_SHOWN = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "KILN_NUM_GPUS_PER_NODE", "KILN_HOST_SLOTS", "KILN_HOST_GPUS",
                   "NCCL_SOCKET_IFNAME", "KILN_COORDINATOR", "JAX_PROCESS_ID", "JAX_NUM_PROCESSES",
                   "JAX_LOCAL_DEVICE_IDS", "NCCL_NET")
NOTICE_GRACE = 90  # seconds a run's processes get after a notice that does not say (EC2's: two minutes' notice)


@dataclass(frozen=True)
class Launch:
    """One process to start: on which host (index), under which task name, how, from which folder."""

    host: int
    task: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    files: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""


@dataclass(frozen=True)
class RunPlan:
    """Everything a run starts, decided before anything is started."""

    run_id: str
    mode: str
    names: tuple[str, ...]
    launches: tuple[Launch, ...]
    finishing: tuple[str, ...]
    rank_hosts: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()  # what the processes listen on, per host: preflight checks they are free
    checkpoint_dir: str = ""  # spread from the first node to the others before a restart
    watch_output: bool = False  # a user's program: silence counts as a stall (kiln's trainer logs its steps)
    placement: str = ""  # how many processes on which nodes, and why (topology.placement_note)
    elastic: bool = False  # horovodrun's or torchrun's elastic mode: nodes but the first may go, the run goes on

    @property
    def logs_in_between_nodes(self) -> bool:
        """Whether the run's processes log in from node to node over the mesh (horovodrun starts the other
        nodes' ranks over SSH); the other modes' processes, each started from here, only connect over TCP."""
        return self.mode == "horovod" and len(self.names) > 1

    @property
    def frameworks(self) -> tuple[str, ...]:
        """What the nodes' Python must have for this run (preflight)."""
        return FRAMEWORKS.get(self.mode, ("tensorflow",))

    def tasks_on(self, host: int) -> list[str]:
        return [launch.task for launch in self.launches if launch.host == host]

    @property
    def may_finish(self) -> frozenset[str]:
        """Processes whose exit 0 before the run is done is theirs to make: with parameter servers, the workers
        (a between-graph program's worker stops on its own once the global step is reached); in an elastic
        torchrun run, every agent but the first."""
        tasks = [launch.task for launch in self.launches]
        if self.mode == "torchrun" and self.elastic:  # the first agent, the rendezvous' host, ends the run
            return frozenset(task for task in tasks if task != f"{TORCHRUN_TASK}-0")
        if self.mode != "tf-config" or not any(task.startswith("ps-") for task in tasks) or \
                not any(task.startswith("chief-") for task in tasks):
            return frozenset()
        return frozenset(task for task in tasks if task.startswith("worker-"))


@dataclass(frozen=True)
class NodePaths:
    """Where a run lives on a node (the same on every node: same user, same home)."""

    root: str

    @property
    def code(self) -> str:
        """The user's project, synced: user programs run here."""
        return f"{self.root}/code"

    @property
    def lib(self) -> str:
        """kiln's own part on the node: the reference trainer and the shims."""
        return f"{self.root}/lib"

    def run(self, run_id: str) -> str:
        return f"{self.root}/runs/{run_id}"


@dataclass(frozen=True)
class Program:
    """What every process runs: the user's argv from `code`, or (no argv) kiln's reference trainer."""

    argv: tuple[str, ...] = ()
    trainer_args: tuple[str, ...] = ()
    checkpoint_dir: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # the user's (--env, a task file's envs), for every process

    @property
    def is_user(self) -> bool:
        return bool(self.argv)


def user_argv(argv: Sequence[str], python: str) -> list[str]:
    """The user's command as the nodes run it: a script (`train.py`) or a bare `python`/`python3` runs with the
    nodes' Python (the one with TensorFlow and Horovod); anything else runs as given, found on PATH."""
    first = argv[0]
    if first.endswith(".py"):
        return [python, *argv]
    if first in ("python", "python3"):
        return [python, *argv[1:]]
    return list(argv)


def program_check(program: Program, python: str, paths: NodePaths) -> str | None:
    """A shell command that fails, saying what is missing, where a node could not start the user's program:
    the command itself (on the processes' PATH, or a path in the project) and the script it runs."""
    if not program.is_user:
        return None
    argv = user_argv(program.argv, python)
    code = paths.code
    env_path = process_path(python, paths)

    def fail(what: str) -> str:
        return f"{{ echo {shlex.quote(what)}; exit 1; }}"

    executable = argv[0]
    if "/" in executable:
        checks = [f"[ -x {shlex.quote(executable)} ] || "
                  + fail(f"{executable}: no such executable (from {code})")]
    else:
        checks = [f"command -v {shlex.quote(executable)} >/dev/null || "
                  + fail(f"{executable}: command not found (PATH={env_path})")]
    if executable == python and len(argv) > 1 and not argv[1].startswith("-"):
        checks.append(f"[ -f {shlex.quote(argv[1])} ] || " + fail(f"{argv[1]}: no such file in {code}"))
    return f"cd {shlex.quote(code)} && PATH={shlex.quote(env_path)} && " + " && ".join(checks)


def process_path(python: str, paths: NodePaths) -> str:
    """Every process's PATH: kiln's shims first (horovodrun's ssh), then the nodes' Python, then the system's."""
    return f"{paths.lib}/shim:{PurePosixPath(python).parent}:{SYSTEM_PATH}"


def checkpoint_dir(program: Program, run_dir: str) -> str:
    return program.checkpoint_dir or f"{run_dir}/checkpoints"


# What every process of every mode gets, however it is started (kiln's launcher, a Slurm job): output unbuffered,
# and legacy Keras (tf-keras), which the multi-worker and parameter-server strategies and Horovod's callbacks need.
EVERY_PROCESS = {"PYTHONUNBUFFERED": "1", "TF_USE_LEGACY_KERAS": "1"}


def process_env(run_id: str, python: str, paths: NodePaths, program: Program = Program()) -> dict[str, str]:
    """What every process gets: the environment contract (docs/environment.md), the code on PYTHONPATH (kiln's
    for the reference trainer, the user's project for theirs), legacy Keras, and kiln's ssh shim first on PATH."""
    run_dir = paths.run(run_id)
    return {
        "KILN_RUN_ID": run_id,
        "KILN_MODEL_DIR": f"{run_dir}/model",
        "KILN_CHECKPOINT_DIR": checkpoint_dir(program, run_dir),
        "KILN_OUTPUT_DIR": f"{run_dir}/output",
        "KILN_HEARTBEAT": f"{run_dir}/{node_side.HEARTBEAT}",
        "PYTHONPATH": paths.code if program.is_user else paths.lib,
        **EVERY_PROCESS,
        **dict(program.env),
        "PATH": process_path(python, paths),
    }


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a variable a user may set (env_refusal)


def env_refusal(name: str) -> str | None:
    """Why a user's variable may not be set for the processes (None: it may): kiln sets it."""
    if not ENV_NAME.fullmatch(name):
        return "not a variable name (letters, digits, _)"
    if name.startswith("KILN_") or name in ("PATH", "PYTHONPATH"):
        return "kiln sets it (docs/environment.md)"
    return None


def parse_env(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """--env NAME=VALUE (repeatable) as (name, value) pairs, a later one winning (pure); UsageError naming it."""
    pairs: dict[str, str] = {}
    for item in items:
        name, equals, value = str(item).partition("=")
        if not equals:
            raise UsageError(f"--env {item!r}: give NAME=VALUE")
        refusal = env_refusal(name)
        if refusal:
            raise UsageError(f"--env {item!r}: {name}: {refusal}")
        pairs[name] = value
    return tuple(pairs.items())


# Placeholders in a user's command, filled per process: `{kiln:NAME}` inside any word. The `kiln:` prefix keeps
# them apart from a program's own braces ({epoch}) and from the shell's brace expansion (no comma, no `..`).
_PLACEHOLDER = re.compile(r"\{kiln:([^{}]*)\}")
PLACE_NAMES = ("local_rank", "local_size", "gpus", "node_rank", "num_nodes")
PLACEHOLDERS = {
    "tf-config": ("task", "task_type", "task_index", "chief_hosts", "worker_hosts", "ps_hosts", *PLACE_NAMES),
    "run": ("task", "shard_index", "shard_count", *PLACE_NAMES),
    "horovod": (),
    "torchrun": ("coordinator", "gpus", "node_rank", "num_nodes"),
    "jax": ("task", "coordinator", "process_id", "num_processes", *PLACE_NAMES),
}
_FROM_ENV = {"local_rank": "LOCAL_RANK", "local_size": "LOCAL_WORLD_SIZE", "gpus": "KILN_NUM_GPUS_PER_NODE",
             "node_rank": "KILN_NODE_RANK", "num_nodes": "KILN_NUM_NODES", "task": "KILN_TASK",
             "shard_index": "KILN_SHARD_INDEX", "shard_count": "KILN_SHARD_COUNT",
             "coordinator": "KILN_COORDINATOR", "process_id": "JAX_PROCESS_ID", "num_processes": "JAX_NUM_PROCESSES"}


def check_placeholders(argv: Sequence[str], mode: str) -> None:
    """Refuse, before anything starts, a placeholder kiln does not fill in `mode` (or one left unclosed)."""
    known = PLACEHOLDERS[mode]
    for word in argv:
        if word.count("{kiln:") != len(_PLACEHOLDER.findall(word)):
            raise UsageError(f"{word!r}: a {{kiln:...}} placeholder without its closing brace")
        for name in _PLACEHOLDER.findall(word):
            if name in known:
                continue
            if mode == "horovod":
                raise UsageError(f"{{kiln:{name}}}: in horovod mode every rank runs the same command; read its "
                                 "place from the environment (HOROVOD_RANK, LOCAL_RANK, KILN_NUM_GPUS_PER_NODE)")
            raise UsageError(f"{{kiln:{name}}}: no such placeholder in {mode} mode (known: "
                             + ", ".join(f"{{kiln:{k}}}" for k in known) + ")")


def fill_placeholders(argv: Sequence[str], values: Mapping[str, str]) -> tuple[str, ...]:
    """`argv` with every `{kiln:NAME}` replaced by its value for this process (pure; check_placeholders first)."""
    return tuple(_PLACEHOLDER.sub(lambda match: values[match.group(1)], word) for word in argv)


def placeholder_values(env: Mapping[str, str], topo: topology.Topology | None = None,
                       process: topology.Process | None = None) -> dict[str, str]:
    """What each placeholder stands for in one process: its place (from its environment) and, in tf-config
    mode, its role and index and every role's `host:port` list, as TF_CONFIG has them."""
    values = {name: env[key] for name, key in _FROM_ENV.items() if key in env}
    if topo is not None and process is not None:
        spec = topo.cluster_spec()
        values.update({"task_type": process.role, "task_index": str(process.index),
                       **{f"{role}_hosts": ",".join(spec.get(role, [])) for role in ("chief", "worker", "ps")}})
    return values


def placement_env(*, node_rank: int, nodes: int, gpus: int, local_rank: int, local_size: int) -> dict[str, str]:
    """Where one process stands (the environment contract, docs/environment.md): its node among the run's nodes,
    the node's GPU count, and its place among the processes on its node, named as torchrun names them."""
    return {"KILN_NUM_NODES": str(nodes), "KILN_NODE_RANK": str(node_rank), "KILN_NUM_GPUS_PER_NODE": str(gpus),
            "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_size)}


def interface_env(nic: str | None) -> dict[str, str]:
    """The interface NCCL's and Gloo's sockets use, where kiln knows it (horovodrun sets these itself)."""
    return {"NCCL_SOCKET_IFNAME": nic, "GLOO_SOCKET_IFNAME": nic} if nic else {}


def gpu_counts(gpus: Sequence[int] | None, hosts: int) -> list[int]:
    return list(gpus) if gpus is not None else [0] * hosts


def placed(launches: list[Launch], nodes: int, gpus: Sequence[int]) -> tuple[Launch, ...]:
    """The launches with their placement variables (placement_env) added."""
    ranks = topology.local_ranks([item.host for item in launches])
    return tuple(replace(item, env={**item.env, **placement_env(
        node_rank=item.host, nodes=nodes, gpus=gpus[item.host], local_rank=local, local_size=size)})
        for item, (local, size) in zip(launches, ranks, strict=True))


def working_dir(program: Program, paths: NodePaths) -> str:
    return paths.code if program.is_user else paths.lib


def entry_argv(program: Program, python: str, strategy: str, run_dir: str) -> list[str]:
    if program.is_user:
        return user_argv(program.argv, python)
    return commands.trainer_argv(python, strategy, run_dir=run_dir, model_dir=f"{run_dir}/model",
                                 extra=program.trainer_args)


def plan_horovod(run_id: str, names: Sequence[str], slots: Sequence[int], *, python: str, paths: NodePaths,
                 program: Program, nic: str | None, mpi: bool = False, gpus: Sequence[int] | None = None,
                 elastic: tuple[int, int] | None = None) -> RunPlan:
    """One horovodrun on the first node over a generated hostfile. Every rank starts through kiln's kiln-rank
    shim, which gives it its placement variables (from the hosts' slots and GPU counts, as the hostfile fills
    them) and, for a user's program, its own KILN_OUTPUT_DIR (output/rank-N)."""
    run_dir = paths.run(run_id)
    entry = [f"{paths.lib}/shim/kiln-rank", *entry_argv(program, python, "horovod", run_dir)]
    # horovodrun through kiln's shim/horovodrun.py: its build check answered from a per-install cache.
    horovodrun = [python, f"{paths.lib}/shim/horovodrun.py"]
    # On one node horovodrun talks over loopback and refuses any other interface; with one process
    # its --output-filename divides by zero (horovod 0.28.1), and the log has that one rank anyway.
    if elastic:  # a discovery script instead of a hostfile (horovodrun runs it through a shell)
        hosts_file, text = f"{run_dir}/discover", topology.discovery_script(names, slots)
        hosts_arg = f"sh {shlex.quote(hosts_file)}"
    else:
        hosts_file, text = f"{run_dir}/hostfile", topology.horovod_hostfile(names, slots)
        hosts_arg = hosts_file
    argv = commands.horovodrun_argv(horovodrun, processes=sum(slots), hostfile=hosts_arg, entry=entry,
                                    nic=nic if len(names) > 1 or elastic else None, mpi=mpi,
                                    output_dir=f"{run_dir}/ranks" if sum(slots) > 1 else None, elastic=elastic)
    env = {**process_env(run_id, python, paths, program), "KILN_NUM_NODES": str(len(names)),
           "KILN_HOST_NAMES": ",".join(names), "KILN_HOST_SLOTS": ",".join(map(str, slots)),
           "KILN_HOST_GPUS": ",".join(map(str, gpu_counts(gpus, len(names))))}
    launch = Launch(0, HOROVOD_TASK, tuple(argv), env, {hosts_file: text}, working_dir(program, paths))
    return RunPlan(run_id, "horovod", tuple(names), (launch,), (HOROVOD_TASK,),
                   tuple(topology.horovod_rank_hosts(names, slots)), checkpoint_dir=checkpoint_dir(program, run_dir),
                   # an elastic run's ranks renumber and its lost ones fall silent: no output watch
                   watch_output=program.is_user and elastic is None, elastic=elastic is not None)


def plan_tf_config(run_id: str, topo: topology.Topology, *, python: str, paths: NodePaths,
                   program: Program, nic: str | None = None, gpus: Sequence[int] | None = None) -> RunPlan:
    """One process per role, each with its own TF_CONFIG and output folder, and the interface its collectives
    use (`nic`)."""
    strategy = "ps" if any(p.role == "ps" for p in topo.processes) else "multiworker"
    run_dir = paths.run(run_id)
    launches = []
    for process in topo.processes:
        env = process_env(run_id, python, paths, program)
        env.update({"KILN_TASK": process.task, "KILN_OUTPUT_DIR": f"{env['KILN_OUTPUT_DIR']}/{process.task}",
                    "TF_CONFIG": json.dumps(topology.tf_config(topo, process), separators=(",", ":")),
                    **interface_env(nic)})
        launches.append(Launch(process.host, process.task, tuple(entry_argv(program, python, strategy, run_dir)),
                               env, cwd=working_dir(program, paths)))
    finishing = tuple(p.task for p in topology.finishing_tasks(topo))
    launches = [replace(item, argv=fill_placeholders(item.argv, placeholder_values(item.env, topo, process)))
                for item, process in zip(placed(launches, len(topo.names), gpu_counts(gpus, len(topo.names))),
                                         topo.processes, strict=True)]
    return RunPlan(run_id, "tf-config", topo.names, tuple(launches), finishing,
                   ports=tuple(sorted({p.port for p in topo.processes})),
                   checkpoint_dir=checkpoint_dir(program, run_dir), watch_output=program.is_user)


def torchrun_entry(program: Program, python: str) -> list[str]:
    """What follows torchrun's own options: a Python script (or `-m module`) runs in torchrun's workers with
    torchrun's Python, the nodes'; any other command with --no-python."""
    argv = user_argv(program.argv, python)
    if argv[0] != python:
        return ["--no-python", *argv]
    rest = argv[1:]
    if rest[:1] == ["-m"] and len(rest) > 1:
        return ["--module", *rest[1:]]
    if not rest or rest[0].startswith("-"):
        raise UsageError(f"{shlex.join(program.argv)}: torchrun runs a Python script or `python -m MODULE`; "
                         "give Python's own options through the environment (PYTHONWARNINGS=..., PYTHONOPTIMIZE=1)")
    return rest


def nodes_range(elastic: tuple[int, int] | None, slots: Sequence[int]) -> str:
    """torchrun's --nnodes: every node, or MIN:MAX nodes for an elastic run whose bounds count processes (as
    horovodrun's do), each node giving its slots."""
    if elastic is None:
        return str(len(slots))
    per_node = set(slots)
    if len(per_node) != 1:
        raise UsageError("an elastic torchrun run (--min-np) needs the same --slots on every node: its bounds "
                         "count whole nodes")
    size = per_node.pop()
    low, high = elastic
    if low % size or high % size:
        raise UsageError(f"--min-np {low} / --max-np {high}: torchrun's elastic bounds count whole nodes of {size} "
                         f"process(es): give multiples of {size}")
    return f"{low // size}:{high // size}"


def plan_torchrun(run_id: str, names: Sequence[str], slots: Sequence[int], *, python: str, paths: NodePaths,
                  program: Program, nic: str | None, port: int, gpus: Sequence[int] | None = None,
                  elastic: tuple[int, int] | None = None) -> RunPlan:
    """One torchrun agent per node (torchrun-N), each starting its node's slots of workers, all meeting in a c10d
    rendezvous on the first node at `port` under the run's id: torchrun gives every worker RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR and the rest. Every agent tees its workers' output (prefixed with their rank) into its
    own log and keeps each worker's files under ranks/NODE. Elastic (`elastic`: process bounds): --nnodes MIN:MAX,
    and the agents restart their workers whenever a node goes or comes (kiln restarts a failed static run)."""
    run_dir = paths.run(run_id)
    counts = gpu_counts(gpus, len(names))
    coordinator = f"{names[0]}:{port}"
    if not program.is_user:
        raise UsageError("--mode torchrun runs your PyTorch program: give it after --, e.g. kiln train --mode "
                         "torchrun -- python train.py (kiln's reference trainer is TensorFlow)")
    entry, nnodes = torchrun_entry(program, python), nodes_range(elastic, slots)
    launches = []
    for host, name in enumerate(names):
        task = f"{TORCHRUN_TASK}-{host}"
        argv = [python, "-m", "torch.distributed.run", "--nnodes", nnodes,
                "--nproc-per-node", str(slots[host]), "--rdzv-backend", "c10d", "--rdzv-endpoint", coordinator,
                "--rdzv-id", run_id, "--local-addr", name,
                "--max-restarts", str(ELASTIC_AGENT_RESTARTS if elastic else 0),
                "--log-dir", f"{run_dir}/ranks/{name}", "--tee", "3", *entry]
        env = process_env(run_id, python, paths, program)
        env.update({"KILN_TASK": task, "KILN_OUTPUT_DIR": f"{env['KILN_OUTPUT_DIR']}/{task}",
                    "KILN_COORDINATOR": coordinator, "KILN_NUM_NODES": str(len(names)),
                    "KILN_NODE_RANK": str(host), "KILN_NUM_GPUS_PER_NODE": str(counts[host]), **interface_env(nic)})
        if elastic:  # a node that joins later waits forever for the first round's master address in a store the
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # agents share (torch 2.13): each round names its own
        launches.append(Launch(host, task, fill_placeholders(argv, placeholder_values(env)), env,
                               cwd=working_dir(program, paths)))
    # An elastic run is done when the first agent (the rendezvous' host) is: an agent that joined as the training
    # ended waits for peers that will not come (RunPlan.may_finish lets the others end early).
    finishing = (launches[0].task,) if elastic else tuple(item.task for item in launches)
    return RunPlan(run_id, "torchrun", tuple(names), tuple(launches), finishing, ports=(port,),
                   checkpoint_dir=checkpoint_dir(program, run_dir), elastic=elastic is not None,
                   watch_output=elastic is None)  # an elastic run's lost agents fall silent: no output watch


def jax_env(*, coordinator: str, processes: int, process_id: int, local_rank: int, local_size: int,
            gpus: int) -> dict[str, str]:
    """What a JAX process is told of its place. JAX reads JAX_COORDINATOR_ADDRESS and JAX_LOCAL_DEVICE_IDS itself;
    the process count and id it takes only from a cluster it detects, so kiln gives them as Open MPI's mpirun does
    (its OMPI_* variables, which jax.distributed reads), as JAX_NUM_PROCESSES / JAX_PROCESS_ID for programs that
    read those, and as Keras 3's own (keras.distribution.initialize(), on the JAX backend). On a node with GPUs,
    each process drives its share of them (JAX_LOCAL_DEVICE_IDS: all of them for one process per node;
    CUDA_VISIBLE_DEVICES untouched, so NCCL sees every GPU)."""
    env = {"JAX_COORDINATOR_ADDRESS": coordinator, "JAX_NUM_PROCESSES": str(processes),
           "JAX_PROCESS_ID": str(process_id), "KILN_COORDINATOR": coordinator,
           "KERAS_BACKEND": "jax", "KERAS_DISTRIBUTION_JOB_ADDRESSES": coordinator,
           "KERAS_DISTRIBUTION_NUM_PROCESSES": str(processes),
           "KERAS_DISTRIBUTION_PROCESS_ID": str(process_id),
           "OMPI_MCA_orte_hnp_uri": f"0.0;tcp://{coordinator}", "OMPI_COMM_WORLD_SIZE": str(processes),
           "OMPI_COMM_WORLD_RANK": str(process_id), "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
           "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size)}
    if gpus:  # else JAX, seeing Open MPI's local rank, would give a node's one process its first GPU alone
        env["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(gpu) for gpu in range(gpus) if gpu % local_size == local_rank)
    return env


def plan_jax(run_id: str, names: Sequence[str], slots: Sequence[int], *, python: str, paths: NodePaths,
             program: Program, nic: str | None, port: int, gpus: Sequence[int] | None = None) -> RunPlan:
    """One JAX process per slot (jax-N; one per node unless --slots: JAX drives every GPU of its node), process 0
    on the first node holding the coordination service at `port`; each told its place (jax_env), so a program
    that calls jax.distributed.initialize() with no arguments runs unchanged."""
    if not program.is_user:
        raise UsageError("--mode jax runs your JAX program: give it after --, e.g. kiln train --mode jax -- "
                         "python train.py (kiln's reference trainer is TensorFlow)")
    run_dir = paths.run(run_id)
    counts = gpu_counts(gpus, len(names))
    for name, count, gpu_count in zip(names, slots, counts, strict=True):
        if gpu_count and count > gpu_count:
            raise UsageError(f"--slots {count} on {name}, which has {gpu_count} GPU(s): in jax mode each process "
                             "drives its own GPUs; give at most one process per GPU")
    hosts = [host for host, count in enumerate(slots) for _ in range(count)]
    coordinator = f"{names[0]}:{port}"
    launches = []
    for process_id, (host, (local, size)) in enumerate(zip(hosts, topology.local_ranks(hosts), strict=True)):
        task = f"{JAX_TASK}-{process_id}"
        env = process_env(run_id, python, paths, program)
        env.update({"KILN_TASK": task, "KILN_OUTPUT_DIR": f"{env['KILN_OUTPUT_DIR']}/{task}", **interface_env(nic),
                    **jax_env(coordinator=coordinator, processes=len(hosts), process_id=process_id,
                              local_rank=local, local_size=size, gpus=counts[host])})
        launches.append(Launch(host, task, tuple(user_argv(program.argv, python)), env,
                               cwd=working_dir(program, paths)))
    launches = [replace(item, argv=fill_placeholders(item.argv, placeholder_values(item.env)))
                for item in placed(launches, len(names), counts)]
    return RunPlan(run_id, "jax", tuple(names), tuple(launches), tuple(item.task for item in launches),
                   ports=(port,), checkpoint_dir=checkpoint_dir(program, run_dir), watch_output=True)


def shard(items: Sequence[str], count: int) -> list[list[str]]:
    """`items` in `count` contiguous parts, in order, sizes differing by at most one: every item exactly once."""
    size, extra = divmod(len(items), count)
    parts, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        parts.append(list(items[start:end]))
        start = end
    return parts


def spread(count: int, slots: Sequence[int]) -> list[int]:
    """The host of each of `count` processes: the hosts' slots in turn (host 0's first slot, its second, ...,
    then host 1's), round and round."""
    seats = [host for host, n in enumerate(slots) for _ in range(n)]
    return [seats[i % len(seats)] for i in range(count)]


def plan_processes(run_id: str, names: Sequence[str], asked: Sequence[int | None], *, python: str,
                   paths: NodePaths, program: Program, processes: int = 0, inputs: Sequence[str] | None = None,
                   gpus: Sequence[int] | None = None) -> RunPlan:
    """`kiln run`: the user's command as `processes` independent processes over the hosts (default: one per
    slot; a host's slots as `asked`, else one per GPU), each told its shard (KILN_SHARD_INDEX/COUNT) and, with
    `inputs`, given its part of them as a file (KILN_SHARD_INPUTS, one item per line)."""
    slots = topology.resolve_slots("run", asked, gpus)
    count = processes or sum(slots)
    run_dir = paths.run(run_id)
    parts = shard(inputs, count) if inputs is not None else None
    launches = []
    for index, host in enumerate(spread(count, slots)):
        task = f"shard-{index}"
        env = process_env(run_id, python, paths, program)
        env.update({"KILN_TASK": task, "KILN_OUTPUT_DIR": f"{env['KILN_OUTPUT_DIR']}/{task}",
                    "KILN_SHARD_INDEX": str(index), "KILN_SHARD_COUNT": str(count)})
        files = {}
        if parts is not None:
            env["KILN_SHARD_INPUTS"] = f"{run_dir}/{task}.inputs"
            files[env["KILN_SHARD_INPUTS"]] = "".join(f"{item}\n" for item in parts[index])
        launches.append(Launch(host, task, tuple(user_argv(program.argv, python)), env, files,
                               working_dir(program, paths)))
    launches = [replace(item, argv=fill_placeholders(item.argv, placeholder_values(item.env)))
                for item in placed(launches, len(names), gpu_counts(gpus, len(names)))]
    return RunPlan(run_id, "run", tuple(names), tuple(launches), tuple(item.task for item in launches),
                   checkpoint_dir=checkpoint_dir(program, run_dir), watch_output=True,
                   placement=topology.placement_note("run", names, asked, slots, gpus))


@dataclass(frozen=True)
class RunSpec:
    """What the operator asked to run, on nodes known by their cluster names, from `root` on every node."""

    run_id: str
    mode: str
    names: tuple[str, ...]
    slots: tuple[int | None, ...]  # as asked: None where the node's GPUs decide (topology.resolve_slots)
    python: str
    root: str
    program: Program = Program()
    nic: str | None = None
    ps: int = 0
    chief: bool = False
    no_chief: bool = False
    evaluator: bool = False
    mpi: bool = False
    base_port: int = topology.DEFAULT_BASE_PORT
    gpus: tuple[int, ...] | None = None  # each node's GPU count (its facts); None: not known yet (a dry run)
    min_np: int = 0  # horovod: elastic from this many processes (0: not elastic)
    max_np: int = 0  # ... to this many (0: every slot)
    fabric: interconnect.Choice = interconnect.Choice("")  # the collectives' fabric (from the nodes' facts)


def elastic_range(min_np: int, max_np: int, processes: int) -> tuple[int, int]:
    """horovodrun's elastic bounds: at least `min_np` processes, at most `max_np` (default: every slot now),
    starting with every slot (pure)."""
    top = max_np or processes
    if not 1 <= min_np <= processes:
        raise UsageError(f"--min-np {min_np}: give 1 to the {processes} processes the hosts have slots for")
    if top < min_np:
        raise UsageError(f"--max-np {max_np} is below --min-np {min_np}")
    return min_np, top


def plan_run(spec: RunSpec) -> RunPlan:
    """Everything the run starts, with its ports, decided once (pure)."""
    paths = NodePaths(spec.root)
    slots = topology.resolve_slots(spec.mode, spec.slots, spec.gpus)
    note = topology.placement_note(spec.mode, spec.names, spec.slots, slots, spec.gpus)
    elastic = elastic_range(spec.min_np, spec.max_np, sum(slots)) if spec.min_np else None  # horovod, torchrun
    if spec.mode == "horovod":
        plan = plan_horovod(spec.run_id, spec.names, slots, python=spec.python, paths=paths,
                            program=spec.program, nic=spec.nic, mpi=spec.mpi, gpus=spec.gpus, elastic=elastic)
    elif spec.mode == "torchrun":
        plan = plan_torchrun(spec.run_id, spec.names, slots, python=spec.python, paths=paths, program=spec.program,
                             nic=spec.nic, port=spec.base_port, gpus=spec.gpus, elastic=elastic)
    elif spec.mode == "jax":
        plan = plan_jax(spec.run_id, spec.names, slots, python=spec.python, paths=paths, program=spec.program,
                        nic=spec.nic, port=spec.base_port, gpus=spec.gpus)
    else:
        topo = topology.plan_tf_config(list(spec.names), list(slots), ps=spec.ps, chief=spec.chief,
                                       evaluator=spec.evaluator, base_port=spec.base_port, no_chief=spec.no_chief)
        plan = plan_tf_config(spec.run_id, topo, python=spec.python, paths=paths, program=spec.program,
                              nic=spec.nic, gpus=spec.gpus)
    return with_fabric(replace(plan, placement=note), spec.fabric)


def with_fabric(plan: RunPlan, choice: interconnect.Choice) -> RunPlan:
    """Every process told the run's fabric (its NCCL environment); the placement says which it is."""
    launches = tuple(replace(item, env={**item.env, **choice.env}) for item in plan.launches)
    return replace(plan, launches=launches, placement="\n".join(line for line in (plan.placement, choice.note) if line))


def allreduce_command(python: str, paths: NodePaths, names: Sequence[str], slots: Sequence[int], nic: str | None,
                      *, tag: str, max_bytes: int, min_bytes: int, reps: int = 3, timeout: float = 300,
                      env: Mapping[str, str] | None = None) -> str:
    """The shell command that measures an all-reduce across `names` from the first of them: one horovodrun
    (through kiln's shims: pinned host keys, as a run's) of kiln.gpu.allreduce, `slots` ranks per node, over
    `nic`, with `env` too (the fabric's: horovodrun passes it to every rank, so NCCL measures what a run would
    use); rank 0 prints the figures. Its hostfile lives under the node's kiln folder while it runs."""
    hostfile = f"{paths.root}/checks/allreduce-{tag}.hosts"
    entry = [python, f"{paths.lib}/allreduce.py", "--horovod", "--min-bytes", str(min_bytes), "--max-bytes",
             str(max_bytes), "--reps", str(reps)]
    argv = commands.horovodrun_argv([python, f"{paths.lib}/shim/horovodrun.py"], processes=sum(slots),
                                    hostfile=hostfile, entry=entry, nic=nic)
    run = commands.remote_command(argv, timeout=timeout, cwd=paths.lib,
                                  env={"PATH": process_path(python, paths), "PYTHONPATH": paths.lib,
                                       "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})
    quoted = shlex.quote(hostfile)
    return (f"mkdir -p {shlex.quote(paths.root + '/checks')} && printf %s "
            f"{shlex.quote(topology.horovod_hostfile(names, slots))} > {quoted} && "
            f"{{ {run}; status=$?; rm -f {quoted}; exit $status; }}")


def launch_command(launch: Launch, paths: NodePaths, run_id: str) -> str:
    """The shell command that writes the launch's files and starts it detached."""
    run_dir = paths.run(run_id)
    writes = "".join(f"printf %s {shlex.quote(text)} > {shlex.quote(path)} && " for path, text in launch.files.items())
    output = launch.env.get("KILN_OUTPUT_DIR")
    if output:
        writes += f"mkdir -p {shlex.quote(output)} && "
    start = commands.detached_command(launch.argv, cwd=launch.cwd or paths.lib, run_dir=run_dir, task=launch.task,
                                      env=launch.env)
    pid = shlex.quote(f"{run_dir}/{launch.task}.pid")
    started = f"for _ in $(seq 50); do [ -s {pid} ] && break; sleep 0.1; done; [ -s {pid} ]"
    return f"{writes}{start} && {started}"


def watcher_command(run_id: str, python: str, paths: NodePaths, timeout: float, tasks: Sequence[str] = (),
                    source: str = "any") -> str:
    """The shell command that starts a node's spot interruption watcher for the run, detached, reading `source`'s
    metadata (shim/interruption.py: ec2, gce, or any that answers): on a notice it writes notice.json in the run
    folder and stops the run's processes there with SIGTERM (node.py stop), killing what is left after the
    source's grace, so they can checkpoint within the cloud's notice. It carries the run's id, so stopping the run
    stops it too; it ends by itself once the node's tasks have all exited (a node with none, a horovod worker
    host, watches until the timeout)."""
    run_dir = paths.run(run_id)
    argv = [python, f"{paths.lib}/shim/interruption.py", "--source", source, "--interval", str(NOTICE_INTERVAL),
            "--timeout", f"{timeout:g}", "--run-dir", run_dir, *(["--until-exited", ",".join(tasks)] if tasks else []),
            "--", python, "-S", f"{paths.lib}/node.py", "stop", run_id]
    log = shlex.quote(f"{run_dir}/interruption.log")
    inner = f"{commands.remote_command(argv, env={'KILN_RUN_ID': run_id})} >> {log} 2>&1"
    return f"mkdir -p {shlex.quote(run_dir)} && {{ setsid sh -c {shlex.quote(inner)} < /dev/null > /dev/null 2>&1 & }}"


def describe_plan(plan: RunPlan, hosts: Sequence[Host]) -> str:
    """The plan as a person reads it (`--dry-run`)."""
    lines = [f"run {plan.run_id}: mode {plan.mode}, {len(hosts)} host(s)"]
    if plan.placement:
        lines.append(plan.placement)
    for launch in plan.launches:
        lines.append(f"[{hosts[launch.host].label} as {plan.names[launch.host]}] {launch.task}")
        for key, value in launch.env.items():
            if key in ("TF_CONFIG", "KILN_RUN_ID"):
                lines.append(f"    {key}={value}")
        shown = [f"{key}={launch.env[key]}" for key in PLACEMENT_SHOWN if key in launch.env]
        if shown:
            lines.append("    " + " ".join(shown))
        lines.append("    " + shlex.join(launch.argv))
        for path, text in launch.files.items():
            lines.append(f"    file {path}:")
            lines += [f"      {line}" for line in text.splitlines()]
    if plan.rank_hosts:
        lines.append("ranks: " + ", ".join(f"{rank}={host}" for rank, host in enumerate(plan.rank_hosts)))
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    """Where a run stands after one look at every process."""

    done: bool
    failed: tuple[tuple[str, str, int | None], ...] = ()   # (host, task, exit code or None if lost)


FINISH_GRACE_S = 300.0  # once a process that must finish has, how long the others may be quiet on their way out


def exited_ok(plan: RunPlan, states: Mapping[int, Mapping[str, dict]]) -> set[str]:
    """The run's processes that have exited 0 (pure): they are done, not stalled."""
    return {launch.task for launch in plan.launches
            if states.get(launch.host, {}).get(launch.task, {}).get("state") == "exited"
            and states[launch.host][launch.task].get("code") == 0}


def judge(plan: RunPlan, states: Mapping[int, Mapping[str, dict]]) -> Verdict:
    """Decide from per-host task states: failed if any process exited non-zero or vanished, or exited 0
    before the run was done where that is not its to do (RunPlan.may_finish); done once every finishing
    process exited 0 (pure)."""
    failed = []
    finished = set()
    for launch in plan.launches:
        state = states.get(launch.host, {}).get(launch.task, {"state": "starting"})
        host = plan.names[launch.host]
        if state["state"] == "exited":
            if state["code"] != 0:
                failed.append((host, launch.task, state["code"]))
            else:
                finished.add(launch.task)
                if launch.task not in plan.finishing and launch.task not in plan.may_finish:
                    failed.append((host, launch.task, 0))
        elif state["state"] == "lost":
            failed.append((host, launch.task, None))
    if failed:
        return Verdict(True, tuple(failed))
    return Verdict(set(plan.finishing) <= finished)


def horovod_failed_host(plan: RunPlan, log_text: str) -> tuple[int, str] | None:
    """The rank horovodrun names as the first to fail, and its host."""
    match = _HOROVOD_FAILED_RANK.search(log_text)
    if not match or not plan.rank_hosts:
        return None
    rank = int(match.group(1))
    return rank, plan.rank_hosts[rank] if rank < len(plan.rank_hosts) else "?"


def failed_hosts(plan: RunPlan, verdict: Verdict, horovod_log: str = "") -> list[str]:
    """The hosts to blame: for Horovod the rank horovodrun names, else where processes failed."""
    culprit = horovod_failed_host(plan, horovod_log)
    return [culprit[1]] if culprit else sorted({host for host, _, _ in verdict.failed})


_PORT_TAKEN = re.compile(r"Could not start gRPC server|Address already in use|Failed to add port")


def port_taken(log_text: str) -> bool:
    """Whether a process's log says it died because its port was taken (TensorFlow's gRPC server, or any
    program's bind)."""
    return _PORT_TAKEN.search(log_text) is not None


def describe_failure(plan: RunPlan, verdict: Verdict, horovod_log: str = "",
                     logs: Mapping[str, str] | None = None) -> str:
    """The failed processes, each with what it did (and, from its log in `logs` by task, a port another program
    held), and horovodrun's first failed rank."""
    parts = []
    for host, task, code in verdict.failed:
        what = "vanished without an exit code" if code is None else (
            "exited 0 before the run was done" if code == 0 else f"exited with status {code}")
        if code and port_taken((logs or {}).get(task, "")):
            what += " (its port was taken: another program listens on it)"
        parts.append(f"{task} on {host} {what}")
    culprit = horovod_failed_host(plan, horovod_log)
    if culprit:
        parts.append(f"rank {culprit[0]} on {culprit[1]} failed first")
    return "; ".join(parts)


@dataclass(frozen=True)
class Attempt:
    """What one attempt of a run came to: its failure (None: it succeeded), the hosts to blame, and whether
    a restart may follow (not when processes could not be stopped)."""

    failure: str | None
    blamed: tuple[str, ...] = ()
    restartable: bool = True
    left: tuple[str, ...] = ()


def judge_attempt(plan: RunPlan, verdict: Verdict, *, horovod_log: str = "", error: str | None = None,
                  error_hosts: Sequence[str] = (), frozen: Sequence[str] = (), left: Sequence[str] = (),
                  logs: Mapping[str, str] | None = None) -> Attempt:
    """Combine what was seen at the end of an attempt (pure): the verdict on the processes, an error that ended
    the watch (stall, timeout, a node gone), processes found stopped, and processes that would not stop."""
    failure, blamed = error, list(error_hosts)
    if verdict.failed:
        failure = describe_failure(plan, verdict, horovod_log, logs)
        blamed = failed_hosts(plan, verdict, horovod_log)
        if frozen:  # the peers of a frozen process fail; name the frozen one too
            failure += f"; stalled: {', '.join(frozen)} (a process there is stopped)"
            blamed = list(frozen)
    if left:
        failure = (failure + "; " if failure else "") + "could not stop: " + ", ".join(left)
    return Attempt(failure, tuple(sorted(set(blamed))), restartable=not left, left=tuple(left))


def should_restart(attempt: Attempt, restarts_done: int, max_restarts: int) -> bool:
    return attempt.failure is not None and attempt.restartable and restarts_done < max_restarts


def next_action(attempt: Attempt, *, lost: Sequence[str] = (), restarts_done: int = 0, max_restarts: int = 0,
                recoveries_done: int = 0, max_recoveries: int = 0) -> str:
    """What follows an attempt (pure): "finish"; "restart" on the same hosts; or "recover": replace the `lost`
    hosts (they stopped answering) through the provider, then restart. A run with a lost host cannot restart
    where it was; processes that would not stop on a host still answering end it."""
    if attempt.failure is None:
        return "finish"
    if lost:
        stuck = set(attempt.left) - set(lost)
        return "recover" if not stuck and recoveries_done < max_recoveries else "finish"
    return "restart" if should_restart(attempt, restarts_done, max_restarts) else "finish"


def validate_mode(mode: str, *, ps: int, evaluator: bool, mpi: bool) -> None:
    if mode not in MODES:
        raise UsageError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "tf-config" and (ps or evaluator):
        raise UsageError("--ps and --evaluator belong to --mode tf-config")
    if mode != "horovod" and mpi:
        raise UsageError("--mpi belongs to --mode horovod")


def validate_elastic(mode: str, *, min_np: int, max_np: int, mpi: bool) -> None:
    if not (min_np or max_np):
        return
    if mode not in ("horovod", "torchrun"):
        raise UsageError("--min-np and --max-np belong to --mode horovod and --mode torchrun (their elastic modes)")
    if max_np and not min_np:
        raise UsageError("--max-np goes with --min-np: kiln train --min-np N [--max-np M]")
    if mpi:
        raise UsageError("elastic Horovod runs over Gloo: --min-np cannot go with --mpi")
