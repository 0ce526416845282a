"""A kiln cluster's Slurm queue, as Slurm's own files say it (pure): `slurm_conf` and `gres_conf` of one description
of the queue (`Queue`): its controller, a partition per node shape (one GPU shape each, its nodes `State=CLOUD`
between `min_nodes`, kept up, and `max_nodes`), where the controller keeps its state (so a restart of it loses no
job), its MUNGE socket (a key made per cluster), and the power saving through which kiln's provisioner makes nodes
when jobs wait and removes them when they have been idle (`ResumeProgram`, `SuspendProgram`, `ResumeFailProgram`).

The power-saving numbers, against the tools teams grow into: AWS ParallelCluster resumes within 1800 s and suspends
within 120 s; Google's cluster-toolkit gives 300 s to both and suspends after 300 s idle; Azure CycleCloud suspends
after 300 s and resumes within 1800 s. kiln suspends after 300 s idle (a GPU node bills while it waits), gives a
resume ResumeTimeout (1800 s on a cloud: a GPU machine, its SSH, its host keys and the mesh; less on the local
cluster) and a suspend 120 s.

MUNGE: every machine of the queue (the controller and each node) runs its own munged with the cluster's key, at
paths of the cluster's own under /run/munge (`Munge`): the same on every machine, so one slurm.conf serves them all,
and apart from another queue's (or the distribution's) munged on the same machine.

Nothing here reads or writes a file, or asks anything of a node: bootstrap/queue.py does.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from bootstrap import container, launch, topology
from bootstrap.errors import UsageError

SHAPE_NAME = re.compile(r"[a-z][a-z0-9]{0,15}")  # a partition's name, and the middle of its nodes' names
GPU_TYPE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
SUSPEND_TIME_S = 300
SUSPEND_TIMEOUT_S = 120
RESUME_TIMEOUT_S = 1800
# A node that has not answered slurmctld for this long is lost: down, its jobs requeued (ParallelCluster: 180 s;
# Slurm's default, 300 s). A requeued job starts again at the earliest this long after (Slurm's cred_expire: a job
# step's credential outlives the old run's steps).
SLURMD_TIMEOUT_S = 180
LOST_MARGIN_S = 10  # past SlurmdTimeout, what a failed job's script waits more for slurmctld to requeue it
REQUEUE_DELAY_S = 120
MAX_ARRAY = 1000  # tasks of one array job: Slurm's MaxArraySize (1001) less one
SLURMCTLD_PORT = 6817  # Slurm's own (a controller machine of its own)
MAX_NODES = 1024  # nodes of one shape: Slurm's own limit is far above what a team's queue holds
MUNGE_DIR = "/run/munge"  # the distribution's own (owner munge, mode 755): a cloud image's, and each local node's
ADDRESS = "addr=$(ip -o -4 route get 1.1.1.1 | sed -n 's/.* src \\([0-9.]*\\).*/\\1/p')"  # a node's own, by its route


@dataclass(frozen=True)
class Shape:
    """One partition: what each of its nodes is (CPUs, memory in MiB, `gpus` GPUs of `gpu_type`, as Slurm's gres
    names them: h100, l4) and how many may run (`min_nodes` are kept up, the rest are made when jobs wait)."""

    name: str
    cpus: int
    memory_mib: int
    max_nodes: int
    min_nodes: int = 0
    gpus: int = 0
    gpu_type: str = ""


@dataclass(frozen=True)
class Power:
    """What slurmctld runs to make nodes (`resume`), remove them (`suspend`), mark a node whose making failed
    (`resume_fail`) and hand back a node lost under a job (`lost`, a trigger on a node going down), and when: a node
    idle `suspend_time_s` is removed; one not up within `resume_timeout_s`, or not gone within `suspend_timeout_s`,
    is marked down; one silent for `slurmd_timeout_s` is lost, and its jobs start again `requeue_delay_s` later."""

    resume: str
    suspend: str
    resume_fail: str
    lost: str = ""
    # A cloud's queue, whose nodes do not see the controller's disk: a job's folder goes to its nodes before it
    # starts (slurmctld's PrologSlurmctld) and what they wrote comes back once it ends (EpilogSlurmctld)
    job_start: str = ""
    job_end: str = ""
    suspend_time_s: int = SUSPEND_TIME_S
    suspend_timeout_s: int = SUSPEND_TIMEOUT_S
    resume_timeout_s: int = RESUME_TIMEOUT_S
    slurmd_timeout_s: int = SLURMD_TIMEOUT_S
    requeue_delay_s: int = REQUEUE_DELAY_S


@dataclass(frozen=True)
class Queue:
    """A cluster's queue: its name, its controller (the host name slurmctld runs as: Slurm refuses any other, and
    the address its nodes reach it at), its partitions (the first is the default), the controller's folder (its
    state, which survives a restart, and the logs), the nodes' folder, the MUNGE socket both use, and the power
    saving. `cgroups`: processes are tracked and confined by cgroup (a machine of its own); without, by process
    tree (the local cluster's nodes share one kernel)."""

    cluster: str
    controller: str
    controller_address: str
    shapes: tuple[Shape, ...]
    state_dir: str
    node_dir: str
    munge_socket: str
    power: Power
    user: str = "slurm"
    cgroups: bool = True
    port: int = SLURMCTLD_PORT


def check_shape(shape: Shape) -> Shape:
    """One line naming what is wrong with a partition, where anything is."""
    where = f"queue partition {shape.name!r}"
    if not SHAPE_NAME.fullmatch(shape.name):
        raise UsageError(f"{where}: a name of 1 to 16 lowercase letters and digits, starting with a letter")
    if shape.cpus < 1 or shape.memory_mib < 1:
        raise UsageError(f"{where}: each node needs at least 1 CPU and 1 MiB of memory")
    if not 1 <= shape.max_nodes <= MAX_NODES:
        raise UsageError(f"{where}: --max-nodes {shape.max_nodes}: give 1 to {MAX_NODES}")
    if not 0 <= shape.min_nodes <= shape.max_nodes:
        raise UsageError(f"{where}: --min-nodes {shape.min_nodes}: give 0 to --max-nodes ({shape.max_nodes})")
    if shape.gpus < 0 or bool(shape.gpus) != bool(shape.gpu_type):
        raise UsageError(f"{where}: a GPU shape names its GPUs' count and type (e.g. 8 of h100), a CPU shape neither")
    if shape.gpu_type and not GPU_TYPE.fullmatch(shape.gpu_type):
        raise UsageError(f"{where}: GPU type {shape.gpu_type!r}: lowercase letters, digits and '-', e.g. h100")
    return shape


def check_queue(queue: Queue) -> Queue:
    if not queue.shapes:
        raise UsageError(f"queue of cluster {queue.cluster}: it needs at least one partition")
    names = [check_shape(shape).name for shape in queue.shapes]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UsageError(f"queue of cluster {queue.cluster}: partition {', '.join(twice)} is named twice")
    return queue


def node_prefix(queue: Queue, shape: Shape) -> str:
    return f"{queue.cluster}-{shape.name}-"


def node_names(queue: Queue, shape: Shape) -> list[str]:
    """The names of a partition's nodes, made or not: CLUSTER-SHAPE-0 to CLUSTER-SHAPE-(max_nodes - 1)."""
    return [f"{node_prefix(queue, shape)}{index}" for index in range(shape.max_nodes)]


def hostlist(prefix: str, indexes: Sequence[int]) -> str:
    """Slurm's compact form of nodes PREFIX0, PREFIX1, ...: PREFIX[0-3,5] (PREFIX5 alone)."""
    ordered = sorted(set(indexes))
    if not ordered:
        return ""
    if len(ordered) == 1:
        return f"{prefix}{ordered[0]}"
    runs: list[list[int]] = []
    for index in ordered:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return prefix + "[" + ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) + "]"


