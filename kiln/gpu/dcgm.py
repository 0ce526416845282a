"""NVIDIA DCGM's diagnostics (`dcgmi diag -r 1`, the quick deployment checks: driver, CUDA, NVML, permissions,
persistence mode, page retirement and row remapping, other processes on the GPUs, the InfoROM), read from the
table dcgmi prints (pure). `kiln check --gpu --deep` runs it where the node has DCGM (the gpu image installs it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

COMMAND = "command -v dcgmi >/dev/null || { echo 'dcgmi: not installed (the gpu image installs DCGM)'; exit 127; }; " \
          "dcgmi diag -r 1"
METADATA = ("DCGM Version", "Driver Version Detected", "GPU Device IDs Detected")
DETAIL = ("Error", "Warning", "Info")


@dataclass
class Diagnostic:
    """Each test's result (`Pass`, `Fail`, `Skip - All`, `Warn`...) and what DCGM said about it."""

    metadata: dict[str, str] = field(default_factory=dict)
    results: dict[str, str] = field(default_factory=dict)
    details: dict[str, list[str]] = field(default_factory=dict)


def parse_diag(text: str) -> Diagnostic:
    """Read dcgmi's diagnostic table (DCGM 3 and 4 print the same two columns); a wrapped cell continues on
    rows whose first column is blank (dcgmi cuts words at the column's width: the pieces join as they are); an
    Error, Warning or Info row belongs to the test above it."""
    diag = Diagnostic()
    test = kind = None
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or line.strip().startswith(("|-----", "|=====")):
            continue
        name, cell = parts[1].strip(), parts[2]
        value = cell[1:-2] if len(cell) > 3 else cell.strip()  # dcgmi pads a cell with one space each side
        if name == "Diagnostic":
            continue
        if name in METADATA:
            diag.metadata[name] = value.strip()
            test = None
        elif name in DETAIL and test:
            kind = name
            diag.details.setdefault(test, []).append(f"{name}: {value}")
        elif not name and test and kind:
            diag.details[test][-1] += value
        elif name:
            test, kind = name, None
            diag.results[name] = value.strip()
    if not diag.results:
        raise ValueError("no dcgmi diagnostic results in the output")
    return diag


def problems(diag: Diagnostic, limit: int = 300) -> list[str]:
    """A line for every test that failed or warned, with what DCGM said (cut to `limit` characters)."""
    found = []
    for test, result in diag.results.items():
        if result.startswith(("Fail", "Warn")):
            said = " ".join(diag.details.get(test, []))
            said = re.sub(r"\s+", " ", said).strip()
            found.append(f"DCGM {test}: {result}" + (f" ({said[:limit]}{'...' if len(said) > limit else ''})"
                                                       if said else ""))
    return found


def judge(output: str) -> list[str]:
    """A node's problems from what `COMMAND` printed: the failed tests, or why there is no diagnostic."""
    try:
        return problems(parse_diag(output))
    except ValueError:
        said = " ".join(output.split())[-300:] or "no output"
        return [f"DCGM diagnostics did not run: {said}"]
