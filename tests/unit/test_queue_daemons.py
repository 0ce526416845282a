"""bootstrap/queue.py's stop of the controller's daemons by their pid files, with real processes: a pid file
names a process of the daemon's name, or it is left alone (a daemon that died, or a file from before the machine
restarted, names a pid another process may have now)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from bootstrap import queue


def started(tmp_path: Path, name: str) -> int:
    """A daemon whose name (its /proc comm) is `name` (sleep, run as a copy of that name), detached as daemons are
    (not this process's child, so no zombie of it stays behind): its pid."""
    program = tmp_path / name
    shutil.copy(shutil.which("sleep"), program)
    forked = subprocess.run(["sh", "-c", f"{program} 300 >/dev/null 2>&1 & echo $!"], capture_output=True,
                            text=True, timeout=10, check=True)
    return int(forked.stdout)


def running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_a_daemon_named_by_its_pid_file_is_stopped(tmp_path):
    daemon = started(tmp_path, "slurmctld")
    try:
        (tmp_path / "slurmctld.pid").write_text(f"{daemon}\n")
        queue.stop_daemon(tmp_path / "slurmctld.pid", "slurmctld", wait_s=10)
        assert not running(daemon)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)


def test_a_pid_file_naming_another_process_leaves_it_running(tmp_path):
    other = started(tmp_path, "sleepy")
    try:
        (tmp_path / "slurmctld.pid").write_text(f"{other}\n")
        queue.stop_daemon(tmp_path / "slurmctld.pid", "slurmctld", wait_s=1)
        assert running(other), "a process that is not slurmctld was stopped"
    finally:
        os.kill(other, signal.SIGKILL)


def test_a_missing_or_unreadable_pid_file_stops_nothing(tmp_path):
    queue.stop_daemon(tmp_path / "slurmctld.pid", "slurmctld", wait_s=1)
    (tmp_path / "munged.pid").write_text("not a pid\n")
    queue.stop_daemon(tmp_path / "munged.pid", "munged", wait_s=1)


class Provider:
    """What undo_up asks of a provider (its kind, its down), whose down ends as told."""

    kind = "local"

    def __init__(self, ends: BaseException | None):
        self.ends, self.asked = ends, []

    def down(self, name: str) -> None:
        self.asked.append(name)
        if self.ends:
            raise self.ends


def test_a_failed_up_is_undone_step_by_step_and_what_is_left_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    assert queue.undo_up("kqunt", done := Provider(None)) == [] and done.asked == ["kqunt"]
    left = queue.undo_up("kqunt", Provider(RuntimeError("the cloud said no")))
    assert left == ["its cluster's machines (local): the cloud said no"]


def test_a_second_ctrl_c_during_the_undo_leaves_the_rest_named_as_not_undone(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    assert queue.undo_up("kqunt", Provider(KeyboardInterrupt())) == [
        "its cluster's machines (local): not undone (Ctrl-C)"]