def expand(text: str) -> list[str]:
    """The node names a compact hostlist stands for (what slurmctld hands the resume and suspend programs):
    `kc-gpu-[0-2,5],kc-cpu-1` -> kc-gpu-0, kc-gpu-1, kc-gpu-2, kc-gpu-5, kc-cpu-1."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", text):
        prefix, bracket, ranges = part.partition("[")
        if not bracket:
            names.append(prefix)
            continue
        for item in ranges.rstrip("]").split(","):
            match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", item)
            low, high = (match.group(1), match.group(2) or match.group(1)) if match else ("", "")
            if not match or int(high) < int(low):
                raise UsageError(f"hostlist {text!r}: {item!r} in {part!r} is not an index or a range LOW-HIGH")
            width = len(low) if low.startswith("0") else 0
            names += [f"{prefix}{index:0{width}d}" for index in range(int(low), int(high) + 1)]
    return names


def slurm_conf(queue: Queue) -> str:
    """slurm.conf of the queue: the controller and where it keeps its state, MUNGE, scheduling by cores, memory and
    GPUs, the power saving through kiln, and per partition its nodes (CLOUD: made when jobs wait)."""
    check_queue(queue)
    power, state, nodes = queue.power, queue.state_dir.rstrip("/"), queue.node_dir.rstrip("/")
    kept = [hostlist(node_prefix(queue, shape), range(shape.min_nodes)) for shape in queue.shapes if shape.min_nodes]
    lines = [
        f"# The Slurm queue of kiln cluster {queue.cluster}: written by kiln (bootstrap/slurm.py), which writes it",
        "# again whenever the queue changes; a change made here by hand is lost then.",
        f"ClusterName={queue.cluster}",
        f"SlurmctldHost={queue.controller}({queue.controller_address})",
        f"SlurmctldPort={queue.port}",
        f"SlurmUser={queue.user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={queue.munge_socket},cred_expire={power.requeue_delay_s}",
        f"StateSaveLocation={state}/state",
        f"SlurmctldPidFile={state}/slurmctld.pid",
        f"SlurmctldLogFile={state}/slurmctld.log",
        f"SlurmdSpoolDir={nodes}/%n/spool",
        f"SlurmdPidFile={nodes}/%n/slurmd.pid",
        f"SlurmdLogFile={nodes}/%n/slurmd.log",
        f"Epilog={nodes}/epilog",  # a job's containers a kill left (kiln submit --image)
        *([f"PrologSlurmctld={power.job_start}", f"EpilogSlurmctld={power.job_end}"] if power.job_start else []),
        "ProctrackType=proctrack/cgroup" if queue.cgroups else "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/cgroup,task/affinity" if queue.cgroups else "TaskPlugin=task/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "GresTypes=gpu",
        "ReturnToService=2",
        "MpiDefault=none",
        # nodes made on demand: their addresses change, and slurmctld reaches each one directly
        "CommunicationParameters=NoAddrCache",
        "TreeWidth=65533",
        "PrivateData=cloud",
        # power saving: kiln makes and removes the nodes
        f"ResumeProgram={power.resume}",
        f"SuspendProgram={power.suspend}",
        f"ResumeFailProgram={power.resume_fail}",
        f"SuspendTime={power.suspend_time_s}",
        f"SuspendTimeout={power.suspend_timeout_s}",
        f"ResumeTimeout={power.resume_timeout_s}",
        f"SlurmdTimeout={power.slurmd_timeout_s}",
        "JobRequeue=1",  # a batch job on a node lost goes back in the queue
        "ResumeRate=0",
        "SuspendRate=0",
        "SlurmctldParameters=idle_on_node_suspend",
        *([f"SuspendExcNodes={','.join(kept)}"] if kept else []),
    ]
    for index, shape in enumerate(queue.shapes):
        names = hostlist(node_prefix(queue, shape), range(shape.max_nodes))
        gres = f" Gres=gpu:{shape.gpu_type}:{shape.gpus}" if shape.gpus else ""
        lines += [f"NodeName={names} CPUs={shape.cpus} RealMemory={shape.memory_mib}{gres} State=CLOUD "
                  f"Feature={shape.name}",
                  f"PartitionName={shape.name} Nodes={names} Default={'YES' if index == 0 else 'NO'} "
                  "MaxTime=INFINITE State=UP"]
    return "\n".join(lines) + "\n"


def gres_conf(queue: Queue) -> str:
    """gres.conf of the queue: each GPU node's GPUs, as device files (/dev/nvidia0 ...)."""
    check_queue(queue)
    lines = [f"# The GPUs of kiln cluster {queue.cluster}'s nodes: written by kiln (bootstrap/slurm.py)."]
    for shape in queue.shapes:
        if shape.gpus:
            files = f"/dev/nvidia[0-{shape.gpus - 1}]" if shape.gpus > 1 else "/dev/nvidia0"
            lines.append(f"NodeName={hostlist(node_prefix(queue, shape), range(shape.max_nodes))} Name=gpu "
                         f"Type={shape.gpu_type} File={files}")
    return "\n".join(lines) + "\n"


