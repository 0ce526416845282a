"""How far a bake is (pure): Ansible's tasks as packer prints them, against the last bake of the same kind.

A bake prints every Ansible task it starts (`TASK [role : name] ***`); `image.run_packer` keeps each line of the
output in the bake's packer.log with the seconds since the start. The last bake's log tells how many tasks a bake
runs and when each began, so a bake under way can say which task it is at, of about how many, and about how long is
left: the last bake's time from the same task to its end."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_TASK = re.compile(r"TASK \[(.+?)\] \*+")
_LOGGED = re.compile(r"^\[\s*([\d.]+)\] ")


def task_of(line: str) -> str | None:
    """The Ansible task a line of packer's output starts, if it starts one."""
    found = _TASK.search(line)
    return found.group(1) if found else None


def logged_tasks(log: Iterable[str]) -> tuple[list[tuple[float, str]], float]:
    """From a bake's packer.log: each task's start (seconds since the bake began, its name), and the bake's
    seconds (its last line's)."""
    tasks, last = [], 0.0
    for line in log:
        stamp = _LOGGED.match(line)
        if not stamp:
            continue
        last = float(stamp.group(1))
        if (task := task_of(line)) is not None:
            tasks.append((last, task))
    return tasks, last


def last_log(images: Path, provider: str, profile: str) -> Path | None:
    """The packer.log of the last bake of this provider and profile in `images`, if any."""
    logs = [path for path in images.glob(f"{provider}-{profile}-*/packer.log") if path.is_file()]
    return max(logs, key=lambda path: path.stat().st_mtime, default=None)


def minutes(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


@dataclass
class BakeProgress:
    """Tasks seen so far in this bake, and what the last bake's log tells (none: no estimate)."""

    before: list[tuple[float, str]] = field(default_factory=list)
    before_seconds: float = 0.0
    count: int = 0
    task: str | None = None
    seen: dict[str, int] = field(default_factory=dict)  # how many times each task name began in this bake

    def feed(self, line: str) -> None:
        if (task := task_of(line)) is not None:
            self.count, self.task = self.count + 1, task
            self.seen[task] = self.seen.get(task, 0) + 1

    def left(self) -> float | None:
        """The last bake's seconds from this task to its end: from the same occurrence of the task's name (a role
        run twice names its tasks twice); None where the last bake had no such task."""
        if self.task is None:
            return None
        starts = [at for at, name in self.before if name == self.task]
        wanted = self.seen[self.task]
        return max(0.0, self.before_seconds - starts[wanted - 1]) if len(starts) >= wanted else None

    def line(self, seconds: float) -> str:
        """What a bake under way says (every KILN_PROGRESS_SECONDS where the output is not a terminal)."""
        if self.task is None:
            return f"bake: {minutes(seconds)}, no Ansible task yet"
        of = f" of about {len(self.before)}" if self.before else ""
        said = f"bake: task {self.count}{of} ({self.task}), {minutes(seconds)}"
        left = self.left()
        return said + (f", about {minutes(left)} left as the last bake went" if left is not None else "")
