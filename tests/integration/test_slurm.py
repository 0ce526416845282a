"""A queue's configuration (bootstrap/slurm.py) in a real slurmctld: Debian's slurmctld and munged, started on this
machine with the slurm.conf and gres.conf kiln writes and a MUNGE key made for the test (as the queue makes one per
cluster). Its partitions' nodes are in the cloud state and none is up; a job that needs nodes makes slurmctld call
the ResumeProgram with those nodes' names, as the queue's will be kiln's provisioner."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import needs_slurm

from bootstrap.slurm import Power, Queue, Shape, expand, gres_conf, slurm_conf

pytestmark = [
    pytest.mark.integration, pytest.mark.quick,
    needs_slurm("slurmctld", "munged", "mungekey", "sbatch", "sinfo"),
    pytest.mark.skipif(os.geteuid() != 0, reason="slurmctld and munged run as their own users: the test starts them "
                                                 "as root"),
]
GPU = Shape("gpu", cpus=2, memory_mib=1000, max_nodes=4, gpus=8, gpu_type="h100")
CPU = Shape("cpu", cpus=1, memory_mib=500, max_nodes=2, min_nodes=1)
# the resume, suspend and resume-fail programs, as slurmctld runs them (as its SlurmUser): each says it was called
PROGRAM = '#!/bin/sh\necho "{name} $*" >> {log}\n'


@dataclass
class Controller:
    folder: Path
    conf: Path
    calls: Path

    def run(self, *argv: str, timeout: float = 30) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "SLURM_CONF": str(self.conf)})
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        return done.stdout

    def called(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_munged(folder: Path) -> None:
    """munged with a key of its own, its socket where the queue's slurm.conf says (AuthInfo)."""
    key, run = folder / "munge-key", folder / "munge"
    key.mkdir(mode=0o700)
    run.mkdir(mode=0o755)
    subprocess.run(["mungekey", "--create", "--keyfile", str(key / "munge.key")], check=True, timeout=30)
    for path in (key, key / "munge.key", run):
        shutil.chown(path, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "munged", f"--key-file={key / 'munge.key'}",
                    f"--socket={run / 'munge.socket'}", f"--pid-file={run / 'munged.pid'}",
                    f"--log-file={run / 'munged.log'}", f"--seed-file={key / 'munged.seed'}"], check=True, timeout=30)


def stop(pid_file: Path, wait_s: float = 15) -> None:
    """SIGTERM to a daemon, then wait until it is gone (slurmctld saves its state as it ends)."""
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return
    deadline = time.monotonic() + wait_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.fixture
def controller() -> Iterator[Controller]:
    folder = Path(tempfile.mkdtemp(prefix="kiln-slurm-"))
    folder.chmod(0o755)  # slurmctld runs as the slurm user, munged as munge: both reach their folders through it
    try:
        start_munged(folder)
        bin_dir, state, nodes = folder / "bin", folder / "ctl", folder / "nodes"
        for path in (bin_dir, state, nodes):
            path.mkdir()
            shutil.chown(path, "slurm", "slurm")
        calls = bin_dir / "calls.log"
        for name in ("resume", "suspend", "resume-fail"):
            (bin_dir / name).write_text(PROGRAM.format(name=name, log=calls))
            (bin_dir / name).chmod(0o755)
        queue = Queue("kq", socket.gethostname(), "127.0.0.1", (GPU, CPU), str(state), str(nodes),
                      str(folder / "munge" / "munge.socket"),
                      Power(*(str(bin_dir / name) for name in ("resume", "suspend", "resume-fail")),
                            suspend_time_s=20, resume_timeout_s=60),
                      cgroups=False, port=free_port())
        conf = folder / "slurm.conf"
        conf.write_text(slurm_conf(queue))
        (folder / "gres.conf").write_text(gres_conf(queue))
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, timeout=60)
        up = Controller(folder, conf, calls)
        deadline = time.monotonic() + 30
        while subprocess.run(["scontrol", "ping"], capture_output=True, timeout=30,
                             env={**os.environ, "SLURM_CONF": str(conf)}).returncode:
            assert time.monotonic() < deadline, (state / "slurmctld.log").read_text()[-2000:]
            time.sleep(0.2)
        yield up
    finally:
        stop(folder / "ctl" / "slurmctld.pid")
        stop(folder / "munge" / "munged.pid")
        shutil.rmtree(folder, ignore_errors=True)


def test_the_queue_starts_with_every_node_in_the_cloud_and_none_up(controller):
    shown = controller.run("sinfo", "--all", "--noheader", "--format=%P %D %t %N").splitlines()
    assert shown == ["gpu* 4 idle~ kq-gpu-[0-3]", "cpu 2 idle~ kq-cpu-[0-1]"]  # ~: powered down, nothing billing
    node = controller.run("scontrol", "show", "node", "kq-gpu-0")
    assert "State=IDLE+CLOUD+POWERED_DOWN" in node and "Gres=gpu:h100:8" in node, node
    config = controller.run("scontrol", "show", "config")
    assert f"ResumeProgram           = {controller.folder}/bin/resume" in config
    assert "SuspendExcNodes         = kq-cpu-0" in config


def test_a_waiting_job_makes_slurmctld_call_the_resume_program_with_its_nodes(controller):
    job = controller.run("sbatch", "--parsable", "--partition=gpu", "--nodes=2", "--gres=gpu:h100:8",
                         "--wrap=hostname").strip()
    deadline = time.monotonic() + 30
    while not controller.called():
        assert time.monotonic() < deadline, controller.run("squeue", "--all")
        time.sleep(0.2)
    [call] = controller.called()
    name, _, nodes = call.partition(" ")
    wanted = controller.run("squeue", "--noheader", "--jobs", job, "--format=%N").strip()
    assert name == "resume" and expand(nodes) == expand(wanted) and len(expand(nodes)) == 2, (call, wanted)
    assert controller.run("squeue", "--noheader", "--jobs", job, "--format=%T").strip() == "CONFIGURING"