def mpi_conf(queue: Queue) -> str:
    """mpi.conf of the queue: srun --mpi=pmix's client folders under the node's own Slurm folder (PMIx makes one
    per job step, named by the user, job and step alone: in a /tmp that machines share, as the local cluster's
    nodes share this machine's, the second node's step could not make its own)."""
    check_queue(queue)
    return (f"# srun --mpi=pmix on kiln cluster {queue.cluster}'s nodes: written by kiln (bootstrap/slurm.py).\n"
            f"PMIxCliTmpDirBase={queue.node_dir.rstrip('/')}/pmix\n")


def conf_files(queue: Queue) -> dict[str, str]:
    """The files of the queue's configuration, by name: the same on the controller and on every node (beside
    slurm.conf: Slurm reads the others from its folder)."""
    return {"slurm.conf": slurm_conf(queue), "gres.conf": gres_conf(queue), "mpi.conf": mpi_conf(queue),
            "epilog": container.epilog_text(queue.node_dir)}


@dataclass(frozen=True)
class Munge:
    """Where the munged of cluster `cluster` keeps its key, socket and files, on every machine of its queue."""

    cluster: str

    def path(self, suffix: str) -> str:
        return f"{MUNGE_DIR}/kiln-{self.cluster}.{suffix}"

    @property
    def socket(self) -> str:
        return self.path("socket")

    @property
    def key(self) -> str:
        return self.path("key")

    def argv(self) -> list[str]:
        """munged of the cluster's key, as the munge user (it refuses a key readable by any other)."""
        return ["runuser", "-u", "munge", "--", "munged", f"--socket={self.socket}", f"--key-file={self.key}",
                f"--pid-file={self.path('pid')}", f"--log-file={self.path('log')}",
                f"--seed-file={self.path('seed')}"]

    def start_script(self) -> str:
        """Shell lines (as root) that put the key read from stdin (base64: it never stands on a command line)
        in place and start munged, where the cluster's munged does not run yet."""
        key, pid = shlex.quote(self.key), shlex.quote(self.path("pid"))
        return (f"install -d -o munge -g munge -m 755 {MUNGE_DIR}\n"
                f"(umask 077; base64 -d > {key}.new)\n"
                f"chown munge:munge {key}.new && chmod 400 {key}.new && mv {key}.new {key}\n"
                f"if ! {{ [ -f {pid} ] && kill -0 \"$(cat {pid})\" 2>/dev/null; }}; then "
                f"{shlex.join(self.argv())}; fi\n")


