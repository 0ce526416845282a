"""usage: scripts/demo [--nodes N] [--epochs E] [--keep]

kiln end to end on this machine: bring up a local cluster (network namespaces
with their own sshd and Docker engine), mesh it, train in horovod mode and in
tf-config mode (workers, then parameter servers), run your own program, submit
a job to a Slurm queue with no node up and watch its nodes come and go, and run
your program again inside the container image kiln bakes; print one result
table, tear it all down.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bake.image import IMAGES
from bootstrap import runs, state
from kiln.paths import PROJECT as ROOT
from localcloud import engines

CLUSTER = "kiln"
STATE = Path("/run/kiln/local") / CLUSTER
QUEUE = "kdemo"  # the queue's cluster: its nodes are made for its jobs and removed once idle
QUEUE_IDLE_MINUTES = 0.25  # SuspendTime 15 s: the demo watches the nodes go


# Each stage's title and seconds, in order: the table at the end says where the demo's time went.
STAGES: list[tuple[str, float]] = []


def step(title: str, argv: list[str], timeout: float = 900, cwd: Path = ROOT) -> None:
    print(f"\n== {title}\n$ {' '.join(argv)}", flush=True)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, timeout=timeout)
    STAGES.append((title, time.monotonic() - started))
    if done.returncode != 0:
        raise SystemExit(f"demo: {title} failed (exit {done.returncode})")


def stage_table(stages: list[tuple[str, float]], wall_s: float) -> str:
    """Where the time went, a stage a line, and the whole: `wall_s`, from the first stage's start to the last's
    end (a stage that ran beside others is counted once there) (pure)."""
    whole = "all of it (wall)"
    width = max([len(title) for title, _ in stages] + [len("stage"), len(whole)])
    lines = [f"{'stage'.ljust(width)}  seconds"]
    lines += [f"{title.ljust(width)}  {seconds:7.1f}" for title, seconds in stages]
    lines.append(f"{whole.ljust(width)}  {wall_s:7.1f}")
    return "\n".join(lines)


def start_bake(log: Path) -> subprocess.Popen:
    """`make image PROVIDER=docker` (reused while unchanged) started beside the rows that do not need the image,
    its output to `log`."""
    print(f"\n== the container image (make image PROVIDER=docker: reused while unchanged), baked beside the rows "
          f"below\n$ {sys.executable} -m bake.image docker >{log}", flush=True)
    with log.open("w") as out:
        # a session of its own: a Ctrl-C reaches it once, from stop_bake, which waits for its undo
        return subprocess.Popen([sys.executable, "-m", "bake.image", "docker"], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def last_bake_line(log: Path) -> str:
    """The newest line the bake printed of its own (its `bake:` and `image:` lines), not the tools' (pure I/O)."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith(("bake:", "image:"))]
    return lines[-1] if lines else ""


def finish_bake(baking: subprocess.Popen, log: Path, started: float, timeout_s: float = 3600) -> None:
    """Wait for the bake started at `started` (time.monotonic()), saying what it does every 15 s."""
    print("\n== waiting for the container image's bake", flush=True)
    began, shown = time.monotonic(), ""
    while baking.poll() is None:
        if time.monotonic() - started > timeout_s:
            stop_bake(baking)
            raise SystemExit(f"demo: the container image's bake ran past {timeout_s:.0f} s (its output: {log})")
        line = last_bake_line(log)
        if line and line != shown:
            print(line, flush=True)
            shown = line
        with contextlib.suppress(subprocess.TimeoutExpired):
            baking.wait(timeout=15 if shown else 1)
    STAGES.append(("the container image, baked beside the rows above", time.monotonic() - started))
    STAGES.append(("waiting for the bake", time.monotonic() - began))
    if baking.returncode != 0:
        print("\n".join(log.read_text(errors="replace").splitlines()[-30:]), flush=True)
        raise SystemExit(f"demo: the container image's bake failed (exit {baking.returncode}; its output: {log})")
    if last_bake_line(log) != shown:
        print(last_bake_line(log), flush=True)


def stop_bake(baking: subprocess.Popen | None) -> None:
    """A demo that stops early stops its bake as Ctrl-C would (bake.image undoes what it made)."""
    if baking is None or baking.poll() is not None:
        return
    baking.send_signal(signal.SIGINT)
    try:
        baking.wait(timeout=120)
    except subprocess.TimeoutExpired:
        baking.kill()
        baking.wait(timeout=60)


def queue_row(kiln: str, frameworks: Path, epochs: int) -> dict:
    """A Slurm queue with no node up; PyTorch's DDP example as a two-node job, whose nodes the queue makes; the
    nodes watched until the queue has removed them again. Its row of the result table."""
    step("a Slurm queue with no node up", [kiln, "queue", "up", QUEUE, "--max-nodes", "2", "--idle-minutes",
                                           str(QUEUE_IDLE_MINUTES)])
    started = time.monotonic()
    step("a two-node job from zero nodes: examples/torch_ddp.py through torchrun",
         [kiln, "submit", QUEUE, "--mode", "torchrun", "--nodes", "2", "--wait", "--python", str(frameworks), "--",
          "python", "torch_ddp.py", "--epochs", str(epochs)], cwd=ROOT / "examples")
    seconds = time.monotonic() - started
    print("\n== the queue's nodes, until it has removed them (SuspendTime 15 s)", flush=True)
    began, shown, up = time.monotonic(), "", ""
    while time.monotonic() - began < 180:
        said = subprocess.run([kiln, "queue", "status", QUEUE], capture_output=True, text=True, timeout=60)
        up = said.stdout.strip().splitlines()[-1] if said.returncode == 0 and said.stdout.strip() else said.stderr
        if up != shown:
            print(f"{time.monotonic() - began:5.0f} s  {up}", flush=True)
            shown = up
        if up == "nodes up: none":
            break
        time.sleep(2)
    STAGES.append(("the queue's nodes removed once idle", time.monotonic() - began))
    step("kiln down (slurmctld, munged and the cluster)", [kiln, "down", QUEUE])
    return {"mode": "queue: torchrun job from 0 nodes", "nodes": "2", "processes": "2", "final_loss": "-",
            "accuracy": "-", "examples/s": "-", "wall_s": f"{seconds:.1f}",
            "status": "ok" if up == "nodes up: none" else "nodes left up"}


