#!/usr/bin/env python3
"""usage: bench/slurm_queue.py [--nodes N] [--rounds R]

The queue, measured in one run on the local provider (root; Debian's slurmctld, slurmd and munged), a two-node
job (each node writes the time it started):
  cold_start_s       submit -> the job starts, every node powered down: slurmctld calls kiln's ResumeProgram,
                     the provider makes the machines, kiln joins them (MUNGE key, slurmd), Slurm starts the job
  warm_start_s       the same with the nodes up and idle (Slurm's scheduling alone)
  cold / warm        what making nodes from zero costs, as a ratio
  kiln_submit_s      `kiln submit` returning (the project copied into a run's folder, the batch script, sbatch)
  sbatch_s           the same job's script submitted with `sbatch` by hand, on the same queue
  submit overhead    kiln_submit_s / sbatch_s
Each figure is the median of --rounds rounds. Nothing is asserted; the queue is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kiln.paths import PROJECT as ROOT

NAME = "kqb"
KILN = [sys.executable, "-m", "bootstrap.main"]
JOB = "import os, time\nopen(os.environ['KILN_OUTPUT_DIR'] + '.started', 'w').write(repr(time.time()))\n"


def run(argv: list[str], env: dict[str, str], cwd: Path = ROOT, timeout: float = 600) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def powered_down(env: dict[str, str], nodes: int) -> bool:
    shown = run(["sinfo", "--all", "--noheader", "--format=%D %t"], env).split()
    return shown == [str(nodes), "idle~"]


def wait(what: str, check, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench/slurm_queue.py: {what} within {timeout:g} s")
        time.sleep(0.5)


def started_at(folder: Path, nodes: int) -> float:
    """When the job's last node started its task (each wrote its start time)."""
    wait("every node's task started", lambda: len(list(folder.glob("output/*.started"))) == nodes)
    return max(float(path.read_text()) for path in folder.glob("output/*.started"))


def submit(env: dict[str, str], project: Path, nodes: int) -> tuple[float, float, Path]:
    """kiln submit: (seconds until it returned, seconds until the job started, the job's folder)."""
    began = time.time()
    said = run([*KILN, "submit", NAME, "--nodes", str(nodes), "--", "python", "job.py"], env, cwd=project)
    returned = time.time() - began
    folder = Path(said.split("its folder ", 1)[1].split(",", 1)[0])
    return returned, started_at(folder, nodes) - began, folder


def by_hand(env: dict[str, str], folder: Path) -> float:
    """The job's own script (what kiln submit wrote) given to sbatch by hand: seconds until sbatch returned."""
    began = time.monotonic()
    run(["sbatch", "--parsable", str(folder / "job.sh")], env)
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="kiln-bench-queue-"))
    env = {**os.environ, "KILN_HOME": str(home),
           "SLURM_CONF": f"/run/kiln/queues/{NAME}/slurm.conf"}  # bootstrap/queue.py SHARED_ROOT
    project = home / "project"
    project.mkdir()
    (project / "job.py").write_text(JOB)
    cold, warm, kiln_s, sbatch_s = [], [], [], []
    try:
        run([*KILN, "queue", "up", NAME, "--max-nodes", str(args.nodes), "--idle-minutes", "0.2"], env)
        for _ in range(args.rounds):
            wait("every node powered down", lambda: powered_down(env, args.nodes))
            returned, start, folder = submit(env, project, args.nodes)
            cold.append(start)
            kiln_s.append(returned)
            returned, start, _ = submit(env, project, args.nodes)  # the nodes are up and idle now
            warm.append(start)
            kiln_s.append(returned)
            sbatch_s.append(by_hand(env, folder))
    finally:
        subprocess.run([*KILN, "down", NAME], env=env, capture_output=True, timeout=300)
        shutil.rmtree(home, ignore_errors=True)
    rows = {"cold_start_s": statistics.median(cold), "warm_start_s": statistics.median(warm),
            "kiln_submit_s": statistics.median(kiln_s), "sbatch_s": statistics.median(sbatch_s)}
    for key, value in rows.items():
        print(f"{key:<16}{value:8.2f}")
    print(f"{'cold / warm':<16}{rows['cold_start_s'] / rows['warm_start_s']:8.2f}")
    print(f"{'submit overhead':<16}{rows['kiln_submit_s'] / rows['sbatch_s']:8.2f}  (kiln submit / sbatch by hand: "
          f"{rows['kiln_submit_s'] - rows['sbatch_s']:.2f} s more, Python's start and the project's copy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