def join_script(queue: Queue, node: str) -> str:
    """What a fresh machine runs (as root, over the cluster's pinned SSH) to become Slurm node `node` of the queue:
    the cluster's MUNGE key from stdin (base64) and its munged, the queue's configuration as the controller's,
    then slurmd under that node name (one already running there for it stopped first: a machine joins again).
    `slurmd -b`: the daemon's start counts as the node's boot (a local node shares the machine's boot time, older
    than the resume, and slurmctld would wait for a boot until ResumeTimeout)."""
    folder = queue.node_dir.rstrip("/")
    conf = f"{folder}/slurm.conf"
    lines = [
        "set -e",
        "umask 022",  # the folders and files a job's user reads (its script in the spool, slurm.conf): a hardened
        # image's root may have 077
        # the machine's name and its Slurm name are its address on the cluster's network, not the loopback Debian
        # gives a hostname (JAX's and Gloo's processes advertise what their hostname names); /etc/hosts rewritten
        # in place (it may be a bind mount)
        ADDRESS,
        f"hosts=$(grep -v -e '^127\\.0\\.1\\.1[[:space:]]' -e ' # kiln queue$' /etc/hosts || true); "
        f"printf '%s\\n%s\\n' \"$hosts\" \"$addr $(hostname) {node} # kiln queue\" > /etc/hosts",
        Munge(queue.cluster).start_script().rstrip("\n"),
        f"mkdir -p {shlex.quote(f'{folder}/{node}/spool')} {shlex.quote(f'{folder}/pmix')}",
        *(f"cat > {shlex.quote(f'{folder}/{file}')} <<'KILN_SLURM_CONF'\n{text}KILN_SLURM_CONF"
          for file, text in conf_files(queue).items()),
        f"chmod 755 {shlex.quote(f'{folder}/epilog')}",
        # a slurmd of this node already running (the machine joins again: slurmctld asked for the node while kiln
        # still held its machine) is stopped first, so that the new one's start is the boot slurmctld waits for;
        # only a process whose command line is this node's slurmd (a pid file may outlive its process)
        f"old=$(cat {shlex.quote(f'{folder}/{node}/slurmd.pid')} 2>/dev/null || true)",
        f"ours() {{ [ -n \"$old\" ] && tr '\\0' ' ' 2>/dev/null < /proc/$old/cmdline | "
        f"grep -qF -- {shlex.quote(f'slurmd -N {node} ')}; }}",
        'if ours; then kill "$old" 2>/dev/null || true; '
        'for _ in $(seq 50); do ours || break; sleep 0.2; done; '
        '! ours || kill -9 "$old" 2>/dev/null || true; fi',
        # where this node's Docker engine answers, as its login sessions have it (a job's --image tasks use it)
        f"printf '%s\\n' \"${{DOCKER_HOST:-}}\" > {shlex.quote(f'{folder}/docker-host')}",
        shlex.join(["slurmd", "-N", node, "-b", "-f", conf]),
    ]
    return "\n".join(lines) + "\n"


