"""Where a run's processes run: on the nodes themselves, or inside one container per node per run (`--image`).

A runtime turns each planned process (launch.Launch) into the command that starts it on its node, and owns what
surrounds it there: for a container, the image on every node (the same image id everywhere: pulled, or shipped
from this machine), the run's container started with what multi-node training needs, the checks made inside it.
The pure part builds argv lists; `ContainerRuntime` does the I/O through the cluster's connections. Stopping is
node.py's (`stop` ends the processes in the container too and removes it), so `kiln stop` needs no runtime.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from bootstrap import commands, interconnect, launch, mesh, progress
from bootstrap import node as node_side
from bootstrap.cluster import Cluster
from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host
from bootstrap.launch import NodePaths
from bootstrap.ssh import HostFailure
from bootstrap.timeline import Timeline
from kiln import proc

PREFIX = "kiln-"  # node.py's CONTAINER_PREFIX
PYTHON_PROBE = "command -v python3 || command -v python"
# What the preflight reads inside the container: the Python and the frameworks the processes will import.
VERSIONS_CODE = (
    "import importlib.metadata as m, json, sys\n"
    "def v(n):\n"
    "    try:\n        return m.version(n)\n"
    "    except m.PackageNotFoundError:\n        return None\n"
    "print(json.dumps({'python': sys.version.split()[0], 'tensorflow': v('tensorflow'), "
    "'horovod': v('horovod'), 'torch': v('torch'), 'jax': v('jax'), 'executable': sys.executable}))\n")
COMPARED = ("python", "tensorflow", "horovod", "torch", "jax")  # the same in every node's container
MISSING = 3  # exit code of image_id_command where the node has no such image


def container_name(run_id: str) -> str:
    return f"{PREFIX}{run_id}"


def check_reference(reference: str) -> str:
    """An image reference as docker takes it: no spaces, no leading dash, not empty."""
    if not reference or reference.startswith("-") or any(c.isspace() for c in reference):
        raise UsageError(f"--image {reference!r}: give an image reference such as registry:5000/team/image:tag "
                         "or image@sha256:...")
    return reference


@dataclass(frozen=True)
class NodeView:
    """What the container needs to know about its node: the login user, its home, its GPUs, its data volume."""

    uid: int
    gid: int
    home: str
    gpus: int = 0
    data_volume: str | None = None
    memlock: int = -1  # the node's hard limit on locked memory (-1: unlimited, as kiln's images set it)
    rdma: bool = False  # the node has RDMA devices (EFA, InfiniBand): the container gets /dev/infiniband
    topology: str = ""  # the NCCL topology file its image carries (Azure's ND images), read-only inside


def mounts(paths: NodePaths, node: NodeView, checkpoint_dir: str | None) -> list[tuple[str, str]]:
    """Bind mounts (source, options), each at the same path inside: kiln's folder (code, lib, runs), the
    checkpoint folder and the data volume where they are elsewhere on the node, and the node's users and hosts
    (read-only: ssh needs the login user's name; the mesh's names stay current after a node is replaced). Not the
    user's ~/.ssh: the container gets the run's own access (access_dir, run_argv), never the cluster's key."""
    found = [(paths.root, "rw")]
    for extra in (checkpoint_dir, node.data_volume):
        if extra and extra.startswith("/") and not extra.startswith(paths.root.rstrip("/") + "/"):
            found.append((extra, "rw"))
    found += [("/etc/passwd", "ro"), ("/etc/group", "ro"), ("/etc/hosts", "ro")]
    if node.topology:
        found.append((node.topology, "ro"))
    return found


def access_dir(home: str, run_id: str) -> str:
    """Where a node keeps a container run's own ssh access (its key, the pinned known_hosts, its ssh config): the
    container's ~/.ssh, read-only (node.py container_access writes it; its stop removes it)."""
    return f"{home}/.ssh/kiln-runs/{run_id}"


def access_line(public_key: str, run_id: str, addresses: Sequence[str]) -> str:
    """The authorized_keys line of a run's container key (pure): from the cluster's addresses only, and good for
    one thing, a command run in that run's container on this node (a forced command: no shell on the node, no
    forwarding, whatever the caller asks)."""
    command = f'docker exec -i {container_name(run_id)} sh -c \\"$SSH_ORIGINAL_COMMAND\\"'
    return f'restrict,from="{",".join(addresses)}",command="{command}" {public_key} kiln-run-{run_id}'


