"""Where a run's processes run in a container image (bootstrap.container): the argv lists, exact (pure)."""

from __future__ import annotations

import shlex

import pytest

from bootstrap import container, launch
from bootstrap import node as node_side
from bootstrap.errors import UsageError
from bootstrap.launch import NodePaths
from bootstrap.ssh import AGENT_CACHE

PATHS = NodePaths("/home/u/kiln")
NODE = container.NodeView(uid=1000, gid=1000, home="/home/u")


def test_the_run_container_has_what_multi_node_training_needs():
    binds = container.mounts(PATHS, NODE, None)
    argv = container.run_argv("r1", "sha256:abc", NODE, binds, ["node1", "node2"])
    assert argv == [
        "docker", "run", "-d", "--name", "kiln-r1", "--label", "kiln.run=r1", "--network", "host", "--ipc", "host",
        "--init", "--ulimit", "memlock=-1:-1", "--user", "1000:1000", "-e", "HOME=/home/u",
        "-e", "KILN_CONTAINER=kiln-r1", "-e", "KILN_CLUSTER_HOSTS=node1,node2",
        "--tmpfs", "/home/u:uid=1000,gid=1000,mode=0700", "--workdir", "/home/u",
        "-v", "/home/u/kiln:/home/u/kiln:rw",
        "-v", "/etc/passwd:/etc/passwd:ro", "-v", "/etc/group:/etc/group:ro", "-v", "/etc/hosts:/etc/hosts:ro",
        "-v", "/home/u/.ssh/kiln-runs/r1:/home/u/.ssh:ro",
        "--entrypoint", "sleep", "sha256:abc", "infinity"]


def test_a_containers_key_is_the_runs_and_opens_only_the_runs_container_on_each_node():
    """The container's ~/.ssh is the run's access folder, never the node's (the cluster's key stays out); the
    run's key is authorized from the cluster's addresses, for a command in that run's container alone."""
    argv = container.run_argv("r1", "img", NODE, container.mounts(PATHS, NODE, None))
    assert not [arg for arg in argv if arg.startswith("/home/u/.ssh:")]
    assert container.access_line("ssh-ed25519 AAAAkey", "r1", ["10.0.0.1", "10.0.0.2"]) == (
        'restrict,from="10.0.0.1,10.0.0.2",command="docker exec -i kiln-r1 sh -c \\"$SSH_ORIGINAL_COMMAND\\"" '
        "ssh-ed25519 AAAAkey kiln-run-r1")


def test_the_run_container_lives_in_the_slice_the_node_keeps_from_the_metadata_services():
    """Under the engine's systemd driver the parent is a slice name, under cgroupfs a path; one slice, named once
    (node.py's, whose rules reject that cgroup's packets to the metadata addresses)."""
    assert container.cgroup_parent("systemd") == "kiln.slice" == node_side.GUARD_SLICE
    assert container.cgroup_parent("cgroupfs") == "/kiln.slice"
    argv = container.run_argv("r1", "img", NODE, container.mounts(PATHS, NODE, None), cgroup_parent="/kiln.slice")
    assert argv[argv.index("--cgroup-parent") + 1] == "/kiln.slice"
    assert argv.index("--cgroup-parent") < argv.index("img")
    assert "--cgroup-parent" not in container.run_argv("r1", "img", NODE, container.mounts(PATHS, NODE, None))


def test_gpus_memlock_checkpoints_and_the_data_volume_follow_the_node():
    node = container.NodeView(uid=0, gid=0, home="/root", gpus=8, data_volume="/data", memlock=65536)
    binds = container.mounts(NodePaths("/root/kiln"), node, "/mnt/ckpt")
    argv = container.run_argv("r2", "img", node, binds)
    assert argv[argv.index("--ulimit") + 1] == "memlock=65536:65536"
    assert argv[argv.index("--gpus") + 1] == "all"
    assert ("/mnt/ckpt", "rw") in binds and ("/data", "rw") in binds
    inside = container.mounts(NodePaths("/root/kiln"), node, "/root/kiln/runs/x/ckpt")
    assert ("/root/kiln/runs/x/ckpt", "rw") not in inside, "already inside kiln's folder"
    assert ("s3://b/p", "rw") not in container.mounts(NodePaths("/root/kiln"), NODE, "s3://b/p")


def test_a_node_with_a_fabric_passes_its_rdma_devices_and_topology_file_in():
    node = container.NodeView(uid=0, gid=0, home="/root", gpus=8, rdma=True, topology="/opt/microsoft/ndv5-topo.xml")
    binds = container.mounts(NodePaths("/root/kiln"), node, None)
    argv = container.run_argv("r3", "img", node, binds)
    assert argv[argv.index("--device") + 1] == "/dev/infiniband"
    assert ("/opt/microsoft/ndv5-topo.xml", "ro") in binds
    plain = container.run_argv("r1", "img", NODE, container.mounts(PATHS, NODE, None))
    assert "--device" not in plain


