"""loss.png and throughput.png in a run folder, drawn from every process's metrics: the chart's layout is pure
(ticks, scales), the drawing Pillow's (ImageDraw).

Not matplotlib: where it is installed, Keras imports matplotlib.pyplot whenever TensorFlow is imported (its
plot_image_gallery), 0.55 CPU-s and 0.7 s more for every TensorFlow process on the machine (2.35 against 2.9 CPU-s
here), and a local cluster's nodes run the operator's Python. Pillow is one of kiln's own dependencies (TensorBoard
needs it too), and Keras's import of it costs 15 ms."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

SIZE = (700, 400)  # pixels
MARGINS = (72, 40, 20, 48)  # left, top, right, bottom: room for the tick labels, the title and the axis label
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")  # one per process, in turn (the tab10 palette)
CHARTS = (("loss", "loss", "loss.png"), ("examples_per_sec", "examples/s", "throughput.png"))
LEGEND_ROWS = 8  # processes named in the legend; past that, a last row says how many more there are


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


def ticks(low: float, high: float, most: int = 6, least_step: float = 0.0) -> list[float]:
    """Round values from at or below `low` to at or above `high`, a step of 1, 2 or 5 times a power of ten (at
    least `least_step`: 1 for steps) and about `most` of them; values too close to tell apart get room around them."""
    magnitude = max(abs(low), abs(high))
    if high - low <= 1e-9 * magnitude or high <= low:
        pad = magnitude / 2 or 1.0
        low, high = low - pad, high + pad
    raw = max((high - low) / most, least_step)
    power = 10 ** math.floor(math.log10(raw))
    step = next(factor * power for factor in (1, 2, 5, 10) if factor * power >= raw)
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    return [round(index * step, decimals(step) + 1) for index in range(first, last + 1)]


def decimals(step: float) -> int:
    """How many decimals tell ticks `step` apart."""
    return max(0, -math.floor(math.log10(step) + 1e-9))


def label(value: float, step: float) -> str:
    """A tick's text, with the decimals its step needs (15000, not 1.5e+04)."""
    return f"{value:.{decimals(step)}f}"


def scale(value: float, span: Sequence[float], pixels: Sequence[float]) -> float:
    """`value` within `span` (first, last) as a position between `pixels` (first, last); the middle for a span of
    nothing."""
    if span[1] == span[0]:
        return (pixels[0] + pixels[1]) / 2
    return pixels[0] + (value - span[0]) / (span[1] - span[0]) * (pixels[1] - pixels[0])


def number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def lines(series: dict[str, list[dict]], key: str) -> dict[str, list[tuple[float, float]]]:
    """Each process's (step, value) points of `key`, where it has any: finite numbers only (a run that diverged
    logs NaN and Infinity, which JSON reads back as floats)."""
    found = {task: [(float(row["step"]), float(row[key])) for row in rows if number(row.get(key))
                    and number(row["step"])]
             for task, rows in series.items()}
    return {task: points for task, points in found.items() if points}


def legend_corner(box: tuple[float, float], area: tuple[float, float, float, float],
                  placed: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The top-left corner of a legend `box` (width, height) inside `area` (left, top, right, bottom), 8 pixels in:
    the corner over the fewest of the `placed` points, the top right first where they tie."""
    width, height = box
    left, top, right, bottom = area
    corners = [(right - 8 - width, top + 8), (left + 8, top + 8), (right - 8 - width, bottom - 8 - height),
               (left + 8, bottom - 8 - height)]
    return min(corners, key=lambda corner: sum(corner[0] <= x <= corner[0] + width and
                                               corner[1] <= y <= corner[1] + height for x, y in placed))


def legend_rows(tasks: Sequence[str]) -> list[str]:
    """The legend's rows: each process, or the first LEGEND_ROWS - 1 and how many more there are."""
    if len(tasks) <= LEGEND_ROWS:
        return list(tasks)
    return [*tasks[:LEGEND_ROWS - 1], f"and {len(tasks) - LEGEND_ROWS + 1} more"]


def chart(points: dict[str, list[tuple[float, float]]], title: str, axis: str, path: Path) -> None:
    """One line per process against the step, with ticks, a grid, a legend and a title, as a PNG at `path`."""
    from PIL import Image, ImageDraw, ImageFont

    font, small = ImageFont.load_default(size=13), ImageFont.load_default(size=11)
    image = Image.new("RGB", SIZE, "white")
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = MARGINS[0], MARGINS[1], SIZE[0] - MARGINS[2], SIZE[1] - MARGINS[3]
    every = [point for line in points.values() for point in line]
    xs = ticks(min(x for x, _ in every), max(x for x, _ in every), least_step=1.0)
    ys = ticks(min(y for _, y in every), max(y for _, y in every))
    across, up = (xs[0], xs[-1]), (ys[0], ys[-1])
    for value in xs:
        x = scale(value, across, (left, right))
        draw.line([(x, top), (x, bottom)], fill="#e6e6e6")
        draw.text((x, bottom + 4), label(value, xs[1] - xs[0]), fill="black", font=small, anchor="ma")
    for value in ys:
        y = scale(value, up, (bottom, top))
        draw.line([(left, y), (right, y)], fill="#e6e6e6")
        draw.text((left - 6, y), label(value, ys[1] - ys[0]), fill="black", font=small, anchor="rm")
    draw.rectangle([(left, top), (right, bottom)], outline="black")
    colours = {task: COLOURS[index % len(COLOURS)] for index, task in enumerate(points)}
    placed = []
    for task, line in points.items():
        at = [(scale(x, across, (left, right)), scale(y, up, (bottom, top))) for x, y in line]
        placed.extend(at)
        if len(at) == 1:
            draw.ellipse([(at[0][0] - 2, at[0][1] - 2), (at[0][0] + 2, at[0][1] + 2)], fill=colours[task])
        else:
            draw.line(at, fill=colours[task], width=2)
    # the legend: a colour's stroke and its process, one a row, in the corner over the fewest points
    rows = legend_rows(list(points))
    box = (34 + max(draw.textlength(row, font=small) for row in rows), 8 + 15 * len(rows))
    corner = legend_corner(box, (left, top, right, bottom), placed)
    draw.rectangle([corner, (corner[0] + box[0], corner[1] + box[1])], fill="white", outline="#cccccc")
    for index, row in enumerate(rows):
        y = corner[1] + 11 + 15 * index
        if row in colours:
            draw.line([(corner[0] + 6, y), (corner[0] + 26, y)], fill=colours[row], width=2)
        draw.text((corner[0] + 30, y), row, fill="black", font=small, anchor="lm")
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
