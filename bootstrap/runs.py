"""Run folders `runs/<run-id>/`: the plan, per-host logs, exit codes and summary.json."""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

from bootstrap.errors import KilnError, UsageError

RESULT_COLUMNS = ("mode", "nodes", "processes", "final_loss", "accuracy", "examples/s", "wall_s", "status")


PROJECT = Path(__file__).resolve().parent.parent


def runs_root() -> Path:
    """runs/ of the project (not of wherever `fab` was started), unless KILN_RUNS says otherwise."""
    return Path(os.environ.get("KILN_RUNS", PROJECT / "runs"))


def new_run_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{secrets.token_hex(2)}"


def validate_run_id(run_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", run_id):
        raise UsageError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-' (at most 64)")
    return run_id


def run_folder(run_id: str) -> Path:
    return runs_root() / run_id


def save_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def load_record(run_id: str | None) -> dict:
    """The saved plan of a run; the newest run when `run_id` is None."""
    if run_id is None:
        records = [read_record(p) for p in runs_root().glob("*/run.json")]
        if not records:
            raise UsageError(f"no runs in {runs_root()}/; start one with cluster.train")
        return max(records, key=lambda record: record.get("started", 0))
    path = run_folder(validate_run_id(run_id)) / "run.json"
    if not path.exists():
        raise UsageError(f"no run {run_id!r} in {runs_root()}/")
    return read_record(path)


def read_record(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise KilnError(f"cannot read {path}: {error}") from None


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


def summary(record: dict, *, status: str, failure: str | None, folder: Path, wall: float,
            restarts: list[dict] | None = None) -> dict:
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
        "run_id": record["run_id"],
        "mode": record["mode"],
        "status": status,
        "failure": failure,
        "nodes": record["names"],
        "processes": record["tasks"],
        "world_size": len(record.get("rank_hosts") or []) or len(record["tasks"]),
        "exit_codes": exit_codes(folder),
        "results": results,
        **headline(results),
        "wall_time": round(wall, 2),
        "restarts": restarts,
    }


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
