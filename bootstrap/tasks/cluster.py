"""Tasks on a cluster's hosts: mesh, check, sync, train, run. They parse, connect and print; bootstrap.orchestration
and the supervisor do the work."""

from __future__ import annotations

import inspect
import shlex
from dataclasses import replace
from pathlib import Path

from bootstrap import autostop as autostop_plan
from bootstrap import launch, mesh, preflight, providers, state, taskfile, topology, training
from bootstrap.cluster import REMOTE_ROOT
from bootstrap.container import check_reference
from bootstrap.errors import KilnError, UsageError
from bootstrap.inputs import list_inputs
from bootstrap.orchestration import check_collective, choose_runtime, same_root, start_and_watch
from bootstrap.providers.common import SSH_WAIT_S
from bootstrap.runspec import TrainAsk, check_train, train_spec
from bootstrap.session import arm, connect_and_mesh, open_cluster, target
from bootstrap.tasks import cluster_task, lifecycle
from bootstrap.timeline import Timeline
from kiln.gpu import probe

HOST_HELP = {
    "hostfile": "read hosts from FILE (`host [slots=N]` per line) instead of -H",
    "cluster": "the cluster's name; its key and pinned host keys live in ~/.kiln/clusters/NAME",
    "slots": "processes per host (default: the hostfile's slots=N, else one per GPU in horovod mode and kiln run, "
             "one per host without GPUs and in tf-config mode)",
    "python": "the Python on the nodes with TensorFlow and Horovod (default: this Python's path)",
    "fanout": "talk to at most this many hosts at once (default 64)",
    "accept_new_host_keys": "trust and record host keys seen for the first time (default: refuse unknown keys)",
    "dry_run": "print the plan and change nothing",
}


