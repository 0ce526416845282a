#!/usr/bin/env python3
"""usage: bench/throughput.py [--epochs E] [--nodes 1,2,3]

Training throughput on a local cluster (synthetic data), 1, 2 and 3 nodes in each
launch mode, as examples/s and as a ratio to one node; and kiln's launcher
overhead: the wall time of `fab cluster.train` (mesh, check, sync, start, watch,
collect) and of the run alone, each as a ratio to the same trainer processes
started by hand over ssh. Measured in one run; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from bootstrap import topology  # noqa: E402

CLUSTER = "kbt"
STATE = Path("/run/kiln/local") / CLUSTER


def local_cluster(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "testbed.cluster", *args, "--name", CLUSTER],
                   check=True, timeout=300, stdout=subprocess.DEVNULL)


def kiln_train(nodes: int, mode: str, trainer_args: str, env: dict) -> tuple[dict, float]:
    run_id = f"bench-{mode}-{nodes}-{int(time.time())}"
    argv = [str(Path(sys.executable).with_name("fab")), "-S", str(STATE / "ssh_config"),
            "-H", ",".join(f"node{i}" for i in range(1, nodes + 1)), "cluster.train", "--mode", mode,
            "--run-id", run_id, "--args", trainer_args]
    start = time.perf_counter()
    subprocess.run(argv, check=True, timeout=1800, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    total = time.perf_counter() - start
    return json.loads((Path(env["KILN_RUNS"]) / run_id / "summary.json").read_text()), total


def by_hand(nodes: int, trainer_args: str) -> float:
    """The same multi-worker processes, started with plain ssh and waited for."""
    names = [f"node{i}" for i in range(1, nodes + 1)]
    topo = topology.plan_tf_config(names, [1] * nodes)

    def one(process: topology.Process) -> None:
        config = json.dumps(topology.tf_config(topo, process))
        command = (f"cd ~/kiln/code && TF_CONFIG={shlex.quote(config)} TF_USE_LEGACY_KERAS=1 "
                   f"{shlex.quote(sys.executable)} -m trainer --strategy multiworker --run-dir /tmp/bench-by-hand "
                   f"--model-dir /tmp/bench-by-hand/model {trainer_args}")
        subprocess.run(["ssh", "-F", str(STATE / "ssh_config"), names[process.host], command], check=True,
                       timeout=1800, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    start = time.perf_counter()
    with ThreadPoolExecutor(nodes) as pool:
        list(pool.map(one, topo.processes))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--nodes", default="1,2,3")
    options = parser.parse_args()
    sizes = [int(n) for n in options.nodes.split(",")]
    trainer_args = f"--data synthetic --epochs {options.epochs} --log-every 20"
    local_cluster("down")
    local_cluster("up", str(max(sizes)))
    try:
        with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as runs:
            env = {**os.environ, "KILN_HOME": home, "KILN_RUNS": runs}
            print(f"{'mode':<10} {'nodes':>5} {'examples/s':>11} {'vs 1 node':>9} {'run_s':>7} {'fab_s':>7}")
            last = {}
            for mode in ("horovod", "tf-config"):
                base = None
                for nodes in sizes:
                    data, total = kiln_train(nodes, mode, trainer_args, env)
                    rate = data["examples_per_sec"] or 0.0
                    base = base or rate
                    last[mode] = (data["wall_time"], total)
                    print(f"{mode:<10} {nodes:>5} {rate:>11.0f} {rate / base:>9.2f} {data['wall_time']:>7.1f} "
                          f"{total:>7.1f}", flush=True)
            hand = by_hand(max(sizes), trainer_args)
            run_s, fab_s = last["tf-config"]
            print(f"\nlauncher overhead, tf-config on {max(sizes)} nodes: by hand {hand:.1f}s; "
                  f"kiln run {run_s:.1f}s ({run_s / hand:.2f}x); whole fab cluster.train {fab_s:.1f}s "
                  f"({fab_s / hand:.2f}x)")
    finally:
        local_cluster("down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