def program_text(argv: Sequence[str], verb: str, cluster: str, log: str, env: dict[str, str]) -> str:
    """The program slurmctld runs for `verb`: kiln's own verb, with the nodes' hostlist slurmctld hands it (resume,
    suspend, resume-fail, lost) or the job's number from its environment (job-start, job-end: its prolog and
    epilog), with kiln's settings (`env`), its output in `log`, and no descriptor of slurmctld's (a daemon started
    with one open would sit on it)."""
    settings = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(env.items()))
    given = '"$SLURM_JOB_ID"' if verb in JOB_PROGRAMS else '"$1"'
    return (f"#!/bin/sh\n# slurmctld's {verb} program for kiln cluster {cluster} (bootstrap/queue.py)\n"
            f"exec env {settings} {shlex.join(argv)} {verb} {shlex.quote(cluster)} {given} "
            f"</dev/null >>{shlex.quote(log)} 2>&1\n")


JOB_PROGRAMS = ("job-start", "job-end")  # slurmctld's prolog and epilog of a job (Power.job_start, job_end)
# A node that is not up yet for a job (slurmctld allocates powered-down nodes, then resumes them)
NOT_UP = ("POWERING_UP", "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN", "NOT_RESPONDING", "DOWN", "FAIL")


def job_place(work_dir: str, nodes: str) -> tuple[str, str] | None:
    """A kiln job's folder and its nodes' hostlist, from what slurmctld gives its prolog and epilog
    (SLURM_JOB_WORK_DIR: the folder's code/; SLURM_JOB_NODELIST); None for a job kiln did not write (nothing of
    kiln's to carry)."""
    if not work_dir.endswith("/code") or not nodes or nodes == "(null)":
        return None
    return work_dir.removesuffix("/code"), nodes