def parse_ports(text: str) -> list[int]:
    try:
        ports = [int(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"--ports {text!r}: give comma-separated port numbers") from None
    if any(not 1 <= p <= 65535 for p in ports):
        raise UsageError(f"--ports {text!r}: ports run from 1 to 65535")
    return ports


def print_changes(changed: dict[str, list[str]]) -> None:
    for host, files in changed.items():
        print(f"{host}: {'changed ' + ', '.join(files) if files else 'ok (nothing to change)'}")


@cluster_task(name="mesh", help=HOST_HELP)
def mesh_(c, hostfile=None, cluster=None, slots=0, python=None, fanout=64, accept_new_host_keys=False,
          dry_run=False):
    """Set up passwordless SSH between all nodes with a per-cluster key and pinned host keys."""
    goal = target(c, hostfile=hostfile, cluster=cluster, slots=slots, python=python)
    if dry_run:
        print(f"cluster {goal.name}: key {state.cluster_dir(goal.name)}/id_ed25519 (made if missing)")
        print("on every node: ~/.ssh/kiln/<cluster>/{id_ed25519,known_hosts,config}, an Include in ~/.ssh/config,")
        print("the key in ~/.ssh/authorized_keys, and every node's name in /etc/hosts")
        print("hosts: " + ", ".join(h.label for h in goal.hosts))
        return
    group = open_cluster(c, goal, fanout=fanout, accept_new_host_keys=accept_new_host_keys)
    group.require_facts("mesh", only=mesh.FACTS)
    print_changes(group.apply_mesh(remember_python=True))


@cluster_task(help={**HOST_HELP, "ports": "comma-separated ports that must be free on every node",
                    "probes": "how many nodes prove the mesh by logging in to the next (default 8, 0: none)",
                    "gpu": "also check the GPUs: same model and count everywhere, driver, ECC, pending repairs, "
                           "Xid events by what they ask of the node, bandwidth and matmul speed against the "
                           "model's data sheet, and all-reduce bus bandwidth over each node's GPUs against its "
                           "floor and the other nodes",
                    "deep": "with --gpu: also run NVIDIA DCGM's diagnostics (dcgmi diag -r 1) on every node",
                    "collective": "measure an all-reduce across the nodes, all at once (one rank per GPU, one per "
                                  "node without) and pair by pair, over the interface runs use, and name a node "
                                  "far below the others (--gpu does it too on more than one node)",
                    "nic": "with --collective: the interface to measure over (default: the one the nodes reach "
                           "each other by)",
                    "gpu_framework": "what measures the GPUs: auto (the first of tensorflow, torch, jax, cupy "
                                     "the nodes' Python has) or one of them"})
def check(c, hostfile=None, cluster=None, slots=0, python=None, fanout=64, ports="", probes=preflight.MESH_PROBES,
          gpu=False, gpu_framework="auto", deep=False, collective=False, nic=None, accept_new_host_keys=False,
          dry_run=False):
    """Preflight: reachability, unique and routable hostnames, same versions, free ports, the mesh (and, with
    --gpu, the GPUs' health and speed)."""
    frameworks = ("auto", *probe.FRAMEWORKS)
    if gpu_framework not in frameworks:
        raise UsageError(f"--gpu-framework {gpu_framework!r}: one of {', '.join(frameworks)}")
    if deep and not gpu:
        raise UsageError("--deep goes with --gpu: kiln check --gpu --deep")
    goal = target(c, hostfile=hostfile, cluster=cluster, slots=slots, python=python)
    wanted_ports = parse_ports(ports)
    if dry_run:
        print(f"would check {len(goal.hosts)} host(s){' and their GPUs' if gpu else ''}: "
              + ", ".join(h.label for h in goal.hosts))
        return
    group = open_cluster(c, goal, fanout=fanout, accept_new_host_keys=accept_new_host_keys)
    # No framework is required here (a node may carry TensorFlow, PyTorch or JAX): the same versions everywhere are.
    table, passed = group.preflight(ports=wanted_ports, probes=int(probes),
                                    gpu_framework=gpu_framework if gpu else None, deep=deep, required=(),
                                    fabric=True)
    print(table)
    if not passed:
        raise KilnError("preflight failed (see the table above)")
    if collective or (gpu and len(goal.hosts) > 1):
        check_collective(group, nic, record=state.load_cluster(goal.name), asked=collective)


def say(line: str) -> None:
    print(line, flush=True)


def user_command(c) -> list[str]:
    """The words after `--` on the command line (kiln keeps them as given; fab joins and they are split)."""
    return list(c.config.get("kiln_command") or [])


def code_folder(code: str | None) -> Path:
    folder = Path(code or ".").resolve()
    if not folder.is_dir():
        raise UsageError(f"--code {code}: no such folder")
    return folder


def project_folder(code: str | None, command: list[str]) -> Path | None:
    """The folder synced to every node for the user's command: --code, else the current folder."""
    if not command:
        if code:
            raise UsageError("--code goes with a command: kiln train --code DIR -- python train.py")
        return None
    folder = code_folder(code)
    script = next((word for word in command[:2] if word.endswith(".py")), None)
    if script and not Path(script).is_absolute() and not (folder / script).is_file():
        raise UsageError(f"{script}: no such file in {folder} (the folder synced to the nodes; see --code)")
    return folder


@cluster_task(help={**HOST_HELP, "code": "the project folder to copy (default: the current folder)"})
def sync(c, hostfile=None, cluster=None, slots=0, python=None, fanout=64, code=None, accept_new_host_keys=False,
         dry_run=False):
    """Copy a project to ~/kiln/code on every node (what train -- CMD runs from), leaving out what its
    .kilnignore, else its .gitignore, leaves out."""
    goal = target(c, hostfile=hostfile, cluster=cluster, slots=slots, python=python)
    source = code_folder(code)
    where = f"~/{REMOTE_ROOT}/code on {len(goal.hosts)} host(s)"
    if dry_run:
        print(f"would mirror {source} to {where}: " + ", ".join(h.label for h in goal.hosts))
        return
    group = open_cluster(c, goal, fanout=fanout, accept_new_host_keys=accept_new_host_keys)
    group.sync_run(f"{REMOTE_ROOT}/lib", str(source), f"{REMOTE_ROOT}/code")
    print(f"synced {source} to {where}")


@cluster_task(help={"cluster": HOST_HELP["cluster"], "fanout": HOST_HELP["fanout"],
                    "accept_new_host_keys": HOST_HELP["accept_new_host_keys"],
                    "idle_minutes": "power each node off after N minutes without a kiln run (0: cancel)"})
def autostop(c, cluster, idle_minutes, fanout=64, accept_new_host_keys=False):
    """Power a kiln-made cluster's nodes off once they sit idle (no kiln run) for N minutes: the agent on each
    node shuts it down (AWS: the instance terminates, its data volume stays; Azure: the VM deallocates itself).
    0 cancels."""
    arm(c, cluster, autostop_plan.validate_idle_minutes(idle_minutes), fanout=fanout,
        accept_new_host_keys=accept_new_host_keys)


TRAIN_HELP = {
    **HOST_HELP,
    "mode": "horovod (one horovodrun over a hostfile), tf-config (one process per role, each its TF_CONFIG), "
            "torchrun (one torchrun per node, a c10d rendezvous on the first) or jax (one process per node, "
            "jax.distributed told its coordinator, count and id)",
    "ps": "tf-config: number of parameter servers (adds a chief as coordinator)",
    "chief": "tf-config: add a chief to a multi-worker run",
    "min_np": "horovod, torchrun: run elastic (horovodrun --min-np; torchrun --nnodes MIN:MAX in whole nodes): "
              "keep going on at least N processes when nodes go (the program must be written for it: "
              "hvd.elastic, or a torchrun program that resumes from its checkpoint)",
    "max_np": "with --min-np: at most M processes (default: every slot now)",
    "no_chief": "tf-config with --ps: no chief; the workers lead themselves (worker 0 first), as between-graph "
                "programs are written; the run is done when every worker has exited 0",
    "evaluator": "tf-config: add an evaluator beside the chief; it evaluates the model the chief saves",
    "mpi": "horovod: run over MPI instead of Gloo",
    "nic": "the network interface the nodes use between them (default: found)",
    "base_port": f"tf-config: first port for the processes on each host; torchrun: the rendezvous port; jax: the "
                 f"coordinator's port (default: from "
                 f"{topology.DEFAULT_BASE_PORT}, moved past the ports other runs hold on the hosts)",
    "args": "extra arguments for kiln's reference trainer, e.g. '--epochs 3 --batch-size 64' (with no command)",
    "code": "with a command: the project folder synced to the nodes and run from (default: the current folder)",
    "checkpoint_dir": "the folder (on the nodes) the program checkpoints to, copied from the first node to the "
                      "others before a restart (default: the run's checkpoints/; KILN_CHECKPOINT_DIR)",
    "run_id": "name the run (default: time stamp + random)",
    "detach": "start the run and return; follow it with kiln status / kiln logs",
    "timeout": "stop the run if it has not ended after this many seconds (default 3600)",
    "max_restarts": "when a process fails, restart the run (from the chief's last checkpoint) up to N times",
    "managed": "replace a node that stops answering (through the provider of the cluster kiln up made) and "
               "restart the run on it from the last checkpoint; with --min-np, the replacement joins the running "
               "elastic job instead",
    "max_recoveries": "with --managed: replace lost nodes at most N times (default 3)",
    "relocate": "with --managed: where a lost node cannot be replaced for want of capacity (the zone emptied), "
                "take the cluster down and bring it up again as its kiln up asked (its other candidates first) "
                "and resume the run there from its last checkpoint (one of --max-recoveries)",
    "down_after": "remove the cluster (kiln up made it) once the run has ended and its folder is collected, "
                  "also when it failed",
    "stall_factor": "stop a run whose logged steps (kiln metrics) stop moving for this many times the median "
                    "time between them, and at least 60 s, while its node shows no work (past --stall-busy while "
                    "it does) (default 20; 0: no watchdog)",
    "stall_minimum": "also stop a run whose process prints nothing for this many seconds while its node shows no "
                     "work (no CPU time, no GPU busy, no touch of KILN_HEARTBEAT); the floor of --stall-factor "
                     "too (default 0: silence alone never stops a run)",
    "stall_busy": "how long a logged step may be late while its node shows work (an evaluation, a checkpoint) "
                  "before kiln stops the run as a hung collective (default 600 s, torch.distributed's collective "
                  "timeout)",
    "image": "run every process inside this container image, one container per node (pulled on every node, or "
             "shipped from this machine's Docker engine; the same image id everywhere); --python then names the "
             "image's Python (default: its python3)",
    "env": "NAME=VALUE: set this variable for every process (repeatable; over a task file's envs)",
    "task": "read the run from this task file (docs/tasks.md): workdir, setup, run, mode, envs, ...; the options "
            "given here override its fields",
    "fabric": "the fabric NCCL uses between nodes: auto (EFA or InfiniBand where every node has it up, else TCP "
              "sockets), efa, ib (refused where a node lacks it), or socket (TCP even where there is a fabric)",
}


@cluster_task(help=TRAIN_HELP, iterable=["env"])
def train(c, hostfile=None, cluster=None, slots=0, python=None, fanout=64, accept_new_host_keys=False,
          mode="horovod", ps=0, chief=False, no_chief=False, evaluator=False, mpi=False, nic=None, min_np=0, max_np=0,
          base_port=0, args="", code=None, checkpoint_dir=None, run_id=None, detach=False,
          timeout=3600, max_restarts=0, stall_factor=20.0, stall_minimum=0.0, stall_busy=600.0, managed=False,
          max_recoveries=3,
          relocate=False, down_after=False, image=None, fabric="auto", env=None, task=None, dry_run=False):
    """Train across the hosts: mesh, preflight, sync, start every process, watch, collect.

    `kiln train [options] -- CMD...` runs your program (from --code, default the current folder) in every process;
    with no command, kiln's reference trainer. docs/environment.md says what every process gets. With
    --image REF, every process runs inside that container image, one container per node. --task FILE reads the
    run from a task file (docs/tasks.md); the options given here override its fields."""
    options, command, setup = with_task(c, "train", task, locals())
    if not (options["cluster"] or options["hostfile"] or c.config.get("kiln_hosts")):
        options["cluster"] = options.pop("name", None)
    options.pop("name", None)
    train_run(c, command, setup, **options)


def train_run(c, command: list[str], setup: str | None, *, hostfile, cluster, slots, python, fanout,
              accept_new_host_keys, mode, ps, chief, no_chief, evaluator, mpi, nic, min_np, max_np, base_port, args,
              code, checkpoint_dir, run_id, detach, timeout, max_restarts, stall_factor, stall_minimum, stall_busy,
              managed, max_recoveries, relocate, down_after, image, fabric, env, dry_run) -> None:
    """kiln train with its options parsed (and a task file's laid under them): the setup on every node, then the
    run."""
    ask = TrainAsk(tuple(command), mode, int(ps), chief, no_chief, evaluator, mpi, nic, int(min_np), int(max_np),
                   int(base_port), args, checkpoint_dir, run_id, detach, int(max_restarts), managed,
                   int(max_recoveries), relocate, down_after, image, fabric, launch.parse_env(env or ()), setup)
    check_train(ask)
    check_setup(setup, managed, image)
    folder = project_folder(code, command)
    if setup:
        ask = replace(ask, setup_folder=str(folder or code_folder(code)))
    # With --image, --python names the image's Python; kiln's own node side keeps the nodes' Python.
    goal = target(c, hostfile=hostfile, cluster=cluster, slots=slots, python=None if image else python)
    owner = training.owner_of(goal, ask, cluster)
    spec = train_spec(ask, goal.hosts, goal.python, state.new_run_id())
    if setup:
        run_command(c, ["sh", "-c", setup], hostfile=hostfile, cluster=cluster, slots=1, python=python,
                    fanout=fanout, accept_new_host_keys=accept_new_host_keys, code=ask.setup_folder,
                    timeout=timeout, image=image, env=env, dry_run=dry_run, what="setup")
    if dry_run:
        print(launch.describe_plan(launch.plan_run(spec), goal.hosts) + described_env(ask.env))
        return
    training.train(c, goal, spec, ask, folder,
                   training.Watch(float(timeout), int(max_restarts), float(stall_factor), float(stall_minimum),
                                  float(stall_busy)),
                   training.Reach(int(fanout), accept_new_host_keys, slots, python), owner, say)


def check_setup(setup: str | None, managed: bool, image: str | None) -> None:
    if setup and managed and image:
        raise UsageError("a task's setup runs in a container of the image on the nodes a run starts on, and a "
                         "managed run's new machines start new containers without it: put it in the container "
                         "image or in your program")


def described_env(env: tuple[tuple[str, str], ...]) -> str:
    """The dry run's line on the variables the user gives every process (--env, a task's envs), if any."""
    return "\nand every process: " + " ".join(f"{name}={shlex.quote(value)}" for name, value in env) if env else ""


def with_task(c, name: str, task: str | None, passed: dict,
              ignore: tuple[str, ...] = ()) -> tuple[dict, list[str], str | None]:
    """A task's options, command and setup: the task file's (taskfile.load) under the options given on the command
    line (but `ignore`), and the command after -- over its run. Without a task file, the options as given."""
    passed = {key: value for key, value in passed.items() if key not in ("c", "task")}
    command = user_command(c)
    if not task:
        return passed, command, None
    read = taskfile.load(task)
    given = set(c.config.get("kiln_given", {}).get(name, ())) - set(ignore)
    options = taskfile.merged(read, {"name": None, **passed}, given)
    if taskfile.unused(read, options):
        say(f"{task}: kiln {name} leaves out {', '.join(taskfile.unused(read, options))} (kiln launch uses them)")
    return options, command or list(read.command), read.setup


RUN_TASK_HELP = {
    **HOST_HELP,
    "processes": "how many processes (default: one per slot; -H gives each host one), spread over the hosts",
    "shard_input": "a list file (one item per line), a folder (its files) or s3://bucket/prefix (its objects): "
                   "each process gets its contiguous share in the file KILN_SHARD_INPUTS",
    "code": "the project folder synced to the nodes and run from (default: the current folder)",
    "run_id": "name the run (default: time stamp + random)",
    "detach": "start the processes and return; follow them with kiln status / kiln logs",
    "timeout": "stop the run if it has not ended after this many seconds (default 3600)",
    "max_restarts": "when a process fails, start every process again up to N times",
    "stall_minimum": "stop the run when a process prints nothing for this many seconds while its node shows no "
                     "work (no CPU time, no GPU busy, no touch of KILN_HEARTBEAT) (default 0: never)",
    "image": TRAIN_HELP["image"],
    "env": "NAME=VALUE: set this variable for every process (repeatable)",
}


@cluster_task(name="run", help=RUN_TASK_HELP, iterable=["env"])
def run_(c, hostfile=None, cluster=None, slots=0, python=None, fanout=64, accept_new_host_keys=False, processes=0,
         shard_input=None, code=None, run_id=None, detach=False, timeout=3600, max_restarts=0, stall_minimum=0.0,
         image=None, env=None, dry_run=False):
    """Run a command on every host (or --processes N over them), each with its shard: `kiln -H h1,h2 run -- CMD`.

    Every process gets KILN_SHARD_INDEX and KILN_SHARD_COUNT (and KILN_SHARD_INPUTS with --shard-input); what
    it writes to KILN_OUTPUT_DIR comes back to the run folder; a table of exit codes and durations ends it."""
    command = user_command(c)
    if not command:
        raise UsageError("give the command after --, e.g. kiln -H h1,h2 run -- python process.py")
    run_command(c, command, hostfile=hostfile, cluster=cluster, slots=slots, python=python, fanout=fanout,
                accept_new_host_keys=accept_new_host_keys, processes=processes, shard_input=shard_input, code=code,
                run_id=run_id, detach=detach, timeout=timeout, max_restarts=max_restarts,
                stall_minimum=stall_minimum, image=image, env=env, dry_run=dry_run)


def run_command(c, command: list[str], *, hostfile=None, cluster=None, slots=0, python=None, fanout=64,
                accept_new_host_keys=False, processes=0, shard_input=None, code=None, run_id=None, detach=False,
                timeout=3600, max_restarts=0, stall_minimum=0.0, image=None, env=None, dry_run=False,
                what: str = "") -> None:
    """kiln run's processes (a task's setup, `what`, one per host), started and watched to their end."""
    if int(processes) < 0:
        raise UsageError(f"--processes {processes}: give a positive number")
    launch.check_placeholders(command, "run")
    folder = project_folder(code, command)
    items = list_inputs(shard_input, folder) if shard_input else None
    goal = target(c, hostfile=hostfile, cluster=cluster, slots=slots, python=None if image else python)
    program = launch.Program(tuple(command), env=launch.parse_env(env or ()))
    run_id = state.validate_run_id(run_id) if run_id else state.new_run_id()
    if image:
        check_reference(image)

    def plan_for(names, python_path: str, root: str, gpus: tuple[int, ...] | None = None) -> launch.RunPlan:
        return launch.plan_processes(run_id, names, [h.slots for h in goal.hosts], python=python_path,
                                     paths=launch.NodePaths(root), program=program, processes=int(processes),
                                     inputs=items, gpus=gpus)

    if dry_run:
        if what:
            print(f"{what} on every node: {shlex.join(command)}")
        print(launch.describe_plan(plan_for([h.address for h in goal.hosts], goal.python, f"~/{REMOTE_ROOT}"),
                                   goal.hosts) + described_env(program.env))
        return
    if what:
        say(f"{what} on {len(goal.hosts)} node(s): {shlex.join(command)} (run {run_id})")
    timeline = Timeline()
    group, nodes = connect_and_mesh(c, goal, timeline, fanout=fanout, accept_new_host_keys=accept_new_host_keys)
    paths = launch.NodePaths(same_root(group))
    runtime, processes_python = choose_runtime(group, image, paths, run_id, program, python, timeline)
    plan = plan_for([n.name for n in nodes], processes_python, paths.root, mesh.gpu_counts(nodes))
    start_and_watch(group, plan, paths, program, folder, detach=detach, timeout=float(timeout),
                    max_restarts=int(max_restarts), stall_factor=1.0 if float(stall_minimum) else 0.0,
                    stall_minimum=float(stall_minimum), timeline=timeline, runtime=runtime, python=processes_python,
                    notice_source=providers.notice_source(state.load_cluster(goal.name)))


LAUNCH_HELP = {
    "name": lifecycle.UP_HELP["name"] + ", or a task file (kiln launch task.yaml)",
    **{k: lifecycle.UP_HELP[k] for k in ("provider", "count", "instance_type", "gpus", "spot", "max_price",
                                          "ami", "ssh_cidr", "user", "region", "profile", "project", "zone",
                                          "subscription", "location", "source_image", "image_id", "ttl_hours",
                                          "ssh_wait", "volume")},
    "snapshot": lifecycle.SNAPSHOT_HELP["snapshot"],
    "mode": "horovod (default) or tf-config", "args": "arguments for kiln's reference trainer",
    "code": "the project folder to run from (default: the current folder)", "run_id": "name the run",
    "timeout": "stop the run if it has not ended after this many seconds (default 3600)",
    "managed": "replace a node that is lost or gets a spot notice (see train --managed)",
    "max_recoveries": "with --managed: replace lost nodes at most N times (default 3)",
    "accept_new_host_keys": "trust host keys the consoles did not show, on first contact (default: refuse)",
    "image": "run the training inside this container image on every node (see train --image)",
    "checkpoint_dir": TRAIN_HELP["checkpoint_dir"],
    "env": TRAIN_HELP["env"],
    "python": "the nodes' Python that runs the program (default: the image's; on --provider local, this "
              "machine's kiln Python: give .venv-frameworks/bin/python for torchrun and jax)",
    "task": "read the cluster and the run from this task file (or give it as NAME: kiln launch task.yaml); the "
            "options given here override its fields (docs/tasks.md)",
}


@cluster_task(name="launch", help=LAUNCH_HELP, iterable=["env"])
def launch_(c, name, provider="aws", count=1, instance_type=None, spot=False, max_price=None,
            ami=None, ssh_cidr=None, user=None, region=None, profile=None, ttl_hours=24.0, ssh_wait=SSH_WAIT_S,
            mode="horovod", args="", code=None, run_id=None, timeout=3600, managed=False, max_recoveries=3,
            accept_new_host_keys=False, volume=None, snapshot=False, image=None, project=None, zone=None,
            source_image=None, subscription=None, location=None, image_id=None, gpus=None, checkpoint_dir=None,
            env=None, python=None, task=None):
    """One go: up, train (`-- CMD...` runs your program), collect the run folder, down. The cluster is removed
    whatever happens after it is up: the run ends, fails, or you press Ctrl-C. `kiln launch task.yaml` reads it
    all from a task file (docs/tasks.md); the options given here override its fields."""
    asked = dict(locals())
    named_file = taskfile.is_task_file(name)
    task = task or (name if named_file else None)
    options, command, setup = with_task(c, "launch", task, {**asked, "name": None if named_file else name},
                                        ignore=("name",) if named_file else ())
    name = options.pop("name") or taskfile.name_from(task)
    where = {key: options.pop(key) for key in ("region", "profile", "project", "zone", "subscription", "location")}
    if options["snapshot"] and not providers.named(options["provider"], where).volumes:
        raise UsageError(f"--snapshot: a {options['provider']} cluster's nodes have no data volumes")
    check_setup(setup, options["managed"], options["image"])
    lifecycle.up(c, name, **{key: options[key] for key in LAUNCH_UP}, **where)
    try:
        train_run(c, command, setup, **{**train_defaults(), "cluster": name,
                                        **{key: options[key] for key in LAUNCH_TRAIN}})
    finally:
        print(f"launch: removing cluster {name}", flush=True)
        lifecycle.down(c, name, snapshot=options["snapshot"], **where)


# What kiln launch hands to kiln up and to kiln train (its other options: where, the snapshot).
LAUNCH_UP = ("count", "provider", "instance_type", "spot", "max_price", "ami", "ssh_cidr", "user", "ttl_hours",
             "ssh_wait", "volume", "source_image", "image_id", "gpus")
LAUNCH_TRAIN = ("mode", "args", "code", "run_id", "timeout", "managed", "max_recoveries", "accept_new_host_keys",
                "image", "checkpoint_dir", "env", "python")


def train_defaults() -> dict:
    """kiln train's options as it has them when none is given."""
    return {key: parameter.default for key, parameter in inspect.signature(train.body).parameters.items()
            if key not in ("c", "task")}
