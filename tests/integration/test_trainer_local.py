"""`python -m trainer` for real on localhost: every strategy trains, distributed
replicas end with identical weights, only the chief keeps a model, bad input
exits 2 with one line. Real TensorFlow and Horovod processes, no mocks."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
TIMEOUT = 600  # seconds for any one trainer process: a hang guard (they take far less, even beside others)
DIGITS_TRAIN = 1437  # 80% of the trainer's 1797 digits
METRIC_KEYS = {"step", "epoch", "loss", "accuracy", "examples_per_sec", "wall_time", "time"}
RESULT_KEYS = {
    "strategy", "task", "world_size", "epochs", "steps", "global_batch_size", "per_replica_batch_size",
    "learning_rate", "first_loss", "final_loss", "test_accuracy", "examples_per_sec", "wall_time",
    "weights_sha256", "status", "resumed_from_step",
}


def trainer(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainer", *args]


def environment(tf_config: dict | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def free_ports(count: int) -> list[int]:
    """Ports the kernel just handed out (all held at once, so they differ)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]


def read_result(run_dir: Path, task: str) -> dict:
    return json.loads((run_dir / f"result.{task}.json").read_text())


def read_metrics(run_dir: Path, task: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / f"metrics.{task}.jsonl").read_text().splitlines()]


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