def test_a_process_is_execd_into_the_container_with_its_environment_and_folder():
    item = launch.Launch(1, "worker-1", ("/opt/kiln/venv/bin/python3", "train.py"),
                         {"TF_CONFIG": '{"task": 1}', "KILN_OUTPUT_DIR": "/home/u/kiln/runs/r/output/worker-1"},
                         cwd="/home/u/kiln/code")
    assert container.exec_argv("r", item.argv, item.env, item.cwd) == [
        "docker", "exec", "-w", "/home/u/kiln/code", "-e", 'TF_CONFIG={"task": 1}',
        "-e", "KILN_OUTPUT_DIR=/home/u/kiln/runs/r/output/worker-1", "kiln-r", "/opt/kiln/venv/bin/python3",
        "train.py"]
    command = container.launch_command(item, PATHS, "r")
    assert "docker exec -w /home/u/kiln/code" in command
    assert "KILN_RUN_ID=r" in command, "the node's stop finds the exec by its run id"
    assert "mkdir -p /home/u/kiln/runs/r/output/worker-1" in command, "made by the login user, on the node"
    assert "echo $? >" in command, "the exec's exit code is the process's"


def test_the_image_check_tells_missing_from_unusable_docker():
    command = container.image_id_command("reg:5000/kiln:cpu-1")
    assert "docker image inspect --format '{{.Id}}' reg:5000/kiln:cpu-1" in command
    assert f"exit {container.MISSING}" in command
    assert "docker is not installed" in command and "docker does not answer to" in command


def test_a_node_whose_image_differs_is_named_beside_the_first():
    assert container.differing_images({"node1": "sha256:aaa", "node2": "sha256:aaa"}) is None
    said = container.differing_images({"node1": "sha256:aaa", "node2": "sha256:aaa", "node3": "sha256:bbb"})
    assert said.startswith("node3 has sha256:bbb, node1 has sha256:aaa")


def test_containers_that_differ_in_framework_versions_are_named():
    same = {"node1": {"python": "3.11.2", "tensorflow": "2.18.1", "horovod": "0.28.1"}}
    assert container.differing_versions({**same, "node2": same["node1"]}) is None
    said = container.differing_versions({**same, "node2": {**same["node1"], "tensorflow": "2.21.0"}})
    assert said == "tensorflow: node1 2.18.1, node2 2.21.0"


@pytest.mark.parametrize("reference", ["", "-v", "a b", "x\ny"])
def test_a_bad_image_reference_is_refused(reference):
    with pytest.raises(UsageError, match="--image"):
        container.check_reference(reference)


def test_the_program_check_runs_inside_the_container():
    check = container.in_container("cd /c && [ -f t.py ]", "r")
    assert shlex.split(check) == ["docker", "exec", "kiln-r", "sh", "-c", "cd /c && [ -f t.py ]"]
    assert container.HostRuntime().wrap_check("true", "r") == "true"


def test_docker_errors_are_read_without_their_help_advice():
    stderr = "docker: Error response from daemon: bad thing.\n\nRun 'docker run --help' for more information\n"
    assert container.docker_error(stderr) == "docker: Error response from daemon: bad thing."


def test_a_container_that_sees_fewer_gpus_than_its_node_is_named():
    listed = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b)\n"
    assert container.gpu_shortfall(2, listed) is None
    assert container.gpu_shortfall(8, listed) == ("the container sees 2 of the node's 8 GPUs (the NVIDIA runtime or "
                                                  "--gpus all failed)")
    assert "sees 0 of" in container.gpu_shortfall(1, "")


def test_the_node_agents_kept_code_is_out_of_a_containers_reach():
    """A run's container writes in what it mounts (kiln's folder, the checkpoint folder, the data volume); the code
    the node's agent keeps compiled (bootstrap.ssh.AGENT_CACHE) is elsewhere: the agent holds the cluster's key,
    which a container never gets, and must not run what a container wrote."""
    node = container.NodeView(uid=1000, gid=1000, home="/home/u", gpus=0, data_volume="/data", memlock=65536)
    kept = AGENT_CACHE.replace("~", node.home, 1) + "/"
    for source, _ in container.mounts(PATHS, node, "/home/u/checkpoints"):
        assert not kept.startswith(source.rstrip("/") + "/"), f"{source} holds {kept}"
