#!/usr/bin/env python3
"""usage: bench/fanout.py [--sizes 4,16,64,256] [--width 64] [--repeat 3]

Time of `fab -H ... cluster.mesh cluster.check` (one invocation) on N local nodes, as a ratio to
a floor of plain parallel `ssh NODE true` over the same nodes (fresh connections,
the same width), and the SSH handshakes each node's sshd accepted during kiln's
steps: from the operator, and from the other nodes (check's ring test).
Floor and kiln take turns `--repeat` times on the same nodes (kiln with a fresh home and no open
connections each time, as a first run); each turn's ratio and the medians are printed. Then where kiln's time
went, per step (the medians of what kiln wrote to KILN_STEP_TIMES): `facts` is a round of one agent call per node
(the first one opens each node's connection and starts its agent), `mesh` the mesh's install, `judge` the
preflight's judging of every node's facts, `exit` the agents' ends, and `rest` what is left of kiln_s (Python's
and Fabric's start, the cluster key, the state files). Measured in one run; nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "kb"
STATE = Path("/run/kiln/local") / CLUSTER
ACCEPTED = re.compile(r"Accepted publickey for \S+ from (\S+)")


def local_cluster(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "localcloud.cluster", *args, "--name", CLUSTER],
                   check=True, timeout=900, stdout=subprocess.DEVNULL)


def accepted(nodes: int) -> dict[str, list[str]]:
    """Per node, the source address of every login its sshd accepted so far."""
    found = {}
    for i in range(1, nodes + 1):
        log = STATE / f"node{i}" / "etc-ssh" / "sshd.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        found[f"node{i}"] = ACCEPTED.findall(text)
    return found


def floor(names: list[str], width: int) -> float:
    config = str(STATE / "ssh_config")

    def one(name: str) -> None:
        subprocess.run(["ssh", "-F", config, "-o", "ControlMaster=no", "-o", "ControlPath=none", name, "true"],
                       check=True, timeout=120, stdin=subprocess.DEVNULL)

    start = time.perf_counter()
    with ThreadPoolExecutor(width) as pool:
        list(pool.map(one, names))
    return time.perf_counter() - start


def kiln(names: list[str], width: int, home: str) -> tuple[float, dict[str, float]]:
    """kiln's seconds, and its steps' seconds (a step that comes twice is named with its turn: facts_2)."""
    fab = [str(Path(sys.executable).with_name("fab")), "-S", str(STATE / "ssh_config"), "-H", ",".join(names)]
    times = Path(home) / "steps.jsonl"
    env = {**os.environ, "KILN_HOME": home, "KILN_STEP_TIMES": str(times)}
    start = time.perf_counter()
    subprocess.run([*fab, "cluster.mesh", "--fanout", str(width), "cluster.check", "--fanout", str(width)],
                   check=True, timeout=1800, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    return seconds, steps([json.loads(line) for line in times.read_text().splitlines()], seconds)


def steps(lines: list[dict], total: float) -> dict[str, float]:
    """The steps in the order they ended, each name once (a repeat is NAME_2, NAME_3 ...), and `rest`."""
    named: dict[str, float] = {}
    turns: collections.Counter[str] = collections.Counter()
    for line in lines:
        turns[line["step"]] += 1
        turn = turns[line["step"]]
        named[line["step"] if turn == 1 else f"{line['step']}_{turn}"] = line["seconds"]
    named["rest"] = total - sum(named.values())
    return named


def close_connections() -> None:
    """kiln's shared SSH connections gone, so its next run starts cold."""
    subprocess.run(["sh", "-c", f"for s in /tmp/kiln-ssh-{os.getuid()}/*; do ssh -O exit -S \"$s\" x; done"],
                   capture_output=True, timeout=300)


def measure(names: list[str], width: int, repeat: int
            ) -> tuple[list[float], list[float], dict[str, float], int, int]:
    """Each turn's floor and kiln seconds, kiln's median seconds per step, and the last kiln run's operator and
    node-to-node handshakes."""
    size, floors, kilns, timed = len(names), [], [], []
    for _ in range(repeat):
        floors.append(floor(names, width))
        before = accepted(size)
        with tempfile.TemporaryDirectory() as home:
            seconds, by_step = kiln(names, width, home)
        kilns.append(seconds)
        timed.append(by_step)
        after = accepted(size)
        close_connections()
        time.sleep(3)  # what kiln left ending in the background (its node agents) is done before the next turn
    operator = sum(1 for n in names for src in after[n][len(before[n]):] if src.endswith(".0.1"))
    peers = sum(len(after[n]) - len(before[n]) for n in names) - operator
    medians = {name: statistics.median(turn.get(name, 0.0) for turn in timed) for name in timed[-1]}
    return floors, kilns, medians, operator, peers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("--sizes", default="4,16,64,256")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    print(f"{'nodes':>5} {'floor_s':>8} {'kiln_s':>8} {'ratio':>6} {'op_handshakes/node':>19} "
          f"{'node_handshakes/node':>21}  turns' ratios", flush=True)
    phases = {}
    for size in (int(s) for s in options.sizes.split(",")):
        names = [f"node{i}" for i in range(1, size + 1)]
        local_cluster("down")
        local_cluster("up", str(size))
        try:
            floors, kilns, phases[size], operator, peers = measure(names, options.width, max(1, options.repeat))
            floor_s, kiln_s = statistics.median(floors), statistics.median(kilns)
            turns = " ".join(f"{k / f:.2f}" for f, k in zip(floors, kilns, strict=True))
            print(f"{size:>5} {floor_s:>8.2f} {kiln_s:>8.2f} {kiln_s / floor_s:>6.2f} {operator / size:>19.2f} "
                  f"{peers / size:>21.2f}  {turns}", flush=True)
        finally:
            close_connections()
            local_cluster("down")
    print("\nwhere kiln's time went (s, medians of the turns)")
    columns = list(dict.fromkeys(name for found in phases.values() for name in found))
    print(f"{'nodes':>5} " + " ".join(f"{name:>8}" for name in columns))
    for size, found in phases.items():
        print(f"{size:>5} " + " ".join(f"{found.get(name, 0.0):>8.2f}" for name in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
