"""What a run did, read from its folder `runs/<run-id>/` (per-host results and exit codes): summary.json's
content and the result table; the run's record (run.json) and summary written there. bootstrap.state reads and
writes the files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from bootstrap import state
from bootstrap.launch import HOROVOD_TASK
from bootstrap.state import RunRecord
from bootstrap.timeline import ProcessTimes, totals

if TYPE_CHECKING:
    from bootstrap.cluster import Cluster
    from bootstrap.launch import NodePaths, RunPlan

PROCESS_COLUMNS = ("process", "host", "exit", "seconds")
RESULT_COLUMNS = ("mode", "nodes", "processes", "final_loss", "accuracy", "examples/s", "wall_s", "status")


def trainer_results(folder: Path) -> dict[str, dict]:
    """Every `result.<task>.json` the processes left, collected under hosts/<name>/."""
    results = {}
    for path in sorted(folder.glob("hosts/*/result.*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        results[path.name[len("result."):-len(".json")]] = {**data, "host": path.parent.name}
    return results


def exit_codes(folder: Path) -> dict[str, dict[str, int]]:
    codes: dict[str, dict[str, int]] = {}
    for path in sorted(folder.glob("hosts/*/*.exit")):
        try:
            codes.setdefault(path.parent.name, {})[path.stem] = int(path.read_text().strip())
        except ValueError:
            continue
    return codes


def durations(folder: Path) -> dict[str, float]:
    """Seconds each process ran, from its collected pid file (written as it started) to its exit file."""
    return {key.split("@")[0]: round(times.exited - times.started, 1)
            for key, times in process_times(folder).items()
            if times.started is not None and times.exited is not None}


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _step_times(path: Path, since: float) -> list[float]:
    """The `time` of every metrics line written at or after `since` (an earlier attempt's lines stay in a
    resumed run's file)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            stamp = float(json.loads(line)["time"])
        except (ValueError, KeyError, TypeError):
            continue
        if stamp >= since:
            found.append(stamp)
    return found


def process_times(folder: Path) -> dict[str, ProcessTimes]:
    """`task@node`: when each collected process started (its pid file), logged its first and last metrics
    line, and exited (its exit file); the nodes' clocks, as rsync keeps the files' times."""
    found: dict[str, ProcessTimes] = {}
    for pid in sorted(folder.glob("hosts/*/*.pid")):
        node, task, started = pid.parent.name, pid.stem, _mtime(pid)
        found[f"{task}@{node}"] = ProcessTimes(started=started, exited=_mtime(pid.with_suffix(".exit")))
    since = min((t.started for t in found.values() if t.started), default=0.0)
    for metrics in sorted(folder.glob("hosts/*/metrics.*.jsonl")):
        node, task = metrics.parent.name, metrics.name[len("metrics."):-len(".jsonl")]
        steps = _step_times(metrics, since)
        if steps:  # a Horovod rank has no pid file of its own: horovodrun has
            own = found.get(f"{task}@{node}", ProcessTimes())
            found[f"{task}@{node}"] = ProcessTimes(own.started, min(steps), max(steps), own.exited)
    return found


def process_rows(data: dict) -> list[dict]:
    """One row per process of a run: where it ran, its exit code and how long it ran."""
    codes = {task: code for by_task in data["exit_codes"].values() for task, code in by_task.items()}
    rows = []
    for process in data["processes"]:
        task = process["task"]
        seconds = data.get("durations", {}).get(task)
        rows.append({"process": task, "host": process["host"], "exit": str(codes.get(task, "-")),
                     "seconds": "-" if seconds is None else f"{seconds:.1f}"})
    return rows


def headline(results: dict[str, dict]) -> dict:
    """The numbers a person wants first: from the chief (or rank 0 / worker 0)."""
    for task in ("chief-0", "rank-0", "worker-0", "local-0"):
        if task in results:
            main = results[task]
            break
    else:
        main = next(iter(results.values()), {})
    throughput = sum(r.get("examples_per_sec") or 0 for r in results.values() if r.get("status") == "ok")
    return {"final_loss": main.get("final_loss"), "accuracy": main.get("test_accuracy"),
            "examples_per_sec": throughput or None}


def summary(record: RunRecord, *, status: str, failure: str | None, folder: Path, wall: float,
            restarts: list[dict] | None = None, phases: Sequence[dict] = ()) -> dict:
    """What a run did, for summary.json. Each restart gets the step the chief had
    logged when it failed and the step the chief resumed from."""
    results = trainer_results(folder)
    resumed = next((results[t].get("resumed_from_step") for t in ("chief-0", "rank-0", "worker-0") if t in results),
                   None)
    restarts = [dict(r) for r in restarts or []]
    if restarts and resumed is not None:
        last = restarts[-1]
        last["resumed_from_step"] = resumed
        if last.get("at_step") is not None:
            last["steps_redone"] = max(0, last["at_step"] - resumed)
    return {
        "run_id": record.run_id,
        "mode": record.mode,
        "status": status,
        "failure": failure,
        "nodes": list(record.names),
        "processes": [asdict(task) for task in record.tasks],
        "world_size": len(record.rank_hosts) or len(record.tasks),
        "exit_codes": exit_codes(folder),
        "durations": durations(folder),
        "results": results,
        **headline(results),
        "wall_time": round(wall, 2),
        "restarts": restarts,
        "phases": sorted(phases, key=lambda item: (item["began"], item["ended"])),
        "phase_seconds": totals(phases),
    }


def status_line(verdict_text: str, saved: dict | None) -> str:
    """What `kiln status` says of a run: a run `kiln stop` ended is stopped (its processes were ended on
    purpose, not failed); otherwise what its processes' states say (`verdict_text`)."""
    if saved and saved.get("status") == "stopped":
        return "stopped (kiln stop)" + (f"; {saved['failure']}" if saved.get("failure") else "")
    return verdict_text


def result_row(data: dict) -> dict:
    def number(value, digits):
        return "-" if value is None else f"{value:.{digits}f}"

    return {"mode": data["mode"], "nodes": str(len(data["nodes"])), "processes": str(data["world_size"]),
            "final_loss": number(data.get("final_loss"), 4), "accuracy": number(data.get("accuracy"), 3),
            "examples/s": number(data.get("examples_per_sec"), 0), "wall_s": number(data.get("wall_time"), 1),
            "status": data["status"]}


def format_rows(rows: Sequence[dict], columns: Sequence[str] = RESULT_COLUMNS) -> str:
    widths = {c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)


def run_folder(run_id: str) -> Path:
    """The run's folder on this machine (runs/<run-id>)."""
    return state.run_folder(run_id)


def record_run(group: Cluster, plan: RunPlan, paths: NodePaths, *, watched: bool = True) -> RunRecord:
    """Save the run's plan (run.json) so status, logs and stop find its processes again; the record. `watched`:
    whether kiln watches the run to its end (not with --detach)."""
    options = group.remote.options
    record = RunRecord(
        run_id=plan.run_id, mode=plan.mode, cluster=group.name, python=group.python, hosts=tuple(group.hosts),
        names=plan.names, root=paths.root,
        tasks=tuple(state.TaskRecord(plan.names[item.host], item.host, item.task) for item in plan.launches),
        finishing=plan.finishing, rank_hosts=plan.rank_hosts,
        ssh=state.SshSettings(options.config_file, options.identity, options.connect_timeout), watched=watched)
    state.save_run(record)
    return record


def save_summary(run_id: str, data: dict) -> Path:
    """summary.json in the run's folder."""
    return state.save_summary(run_id, data)


def conclude(record: RunRecord, folder: Path, *, failure: str | None, restarts: Sequence[dict], wall: float,
             phases: Sequence[dict]) -> dict:
    """A watched run's end: summary.json and the plots written, the result printed (a table of processes for
    `kiln run`, the result row otherwise); RunFailed where the run failed, else summary.json's content."""
    from bootstrap import plots
    from bootstrap.errors import RunFailed

    data = summary(record, status="failed" if failure else "ok", failure=failure, folder=folder, wall=wall,
                   restarts=list(restarts), phases=list(phases))
    save_summary(record.run_id, data)
    plots.draw(folder)
    if record.mode == "run":
        print(format_rows(process_rows(data), PROCESS_COLUMNS))
    else:
        print(format_rows([result_row(data)]))
    print(f"run folder: {folder}")
    if failure:
        raise RunFailed(f"run {record.run_id} failed: {failure}")
    return data


def failed_logs(folder: Path, first: str, failed: Sequence[tuple[str, str, int]]) -> tuple[str, dict[str, str]]:
    """What a failed attempt's judge reads: horovodrun's log on the first node (`first`), and the last 20,000
    characters of each process that exited non-zero (`failed`: node, task, code)."""
    horovod = read_text(folder / "hosts" / first / f"{HOROVOD_TASK}.log") if failed else ""
    return horovod, {task: read_text(folder / "hosts" / host / f"{task}.log")[-20000:]
                     for host, task, code in failed if code}


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
