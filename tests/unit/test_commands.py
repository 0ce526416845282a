import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from bootstrap.commands import (
    SshOptions,
    detached_command,
    horovodrun_argv,
    one_writer_rsync_path,
    remote_command,
    rsync_pull_argv,
    rsync_push_argv,
    ssh_argv,
    trainer_argv,
    with_progress,
)
from bootstrap.hosts import Host
from bootstrap.ssh import describe_failure

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


def test_a_master_that_does_not_persist_is_asked_for_as_no_never_as_0():
    """ControlPersist=0 is OpenSSH's "for ever": a connection that ends with its first session is `no`."""
    options = SshOptions(control_path="/tmp/kiln-ssh-0/%C", control_persist=0)
    assert ssh_argv(Host("node1"), "true", options)[-6:-3] == ["ControlPath=/tmp/kiln-ssh-0/%C", "-o",
                                                             "ControlPersist=no"]


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
    assert argv[:5] == ["rsync", "-a", "--delete", "--timeout=60", "--mkpath"]
    assert argv[5] == "--rsync-path=" + one_writer_rsync_path("kiln/code", 60)
    assert argv[6:8] == ["--exclude=.git/", "-e"]
    assert shlex.split(argv[8])[-4:] == ["-l", "u", "-p", "22"]
    assert argv[9:] == ["/repo/", "[::1]:kiln/code/"]
    assert "--rsync-path" not in " ".join(rsync_push_argv("/c", Host("n1"), "r/ckpt", options, one_writer=False))
    assert rsync_pull_argv(Host("n1"), "/r/runs/x", "runs/x/hosts/n1", options)[-2:] == [
        "n1:/r/runs/x/", "runs/x/hosts/n1/"]
    reporting = with_progress(argv)
    assert reporting[:3] == ["rsync", "--info=progress2", "--no-inc-recursive"] and reporting[3:] == argv[1:]


def local_push(source: Path, dest: Path, wait: int, tmp_path: Path) -> subprocess.CompletedProcess:
    """A push as kiln makes it, where the node's side runs here: rsync's remote shell is `sh -c`."""
    shell = tmp_path / "here-shell"
    if not shell.exists():  # written once: a file being rewritten while another push runs it cannot be run
        shell.write_text('#!/bin/sh\nshift\nexec sh -c "$*"\n')
        shell.chmod(0o755)
    argv = rsync_push_argv(str(source), Host("node"), str(dest), SshOptions(), timeout=wait)
    argv[argv.index("-e") + 1] = str(shell)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_pushes_into_one_folder_at_once_take_turns(tmp_path):
    source = tmp_path / "project"
    source.mkdir()
    for index in range(300):
        (source / f"f{index}.py").write_bytes(os.urandom(4096))
    failures = []
    for attempt in range(4):  # without the lock, 7 of 20 such pushes ended with exit 23, 24 or 11 in a trial here
        dest = tmp_path / f"nodes-{attempt}" / "code"
        pushes = [local_push(source, dest, 60, tmp_path) for _ in range(4)]
        failures += [(push.wait(), push.stderr.read()) for push in pushes if push.wait() != 0]
        assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in source.iterdir())
    assert failures == []


def test_a_push_that_waits_too_long_for_the_folder_says_so(tmp_path):
    (tmp_path / "project").mkdir()
    dest = tmp_path / "node" / "code"
    dest.parent.mkdir()
    holder = subprocess.Popen(["flock", f"{dest}.lock", "sleep", "30"])
    try:
        time.sleep(0.5)
        push = local_push(tmp_path / "project", dest, 1, tmp_path)
        code = push.wait(timeout=30)
        assert code != 0
        assert describe_failure(code, push.stderr.read()) == f"{dest} stayed locked by another sync for 1s"
    finally:
        holder.kill()
        holder.wait()


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


def test_root_is_reached_through_sudo_where_the_login_is_another_users():
    from bootstrap.commands import root_command, root_rsync

    assert root_command("slurmd -N q-cpu-0", "root") == "slurmd -N q-cpu-0"
    assert root_command("slurmd -N q-cpu-0", None) == "slurmd -N q-cpu-0"
    assert root_command("rm -rf '/home/ubuntu/kiln/jobs/r 1'", "ubuntu") == \
        "sudo -n sh -c 'rm -rf '\"'\"'/home/ubuntu/kiln/jobs/r 1'\"'\"''"
    assert root_rsync("root") == [] and root_rsync("ubuntu") == ["--rsync-path=sudo -n rsync"]
