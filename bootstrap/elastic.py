"""An elastic run's members (I/O): nodes that stop answering or get a spot notice are let go while the run goes
on (horovodrun's host discovery, torchrun's rendezvous), and with --managed their replacements join it."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable

from bootstrap import runs
from bootstrap.errors import KilnError, RemoteError
from bootstrap.hosts import Host
from bootstrap.launch import RunPlan
from bootstrap.live import Live

# The command that starts a host's part of a plan (its processes and interruption watcher), detached.
Starter = Callable[[RunPlan, Host], str]


class Membership:
    """Who is in an elastic run: `joiner` replaces nodes that went (--managed), at most `max_joins` times."""

    def __init__(self, live: Live, starter: Starter):
        self.live, self.starter = live, starter
        self.joiner: Callable[[list[Host]], tuple[list, RunPlan]] | None = None
        self.max_joins = 0
        self.joins: list[dict] = []  # each replacement that joined the run, as summary.json keeps it

    def let_go(self, failures: dict[Host, str]) -> None:
        """In an elastic run, nodes that stopped answering (confirmed by a fresh connection), but the first
        where horovodrun runs, are let go: the run goes on without them. Otherwise, or for any other failure,
        the watch fails as always."""
        live = self.live
        going = [host for host in failures if host != live.group.hosts[0]] if live.plan.elastic else []
        lost = live.group.remote.unreachable(going)
        if not lost or len(lost) != len(failures):
            raise RemoteError("status", {h.label: r for h, r in failures.items()})
        self.leave(lost, "stopped answering")

    def leave(self, hosts: list[Host], why: str) -> None:
        """The elastic run goes on without `hosts` (no longer watched); with --managed, replacements join it."""
        if not hosts:
            return
        for host in hosts:
            self.live.gone.append(host)
            self.live.group.remote.reset([host])
            print(f"{self.live.name(host)} ({host.label}) {why}: the elastic run goes on without it", flush=True)
        if self.joiner:
            self.join(hosts)

    def join(self, going: list[Host]) -> None:
        """Replace nodes an elastic run lost through the provider (the mesh, the code, the runtime on the new
        machines), then name them in the run's host discovery script: horovodrun adds them to the live job at its
        next look (Horovod's blacklist cooldown lets a replacement under a lost node's name back in). A
        replacement that cannot be made is said and the run goes on without it."""
        live = self.live
        labels = ", ".join(host.label for host in going)
        if len(self.joins) >= self.max_joins:
            print(f"all {self.max_joins} recoveries of --max-recoveries used: {labels} not replaced", flush=True)
            return
        print(f"recovery {len(self.joins) + 1} of {self.max_joins}: replacing {labels} to join the elastic run",
              flush=True)
        detected, before = time.time(), list(live.group.hosts)
        names = {host: live.name(host) for host in going}
        try:
            with live.timeline.phase("replace"):
                replaced, plan = self.joiner(going)
                fresh = [item.new for item in replaced]
                live.runtime.prepare(fresh, live.timeline)
                self.announce(plan, fresh)
        except KilnError as failure:
            live.gone += [host for host in live.group.hosts if host not in before]
            print(f"warning: recovery failed: {failure}; the elastic run goes on without {labels}", file=sys.stderr,
                  flush=True)
            return
        olds = {item.old for item in replaced}
        live.gone = [host for host in live.gone if host not in olds]
        live.plan = plan
        live.record = runs.record_run(live.group, plan, live.paths)
        self.joins.append({"kind": "join", "lost": [names[h] for h in going], "detected_at": round(detected, 3),
                           "replaced": [{"old": r.old.label, "new": r.new.label} for r in replaced],
                           "joined_at": round(time.time(), 3)})
        print(f"{', '.join(r.new.label for r in replaced)} ready: the elastic run adds it at its next host "
              "discovery", flush=True)

    def announce(self, plan: RunPlan, fresh: list[Host]) -> None:
        """Start the `fresh` nodes' part of the run (a torchrun agent, which joins the rendezvous: the agents running
        restart their workers with it) and their interruption watchers; for horovodrun, then give the first node the
        plan's host discovery script (replaced whole, in one rename: horovodrun runs it every second)."""
        group = self.live.group
        group.remote.map_or_raise("join", fresh, lambda h: group.remote.check(h, self.starter(plan, h), timeout=60))
        if plan.mode == "torchrun":
            return
        first = group.hosts[0]
        for path, text in plan.launches[0].files.items():
            quoted = shlex.quote(path)
            group.remote.check(first, f"printf %s {shlex.quote(text)} > {quoted}.new && mv -f {quoted}.new {quoted}",
                               timeout=60)
