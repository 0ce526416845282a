import shlex

import pytest

from bootstrap.commands import (
    SshOptions,
    detached_command,
    horovodrun_argv,
    remote_command,
    rsync_pull_argv,
    rsync_push_argv,
    ssh_argv,
    trainer_argv,
)
from bootstrap.hosts import Host

BASE = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ForwardAgent=no", "-o", "ClearAllForwardings=yes",
        "-o", "ServerAliveInterval=5",
        "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR"]


def test_ssh_argv_checks_host_keys_and_shares_one_connection():
    options = SshOptions(config_file="/c/ssh_config", identity="/k/id", known_hosts=("/kh",),
                         control_path="/tmp/kiln-ssh-0/%C", control_persist=60)
    assert ssh_argv(Host("node1", 2222, "root"), "hostname", options) == [
        "ssh", "-F", "/c/ssh_config", "-i", "/k/id", "-o", "IdentitiesOnly=yes", *BASE,
        "-o", "GlobalKnownHostsFile=/kh /etc/ssh/ssh_known_hosts", "-o", "StrictHostKeyChecking=yes",
        "-o", "ControlMaster=auto", "-o", "ControlPath=/tmp/kiln-ssh-0/%C", "-o", "ControlPersist=60",
        "-l", "root", "-p", "2222", "--", "node1", "hostname",
    ]


def test_trust_on_first_use_records_into_the_cluster_file_first():
    options = SshOptions(accept_new_into="/c/first", user_known_hosts=("/root/.ssh/known_hosts",))
    assert ssh_argv(Host("fe80::1"), "true", options) == [
        "ssh", *BASE, "-o", "UserKnownHostsFile=/c/first /root/.ssh/known_hosts",
        "-o", "StrictHostKeyChecking=accept-new", "--", "fe80::1", "true",
    ]


def test_remote_command_quotes_env_and_bounds_time():
    assert remote_command(["echo", "a b"], timeout=30, cwd="/w d", env={"K": "v 1"}) == (
        "cd '/w d' && timeout -k 5 30 env 'K=v 1' echo 'a b'"
    )
    assert remote_command(["true"]) == "true"


def test_rsync_mirrors_code_over_the_same_ssh_settings():
    options = SshOptions(connect_timeout=5)
    argv = rsync_push_argv("/repo/", Host("[::1]".strip("[]"), 22, "u"), "kiln/code", options, excludes=(".git/",))
    assert argv[:6] == ["rsync", "-a", "--delete", "--timeout=60", "--mkpath", "--exclude=.git/"]
    assert argv[6] == "-e"
    assert shlex.split(argv[7])[-4:] == ["-l", "u", "-p", "22"]
    assert argv[8:] == ["/repo/", "[::1]:kiln/code/"]
    assert rsync_pull_argv(Host("n1"), "/r/runs/x", "runs/x/hosts/n1", options)[-2:] == [
        "n1:/r/runs/x/", "runs/x/hosts/n1/"]


def test_horovodrun_argv_is_exact():
    entry = trainer_argv("/v/bin/python", "horovod", run_dir="/r", model_dir="/r/model", extra=["--epochs", "2"])
    assert horovodrun_argv(["/v/bin/horovodrun"], processes=3, hostfile="/r/hostfile", entry=entry, nic="eth0",
                           output_dir="/r/ranks") == [
        "/v/bin/horovodrun", "-np", "3", "--hostfile", "/r/hostfile", "--gloo", "--start-timeout", "60",
        "--gloo-timeout-seconds", "60",
        "--network-interfaces", "eth0", "--output-filename", "/r/ranks",
        "/v/bin/python", "-m", "trainer", "--strategy", "horovod", "--run-dir", "/r", "--model-dir", "/r/model",
        "--epochs", "2",
    ]
    assert horovodrun_argv(["py", "hr.py"], processes=2, hostfile="h", entry=["x"], nic=None, mpi=True) == [
        "py", "hr.py", "-np", "2", "--hostfile", "h", "--mpi", "--start-timeout", "60", "x"]


def test_detached_command_leaves_pid_log_and_exit_files():
    command = detached_command(["python", "-m", "trainer"], cwd="/w", run_dir="/r", task="worker-0",
                               env={"TF_CONFIG": '{"a": 1}'})
    inner = ("echo $$ > /r/worker-0.pid; cd /w && env 'TF_CONFIG={\"a\": 1}' python -m trainer "
             ">> /r/worker-0.log 2>&1; echo $? > /r/worker-0.exit.tmp && mv /r/worker-0.exit.tmp /r/worker-0.exit")
    assert command == f"mkdir -p /r && {{ setsid sh -c {shlex.quote(inner)} < /dev/null > /dev/null 2>&1 & }}"


def test_waiting_for_a_node_takes_descriptors_above_1023():
    """A few hundred nodes' connections pass descriptor 1023, which select(2) refuses (seen at 512 nodes)."""
    import os
    import resource

    from bootstrap.ssh import readable

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the descriptor limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    read, write = os.pipe()
    high = os.dup2(read, 1500)
    try:
        assert not readable(high, 0.05)
        os.write(write, b"answer\n")
        assert readable(high, 1.0)
    finally:
        for descriptor in (read, write, high):
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
