"""loss.png and throughput.png in a run folder, drawn from every process's metrics (I/O)."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(folder: Path) -> dict[str, list[dict]]:
    """Every `metrics.<task>.jsonl` collected under hosts/<node>/, by task; bad lines are skipped."""
    series: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("hosts/*/metrics.*.jsonl")):
        task = path.name[len("metrics."):-len(".jsonl")]
        rows = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "step" in row:
                rows.append(row)
        if rows:
            series[f"{task} ({path.parent.name})"] = rows
    return series


def draw(folder: Path) -> list[Path]:
    """Draw loss and examples/s against the step, one line per process; the files written."""
    series = read_metrics(folder)
    if not series:
        return []
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    written = []
    for key, label, name in (("loss", "loss", "loss.png"), ("examples_per_sec", "examples/s", "throughput.png")):
        figure, axes = pyplot.subplots(figsize=(7, 4), dpi=100)
        for task, rows in series.items():
            points = [(row["step"], row[key]) for row in rows if row.get(key) is not None]
            if points:
                axes.plot(*zip(*points, strict=True), label=task, linewidth=1.2)
        axes.set_xlabel("step")
        axes.set_ylabel(label)
        axes.set_title(f"{folder.name}: {label}")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        figure.savefig(folder / name)
        pyplot.close(figure)
        written.append(folder / name)
    return written
