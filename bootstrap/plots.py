"""loss.png and throughput.png in a run folder, drawn from every process's metrics: the chart's layout is pure
(ticks, scales), the drawing Pillow's (ImageDraw).

Not matplotlib: where it is installed, Keras imports matplotlib.pyplot whenever TensorFlow is imported (its
plot_image_gallery), 0.55 CPU-s and 0.7 s more for every TensorFlow process on the machine (2.35 against 2.9 CPU-s
here), and a local cluster's nodes run the operator's Python. Pillow is one TensorBoard needs anyway, and Keras's
import of it costs 15 ms."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
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


SIZE = (700, 400)  # pixels
MARGINS = (72, 40, 20, 48)  # left, top, right, bottom: room for the tick labels, the title and the axis label
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")  # one per process, in turn (the tab10 palette)
CHARTS = (("loss", "loss", "loss.png"), ("examples_per_sec", "examples/s", "throughput.png"))


def ticks(low: float, high: float, most: int = 6) -> list[float]:
    """Round values from at or below `low` to at or above `high`, a step of 1, 2 or 5 times a power of ten, at
    most `most` + 1 of them; a single value is given room around it."""
    if high <= low:
        low, high = low - (abs(low) or 1.0) / 2, high + (abs(high) or 1.0) / 2
    raw = (high - low) / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(factor * power for factor in (1, 2, 5, 10) if factor * power >= raw)
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    return [round(index * step, 12) for index in range(first, last + 1)]


def label(value: float) -> str:
    """A tick's text: short, without trailing zeros."""
    return f"{value:.4g}"


def scale(value: float, span: Sequence[float], pixels: Sequence[float]) -> float:
    """`value` within `span` (first, last) as a position between `pixels` (first, last)."""
    return pixels[0] + (value - span[0]) / (span[1] - span[0]) * (pixels[1] - pixels[0])


def lines(series: dict[str, list[dict]], key: str) -> dict[str, list[tuple[float, float]]]:
    """Each process's (step, value) points of `key`, where it has any."""
    found = {task: [(float(row["step"]), float(row[key])) for row in rows
                    if isinstance(row.get(key), int | float) and isinstance(row["step"], int | float)]
             for task, rows in series.items()}
    return {task: points for task, points in found.items() if points}


def chart(points: dict[str, list[tuple[float, float]]], title: str, axis: str, path: Path) -> None:
    """One line per process against the step, with ticks, a grid, a legend and a title, as a PNG at `path`."""
    from PIL import Image, ImageDraw, ImageFont

    font, small = ImageFont.load_default(size=13), ImageFont.load_default(size=11)
    image = Image.new("RGB", SIZE, "white")
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = MARGINS[0], MARGINS[1], SIZE[0] - MARGINS[2], SIZE[1] - MARGINS[3]
    xs = ticks(min(x for line in points.values() for x, _ in line), max(x for line in points.values() for x, _ in line))
    ys = ticks(min(y for line in points.values() for _, y in line), max(y for line in points.values() for _, y in line))
    across, up = (xs[0], xs[-1]), (ys[0], ys[-1])
    for value in xs:
        x = scale(value, across, (left, right))
        draw.line([(x, top), (x, bottom)], fill="#e6e6e6")
        draw.text((x, bottom + 4), label(value), fill="black", font=small, anchor="ma")
    for value in ys:
        y = scale(value, up, (bottom, top))
        draw.line([(left, y), (right, y)], fill="#e6e6e6")
        draw.text((left - 6, y), label(value), fill="black", font=small, anchor="rm")
    draw.rectangle([(left, top), (right, bottom)], outline="black")
    colours = {task: COLOURS[index % len(COLOURS)] for index, task in enumerate(points)}
    for task, line in points.items():
        placed = [(scale(x, across, (left, right)), scale(y, up, (bottom, top))) for x, y in line]
        if len(placed) == 1:
            x, y = placed[0]
            draw.ellipse([(x - 2, y - 2), (x + 2, y + 2)], fill=colours[task])
        else:
            draw.line(placed, fill=colours[task], width=2)
    # the legend, in the top right corner over the lines: a colour's stroke and its process, one a row
    width = 34 + max(draw.textlength(task, font=small) for task in points)
    corner = (right - 8 - width, top + 8)
    draw.rectangle([corner, (right - 8, corner[1] + 8 + 15 * len(points))], fill="white", outline="#cccccc")
    for row, (task, colour) in enumerate(colours.items()):
        y = corner[1] + 11 + 15 * row
        draw.line([(corner[0] + 6, y), (corner[0] + 26, y)], fill=colour, width=2)
        draw.text((corner[0] + 30, y), task, fill="black", font=small, anchor="lm")
    draw.text(((left + right) / 2, top / 2), title, fill="black", font=font, anchor="mm")
    draw.text(((left + right) / 2, SIZE[1] - 6), "step", fill="black", font=font, anchor="md")
    draw.text((4, top / 2), axis, fill="black", font=font, anchor="lm")
    image.save(path)


def draw(folder: Path) -> list[Path]:
    """Draw loss and examples/s against the step, one line per process; the files written."""
    series = read_metrics(folder)
    written = []
    for key, axis, name in CHARTS:
        if points := lines(series, key):
            chart(points, f"{folder.name}: {axis}", axis, folder / name)
            written.append(folder / name)
    return written