def container_image() -> str:
    """The newest container image bake.image made (its tag)."""
    records = sorted(IMAGES.glob("docker-cpu-*/image.json"), key=lambda path: path.stat().st_mtime)
    if not records:
        raise SystemExit("demo: no container image was baked")
    return json.loads(records[-1].read_text())["image"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__.splitlines()[2])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    options = parser.parse_args(argv)
    local_cluster = [sys.executable, "-m", "localcloud.cluster"]
    kiln = [str(Path(sys.executable).with_name("kiln")), "-S", str(STATE / "ssh_config"),
            "-H", ",".join(f"node{i}" for i in range(1, options.nodes + 1))]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    modes = [
        ("horovod", ["--mode", "horovod"]),
        ("tf-config (workers)", ["--mode", "tf-config"]),
        ("tf-config (1 ps)", ["--mode", "tf-config", "--ps", "1"]),
    ]
    subprocess.run([*local_cluster, "down", "--name", CLUSTER], timeout=120, check=False)
    began = time.monotonic()
    bake_log = state.kiln_home() / "demo" / f"bake-{stamp}.log"
    bake_log.parent.mkdir(parents=True, exist_ok=True)
    baking = None
    try:
        baking, bake_started = start_bake(bake_log), time.monotonic()
        step(f"a local cluster of {options.nodes} nodes", [*local_cluster, "up", str(options.nodes), "--name", CLUSTER,
                                                          "--docker"])
        # --python: the cluster's Python is this venv's, whatever an earlier demo's torchrun row left in its record
        step("the SSH mesh", [*kiln, "mesh", "--cluster", CLUSTER, "--python", sys.executable])
        step("preflight", [*kiln, "check", "--cluster", CLUSTER])
        rows = []
        for index, (label, args) in enumerate(modes):
            run_id = f"demo-{stamp}-{index}"
            step(f"training: {label}", [*kiln, "train", "--cluster", CLUSTER, *args, "--run-id", run_id,
                                        "--args", f"--epochs {options.epochs}"])
            data = json.loads((state.run_folder(run_id) / "summary.json").read_text())
            rows.append({**runs.result_row(data), "mode": label})
        run_id = f"demo-{stamp}-user"  # a user's own program, from its own folder (examples/)
        step("training your own program: examples/keras_multiworker.py",
             [*kiln, "train", "--cluster", CLUSTER, "--mode", "tf-config", "--run-id", run_id, "--",
              "python", "keras_multiworker.py", "--epochs", str(options.epochs)], cwd=ROOT / "examples")
        data = json.loads((state.run_folder(run_id) / "summary.json").read_text())
        rows.append({**runs.result_row(data), "mode": "your program (tf-config)"})
        run_id = f"demo-{stamp}-torchrun"  # PyTorch DDP through torchrun, from make setup's .venv-frameworks
        step("PyTorch DDP through torchrun: examples/torch_ddp.py",
             [*kiln, "train", "--cluster", CLUSTER, "--mode", "torchrun", "--python",
              str(ROOT / ".venv-frameworks" / "bin" / "python"), "--run-id", run_id, "--",
              "python", "torch_ddp.py", "--epochs", str(options.epochs)], cwd=ROOT / "examples")
        data = json.loads((state.run_folder(run_id) / "summary.json").read_text())
        rows.append({**runs.result_row(data), "mode": "torchrun (torch_ddp.py)"})
        rows.append(queue_row(str(Path(sys.executable).with_name("kiln")), ROOT / ".venv-frameworks" / "bin" /
                              "python", options.epochs))
        finish_bake(baking, bake_log, bake_started)
        local = container_image()
        print(f"\n== pushing {local} to the cluster's registry (the nodes pull it from there)", flush=True)
        started = time.monotonic()
        image = engines.push_to_cluster(CLUSTER, local)
        STAGES.append(("pushing the image to the cluster's registry", time.monotonic() - started))
        run_id = f"demo-{stamp}-image"
        step(f"your program inside the image, one container per node: {image}",
             [*kiln, "train", "--cluster", CLUSTER, "--mode", "tf-config", "--image", image, "--run-id", run_id,
              "--", "python", "keras_multiworker.py", "--epochs", str(options.epochs)], cwd=ROOT / "examples")
        data = json.loads((state.run_folder(run_id) / "summary.json").read_text())
        rows.append({**runs.result_row(data), "mode": "your program (--image)"})
        print("\n" + runs.format_rows(rows))
        print(f"\nrun folders: {state.runs_root()}/demo-{stamp}-*")
    finally:
        stop_bake(baking)
        if not options.keep:
            subprocess.run([*local_cluster, "down", "--name", CLUSTER], timeout=120, check=False)
        if (state.cluster_dir(QUEUE) / "cluster.json").exists():  # the queue's row stopped half-way
            subprocess.run([str(Path(sys.executable).with_name("kiln")), "down", QUEUE], timeout=300, check=False)
        if STAGES:
            print("\n" + stage_table(STAGES, time.monotonic() - began), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
