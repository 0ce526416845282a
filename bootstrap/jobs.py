"""A queue's jobs (I/O): kiln submit's batch jobs, and the verbs that show, follow, cancel and fetch them, wherever
the queue's Slurm is.

Two kinds of queue, each a `Reach` (how Slurm's client tools are run, where a job's folder is, how a job's files get
there and come back):
- `Here`: the queue kiln made (`kiln queue up`, bootstrap/queue.py): its controller on this machine, the tools run
  here, a job's folder is a run's folder on this machine's disk, which every local node sees.
- `Login` (bootstrap/attached.py): a Slurm cluster kiln did not make (`kiln queue attach`), reached through its
  login node over SSH with the node's host keys pinned, as the user the login names; the tools run there, a job's
  folder is under that user's folder on the cluster (its shared home, as an HPC cluster's), and a run's folder here
  keeps what kiln sent and what `kiln queue fetch` brings back.

What a job is, its batch script, is one pure function for both (slurm.batch_script).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bootstrap import attached, container, launch, queue, slurm, state
from bootstrap.commands import SYNC_EXCLUDES
from bootstrap.errors import KilnError, UsageError
from bootstrap.inputs import list_inputs
from bootstrap.slurm import Partition

WAIT_S = 7 * 24 * 3600  # kiln submit --wait: a week at most
HERE_EVERY_S = 2.0  # how often --wait asks slurmctld on this machine
LOGIN_EVERY_S = 10.0  # and a login node (a login each: a site's sshd limits how many come at once)
MISSED_CALLS = 5  # calls in a row that may fail to reach a login node before --wait gives up


class JobError(KilnError):
    """Slurm refused a job, or no longer knows it."""


class Reach(Protocol):
    """Where a queue's Slurm is, and how kiln reaches it."""

    name: str  # the queue's (its cluster's) name
    python: str | None  # the nodes' Python, where kiln knows it
    partitions: tuple[Partition, ...]  # the first is the default
    slurmd_timeout_s: int  # how long slurmctld waits on a silent node (the batch script's lost-node check)
    here: bool  # a job's folder is this machine's own
    node_dir: str  # the nodes' Slurm folder, where kiln made it ("" on a login node's cluster)
    docker: bool  # kiln submit --image can run there: the nodes have a Docker engine of their own
    user: str  # who the jobs run as on a login node ("" here: whoever runs kiln)

    def tool(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """One of Slurm's client tools (sbatch, squeue, scontrol, ...) against the queue, bounded; text output."""

    def job_folder(self, run_id: str) -> str:
        """The folder of a job, as the cluster's nodes see it."""

    def place(self, project: Path, staged: Path, folder: str) -> None:
        """Put the job's files where its nodes see them: the project as `folder`/code, and what kiln wrote for the
        job in `staged` (its script, its shards' inputs) in `folder`."""

    def read(self, path: str, offset: int) -> bytes | None:
        """What file `path` of the cluster holds from `offset` on, or None where there is no such file."""

    def fetch(self, folder: str, into: Path) -> list[str]:
        """Copy the job's folder (but its code) into `into`; what was copied, a line each."""


@dataclass(frozen=True)
class Here:
    """The queue kiln made: its controller on this machine (bootstrap/queue.py)."""

    name: str
    partitions: tuple[Partition, ...]
    slurmd_timeout_s: int
    python: str | None = None
    here: bool = True
    user: str = ""
    node_dir: str = queue.NODE_DIR
    docker: bool = True  # its nodes have a Docker engine of their own

    def tool(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return queue.slurm_tool(self.name, *argv, timeout=timeout)

    def job_folder(self, run_id: str) -> str:
        """A run's folder (kiln status and fetch find it there; kiln down leaves it): this machine's disk, which
        every local node sees, as a cluster's shared filesystem."""
        return str(state.run_folder(run_id))

    def place(self, project: Path, staged: Path, folder: str) -> None:
        shutil.copytree(project, Path(folder) / "code", symlinks=True,
                        ignore=shutil.ignore_patterns(*(pattern.rstrip("/") for pattern in SYNC_EXCLUDES)))

    def read(self, path: str, offset: int) -> bytes | None:
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                return handle.read()
        except FileNotFoundError:
            return None
        except PermissionError:  # another user's job (kiln queue status --all lists them)
            raise JobError(f"{path}: not yours to read (its job runs as another user)") from None

    def fetch(self, folder: str, into: Path) -> list[str]:
        return [f"{folder}: on this machine already"]


def reach(name: str) -> Reach:
    """How to reach the queue of cluster `name`: one kiln made, or one attached through its login node."""
    if attached.exists(name):
        return attached.load(name)
    shown = queue.public(name)  # the one this machine's users share: made by root here, or by this user
    if shown is None:
        raise UsageError(f"cluster {name} has no queue (kiln queue up {name} makes one; kiln queue attach {name} "
                         "--login USER@HOST reaches a Slurm cluster you have)")
    # the nodes share this machine's files: its Python, where this user may run it (root's may be under /root)
    python = shown.python if shown.python and os.access(shown.python, os.X_OK) else None
    return Here(name, tuple(Partition(part, nodes) for part, nodes in shown.partitions), shown.slurmd_timeout_s,
                python, node_dir=shown.node_dir, docker=shown.docker)


# ---------------------------------------------------------------- submit


@dataclass(frozen=True)
class Submitted:
    job: str  # Slurm's job id
    run_id: str
    folder: str  # the job's folder, as the cluster's nodes see it
    shards: int = 0
    script: str = ""  # its batch script

    @property
    def log(self) -> str:
        """Where its log is (an array job's: each task's, in the same folder)."""
        return f"{self.folder}/" + (f"slurm-{self.job}_*.out" if self.shards else f"slurm-{self.job}.out")


def submit(name: str, project: Path, argv: Sequence[str], *, mode: str, nodes: int, nproc_per_node: int = 1,
           partition: str | None = None, python: str | None = None, shards: int = 0,
           shard_input: str | None = None, image: str | None = None, dry_run: bool = False) -> Submitted:
    """Put the project in a fresh job folder and submit the program as a batch job of `nodes` nodes
    (slurm.batch_script); with `shards` (or `shard_input`: as many shards as the partition's nodes), an array job
    of that many one-node tasks, each given its shard (and its part of the inputs, as kiln run splits them).
    With `image`, each task runs in a container of it (pulled on each node first; the image's own Python, unless
    `python` names another). `dry_run`: the job as it would be (no job number), with nothing written or sent."""
    if image is not None:
        container.check_reference(image)
    where = reach(name)
    if image is not None and not where.here:
        raise UsageError(f"kiln submit {name} --image: a cluster reached through its login node runs containers "
                         "through its site's own runtime (Apptainer, pyxis), not kiln's; --image runs on a queue "
                         "kiln made")
    if image is not None and not where.docker:
        raise UsageError(f"kiln submit {name} --image: the queue's nodes have no Docker engine of their own (the "
                         f"local provider's get one each with kiln queue up {name} --docker)")
    if mode not in slurm.JOB_MODES:
        raise UsageError(f"--mode {mode}: choose one of {', '.join(slurm.JOB_MODES)}")
    parts = {part.name: part for part in where.partitions}
    part = parts.get(partition or where.partitions[0].name)
    if part is None:
        raise UsageError(f"--partition {partition}: queue {name} has {', '.join(parts)}")
    if not 1 <= nodes <= part.nodes:
        raise UsageError(f"--nodes {nodes}: partition {part.name} of queue {name} runs 1 to {part.nodes}")
    if not argv:
        raise UsageError("kiln submit: give the program after --, e.g. kiln submit NAME -- python train.py")
    shards = shards or (part.nodes if shard_input else 0)
    if shards < 0 or shards > slurm.MAX_ARRAY:
        raise UsageError(f"--shards {shards}: give 1 to {slurm.MAX_ARRAY}")
    if shards and (mode != "run" or nodes != 1):
        raise UsageError("--shards and --shard-input run the program once on each of the array's one-node tasks "
                         "(--mode run, --nodes 1)")
    items = list_inputs(shard_input, project) if shard_input else None
    python = python or ("python3" if image else where.python or sys.executable)
    program = launch.Program(tuple(argv))
    entry = launch.torchrun_entry(program, python) if mode == "torchrun" else launch.user_argv(argv, python)
    run_id = state.new_run_id()
    folder = where.job_folder(run_id)
    if any(char.isspace() or char == "%" for char in folder):  # sbatch's --output and --chdir take it bare
        raise UsageError(f"kiln submit: the job's folder {folder} has a space or '%' in its path, which Slurm "
                         "cannot take; " + ("set KILN_RUNS to another folder" if where.here else
                                            f"kiln queue attach {name} --folder names another"))
    script = slurm.batch_script(slurm.Job(name, run_id, part.name, nodes, mode, tuple(entry), python, folder,
                                          nproc_per_node, where.slurmd_timeout_s, shards, items is not None,
                                          image or "", where.node_dir))
    if dry_run:
        return Submitted("", run_id, folder, shards, script)
    staged = state.run_folder(run_id)
    staged.mkdir(parents=True)
    for index, part_items in enumerate(launch.shard(items, shards) if items is not None else []):
        (staged / f"shard-{index}.inputs").write_text("".join(f"{item}\n" for item in part_items))
    (staged / "job.sh").write_text(script)
    where.place(project, staged, folder)
    done = where.tool("sbatch", "--parsable", f"{folder}/job.sh", timeout=60)
    job = (done.stdout.strip().splitlines() or [""])[-1].split(";")[0]
    if done.returncode or not job.isdigit():
        raise JobError(f"sbatch refused the job: {(done.stderr or done.stdout).strip()}")
    state.write_json(staged / "job.json", {"queue": name, "job": job, "folder": folder, "shards": shards})
    return Submitted(job, run_id, folder, shards, script)


# ---------------------------------------------------------------- jobs


def wait_for(name: str, job: str, timeout_s: float = WAIT_S, every_s: float | None = None) -> int:
    """Wait until the job has ended; its exit status (slurmctld keeps an ended job's record for MinJobAge). A login
    node is asked every LOGIN_EVERY_S (a connection each), and a few calls that do not reach it are ridden out."""
    where = reach(name)
    every_s = every_s or (HERE_EVERY_S if where.here else LOGIN_EVERY_S)
    deadline, missed = time.monotonic() + timeout_s, 0
    while True:
        try:
            shown = where.tool("scontrol", "show", "job", "--oneliner", job)
            missed = 0
        except KilnError:
            missed += 1
            if missed > MISSED_CALLS:
                raise
            time.sleep(every_s)
            continue
        ended = slurm.job_exit(shown.stdout) if shown.returncode == 0 else None
        if ended is not None:
            return ended
        if shown.returncode:
            raise JobError(f"job {job} of queue {name}: slurmctld no longer knows it: {shown.stderr.strip()}")
        if time.monotonic() > deadline:
            raise JobError(f"job {job} of queue {name} has not ended within {timeout_s:g} s")
        time.sleep(every_s)


def check_job_number(job: str) -> None:
    """--job: a job's number (digits 0-9 alone: str.isdigit also takes '²', which no int reads)."""
    if not (job.isascii() and job.isdigit()):
        raise UsageError(f"--job {job}: give a job's number, as kiln submit printed it")


def shown_job(where: Reach, job: str) -> str:
    """`scontrol show job` of one of the queue's jobs; refused by name where slurmctld has no such job (it keeps an
    ended one's record for MinJobAge)."""
    check_job_number(job)
    shown = where.tool("scontrol", "show", "job", "--oneliner", job)
    if shown.returncode:
        raise UsageError(f"--job {job}: queue {where.name} has no such job ({(shown.stderr or shown.stdout).strip()})")
    return shown.stdout


def cancel_job(name: str, job: str) -> str:
    """Cancel a job that has not ended; what became of it."""
    where = reach(name)
    if slurm.job_exit(shown_job(where, job)) is not None:
        return f"job {job} of queue {name} had already ended"
    done = where.tool("scancel", job)
    if done.returncode:
        raise JobError(f"scancel {job}: {(done.stderr or done.stdout).strip()}")
    return f"job {job} of queue {name} cancelled"


def job_log(name: str, job: str, follow: bool = False, every_s: float = 1.0) -> Iterator[str]:
    """The job's log (its sbatch --output; an array job's, each task's in turn) as it is: what is there, or with
    `follow`, what is written until the job has ended. A follow whose asks slurmctld stops answering (the queue
    taken down, the login node gone) ends after MISSED_CALLS of them in a row, naming why."""
    where = reach(name)
    shown = shown_job(where, job)
    offsets: dict[str, int] = {}
    missed = 0
    while True:
        ended = slurm.job_exit(shown) is not None
        for line in shown.splitlines():
            log = slurm.job_fields(line).get("StdOut")
            chunk = where.read(log, offsets.get(log, 0)) if log else None
            if chunk:
                offsets[log] = offsets.get(log, 0) + len(chunk)
                yield chunk.decode(errors="replace")
        if not follow or ended:
            return
        time.sleep(every_s)
        try:
            again = where.tool("scontrol", "show", "job", "--oneliner", job)
        except KilnError as error:
            again, why = None, str(error)
        else:
            why = (again.stderr or again.stdout).strip() or f"scontrol exited {again.returncode}"
        if again is not None and again.returncode == 0 and again.stdout:
            shown, missed = again.stdout, 0
            continue
        missed += 1
        if missed > MISSED_CALLS:
            raise JobError(f"job {job} of queue {name}: slurmctld answers no more about it ({why}); its log so "
                           "far is above")


def describe(name: str) -> str:
    """The queue's partitions and nodes as sinfo shows them (the powered-down ones too), its jobs as squeue shows
    them; of a queue kiln made, which machine each node that is up is."""
    where = reach(name)
    shown = where.tool("sinfo", "--all", "--format=%P %D %t %N")
    jobs = where.tool("squeue", *(["--all"] if where.here else [f"--user={where.user}"]), "--format=%i %j %T %D %R")
    said = [shown.stdout if shown.returncode == 0 else f"sinfo: {shown.stderr.strip()}\n",
            jobs.stdout if jobs.returncode == 0 else f"squeue: {jobs.stderr.strip()}\n"]
    if where.here and queue.exists(name):  # the user who made it: which machine each node is
        nodes = queue.load(name).nodes
        said.append("nodes up: " + (", ".join(f"{node} on {at['host']}" for node, at in sorted(nodes.items()))
                                    or "none"))
    return "".join(said).rstrip("\n")


def fetch(name: str, job: str) -> list[str]:
    """Bring a job's folder (outputs, checkpoints, model, logs; not its code) into its run's folder here: the job
    kiln submitted from this machine, by its number."""
    where = reach(name)
    check_job_number(job)
    for path in sorted(state.runs_root().glob("*/job.json"), reverse=True):  # newest first: a name used again
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and record.get("queue") == name and record.get("job") == job and \
                isinstance(record.get("folder"), str):
            return where.fetch(record["folder"], path.parent)
    raise UsageError(f"--job {job}: no job of queue {name} was submitted from here (kiln submit writes a run's "
                     f"job.json under {state.runs_root()})")

