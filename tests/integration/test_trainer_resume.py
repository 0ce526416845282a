"""Checkpoints that survive a node's death, for real: a rerun resumes where the
last checkpoint left off, after a clean finish, a kill -9 or a SIGTERM, under
onedevice, Horovod and MultiWorkerMirroredStrategy; ``--data PATH.npz`` trains
and bad input exits 2 having written nothing. Real TensorFlow processes."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from test_trainer_local import (
    HOROVODRUN,
    ROOT,
    Processes,
    environment,
    free_ports,
    read_metrics,
    read_result,
    trainer,
)

from trainer import splits

pytestmark = pytest.mark.integration

DIGITS_STEPS = 23  # steps per epoch: ceil(1437 / 64)
FLOOR = 0.85


def output(processes: Processes, process: subprocess.Popen) -> str:
    """The whole log of ``process`` (Processes.log gives only its tail)."""
    return (processes.log_dir / f"{process.name}.log").read_text(errors="replace")


def latest_checkpoint_step(checkpoint_dir: Path) -> int:
    """The step of the checkpoint the manager's state file names (ckpt-<step>)."""
    state = (checkpoint_dir / "checkpoint").read_text()
    name = state.splitlines()[0].split('"')[1]
    assert (checkpoint_dir / f"{name}.index").is_file(), state
    return int(name.rsplit("-", 1)[1])


def wait_for_step(run_dir: Path, task: str, step: int, process: subprocess.Popen, processes: Processes) -> int:
    """Block until metrics.<task>.jsonl has logged ``step``; return the last step logged."""
    path = run_dir / f"metrics.{task}.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited {process.returncode} early:\n{processes.log(process)}"
        if path.exists():
            lines = [line for line in path.read_text().splitlines() if line.endswith("}")]
            if lines and json.loads(lines[-1])["step"] >= step:
                return json.loads(lines[-1])["step"]
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in 120s:\n{processes.log(process)}")


def assert_global_steps(metrics: list[dict], total: int) -> None:
    steps = [line["step"] for line in metrics]
    assert steps == sorted(set(steps)), steps
    assert steps[0] == 1 and steps[-1] == total


def test_rerun_with_more_epochs_resumes_from_the_first_runs_total(tmp_path, processes):
    run_dir = tmp_path / "run"
    args = ["--learning-rate", "0.05", "--log-every", "5", "--checkpoint-every", "5",
            "--run-dir", str(run_dir), "--model-dir", str(tmp_path / "model")]
    first = processes.start("first", trainer("--epochs", "2", *args), environment())
    assert processes.wait(first) == 0, processes.log(first)
    before = read_result(run_dir, "local-0")
    assert (before["resumed_from_step"], before["steps"]) == (0, 2 * DIGITS_STEPS)
    assert latest_checkpoint_step(run_dir / "checkpoints") == 2 * DIGITS_STEPS
    assert len(list((run_dir / "checkpoints").glob("ckpt-*.index"))) == 2  # max_to_keep

    second = processes.start("second", trainer("--epochs", "4", *args), environment())
    assert processes.wait(second) == 0, processes.log(second)
    assert f"trainer: resumed from step {2 * DIGITS_STEPS}\n" in output(processes, second)
    after = read_result(run_dir, "local-0")
    assert (after["resumed_from_step"], after["steps"]) == (2 * DIGITS_STEPS, 4 * DIGITS_STEPS)
    assert after["first_loss"] < before["first_loss"]  # it starts from the trained weights
    assert after["final_loss"] < before["final_loss"]
    assert after["test_accuracy"] >= FLOOR, after
    metrics = read_metrics(run_dir, "local-0")
    assert_global_steps(metrics, 4 * DIGITS_STEPS)
    assert [line["step"] for line in metrics if line["step"] > 2 * DIGITS_STEPS][0] == 2 * DIGITS_STEPS + 1


def test_kill_9_mid_training_resumes_from_the_last_checkpoint(tmp_path, processes):
    run_dir = tmp_path / "run"
    epochs, every = 60, 3
    argv = trainer("--epochs", str(epochs), "--log-every", "1", "--checkpoint-every", str(every),
                   "--run-dir", str(run_dir), "--model-dir", str(tmp_path / "model"))
    first = processes.start("first", argv, environment())
    wait_for_step(run_dir, "local-0", 40, first, processes)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    reached = read_metrics_tolerant(run_dir / "metrics.local-0.jsonl")[-1]["step"]
    saved = latest_checkpoint_step(run_dir / "checkpoints")
    assert 0 < saved <= reached and reached - saved <= every, (saved, reached)

    second = processes.start("second", argv, environment())
    assert processes.wait(second) == 0, processes.log(second)
    assert f"trainer: resumed from step {saved}\n" in output(processes, second)
    result = read_result(run_dir, "local-0")
    assert (result["resumed_from_step"], result["steps"]) == (saved, epochs * DIGITS_STEPS)
    assert result["test_accuracy"] >= FLOOR, result
    assert_global_steps(read_metrics(run_dir, "local-0"), epochs * DIGITS_STEPS)