def cgroup_parent(driver: str) -> str:
    """`docker run --cgroup-parent` for the cgroup a node keeps from the metadata services (node.py
    guard_metadata): a slice under the engine's systemd cgroup driver, a path under cgroupfs."""
    return node_side.GUARD_SLICE if driver == "systemd" else f"/{node_side.GUARD_SLICE}"


def run_argv(run_id: str, image: str, node: NodeView, binds: Sequence[tuple[str, str]],
             hosts: Sequence[str] = (), cgroup_parent: str | None = None) -> list[str]:
    """`docker run` of the run's container on one node: the node's network (Gloo, gRPC and NCCL see its
    interface and hostname), its IPC namespace (NCCL's shared memory), every GPU where it has any, its RDMA
    devices where it has any, unlimited
    locked memory (RDMA; up to the node's own hard limit), an init process that reaps and passes signals, the
    login user's uid (outputs are theirs) with a home of its own to write in (a tmpfs under the binds), the
    binds at the same paths, and the cluster's node names (`hosts`: the ssh shim execs only into those), under
    `cgroup_parent` (the cgroup the node keeps from the metadata services); it idles until the run's processes
    are exec'd into it."""
    name = container_name(run_id)
    argv = ["docker", "run", "-d", "--name", name, "--label", f"kiln.run={run_id}", "--network", "host",
            "--ipc", "host", "--init", "--ulimit", f"memlock={node.memlock}:{node.memlock}",
            "--user", f"{node.uid}:{node.gid}", "-e", f"HOME={node.home}", "-e", f"KILN_CONTAINER={name}",
            "-e", f"KILN_CLUSTER_HOSTS={','.join(hosts)}",
            "--tmpfs", f"{node.home}:uid={node.uid},gid={node.gid},mode=0700", "--workdir", node.home]
    if cgroup_parent:
        argv += ["--cgroup-parent", cgroup_parent]
    if node.gpus:
        argv += ["--gpus", "all"]
    if node.rdma:  # the fabric's verbs devices (uverbs*, rdma_cm), for NCCL's IB transport or libfabric's EFA
        argv += ["--device", "/dev/infiniband"]
    for source, options in binds:
        argv += ["-v", f"{source}:{source}:{options}"]
    argv += ["-v", f"{access_dir(node.home, run_id)}:{node.home}/.ssh:ro"]  # the run's key, not the cluster's
    return [*argv, "--entrypoint", "sleep", image, "infinity"]


