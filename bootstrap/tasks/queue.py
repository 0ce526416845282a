"""`kiln queue VERB NAME`: a cluster whose nodes Slurm asks for (bootstrap/queue.py). It parses and prints."""

from __future__ import annotations

from pathlib import Path

from bootstrap import attached, controller, jobs, programs, providers, queue, slurm, state
from bootstrap.errors import KilnError, UsageError
from bootstrap.providers import common
from bootstrap.session import ssh_options
from bootstrap.tasks import cluster_task
from bootstrap.tasks.cluster import user_command
from kiln.shield import shielded

VERBS = ("up", "attach", "down", "status", "env", "logs", "cancel", "fetch")
# slurmctld's: not for people (kiln queue --help lists them)
PROGRAM_VERBS = programs.VERBS
QUEUE_HELP = {
    "verb": f"{', '.join(VERBS)}; slurmctld itself runs {', '.join(PROGRAM_VERBS)} with --nodes",
    "name": "the cluster's name (the local provider: 1-6 of a-z, 0-9, starting with a letter; attach: 1-32 of "
            "a-z, 0-9 and -)",
    "provider": "where its nodes are made: local (nodes in network namespaces on this machine, root), or aws (a "
                "controller machine runs slurmctld and kiln's programs, which make the nodes)",
    "max_nodes": "up: the most nodes the partition runs at once (default 2)",
    "min_nodes": "up: the nodes kept up even without jobs (default 0: none, the queue scales to zero)",
    "cpus": "up: the CPUs Slurm gives each node (default 1)",
    "memory_mib": "up: the memory Slurm gives each node, MiB (default 1000)",
    "partition": "up: the partition's name (default cpu)",
    "docker": "up: each node made with its own Docker engine (the local provider's; a cloud image has one), for "
              "kiln submit --image",
    "idle_minutes": "up: remove a node after it has been idle this long (Slurm's SuspendTime; default 5)",
    "nodes": "resume, suspend, resume-fail: the Slurm nodes, as slurmctld hands them (kq-cpu-[0-1])",
    "job": "logs, cancel, fetch: the job's number (kiln submit prints it; kiln queue status lists them)",
    "follow": "logs: print what the job writes until it has ended",
    "login": "attach: USER@HOST[:PORT] of a Slurm cluster's login node kiln did not make (kiln's -i and -S give "
             "the key and ssh config to log in with)",
    "accept_new_host_keys": "attach: trust the login node's host key seen on this first contact (default: only "
                            "keys already in your known_hosts)",
    "folder": "attach: where the jobs' folders go on the cluster, under the user's home unless absolute (default "
              "kiln-jobs); the cluster's nodes must see it (a shared home)",
    "python": "attach: the nodes' Python that runs a job's program (default python3)",
    "region": "up --provider aws: the region of its nodes and its controller machine (default: AWS_REGION)",
    "profile": "up --provider aws: the AWS profile whose credentials make the cluster and its controller",
    "instance_type": "up on a cloud: its nodes' machine type (as kiln up --instance-type)",
    "ami": "up --provider aws: the image of its nodes and its controller (default: the newest kiln image)",
    "ssh_cidr": "up on a cloud: who may reach the controller and the nodes over SSH (as kiln up --ssh-cidr)",
    "user": "up on a cloud: the image's login user (as kiln up --user)",
    "ttl_hours": "up on a cloud: when kiln sweep may remove the queue's cluster (default: the longest, "
                 f"{common.MAX_TTL_HOURS // 24} days; kiln down removes it any time)",
}


@cluster_task(name="queue", help=QUEUE_HELP)
def queue_(c, verb, name, provider="local", max_nodes=2, min_nodes=0, cpus=1, memory_mib=1000, partition="cpu",
           idle_minutes=5.0, docker=False, nodes=None, job=None, follow=False, login=None, accept_new_host_keys=False,
           folder="kiln-jobs", python="python3", region=None, profile=None, instance_type=None, ami=None,
           ssh_cidr=None, user=None, ttl_hours=None):
    """A Slurm queue on a cluster whose nodes kiln makes when jobs wait and removes when they are idle: up makes
    the cluster (no node yet) and its controller, down removes both (kiln down NAME does too), status shows the
    partitions, the jobs and the nodes up, env prints what sbatch, srun and squeue need to reach it, logs prints a
    job's log (--follow: until it ends), cancel cancels a job, fetch brings a job's folder here. attach reaches a
    Slurm cluster kiln did not make, through its login node (down forgets it and leaves it running)."""
    if verb in PROGRAM_VERBS:
        program(verb, name, nodes)
    elif verb == "up":
        attached.refuse_taken(name)
        shape = slurm.Shape(partition, cpus=int(cpus), memory_mib=int(memory_mib), max_nodes=int(max_nodes),
                            min_nodes=int(min_nodes))
        seconds = round(float(idle_minutes) * 60)
        if seconds < 1:
            raise UsageError(f"--idle-minutes {idle_minutes}: give at least a second's worth (0.02)")
        given = {"instance_type": instance_type, "ami": ami, "ssh_cidr": ssh_cidr, "user": user,
                 "ttl_hours": ttl_hours}
        print("\n".join(controller.up(name, providers.named(provider, {"region": region, "profile": profile}),
                                       [shape], suspend_time_s=seconds, docker=bool(docker),
                                       options={k: v for k, v in given.items() if v is not None})))
    elif verb == "attach":
        if not login:
            raise UsageError(f"kiln queue attach {name}: give --login USER@HOST of the cluster's login node")
        print("\n".join(attached.attach(name, login, settings(c), accept_new=bool(accept_new_host_keys),
                                        folder=folder, python=python)))
    elif verb == "down" and attached.exists(name) and attached.load(name).controller:
        print("\n".join(queue.placed(name).down(name).lines))  # its controller ended first
    elif verb == "down" and attached.exists(name):
        print("\n".join(attached.detach(name)))
    elif verb == "down":
        queue.load(name)  # refused where the cluster has no queue: kiln down NAME removes any cluster
        stopped = queue.stop_controller(name)
        gone = queue.placed(name).down(name)
        print("\n".join([*([f"queue {name}: slurmctld and munged stopped"] if stopped else []), *gone.lines]))
    elif verb == "status":
        print(jobs.describe(name))
    elif verb == "env" and attached.exists(name):
        raise UsageError(f"kiln queue env {name}: its Slurm tools run on its login node, "
                         f"{attached.load(name).login}; kiln queue status, logs and cancel reach them from here")
    elif verb == "env":
        print(queue.env_lines(name), end="")
    elif verb in ("logs", "cancel", "fetch") and not job:
        raise UsageError(f"kiln queue {verb} {name}: give --job N (kiln queue status {name} lists the jobs)")
    elif verb == "logs":
        for chunk in jobs.job_log(name, str(job), follow=bool(follow)):
            print(chunk, end="", flush=True)
    elif verb == "cancel":
        print(jobs.cancel_job(name, str(job)))
    elif verb == "fetch":
        print("\n".join(jobs.fetch(name, str(job))))
    else:
        raise UsageError(f"kiln queue {verb}: choose one of {', '.join(VERBS)}")