def read_metrics_tolerant(path: Path) -> list[dict]:
    """Metrics lines, leaving out a last line a kill cut short."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_sigterm_saves_the_last_step_exits_143_and_a_rerun_resumes(tmp_path, processes):
    run_dir = tmp_path / "run"
    # No periodic checkpoint before the end: the only one is SIGTERM's.
    args = ["--log-every", "1", "--checkpoint-every", "100000",
            "--run-dir", str(run_dir), "--model-dir", str(tmp_path / "model")]
    first = processes.start("first", trainer("--epochs", "60", *args), environment())
    wait_for_step(run_dir, "local-0", 20, first, processes)
    os.kill(first.pid, signal.SIGTERM)
    assert processes.wait(first, timeout=30) == 143, processes.log(first)
    last = read_metrics(run_dir, "local-0")[-1]["step"]
    assert latest_checkpoint_step(run_dir / "checkpoints") == last
    assert f"trainer: stopped by SIGTERM after step {last} (checkpoint saved); exiting 143" in output(processes, first)
    stopped = read_result(run_dir, "local-0")
    assert (stopped["status"], stopped["steps"]) == ("preempted", last)
    assert not (tmp_path / "model").exists()  # no final model from a preempted run

    epochs = last // DIGITS_STEPS + 2  # on past where the first run stopped, however far a busy machine let it get
    second = processes.start("second", trainer("--epochs", str(epochs), *args), environment())
    assert processes.wait(second) == 0, processes.log(second)
    assert f"trainer: resumed from step {last}\n" in output(processes, second)
    result = read_result(run_dir, "local-0")
    assert (result["resumed_from_step"], result["steps"], result["status"]) == (last, epochs * DIGITS_STEPS, "ok")


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None, reason="horovod is not installed in this Python")
def test_horovod_ranks_resume_with_identical_weights(tmp_path, processes):
    run_dir = tmp_path / "run"

    def horovodrun(name: str, epochs: int) -> subprocess.Popen:
        return processes.start(name, [
            str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo",
            *trainer("--strategy", "horovod", "--epochs", str(epochs), "--learning-rate", "0.05",
                     "--log-every", "5", "--run-dir", str(run_dir), "--model-dir", str(tmp_path / "model")),
        ], environment())

    first = horovodrun("first", 1)
    assert processes.wait(first) == 0, processes.log(first)
    assert latest_checkpoint_step(run_dir / "checkpoints") == DIGITS_STEPS
    second = horovodrun("second", 2)
    assert processes.wait(second) == 0, processes.log(second)
    assert output(processes, second).count(f"trainer: resumed from step {DIGITS_STEPS}") == 2
    results = [read_result(run_dir, f"rank-{rank}") for rank in range(2)]
    for result in results:
        assert (result["resumed_from_step"], result["steps"]) == (DIGITS_STEPS, 2 * DIGITS_STEPS)
        assert result["test_accuracy"] >= FLOOR, result
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]


def test_multiworker_workers_resume_from_the_chiefs_copied_checkpoint(tmp_path, processes):
    run_dir = tmp_path / "run"
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    dirs = [tmp_path / f"checkpoints-{index}" for index in range(2)]

    def workers(tag: str, epochs: int) -> list[subprocess.Popen]:
        return [
            processes.start(f"{tag}-worker-{index}", trainer(
                "--strategy", "multiworker", "--epochs", str(epochs), "--learning-rate", "0.05",
                "--log-every", "5", "--run-dir", str(run_dir), "--checkpoint-dir", str(dirs[index]),
                "--model-dir", str(tmp_path / f"model-{index}"),
            ), environment({"cluster": cluster, "task": {"type": "worker", "index": index}}))
            for index in range(2)
        ]

    for worker in workers("first", 1):
        assert processes.wait(worker) == 0, processes.log(worker)
    assert latest_checkpoint_step(dirs[0]) == DIGITS_STEPS
    assert not dirs[1].exists()  # only the chief (worker 0) writes checkpoints
    shutil.copytree(dirs[0], dirs[1])  # what the launcher does before a restart

    for worker in workers("second", 2):
        assert processes.wait(worker) == 0, processes.log(worker)
        assert f"trainer: resumed from step {DIGITS_STEPS}\n" in output(processes, worker)
    results = [read_result(run_dir, f"worker-{index}") for index in range(2)]
    for result in results:
        assert (result["resumed_from_step"], result["steps"]) == (DIGITS_STEPS, 2 * DIGITS_STEPS)
        assert result["test_accuracy"] >= FLOOR, result
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]
    assert latest_checkpoint_step(dirs[1]) == DIGITS_STEPS  # worker 1 still wrote nothing


def save_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def digits_npz(path: Path) -> Path:
    """The bundled digits (the trainer's own reader: pixels in [0, 1], labels) as an .npz."""
    x, y = splits.digits()
    return save_npz(path, x=x, y=y)


def test_npz_data_trains(tmp_path, processes):
    data = digits_npz(tmp_path / "digits.npz")
    run_dir = tmp_path / "run"
    process = processes.start("npz", trainer("--data", str(data), "--epochs", "3", "--learning-rate", "0.05",
                                         "--run-dir", str(run_dir), "--model-dir", str(tmp_path / "model")),
                          environment())
    assert processes.wait(process) == 0, processes.log(process)
    result = read_result(run_dir, "local-0")
    assert result["steps"] == 3 * DIGITS_STEPS
    assert result["test_accuracy"] >= FLOOR, result


def bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    x, y = np.zeros((10, 4), np.float32), np.arange(10) % 2
    no_y = save_npz(tmp / "no-y.npz", x=x)
    short = save_npz(tmp / "short.npz", x=x, y=y[:7])
    a_file = tmp / "a-file"
    a_file.write_text("not a directory\n")
    return [
        (["--data", str(tmp / "missing.npz")], f"--data {tmp}/missing.npz: no such file"),
        (["--data", str(no_y)], f"--data {no_y}: the .npz has no array 'y' (it has: x)"),
        (["--data", str(short)], f"--data {short}: x has 10 rows but y has 7 labels"),
        (["--model-dir", str(a_file / "model")],
         f"--model-dir {a_file}/model: not writable ({a_file} is not a directory)"),
        (["--checkpoint-dir", str(a_file / "ckpt")],
         f"--checkpoint-dir {a_file}/ckpt: not writable ({a_file} is not a directory)"),
    ]


@pytest.mark.parametrize("case", range(5), ids=["missing", "no-y", "lengths", "model-dir", "checkpoint-dir"])
def test_bad_data_or_dir_exits_2_with_one_line_and_writes_nothing(case, tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    args, message = bad_inputs(inputs)[case]
    out = tmp_path / "out"
    defaults = {"--model-dir": str(out / "model"), "--checkpoint-dir": str(out / "ckpt")}
    extra = [item for flag, value in defaults.items() if flag not in args for item in (flag, value)]
    done = subprocess.run(trainer(*args, *extra, "--run-dir", str(out / "run")), cwd=ROOT, env=environment(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"trainer: error: {message}\n"
    assert done.stdout == ""
    assert not out.exists()


def run_trainer_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    folder.mkdir(exist_ok=True)
    return subprocess.run(trainer(*args), cwd=folder, env=environment(), capture_output=True, text=True,
                          timeout=300)


def test_state_lives_in_the_model_dir_and_another_model_dir_starts_fresh(tmp_path):
    work = tmp_path / "work"
    first = run_trainer_in(work, "--epochs", "1", "--model-dir", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    assert list(work.iterdir()) == []  # nothing in the current folder
    assert (tmp_path / "a" / "saved_model.pb").is_file()
    assert latest_checkpoint_step(tmp_path / "a" / "checkpoints") == DIGITS_STEPS
    assert read_result(tmp_path / "a", "local-0")["steps"] == DIGITS_STEPS
    assert json.loads((tmp_path / "a" / "checkpoints" / "trained-on.json").read_text()) == {
        "model": "mlp", "data": "digits", "shard": "all"}

    second = run_trainer_in(work, "--epochs", "1", "--model-dir", str(tmp_path / "b"))
    assert second.returncode == 0, second.stderr
    assert "resumed" not in second.stdout
    assert read_result(tmp_path / "b", "local-0")["resumed_from_step"] == 0


def test_checkpoints_of_other_data_are_refused_unless_resume_from_names_them(tmp_path):
    data = digits_npz(tmp_path / "digits.npz")
    model_dir = tmp_path / "model"
    first = run_trainer_in(tmp_path / "work", "--epochs", "1", "--model-dir", str(model_dir))
    assert first.returncode == 0, first.stderr
    before = sorted(path.name for path in (model_dir / "checkpoints").iterdir())

    refused = run_trainer_in(tmp_path / "work", "--epochs", "2", "--data", str(data), "--model-dir", str(model_dir))
    checkpoints = model_dir / "checkpoints"
    assert refused.returncode == 2
    assert refused.stderr == (
        f"trainer: error: --checkpoint-dir {checkpoints} holds checkpoints of another run "
        f"(data: {data} here, digits there): resume them on purpose with --resume-from {checkpoints}, "
        f"or give this run its own --model-dir or --checkpoint-dir\n")
    assert sorted(path.name for path in checkpoints.iterdir()) == before

    # Fine-tuning on purpose: restore another folder's checkpoint, keep this run's own.
    tuned = tmp_path / "tuned"
    resumed = run_trainer_in(tmp_path / "work", "--epochs", "2", "--data", str(data), "--model-dir", str(tuned),
                             "--resume-from", str(checkpoints))
    assert resumed.returncode == 0, resumed.stderr
    assert f"trainer: resumed from step {DIGITS_STEPS} of {checkpoints}\n" in resumed.stdout
    assert read_result(tuned, "local-0")["resumed_from_step"] == DIGITS_STEPS
    assert latest_checkpoint_step(tuned / "checkpoints") == 2 * DIGITS_STEPS
    assert json.loads((tuned / "checkpoints" / "trained-on.json").read_text())["data"] == str(data)