def exec_argv(run_id: str, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> list[str]:
    """`docker exec` of one process in the run's container, in `cwd` with its environment."""
    variables = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    return ["docker", "exec", "-w", cwd, *variables, container_name(run_id), *argv]


def image_id_command(reference: str) -> str:
    """Shell: print the node's image id of `reference`; exit MISSING where it has none (docker is there and
    answers), another code where docker is missing or unusable by the login user."""
    quoted = shlex.quote(reference)
    return (f"command -v docker >/dev/null || {{ echo 'docker is not installed' >&2; exit 2; }}; "
            f"docker info >/dev/null 2>&1 || {{ echo \"docker does not answer to $(id -un): "
            f"$(docker info 2>&1 | tail -n 1)\" >&2; exit 2; }}; "
            f"docker image inspect --format '{{{{.Id}}}}' {quoted} 2>/dev/null || exit {MISSING}")


def launch_command(item: launch.Launch, paths: NodePaths, run_id: str) -> str:
    """The shell command that starts one process in the run's container, detached, leaving the same pid, log and
    exit files on the node as a process started there (the exec's exit code is the process's)."""
    env = {"KILN_RUN_ID": run_id}
    if item.env.get("KILN_OUTPUT_DIR"):  # made by the node, as the login user, before the exec
        env["KILN_OUTPUT_DIR"] = item.env["KILN_OUTPUT_DIR"]
    argv = exec_argv(run_id, item.argv, item.env, item.cwd or paths.lib)
    return launch.launch_command(launch.Launch(item.host, item.task, tuple(argv), env, item.files, paths.lib), paths,
                                 run_id)


def docker_error(stderr: str) -> str:
    """The line of a docker command's error output that says what went wrong (not its `Run 'docker ... --help'`
    advice)."""
    said = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Run '")]
    return said[-1] if said else ""


def in_container(command: str | None, run_id: str) -> str | None:
    """A node-side shell command (the program check, launch.program_check) as the run's container runs it."""
    if command is None:
        return None
    return shlex.join(["docker", "exec", container_name(run_id), "sh", "-c", command])


def differing_images(ids: Mapping[str, str]) -> str | None:
    """A message naming the nodes whose image id differs from the first node's, or None."""
    names = list(ids)
    first = ids[names[0]]
    odd = [name for name in names[1:] if ids[name] != first]
    if not odd:
        return None
    return (f"{', '.join(f'{name} has {ids[name][:19]}' for name in odd)}, {names[0]} has {first[:19]}: the "
            "same reference is a different image there")


def gpu_shortfall(expected: int, listed: str) -> str | None:
    """What is wrong when a node's container sees fewer GPUs than the node has (`listed`: nvidia-smi -L inside
    it), or None."""
    seen = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
    if seen == expected:
        return None
    return f"the container sees {seen} of the node's {expected} GPUs (the NVIDIA runtime or --gpus all failed)"


def differing_versions(found: Mapping[str, Mapping[str, str | None]]) -> str | None:
    """A message naming what differs between the nodes' containers (Python and the frameworks), or None."""
    names = list(found)
    problems = []
    for key in COMPARED:
        values = {name: found[name].get(key) for name in names}
        if len(set(values.values())) > 1:
            problems.append(f"{key}: " + ", ".join(f"{name} {value}" for name, value in values.items()))
    return "; ".join(problems) or None


# ---------------------------------------------------------------- a Slurm job's tasks (kiln submit --image)

JOB_LABEL = "kiln.slurm-job"  # a Slurm task's container, by its job (the queue's epilog removes what a kill left)
# What a Slurm task's container is given of the task's environment, by name: kiln's contract, Slurm's own (a bare
# jax.distributed.initialize() reads it; PMIx's), torchrun's agents' options (PET_*), the coordinators', the
# collectives' interfaces, the project on PYTHONPATH, launch.EVERY_PROCESS
TASK_ENV = ("KILN_*", "SLURM_*", "PMIX_*", "PET_*", "JAX_*", "TF_CONFIG", "NCCL_*", "GLOO_*", "PYTHONPATH",
            *launch.EVERY_PROCESS)


def docker_host_line(node_dir: str) -> str:
    """Shell: talk to the node's own Docker engine, where its login sessions' is not the default socket (the queue's
    join wrote it in the node's Slurm folder: slurm.join_script)."""
    return (f"h=$(cat {shlex.quote(node_dir.rstrip('/') + '/docker-host')} 2>/dev/null || true); "
            '[ -z "$h" ] || export DOCKER_HOST=$h')


def pull_lines(reference: str, node_dir: str) -> list[str]:
    """A batch script's lines that pull the image on every node of the job, once per node, and stop the job where a
    node could not, or where the nodes' image ids differ (a tag moved between pulls): each node runs one image."""
    image = shlex.quote(reference)
    pull = (f"{docker_host_line(node_dir)}; "
            "docker info >/dev/null 2>&1 || { echo \"kiln: docker does not answer to $(id -un) on $(hostname)\" >&2; "
            f"exit 1; }}; docker pull -q {image} >/dev/null && "
            f"echo \"$(hostname) $(docker image inspect --format '{{{{.Id}}}}' {image})\"")
    return [  # a node lost meanwhile puts the job back in the queue, as in its main step (slurm.lost_lines)
        f"ids=$(srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {shlex.quote(pull)}) || "
        f"{{ echo kiln: {image} could not be pulled on every node of the job >&2; lost 1; }}",
        "[ \"$(cut -d' ' -f2 <<<\"$ids\" | sort -u | wc -l)\" = 1 ] || "
        f"{{ echo kiln: {image} is not the same image on every node: $ids >&2; exit 1; }}",
        f"echo kiln: the job\\'s tasks run in {image}, \"$(head -n 1 <<<\"$ids\" | cut -d' ' -f2)\"",
    ]


def task_shell(reference: str, folder: str, node_dir: str) -> str:
    """Shell (a Slurm task's, on its node, as the job's user): exec the task's program ("$@") in a container of the
    image, with what run_argv gives a run's container: the node's network and IPC namespaces, an init that passes
    signals (srun's go to the docker client, which hands them on), locked memory up to the node's limit, the job's
    user (outputs are theirs) with a home of its own, every GPU where the node has any, its RDMA devices where it
    has any, the job's folder and the node's Slurm folder at the same paths (PMIx's files: an MPI program that
    srun --mpi=pmix started reaches the node's PMIx server from inside), the node's users and hosts read-only; the
    task's environment by name (TASK_ENV), in the task's folder. Labelled with the job: a task killed outright
    leaves its container to the queue's epilog (epilog_text)."""
    image, where, slurm_dir = shlex.quote(reference), shlex.quote(folder.rstrip("/")), shlex.quote(node_dir)
    return (f"{docker_host_line(node_dir)}; "
            f"envs=(); for v in $(compgen -e); do case $v in {'|'.join(TASK_ENV)}) envs+=(-e \"$v\");; esac; done; "
            "gpus=(); ! [ -e /dev/nvidiactl ] || gpus=(--gpus all); "
            "rdma=(); ! [ -d /dev/infiniband ] || rdma=(--device /dev/infiniband); "
            # ulimit says KiB, docker takes bytes
            "lock=$(ulimit -H -l); if [ \"$lock\" = unlimited ]; then lock=-1; else lock=$((lock * 1024)); fi; "
            "home=${HOME:-/tmp/kiln-home}; name=\"kiln-$SLURM_JOB_ID-$KILN_TASK\"; "
            "docker rm -f \"$name\" >/dev/null 2>&1 || true; "  # a requeued job's, where the epilog could not
            f"exec docker run --rm --init --name \"$name\" --label {JOB_LABEL}=$SLURM_JOB_ID "
            "--network host --ipc host --ulimit \"memlock=$lock:$lock\" --user \"$(id -u):$(id -g)\" "
            "-e HOME=\"$home\" --tmpfs \"$home:uid=$(id -u),gid=$(id -g),mode=0700\" "
            f"-v {where}:{where} -v {slurm_dir}:{slurm_dir} -v /etc/passwd:/etc/passwd:ro "
            "-v /etc/group:/etc/group:ro -v /etc/hosts:/etc/hosts:ro "
            f"-w \"$PWD\" \"${{gpus[@]}}\" \"${{rdma[@]}}\" \"${{envs[@]}}\" {image} \"$@\"")


def epilog_text(node_dir: str) -> str:
    """The queue's Epilog (root, on each node of a job once it has ended, requeued or cancelled): remove the job's
    containers that a task killed outright left (its docker client gone, the container goes on), bounded, never
    failing (a failed epilog drains the node)."""
    return "\n".join([
        "#!/bin/bash",
        "# Slurm's Epilog on a kiln queue's node (bootstrap/container.py): removes the job's containers",
        'export PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"',
        "command -v docker >/dev/null 2>&1 || exit 0",
        docker_host_line(node_dir),
        f"ids=$(timeout 30 docker ps -aq --filter \"label={JOB_LABEL}=$SLURM_JOB_ID\" 2>/dev/null)",
        "[ -z \"$ids\" ] || timeout 60 docker rm -f $ids >/dev/null 2>&1",
        "exit 0",
    ]) + "\n"


# ---------------------------------------------------------------- I/O


class Runtime(Protocol):
    """Where a run's processes run: what the supervisor and the launch tasks ask of it."""

    needs_node_frameworks: bool  # whether the nodes' own Python must have TensorFlow and Horovod
    contained: bool  # whether the run's processes run in a container on each node (its engine knows where)

    def launch_command(self, item: launch.Launch, paths: NodePaths, run_id: str) -> str: ...

    def prepare(self, hosts: Sequence[Host], timeline: Timeline) -> None: ...

    def check(self, hosts: Sequence[Host]) -> dict[str, dict]: ...

    def wrap_check(self, command: str | None, run_id: str) -> str | None: ...

    def moved(self, group: Cluster) -> None: ...


class HostRuntime:
    """Processes run on the nodes themselves (the default)."""

    needs_node_frameworks = True
    contained = False

    def launch_command(self, item: launch.Launch, paths: NodePaths, run_id: str) -> str:
        return launch.launch_command(item, paths, run_id)

    def prepare(self, hosts: Sequence[Host], timeline: Timeline) -> None:
        """Nothing to make ready before the processes start."""

    def check(self, hosts: Sequence[Host]) -> dict[str, dict]:
        """Nothing to check beyond the preflight."""
        return {}

    def wrap_check(self, command: str | None, run_id: str) -> str | None:
        return command

    def moved(self, group: Cluster) -> None:
        """Nothing of the old cluster to let go."""


class ContainerRuntime:
    """Every process of the run in the run's container on its node, from one image (one image id everywhere)."""

    needs_node_frameworks = False
    contained = True

    def __init__(self, group: Cluster, reference: str, paths: NodePaths, run_id: str, *,
                 checkpoint_dir: str | None = None, python: str | None = None, pull_timeout: float = 1800):
        self.group, self.reference, self.paths, self.run_id = group, check_reference(reference), paths, run_id
        self.checkpoint_dir, self.python, self.pull_timeout = checkpoint_dir, python, pull_timeout
        self.image = ""  # the image id, once resolved
        self.key: tuple[str, str] | None = None  # the run's containers' key pair, made once for the run

    def moved(self, group: Cluster) -> None:
        """The run moved to another cluster (a managed run's move): its containers are made there at the restart."""
        self.group = group

    def view(self, host: Host) -> NodeView:
        for node in self.group.nodes:
            if node.host == host:
                facts = node.facts
                return NodeView(facts["uid"], facts.get("gid", facts["uid"]), facts["home"], facts.get("gpus", 0),
                                facts.get("data_volume"), facts.get("memlock", -1), bool(facts.get("rdma")),
                                interconnect.topology_of(facts))
        raise KilnError(f"no facts for {host.label}")

    def name(self, host: Host) -> str:
        return next((node.name for node in self.group.nodes if node.host == host), host.label)

    # --- the image on every node

    def image_ids(self, hosts: Sequence[Host]) -> dict[Host, str | None]:
        """Each node's image id of the reference (None: it has none); a node without a usable docker fails."""
        remote = self.group.remote

        def look(host: Host) -> str | None:
            result = remote.run(host, image_id_command(self.reference), timeout=60)
            if result.code == MISSING:
                return None
            if result.code != 0:
                raise HostFailure(result.stderr.strip().splitlines()[-1] if result.stderr.strip()
                                  else f"exit {result.code}")
            return result.stdout.strip()

        found = remote.map_or_raise("image", hosts, look)
        return {host: found[host] for host in hosts}

    def pull(self, hosts: Sequence[Host]) -> dict[Host, str]:
        """Pull the reference on the nodes that lack it, all at once, with each node's progress (bytes, rate, time
        left; a line every 30 s where the output is no terminal) and how long each took; the failures."""
        with progress.Report(f"pulling {self.reference}", [self.name(h) for h in hosts]) as report:
            _, failures = self.group.remote.map(hosts, lambda host: self.pull_one(host, report))
        return failures

    def pull_one(self, host: Host, report: progress.Report) -> None:
        """`docker pull` on the node, on a terminal of its own (util-linux's script) so that docker prints its
        layers' bytes, which `report` shows as they come."""
        started = time.monotonic()
        counted = progress.PullBytes()
        pull = shlex.join(["docker", "pull", self.reference])
        shell = f"if command -v script >/dev/null; then exec script -qfec {shlex.quote(pull)} /dev/null; " \
                f"else exec {pull}; fi"
        ssh = subprocess.Popen(commands.ssh_argv(host, shell, self.group.remote.options), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            for chunk in proc.chunks(ssh.stdout, deadline=started + self.pull_timeout):
                counted.feed(chunk.decode(errors="replace"))
                report.update(self.name(host), counted.done, counted.total)
            code = ssh.wait(timeout=max(1.0, started + self.pull_timeout - time.monotonic()))
        except (TimeoutError, subprocess.TimeoutExpired):
            raise HostFailure(f"docker pull took over {self.pull_timeout:g} s") from None
        finally:
            if ssh.poll() is None:
                ssh.kill()
                ssh.wait()
            ssh.stdout.close()
        counted.feed("\n")
        if code != 0:
            raise HostFailure(docker_error(counted.text) or f"docker pull exited {code}")
        pulled = f" ({progress.filesize.decimal(counted.total)} downloaded)" if counted.total else ""
        print(f"{self.name(host)}: pulled {self.reference}{pulled} in {time.monotonic() - started:.1f} s",
              flush=True)

    def local_image_id(self) -> str | None:
        """This machine's image id of the reference, where its engine has it."""
        try:
            done = proc.run(["docker", "image", "inspect", "--format", "{{.Id}}", self.reference], timeout=60,
                            check=False)
        except KilnError:  # no docker here, or it does not answer
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    def ship(self, hosts: Sequence[Host]) -> dict[Host, str]:
        """Send this machine's image to the nodes over kiln's connections (docker save | ssh docker load); the
        failures."""
        options = self.group.remote.options

        def send(host: Host) -> None:
            started = time.monotonic()
            save = subprocess.Popen(["docker", "save", self.reference], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
            try:
                load = subprocess.run(commands.ssh_argv(host, "docker load --quiet", options), stdin=save.stdout,
                                      capture_output=True, text=True, timeout=self.pull_timeout)
            except subprocess.TimeoutExpired:
                raise HostFailure(f"shipping the image took over {self.pull_timeout:g} s") from None
            finally:
                save.stdout.close()
                try:
                    save.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    save.kill()
                    save.wait()
            if save.returncode != 0 or load.returncode != 0:
                said = docker_error(load.stderr or save.stderr.read().decode(errors="replace"))
                raise HostFailure(said or "docker save | docker load failed")
            print(f"{self.name(host)}: shipped {self.reference} from this machine in "
                  f"{time.monotonic() - started:.1f} s", flush=True)

        _, failures = self.group.remote.map(hosts, send)
        return failures

    def resolve(self, hosts: Sequence[Host]) -> str:
        """Make the image present on every node (pulled where it can be, else shipped from this machine), then
        refuse nodes whose image id differs: the image id every node has."""
        ids = self.image_ids(hosts)
        lacking = [host for host in hosts if ids[host] is None]
        failures = self.pull(lacking) if lacking else {}
        if failures and self.local_image_id():
            failures = self.ship(list(failures))
        if failures:
            raise KilnError(f"image {self.reference} is missing and could not be pulled: "
                            + "; ".join(f"{self.name(h)}: {why}" for h, why in failures.items())
                            + "; nothing was started")
        if lacking:  # what the pulls and shipments brought
            ids = self.image_ids(hosts)
        if missing := [self.name(h) for h, found in ids.items() if not found]:
            raise KilnError(f"image {self.reference} is still missing on {', '.join(missing)}; nothing was started")
        named = {self.name(h): found for h, found in ids.items()}
        if self.image:  # a restart: every node must still have the run's image
            named = {"the run": self.image, **named}
        if differ := differing_images(named):
            raise KilnError(f"image {self.reference}: {differ}; nothing was started")
        self.image = self.image or ids[hosts[0]]
        return self.image

    # --- the run's container on every node

    def prepare(self, hosts: Sequence[Host], timeline: Timeline) -> None:
        """Before the processes start (again): the image on the nodes (a replacement may lack it), and a fresh run
        container on each."""
        with timeline.phase("pull"):
            self.resolve(hosts)
        with timeline.phase("container"):
            self.start_containers(hosts)

    def start_containers(self, hosts: Sequence[Host]) -> None:
        remote = self.group.remote
        name = container_name(self.run_id)

        names = [node.name for node in self.group.nodes]

        access = self.access_payload()
        others = [host for host in self.group.hosts if host not in hosts]
        if others:  # a node that joins: the containers there already learn its address and host key
            remote.map(others, lambda host: remote.node(host, self.group.python, "container_access", input=access,
                                                        timeout=60))

        def start(host: Host) -> None:
            node = self.view(host)
            binds = mounts(self.paths, node, self.checkpoint_dir)
            remote.node(host, self.group.python, "container_access", input=access, timeout=60)
            made = remote.run(host, ["mkdir", "-p", *(source for source, options in binds if options == "rw")],
                              timeout=60)  # as the login user: docker would make them root's
            if made.code != 0:
                raise HostFailure(f"mkdir: {made.reason()}")
            guarded = self.guard(host)
            driver = remote.run(host, f"docker rm -f {name} >/dev/null 2>&1; "
                                      "docker info --format '{{.CgroupDriver}}'", timeout=60).stdout.strip()
            argv = run_argv(self.run_id, self.image, node, binds, names,
                            cgroup_parent(driver) if guarded else None)
            result = remote.run(host, argv, timeout=120)
            if result.code != 0:
                raise HostFailure(f"docker run: {docker_error(result.stderr) or f'exit {result.code}'}")

        remote.map_or_raise("container", hosts, start)

    def guard(self, host: Host) -> bool:
        """The node keeps the run's container from the cloud's metadata services (True), or has none to keep it
        from (False); a node whose metadata service answers and that cannot keep it out is refused."""
        remote = self.group.remote
        try:
            answer = remote.node(host, self.group.python, "guard_metadata", sudo=True, timeout=60)
        except HostFailure as error:  # no root here (sudo asks for a password): is there anything to keep out?
            answer = {"refused": str(error), **remote.node(host, self.group.python, "metadata_open", timeout=30)}
        if "guarded" in answer:
            return True
        if answer["open"]:
            raise HostFailure(f"the cloud's metadata service answers here and kiln cannot keep it from the run's "
                              f"container ({answer['refused']})")
        return False

    def access_payload(self) -> dict:
        """What each node needs to give the run's containers their own way to each other (node.py
        container_access): a key made for this run alone, the cluster's pinned known_hosts, and an ssh config that
        names them as the container's ~/.ssh."""
        self.key = self.key or mesh.new_key(f"kiln-run-{self.run_id}")
        private_key, public_key = self.key
        nodes = self.group.nodes
        return {"run_id": self.run_id, "private_key": private_key,
                "known_hosts": mesh.known_hosts_text(nodes),
                "ssh_config": mesh.node_ssh_config(self.group.name, nodes, base="~/.ssh"),
                "authorized": access_line(public_key, self.run_id, [node.address for node in nodes])}

    def python_path(self, host: Host) -> str:
        """The Python the image runs (`--python`, else the first python3 on the image's PATH); the image must be
        on the host (resolve)."""
        if self.python:
            return self.python
        result = self.group.remote.run(host, ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh",
                                              self.image or
                                              self.reference, "-c", PYTHON_PROBE], timeout=120)
        found = result.stdout.strip()
        if result.code != 0 or not found:
            raise KilnError(f"image {self.reference} has no python3 on its PATH (give --python)")
        self.python = found
        return found

    def check(self, hosts: Sequence[Host]) -> dict[str, dict]:
        """Python, TensorFlow and Horovod inside every node's container; the same everywhere, or KilnError."""
        python = self.python_path(hosts[0])
        remote = self.group.remote

        def read(host: Host) -> dict:
            result = remote.run(host, ["docker", "exec", "-e", "TF_CPP_MIN_LOG_LEVEL=3",
                                       container_name(self.run_id), python, "-c", VERSIONS_CODE], timeout=120)
            if result.code != 0:
                raise HostFailure(f"{python} in the container: {result.reason()}")
            return json.loads(result.stdout.strip().splitlines()[-1])

        found = {self.name(h): v for h, v in remote.map_or_raise("container preflight", hosts, read).items()}
        if differ := differing_versions(found):
            raise KilnError(f"the containers differ: {differ}; nothing was started")
        self.check_gpus(hosts)
        return found

    def check_gpus(self, hosts: Sequence[Host]) -> None:
        """On nodes with GPUs, the run's container must see every one (nodes without any are not asked)."""
        remote = self.group.remote
        with_gpus = [host for host in hosts if self.view(host).gpus]

        def count(host: Host) -> str | None:
            result = remote.run(host, ["docker", "exec", container_name(self.run_id), "nvidia-smi", "-L"],
                                timeout=120)
            return gpu_shortfall(self.view(host).gpus, result.stdout if result.code == 0 else "")

        problems = {self.name(h): why for h, why in remote.map_or_raise("container gpus", with_gpus, count).items()
                    if why}
        if problems:
            raise KilnError("; ".join(f"{name}: {why}" for name, why in problems.items()) + "; nothing was started")

    def launch_command(self, item: launch.Launch, paths: NodePaths, run_id: str) -> str:
        return launch_command(item, paths, run_id)

    def wrap_check(self, command: str | None, run_id: str) -> str | None:
        return in_container(command, run_id)