def node_up(shown: str) -> bool:
    """Whether `scontrol show node --oneliner` shows a node that is up and answers (its job can reach it)."""
    return not any(flag in NOT_UP for flag in job_fields(shown).get("State", "").split("+"))


@dataclass(frozen=True)
class Partition:
    """A partition a job may ask for: its name, and the most nodes one job of it can have (a queue kiln made: its
    shape's max_nodes; a cluster reached through its login node: sinfo's count)."""

    name: str
    nodes: int


JOB_MODES = ("run", "torchrun", "jax", "tf-config", "horovod")
# torchrun's c10d rendezvous and JAX's coordinator listen on the job's first node at 29400 + the job's id % 1000,
# tf-config's workers on each node at 23456 + the job's id % 1000: two jobs sharing a node listen apart
RENDEZVOUS_PORT = 29400
TF_CONFIG_PORT = topology.DEFAULT_BASE_PORT


@dataclass(frozen=True)
class Job:
    """A program submitted to the queue (kiln submit): `nodes` nodes of `partition`, each running it once (`run`;
    `jax`: with its coordinator, for a bare jax.distributed.initialize(), which reads its process id and count
    from Slurm) or a torchrun agent of `nproc_per_node` workers (`torchrun`: `argv` is what follows torchrun's own
    options; `tf-config`: one worker per node, each with its TF_CONFIG, for MultiWorkerMirroredStrategy;
    `horovod`: `nproc_per_node` processes per node under srun --mpi=pmix, which Horovod's MPI reads its ranks from).
    With `shards`: an array job of `shards` tasks (kiln run's shards), each one node running the program once.
    `folder`: the job's folder, which every node sees (code/, output/, checkpoints/, model/, the job's log)."""

    cluster: str
    run_id: str
    partition: str
    nodes: int
    mode: str
    argv: tuple[str, ...]
    python: str
    folder: str
    nproc_per_node: int = 1
    slurmd_timeout_s: int = SLURMD_TIMEOUT_S  # the queue's (Power): how long lost_lines asks after a failure
    shards: int = 0  # an array job of this many tasks, each its shard (`run` on one node); 0: one job
    shard_inputs: bool = False  # each shard's items are in the job's folder, shard-INDEX.inputs
    image: str = ""  # each task in a container of this image (kiln submit --image), pulled on each node first
    node_dir: str = ""  # the nodes' Slurm folder (Queue.node_dir), where the join left the node's Docker engine


def tf_config_lines() -> list[str]:
    """The batch script's lines that give each task of a tf-config job its TF_CONFIG: a step on every node tells its
    address (in node order), and each node's worker listens at the job's port (topology.tf_config's shape: one
    worker per node, indexed by the node's place in the job; the first leads)."""
    return [
        f"addrs=($(srun --kill-on-bad-exit=1 bash -c {shlex.quote(ADDRESS + '; echo $SLURM_NODEID $addr')} "
        "| sort -n | cut -d' ' -f2))",
        f"port=$(({TF_CONFIG_PORT} + SLURM_JOB_ID % 1000))",
        r'workers=; for a in "${addrs[@]}"; do workers+="${workers:+,}\"$a:$port\""; done',
        'export KILN_TF_WORKERS="[$workers]"',
    ]