class Processes:
    """Processes started in their own session, each logging to a file; all of
    them are killed (SIGKILL to their group) when the test ends, pass or fail."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen:
        log = (self.log_dir / f"{name}.log").open("w")
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        process.name = name  # type: ignore[attr-defined]
        self.started.append(process)
        return process

    def wait(self, process: subprocess.Popen, timeout: float = TIMEOUT) -> int:
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{process.name} ran past {timeout}s:\n{self.log(process)}") from None

    def log(self, process: subprocess.Popen) -> str:
        return tail(self.log_dir / f"{process.name}.log")

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                # MultiWorkerMirroredStrategy traps SIGTERM; horovodrun has children.
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def assert_learned(result: dict, metrics: list[dict], *, floor: float) -> None:
    assert set(result) == RESULT_KEYS
    assert result["status"] == "ok"
    assert result["final_loss"] < result["first_loss"], result
    assert result["test_accuracy"] >= floor, result
    assert result["examples_per_sec"] > 0
    assert metrics and all(set(line) == METRIC_KEYS for line in metrics)
    assert all(0 <= line["accuracy"] <= 1 and line["loss"] > 0 for line in metrics), metrics
    assert metrics[0]["step"] == 1 and metrics[0]["loss"] == result["first_loss"]
    assert metrics[-1]["step"] == result["steps"]
    assert [line["step"] for line in metrics] == sorted({line["step"] for line in metrics})


@pytest.mark.parametrize("strategy", ["onedevice", "mirrored"])
def test_single_process_strategy_learns_digits(strategy, tmp_path, processes):
    run_dir, model_dir = tmp_path / "run", tmp_path / "model"
    process = processes.start(strategy, trainer(
        "--strategy", strategy, "--epochs", "5", "--learning-rate", "0.05", "--log-every", "5",
        "--run-dir", str(run_dir), "--model-dir", str(model_dir),
    ), environment())
    assert processes.wait(process) == 0, processes.log(process)

    result = read_result(run_dir, "local-0")
    assert_learned(result, read_metrics(run_dir, "local-0"), floor=0.85)
    assert (result["strategy"], result["task"], result["world_size"]) == (strategy, "local-0", 1)
    assert (result["global_batch_size"], result["per_replica_batch_size"]) == (64, 64)
    assert result["steps"] == 5 * 23
    assert result["learning_rate"] == 0.05
    assert (model_dir / "saved_model.pb").is_file()
    assert f"trainer: strategy={strategy} task=local-0 world=1 final_loss=" in processes.log(process)
    assert list((run_dir / "tensorboard").rglob("events.out.tfevents.*")), "no TensorBoard event files"


def test_multiworker_workers_agree_and_only_the_chief_keeps_a_model(tmp_path, processes):
    run_dir = tmp_path / "run"
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    workers = [
        processes.start(f"worker-{index}", trainer(
            "--strategy", "multiworker", "--epochs", "3", "--learning-rate", "0.05", "--log-every", "5",
            "--run-dir", str(run_dir), "--model-dir", str(tmp_path / f"model-worker-{index}"),
        ), environment({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        for index in range(2)
    ]
    # The evaluator side-car watches worker 0's model dir (a shared disk, here).
    evaluator = processes.start("evaluator-0", trainer(
        "--strategy", "multiworker", "--run-dir", str(run_dir), "--model-dir", str(tmp_path / "model-worker-0"),
    ), environment({"cluster": cluster, "task": {"type": "evaluator", "index": 0}}))
    for worker in workers:
        assert processes.wait(worker) == 0, processes.log(worker)
    assert processes.wait(evaluator, timeout=60) == 0, processes.log(evaluator)

    results = [read_result(run_dir, f"worker-{index}") for index in range(2)]
    for index, result in enumerate(results):
        assert_learned(result, read_metrics(run_dir, f"worker-{index}"), floor=0.85)
        assert result["world_size"] == 2
        assert (result["global_batch_size"], result["per_replica_batch_size"]) == (64, 32)
        assert result["learning_rate"] == 0.1
        assert result["steps"] == 3 * 23
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]
    assert results[0]["final_loss"] == results[1]["final_loss"]
    assert (tmp_path / "model-worker-0" / "saved_model.pb").is_file()
    assert not (tmp_path / "model-worker-1").exists()

    evaluation = read_result(run_dir, "evaluator-0")
    assert evaluation["status"] == "ok"
    assert evaluation["weights_sha256"] == results[0]["weights_sha256"]
    assert evaluation["test_accuracy"] == results[0]["test_accuracy"]


def wait_until_serving(processes: Processes, run_dir: Path, servers: dict[str, subprocess.Popen]) -> None:
    deadline = time.monotonic() + 90
    waiting = dict(servers)
    while waiting:
        for task, process in list(waiting.items()):
            assert process.poll() is None, f"{task} exited {process.returncode}:\n{processes.log(process)}"
            path = run_dir / f"result.{task}.json"
            if path.exists() and json.loads(path.read_text())["status"] == "serving":
                del waiting[task]
        assert time.monotonic() < deadline, f"not serving after 90s: {sorted(waiting)}"
        time.sleep(0.5)


def test_parameter_server_coordinator_trains_through_ps_and_worker(tmp_path, processes):
    run_dir, model_dir = tmp_path / "run", tmp_path / "model"
    chief_port, worker_port, ps_port = free_ports(3)
    cluster = {
        "chief": [f"localhost:{chief_port}"],
        "worker": [f"localhost:{worker_port}"],
        "ps": [f"localhost:{ps_port}"],
    }

    def start(task_type: str) -> subprocess.Popen:
        return processes.start(f"{task_type}-0", trainer(
            "--strategy", "ps", "--epochs", "3", "--learning-rate", "0.05", "--log-every", "5",
            "--run-dir", str(run_dir), "--model-dir", str(model_dir),
        ), environment({"cluster": cluster, "task": {"type": task_type, "index": 0}}))

    servers = {"ps-0": start("ps"), "worker-0": start("worker")}
    wait_until_serving(processes, run_dir, servers)
    chief = start("chief")
    assert processes.wait(chief) == 0, processes.log(chief)

    result = read_result(run_dir, "chief-0")
    assert_learned(result, read_metrics(run_dir, "chief-0"), floor=0.85)
    assert (result["strategy"], result["task"], result["world_size"]) == ("ps", "chief-0", 1)
    assert result["steps"] == 3 * 23
    assert (model_dir / "saved_model.pb").is_file()
    for task, server in servers.items():
        assert server.poll() is None, f"{task} stopped serving:\n{processes.log(server)}"


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None, reason="horovod is not installed in this Python")
def test_horovod_ranks_agree(tmp_path, processes):
    run_dir, model_dir = tmp_path / "run", tmp_path / "model"
    horovodrun = processes.start("horovodrun", [
        str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo",
        *trainer("--strategy", "horovod", "--epochs", "3", "--learning-rate", "0.05", "--log-every", "5",
                 "--run-dir", str(run_dir), "--model-dir", str(model_dir)),
    ], environment())
    assert processes.wait(horovodrun) == 0, processes.log(horovodrun)

    results = [read_result(run_dir, f"rank-{rank}") for rank in range(2)]
    for rank, result in enumerate(results):
        assert_learned(result, read_metrics(run_dir, f"rank-{rank}"), floor=0.85)
        assert (result["task"], result["world_size"]) == (f"rank-{rank}", 2)
        assert (result["global_batch_size"], result["per_replica_batch_size"]) == (64, 32)
        assert result["learning_rate"] == 0.1
        assert result["steps"] == 3 * 23
    # Different shards on each rank: identical weights prove the gradients were averaged.
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]
    assert (model_dir / "saved_model.pb").is_file()
    events = list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert events, "rank 0 writes TensorBoard's event files under the run folder"


@pytest.mark.parametrize(
    ("args", "tf_config", "message"),
    [
        (["--strategy", "multiworker"], None,
         "trainer: error: --strategy multiworker needs TF_CONFIG (cluster and task) in the environment"),
        (["--strategy", "multiworker", "--batch-size", "1"],
         {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 0}},
         "trainer: error: --batch-size 1 is smaller than the 2 replicas: each replica needs at least one example "
         "per step"),
        (["--epochs", "zero"], None, "trainer: error: argument --epochs: expected a positive integer, got 'zero'"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, tf_config, message, tmp_path):
    done = subprocess.run(trainer(*args, "--run-dir", str(tmp_path)), cwd=ROOT, env=environment(tf_config),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == message + "\n"
    assert done.stdout == ""
