#!/usr/bin/env python3
"""usage: bench/throughput.py [--epochs E] [--nodes 1,2,3] [--modes horovod,tf-config,torchrun] [--image]
                            [--against MATRIX-FILE] [--repeat R]

Training throughput on a local cluster (synthetic data), 1, 2 and 3 nodes in each launch mode, as examples/s and as
a ratio to one node, with kiln's fixed cost (`kiln train`'s wall time less the training itself, first logged step to
last) and where it went (the phases of summary.json); then kiln's launcher overhead on the most nodes, for kiln's
reference trainer and for a user's program (examples/keras_multiworker.py, examples/horovod_keras.py, and
examples/torch_ddp.py through torchrun with make setup's .venv-frameworks): the wall time of `kiln train` (mesh,
check, sync, start, watch, collect) against the very processes kiln planned (same argv, environment and folder),
started by hand over plain ssh and waited for: the two take turns --repeat times, after the framework was imported
once (both find its libraries in the page cache), and their medians are compared. With --image, also the same user
programs inside the container image `make image PROVIDER=docker` bakes against bare processes on the most nodes (the
image already on the nodes), and the time to get the image onto the nodes: pulled from the cluster's registry, and
shipped from this machine over kiln's connections. With --against FILE (a matrix file, e.g.
matrices/tensorflow-2.18.yml), the first table also runs each mode on the Python environment made for it (make
matrix-env MATRIX=FILE: its TensorFlow and Horovod), side by side with this one's, and says their ratio. Measured in
one run; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bootstrap import launch
from bootstrap.timeline import NODE_PHASES, OPERATOR_PHASES
from kiln.paths import PROJECT

CLUSTER = "kbt"
STATE = Path("/run/kiln/local") / CLUSTER
SSH_CONFIG = STATE / "ssh_config"
NIC = "eth0"  # every local node's interface (localcloud.cluster)
KILN = Path(sys.executable).with_name("kiln")
EXAMPLES = PROJECT / "examples"
# In the order a run goes through them: kiln's steps up to the start, the nodes', then kiln's stop and collect.
PHASES = (*OPERATOR_PHASES[:OPERATOR_PHASES.index("watch")], *NODE_PHASES, "stop", "collect")
USER_PROGRAMS = {"tf-config": ("python", "keras_multiworker.py"), "horovod": ("python", "horovod_keras.py"),
                 "torchrun": ("python", "torch_ddp.py")}
TF_MODES = ("horovod", "tf-config")  # the reference trainer's (TensorFlow)
FRAMEWORKS_PYTHON = PROJECT / ".venv-frameworks" / "bin" / "python"  # PyTorch and JAX (make setup)


def local_cluster(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "localcloud.cluster", *args, "--name", CLUSTER],
                   check=True, timeout=300, stdout=subprocess.DEVNULL)


def names(nodes: int) -> tuple[str, ...]:
    return tuple(f"node{i}" for i in range(1, nodes + 1))


def stacks(against: str) -> list[tuple[str, str]]:
    """(TensorFlow version, the nodes' Python) for this environment and, with a matrix file, the one made for it."""
    pythons = [sys.executable]
    if against:
        from bake.matrix import environment

        if environment(against) == ".venv":
            raise SystemExit(f"throughput: {against} changes nothing the TensorFlow runs go through (PyTorch and JAX "
                             "alone): nothing to compare against")
        python = PROJECT / f".venv-{Path(against).stem}" / "bin" / "python"
        if not python.exists():
            raise SystemExit(f"throughput: no environment for {against}: make matrix-env MATRIX={against}")
        pythons.append(str(python))
    ask = "import importlib.metadata as m; print(m.version('tensorflow'))"
    return [(subprocess.run([python, "-c", ask], check=True, timeout=60, capture_output=True,
                            text=True).stdout.strip(), python) for python in pythons]


def kiln_train(nodes: int, mode: str, env: dict, *, trainer_args: str = "", command: tuple[str, ...] = (),
               image: str | None = None, python: str | None = None) -> tuple[dict, float]:
    """One `kiln train`, timed from the operator's side; its summary.json. `python`: the nodes' (bare: this
    venv's; in an image: the image's own)."""
    python = python or (None if image else sys.executable)
    run_id = f"bench-{mode}-{nodes}-{'user' if command else 'ref'}-{time.time_ns()}"
    argv = [str(KILN), "-S", str(SSH_CONFIG), "-H", ",".join(names(nodes)), "train", "--mode", mode,
            "--nic", NIC, "--run-id", run_id, *(["--python", python] if python else []),
            *(["--image", image] if image else [])]
    if command:
        argv += ["--code", str(EXAMPLES), "--", *command]
    else:
        argv += ["--args", trainer_args]
    start = time.perf_counter()
    subprocess.run(argv, check=True, timeout=1800, env=env, cwd=PROJECT, stdout=subprocess.DEVNULL)
    total = time.perf_counter() - start
    return json.loads((Path(env["KILN_RUNS"]) / run_id / "summary.json").read_text()), total


def warm(python: str, mode: str) -> None:
    """Import the mode's framework once, so kiln's run and the hand-started one both find its libraries (GBs for
    PyTorch) in the page cache the local nodes share: measured first, kiln's run would pay the cold start alone."""
    framework = "torch" if mode == "torchrun" else "tensorflow"
    subprocess.run([python, "-c", f"import {framework}"], check=True, timeout=600, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def ssh(node: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(SSH_CONFIG), node, command], check=True, timeout=1800, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def by_hand(nodes: int, mode: str, program: launch.Program, python: str = sys.executable) -> float:
    """The processes `kiln train` would start (launch.plan_run), each started with plain ssh in the
    foreground from its folder with its environment, and waited for: no mesh, check, sync or watch."""
    root = ssh("node1", "echo $HOME").stdout.strip() + "/kiln"
    spec = launch.RunSpec(run_id=f"bench-by-hand-{time.time_ns()}", mode=mode, names=names(nodes),
                          slots=(1,) * nodes, python=python, root=root, program=program, nic=NIC,
                          gpus=(0,) * nodes)
    plan = launch.plan_run(spec)
    run_dir = launch.NodePaths(root).run(spec.run_id)

    def one(process: launch.Launch) -> None:
        folders = [run_dir, *(value for key, value in process.env.items() if key == "KILN_OUTPUT_DIR")]
        files = "".join(f"printf %s {shlex.quote(text)} > {shlex.quote(path)} && "
                        for path, text in process.files.items())
        env = " ".join(shlex.quote(f"{key}={value}") for key, value in process.env.items())
        log = shlex.quote(f"{run_dir}/{process.task}.log")
        ssh(plan.names[process.host], f"mkdir -p {shlex.join(folders)} && {files}cd {shlex.quote(process.cwd)} && "
                                      f"env {env} {shlex.join(process.argv)} >{log} 2>&1")

    start = time.perf_counter()
    with ThreadPoolExecutor(len(plan.launches)) as pool:
        list(pool.map(one, plan.launches))
    return time.perf_counter() - start


def image_rows(most: int, env: dict, epochs: int) -> list[str]:
    """The user programs bare and in the container image (present on the nodes); then the image brought to the
    nodes: pulled from the cluster's registry, and shipped from this machine (docker save | ssh docker load)."""
    from localcloud import engines

    subprocess.run([sys.executable, "-m", "bake.image", "docker"], check=True, timeout=3600, cwd=PROJECT,
                   stdout=subprocess.DEVNULL)
    records = sorted((PROJECT / "images").glob("docker-cpu-*/image.json"), key=lambda path: path.stat().st_mtime)
    local = json.loads(records[-1].read_text())["image"]
    image = engines.push_to_cluster(CLUSTER, local)
    rows = []
    for mode in TF_MODES:  # the frameworks the container image holds
        command = (*USER_PROGRAMS[mode], "--epochs", str(epochs))
        kiln_train(most, mode, env, command=command, image=image)  # the image onto the nodes, not timed here
        _, bare = kiln_train(most, mode, env, command=command)
        data, inside = kiln_train(most, mode, env, command=command, image=image)
        rows.append(f"{mode:<10} {bare:>7.1f} {inside:>8.1f} {inside - bare:>10.1f} {inside / bare:>6.2f} "
                    f"{data['phase_seconds'].get('container', 0):>11.1f}")
    moves = []
    for how, reference in (("pull", image), ("ship", local)):
        for node in names(most):
            ssh(node, f"docker rmi -f {image} {local} >/dev/null 2>&1; true")
        data, _ = kiln_train(most, "tf-config", env, command=(*USER_PROGRAMS["tf-config"], "--epochs", "1"),
                             image=reference)
        moves.append(f"{how:<6} {most:>5} {data['phase_seconds']['pull']:>7.1f}")
    return [f"\nthe user programs on {most} nodes, bare and in the container image (present on the nodes)",
            f"{'mode':<10} {'bare_s':>7} {'image_s':>8} {'overhead_s':>10} {'ratio':>6} {'container_s':>11}",
            *rows, f"\nthe image ({local}) onto {most} nodes that lack it", f"{'how':<6} {'nodes':>5} {'pull_s':>7}",
            *moves]


def phase_row(label: str, mode: str, nodes: int, seconds: dict[str, float]) -> str:
    return f"{label:<10} {mode:<10} {nodes:>5} " + " ".join(
        f"{seconds[name]:>{len(name)}.1f}" if name in seconds else f"{'-':>{len(name)}}" for name in PHASES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--nodes", default="1,2,3")
    parser.add_argument("--modes", default="horovod,tf-config,torchrun",
                        help="launch modes to measure (torchrun: with make setup's .venv-frameworks)")
    parser.add_argument("--image", action="store_true", help="also measure runs in the container image")
    parser.add_argument("--against", default="", help="a matrix file: also run the first table on its environment")
    parser.add_argument("--repeat", type=int, default=3,
                        help="kiln and the hand-started processes take turns this many times for the launcher "
                             "overhead; the medians are compared (one run of a program varies by seconds here)")
    options = parser.parse_args()
    modes = options.modes.split(",")
    if unknown := set(modes) - set(USER_PROGRAMS):
        parser.error(f"--modes: no such mode {', '.join(sorted(unknown))} (known: {', '.join(USER_PROGRAMS)})")
    if "torchrun" in modes and not FRAMEWORKS_PYTHON.exists():
        parser.error(f"--modes torchrun: {FRAMEWORKS_PYTHON} is missing (make setup makes it)")
    tf_modes = [mode for mode in TF_MODES if mode in modes]
    tested = stacks(options.against)
    sizes = [int(n) for n in options.nodes.split(",")]
    most = max(sizes)
    trainer_args = f"--data synthetic --epochs {options.epochs} --log-every 20"
    local_cluster("down")
    local_cluster("up", str(most), *(["--docker"] if options.image else []))
    try:
        with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as runs:
            env = {**os.environ, "KILN_HOME": home, "KILN_RUNS": runs}
            print(f"{'tensorflow':<10} {'mode':<10} {'nodes':>5} {'examples/s':>11} {'vs 1 node':>9} {'run_s':>7} "
                  f"{'kiln_s':>7} {'fixed_s':>7}")
            overhead, phases, fixed, rates = [], [], {}, {}
            for mode in tf_modes:
                for version, python in tested:
                    base = None
                    for nodes in sizes:
                        data, total = kiln_train(nodes, mode, env, trainer_args=trainer_args, python=python)
                        rate = rates[version, mode, nodes] = data["examples_per_sec"] or 0.0
                        base = base or rate
                        # The run's own time is its training (first logged step to last); the rest is the fixed cost.
                        run_s = data["phase_seconds"]["training"]
                        fixed[version, mode, nodes] = total - run_s
                        print(f"{version:<10} {mode:<10} {nodes:>5} {rate:>11.0f} {rate / base:>9.2f} {run_s:>7.1f} "
                              f"{total:>7.1f} {fixed[version, mode, nodes]:>7.1f}", flush=True)
                        if python == sys.executable:
                            phases.append(phase_row("reference", mode, nodes, data["phase_seconds"]))
            for version, _ in tested if len(tf_modes) == 2 else ():
                print(f"TensorFlow {version}: horovod's fixed cost above tf-config's: " + ", ".join(
                    f"{n} node(s) {fixed[version, 'horovod', n] - fixed[version, 'tf-config', n]:+.1f}s"
                    for n in sizes), flush=True)
            if len(tested) == 2:
                (new, _), (old, _) = tested
                print(f"\nTensorFlow {new} against {old} (examples/s ratio; fixed cost difference, s)")
                print(f"{'mode':<10} {'nodes':>5} {'rate_ratio':>10} {'fixed_diff_s':>12}")
                for mode in tf_modes:
                    for n in sizes:
                        ratio = rates[new, mode, n] / rates[old, mode, n] if rates[old, mode, n] else 0.0
                        print(f"{mode:<10} {n:>5} {ratio:>10.2f} "
                              f"{fixed[new, mode, n] - fixed[old, mode, n]:>+12.1f}", flush=True)

            for mode in modes:
                ref = launch.Program(trainer_args=tuple(shlex.split(trainer_args)))
                user = launch.Program(argv=(*USER_PROGRAMS[mode], "--epochs", str(options.epochs)))
                python = str(FRAMEWORKS_PYTHON) if mode == "torchrun" else sys.executable
                programs = (("user", user),) if mode == "torchrun" else (("reference", ref), ("user", user))
                for label, program in programs:
                    warm(python, mode)
                    totals, hands = [], []
                    for _ in range(max(1, options.repeat)):
                        # kiln first: it meshes and syncs what the hand-started processes then find in place.
                        data, total = kiln_train(most, mode, env, trainer_args=trainer_args, command=program.argv,
                                                 python=python)
                        totals.append(total)
                        hands.append(by_hand(most, mode, program, python))
                    total, hand = statistics.median(totals), statistics.median(hands)
                    overhead.append(f"{label:<10} {mode:<10} {hand:>9.1f} {total:>7.1f} {total - hand:>10.1f} "
                                    f"{total / hand:>6.2f}")
                    if label == "user":
                        phases.append(phase_row(label, mode, most, data["phase_seconds"]))
            print(f"\nlauncher overhead on {most} nodes: the same processes by hand over ssh, then through kiln")
            print(f"{'program':<10} {'mode':<10} {'by_hand_s':>9} {'kiln_s':>7} {'overhead_s':>10} {'ratio':>6}")
            print("\n".join(overhead))
            print("\nwhere kiln's time went (summary.json phase_seconds, s)")
            print(f"{'program':<10} {'mode':<10} {'nodes':>5} " + " ".join(PHASES))
            print("\n".join(phases))
            if options.image:
                print("\n".join(image_rows(most, env, options.epochs)))
    finally:
        local_cluster("down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