def settings(c) -> state.SshSettings:
    """How to log in to a login node: Fabric's -i, -S and -t flags (session.ssh_options)."""
    options = ssh_options(c)
    return state.SshSettings(options.config_file, options.identity, options.connect_timeout)


def program(verb: str, name: str, nodes: str | None) -> None:
    """What slurmctld runs, as kiln's command line (bootstrap/programs.py: slurmctld's programs start it)."""
    print("\n".join(programs.run(verb, name, nodes)), flush=True)


SUBMIT_HELP = {
    "name": "the cluster whose queue takes the job (kiln queue up NAME, or kiln queue attach NAME)",
    "mode": "run: each node runs the program once (default); torchrun: a torchrun agent per node, the rendezvous "
            "on the job's first node; jax: each node's process told its coordinator (the first node) for a bare "
            "jax.distributed.initialize(); tf-config: a worker per node, each given its TF_CONFIG "
            "(MultiWorkerMirroredStrategy); horovod: --nproc-per-node ranks a node, started by srun --mpi=pmix "
            "(no horovodrun)",
    "nodes": "how many nodes the job runs on (default 1); the queue makes those it lacks",
    "nproc_per_node": "torchrun, horovod: processes on each node (default 1)",
    "partition": "the partition (default: the queue's first)",
    "wait": "return once the job has ended, with its exit status, and print its log",
    "python": "the nodes' Python that runs the program (default: the cluster's, or what attach was given)",
    "shards": "an array job of N one-node tasks, each told its shard (KILN_SHARD_INDEX, KILN_SHARD_COUNT), as kiln "
              "run's processes",
    "shard_input": "a list file, a folder or s3://bucket/prefix: each shard gets its contiguous share in the file "
                   "KILN_SHARD_INPUTS (default --shards: the partition's nodes)",
    "image": "run each task in a container of this image (REGISTRY/NAME:TAG or @sha256:...), pulled on each node "
             "first (one image id on every node), with the node's network, GPUs and the job's folder; its own "
             "Python runs the program unless --python names another",
    "dry_run": "print the job's batch script and where its folder would be; nothing is copied or submitted",
}


@cluster_task(help=SUBMIT_HELP)
def submit(c, name, mode="run", nodes=1, nproc_per_node=1, partition=None, wait=False, python=None, shards=0,
           shard_input=None, image=None, dry_run=False):
    """Submit the program after -- to the cluster's queue as a batch job, from a copy of this folder: it waits
    for its nodes (the queue makes them) and runs with kiln's environment (KILN_OUTPUT_DIR, KILN_CHECKPOINT_DIR,
    KILN_NODE_RANK, ...)."""
    done = jobs.submit(name, Path.cwd(), user_command(c), mode=mode, nodes=int(nodes),
                        nproc_per_node=int(nproc_per_node), partition=partition, python=python,
                        shards=int(shards), shard_input=shard_input, image=image, dry_run=bool(dry_run))
    if dry_run:
        print(f"kiln submit {name} --dry-run: the job's folder would be {done.folder}; its batch script:\n"
              f"{done.script}", end="")
        return
    log = done.log
    print(f"job {done.job} (run {done.run_id}) submitted to queue {name}: its folder {done.folder}, its log {log}",
          flush=True)
    if not wait:
        return
    try:
        code = jobs.wait_for(name, done.job)
    except KeyboardInterrupt:
        with shielded(f"cancelling job {done.job}", f"leaves it in queue {name} (kiln queue cancel {name} --job "
                                                    f"{done.job})"):
            try:
                jobs.cancel_job(name, done.job)
            except (KeyboardInterrupt, KilnError) as error:
                said = "interrupted twice" if isinstance(error, KeyboardInterrupt) else str(error)
                raise KilnError(f"job {done.job} may still be in queue {name} ({said}): kiln queue cancel {name} "
                                f"--job {done.job}; its log: {log}") from None
        raise KilnError(f"job {done.job} cancelled (interrupted); its log: {log}") from None
    print("".join(jobs.job_log(name, done.job)) or "(the job wrote no log)\n", end="")
    if code:
        raise KilnError(f"job {done.job} failed (exit {code}); its log: {log}")
