"""A run being watched, as the supervisor and its parts share it (bootstrap/supervisor.py watches and restarts;
checkpoints.py keeps and spreads the checkpoints; elastic.py lets nodes go and join; stalls.py judges progress;
recovery.py answers a lost node): the cluster it runs on, its plan, the nodes' and this machine's folders, its
runtime and timeline, and the nodes it lost; and stopping its processes and collecting its nodes' folders, which
every attempt's end (and `kiln stop`) does. A replacement, a join or a move gives it a new cluster or plan."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from bootstrap import commands, launch
from bootstrap.cluster import Cluster
from bootstrap.container import HostRuntime, Runtime
from bootstrap.errors import KilnError
from bootstrap.hosts import Host
from bootstrap.launch import NodePaths, RunPlan
from bootstrap.ssh import HostFailure
from bootstrap.state import RunRecord
from bootstrap.timeline import Timeline


@dataclass
class Live:
    group: Cluster
    plan: RunPlan
    paths: NodePaths
    folder: Path  # this machine's run folder (runs/<id>): what is collected, and the checkpoints kept here
    runtime: Runtime = field(default_factory=HostRuntime)
    timeline: Timeline = field(default_factory=Timeline)
    record: RunRecord | None = None
    lost: list[Host] = field(default_factory=list)  # the attempt's machines that no longer answer
    gone: list[Host] = field(default_factory=list)  # an elastic run's nodes lost while the run went on
    released: bool = False  # the run's port reservations went with the machines (a move that failed)
    notice_source: str = "any"  # where the nodes' interruption watchers look (the cluster's cloud)

    @property
    def run_dir(self) -> str:
        """The run's folder on every node."""
        return self.paths.run(self.plan.run_id)

    def name(self, host: Host) -> str:
        """A host's node name in the run's plan."""
        return self.plan.names[self.group.hosts.index(host)]

    def watched(self) -> list[Host]:
        return [host for host in self.group.hosts if host not in self.gone]

    def stop(self, skip: Sequence[Host] = (), patient: Mapping[Host, dict] = MappingProxyType({})) -> dict[str, str]:
        """Stop every process of the run on every host (but `skip`: gone) with SIGTERM, then SIGKILL after 5 s;
        on `patient` hosts (a spot notice came: their processes may be checkpointing) after the grace their
        notice leaves (its source's). Failures by host."""
        remote, python = self.group.remote, self.group.python

        def halt(host: Host) -> dict:
            grace = float(patient[host].get("grace_s", launch.NOTICE_GRACE)) if host in patient else 5
            stopped = remote.node(host, python, "stop", self.plan.run_id, str(grace), timeout=2 * grace + 120)
            if stopped.get("container"):
                raise HostFailure(f"could not remove the run's container: {stopped['container']}")
            return stopped

        staying = [h for h in self.group.hosts if h not in skip]
        _, failures = remote.map(staying, halt)
        try:  # the run's ports stay its own between attempts (node.py reserve: refreshed, they hold a while)
            answering = [h for h in staying if h not in failures]
            if answering:
                self.group.reserve_ports(self.plan.run_id, self.paths.root, self.plan.ports, answering)
        except KilnError:
            pass
        return {h.label: r for h, r in failures.items()}

    def collect(self, skip: Sequence[Host] = ()) -> Path:
        """Copy every node's run folder (but `skip`'s: gone) into runs/<id>/hosts/<node>/."""

        def pull(host: Host) -> None:
            argv = commands.rsync_pull_argv(host, self.run_dir, str(self.folder / "hosts" / self.name(host)),
                                            self.group.remote.options)
            self.group.remote.rsync(host, argv)

        _, failures = self.group.remote.map([h for h in self.group.hosts if h not in skip], pull)
        for host, reason in failures.items():
            print(f"warning: could not collect from {host.label}: {reason}", file=sys.stderr)
        return self.folder


class Interrupted(KilnError):
    """Spot interruption notices came for some nodes (their watchers stopped the run's processes there)."""

    def __init__(self, notices: dict[Host, dict]):
        self.notices = notices
        self.hosts = [host.label for host in notices]
        said = "; ".join(f"{host.label}: {notice.get('action')} at {notice.get('time')}"
                         for host, notice in notices.items())
        super().__init__(f"spot interruption notice ({said})")


@dataclass(frozen=True)
class Ended:
    """What an attempt came to once it was stopped and collected: the judged attempt, the hosts to replace, and
    when its end was seen."""

    attempt: launch.Attempt
    going: list[Host]
    detected: float


class Recoverer(Protocol):
    """A managed run's answer to lost nodes (recovery.Recovery)."""

    def recover(self, lost: list[Host]) -> tuple[list, RunPlan]:
        """Replace `lost` where the cluster is: (the replacements, the run's new plan)."""

    def answer(self, live: Live, ended: Ended, number: int, of: int, entry: dict) -> str | None:
        """The `number`th recovery of `of`: the attempt's lost and noticed hosts replaced (or the cluster moved),
        `entry` (summary.json's) filled in; the failure, where the run cannot go on."""