def lost_lines(job: Job) -> list[str]:
    """What the batch script does when its program fails: a process whose peer's node was lost fails at once (its
    collective breaks), before slurmctld has marked the node down and requeued the job itself. So it asks slurmctld,
    for at most the queue's SlurmdTimeout and a margin (by then slurmctld has marked a lost node down and
    requeued the job itself), whether a node of the job no longer answers; once one does not, it puts the job back
    in the queue (the program resumes from its checkpoints on nodes that answer). A program that failed on its own
    fails its job that much later."""
    return [
        "lost() {",
        f"  for _ in $(seq {(job.slurmd_timeout_s + LOST_MARGIN_S) // 2}); do",
        "    if scontrol show node --oneliner \"$SLURM_JOB_NODELIST\" | grep -q 'State=[^ ]*NOT_RESPONDING'; then",
        '      echo "kiln: a node of job $SLURM_JOB_ID does not answer: the job goes back in the queue" >&2',
        '      scontrol requeue "$SLURM_JOB_ID"; exit "$1"',
        "    fi",
        "    sleep 2",
        "  done",
        '  exit "$1"',
        "}",
    ]


def batch_script(job: Job) -> str:
    """The job's sbatch script: the environment kiln's contract gives a program (KILN_RUN_ID; KILN_OUTPUT_DIR and
    KILN_CHECKPOINT_DIR per task, as each node's own disk would hold them; KILN_NODE_RANK, KILN_NUM_NODES), one
    task per node started by srun, which ends the job when one of them fails; for torchrun, the rendezvous on the
    job's first node under the job's id. Gloo and NCCL use each node's default-route interface (a node's hostname
    may name its loopback)."""
    folder = job.folder.rstrip("/")
    task = {"torchrun": "torchrun", "jax": "jax", "tf-config": "worker", "horovod": "rank"}.get(job.mode, "node")
    # a process per node, named by its node's place in the job; horovod's `nproc_per_node` per node, by their rank;
    # an array's task by its shard
    index = "$SLURM_PROCID" if job.mode == "horovod" else "$SLURM_NODEID"
    env = {"KILN_RUN_ID": job.run_id, "KILN_MODEL_DIR": f"{folder}/model", "KILN_NUM_NODES": str(job.nodes),
           "PYTHONPATH": f"{folder}/code", **launch.EVERY_PROCESS}
    shard = ""
    if job.shards:
        task, index = "shard", "$SLURM_ARRAY_TASK_ID"
        env["KILN_SHARD_COUNT"] = str(job.shards)
        shard = "KILN_SHARD_INDEX=$SLURM_ARRAY_TASK_ID " + (
            f"KILN_SHARD_INPUTS={shlex.quote(folder)}/shard-$SLURM_ARRAY_TASK_ID.inputs " if job.shard_inputs else "")
    # torchrun's agents (PET_X is their --x): the first node's keeps the rendezvous' store, and each names itself
    # to the workers by its address (a node's hostname may name its loopback, and no other node may know it)
    torchrun = ('PET_RDZV_CONF=is_host=$([ "$SLURM_NODEID" = 0 ] && echo 1 || echo 0) PET_LOCAL_ADDR=$addr '
                if job.mode == "torchrun" else "")
    jax = "JAX_COORDINATOR_ADDRESS=$KILN_COORDINATOR " if job.mode == "jax" else ""
    tf_config = ('TF_CONFIG="{\\"cluster\\":{\\"worker\\":$KILN_TF_WORKERS},'
                 '\\"task\\":{\\"type\\":\\"worker\\",\\"index\\":$SLURM_NODEID}}" '
                 if job.mode == "tf-config" else "")
    per_task = (f'{ADDRESS}; nic=$(ip route show default | awk \'{{print $5; exit}}\'); '
                f'export KILN_TASK={task}-{index} KILN_NODE_RANK=$SLURM_NODEID '
                f'KILN_OUTPUT_DIR={shlex.quote(folder)}/output/{task}-{index} '
                f'KILN_CHECKPOINT_DIR={shlex.quote(folder)}/checkpoints/{task}-{index} '
                f'NCCL_SOCKET_IFNAME=$nic GLOO_SOCKET_IFNAME=$nic {torchrun}{jax}{tf_config}{shard}; '
                'mkdir -p "$KILN_OUTPUT_DIR" "$KILN_CHECKPOINT_DIR"; '
                + (container.task_shell(job.image, folder, job.node_dir) if job.image else 'exec "$@"'))
    if job.mode == "torchrun":
        program = (f"{shlex.quote(job.python)} -m torch.distributed.run --nnodes {job.nodes} "
                   f"--nproc-per-node {job.nproc_per_node} --rdzv-backend c10d "
                   f'--rdzv-endpoint "$KILN_COORDINATOR" --rdzv-id "$SLURM_JOB_ID" {shlex.join(job.argv)}')
    else:
        program = shlex.join(job.argv)
    lines = [
        "#!/bin/bash",
        f"# kiln submit to the queue of cluster {job.cluster}: run {job.run_id} (written by kiln, bootstrap/slurm.py)",
        f"#SBATCH --job-name={job.run_id}",
        f"#SBATCH --partition={job.partition}",
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.nproc_per_node if job.mode == 'horovod' else 1}",
        "#SBATCH --wait-all-nodes=1",
        *([f"#SBATCH --array=0-{job.shards - 1}"] if job.shards else []),
        f"#SBATCH --output={folder}/slurm-{'%A_%a' if job.shards else '%j'}.out",
        "#SBATCH --open-mode=append",  # a job run again (requeued) adds to its log
        "#SBATCH --requeue",
        f"#SBATCH --chdir={folder}/code",
        "set -e",
        "export " + " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items()),
        f"{ADDRESS}  # this node's: the job's first",
        f"export KILN_COORDINATOR=$addr:$(({RENDEZVOUS_PORT} + SLURM_JOB_ID % 1000))",
        *(tf_config_lines() if job.mode == "tf-config" else []),
        *lost_lines(job),
        *(container.pull_lines(job.image, job.node_dir) if job.image else []),
        # horovod: Horovod's MPI finds its rank and size through the node's PMIx server (Slurm's mpi/pmix)
        f"srun {'--mpi=pmix ' if job.mode == 'horovod' else ''}--kill-on-bad-exit=1 bash -c {shlex.quote(per_task)} "
        f"kiln {program} || lost $?",
    ]
    return "\n".join(lines) + "\n"


