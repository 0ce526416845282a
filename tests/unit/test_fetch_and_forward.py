"""`kiln fetch` destinations and the remote command of `kiln tensorboard`, which must end with its connection."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from bootstrap.commands import SshOptions, forward_argv, tied_to_connection
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.tasks.runs import fetch_destination


def test_a_fetched_path_lands_under_its_node_in_the_run_folder():
    run = Path("/runs/r1")
    assert fetch_destination(run, "node2", "model") == run / "hosts/node2"
    assert fetch_destination(run, "node2", "output/shard-1/x.txt") == run / "hosts/node2/output/shard-1"
    assert fetch_destination(run, "node1", "/data/ckpt") == run / "hosts/node1/fetched/data"
    with pytest.raises(UsageError, match="without .."):
        fetch_destination(run, "node1", "../../etc")


def test_the_forward_is_loopback_to_loopback_with_host_keys_checked():
    argv = forward_argv(Host("n1"), 6006, 16010, "tb", SshOptions(known_hosts=("/k",)))
    assert argv[argv.index("-L") + 1] == "127.0.0.1:6006:127.0.0.1:16010"
    assert "StrictHostKeyChecking=yes" in argv and "ExitOnForwardFailure=yes" in argv
    assert "ClearAllForwardings=yes" not in argv and argv[-2:] == ["n1", "tb"]


def test_a_command_tied_to_the_connection_ends_when_its_stdin_closes(tmp_path):
    marker = tmp_path / "alive"
    command = tied_to_connection(f"sh -c 'echo $$ > {marker}; exec sleep 300'")
    with subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE) as shell:
        for _ in range(50):
            if marker.exists() and marker.read_text().strip():
                break
            time.sleep(0.1)
        pid = int(marker.read_text())
        assert Path(f"/proc/{pid}").exists()
        shell.stdin.close()  # the connection ends
        assert shell.wait(timeout=10) != 0
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists()