# The states a job ends in; every other (pending, configuring, running, requeued, completing) is still going.
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                   "OUT_OF_MEMORY"})


def not_responding(shown: str) -> bool:
    """Whether `scontrol show node --oneliner` shows a node slurmctld no longer hears from (DOWN*, ALLOCATED*)."""
    return "NOT_RESPONDING" in job_fields(shown).get("State", "").split("+")


def down_by_kiln(shown: str) -> bool:
    """Whether `scontrol show node --oneliner` shows a node kiln's own programs marked down (it could not be made or
    joined, or it was lost): every reason they give begins with "kiln"."""
    return job_fields(shown).get("Reason", "").startswith("kiln")


def job_fields(shown: str) -> dict[str, str]:
    """`scontrol show job --oneliner`'s KEY=VALUE words (a value with no space: state, exit code, paths)."""
    return dict(word.split("=", 1) for word in shown.split() if "=" in word)


def job_exit(shown: str) -> int | None:
    """A job's exit status as `scontrol show job --oneliner` shows it (an array job: a line per task, or per tasks
    still pending), or None while it has not ended: 0 only for a job COMPLETED with status 0; one that ended
    otherwise (cancelled, failed on a node, timed out) is never 0. A job slurmctld requeues (a node lost, Requeue=1)
    shows PENDING (or REQUEUED) again, never NODE_FAIL or PREEMPTED: slurmctld sets those and then PENDING in one
    step under its job lock, so either as shown is the job's end, Requeue=1 or not. An array job has ended when
    every task has, with its first task's failure."""
    codes = [record_exit(line) for line in shown.splitlines() if "JobState=" in line]
    if not codes or None in codes:
        return None
    return next((code for code in codes if code), 0)


def record_exit(shown: str) -> int | None:
    """job_exit of one job's (or one array task's) record."""
    fields = job_fields(shown)
    if fields.get("JobState") not in ENDED:
        return None
    code = int(fields.get("ExitCode", "0:0").split(":")[0] or 0)
    return code if fields["JobState"] == "COMPLETED" else code or 1
