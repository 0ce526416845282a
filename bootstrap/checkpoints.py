"""A run's checkpoints across restarts (I/O): the first node's copied here (runs/<id>/checkpoints) before its
machine or the whole cluster goes, and given to every node before a restart, so that every process resumes from
the same step without shared storage."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence

from bootstrap import commands
from bootstrap.hosts import Host
from bootstrap.live import Live
from bootstrap.runs import read_text

CHIEF_TASKS = ("chief-0", "worker-0", "rank-0")


def pull(live: Live, source: Host) -> bool:
    """The run's checkpoints on `source`, copied to the run folder here (checkpoints/); whether it had any."""
    group = live.group
    checkpoints = live.plan.checkpoint_dir or f"{live.run_dir}/checkpoints"
    if group.remote.run(source, ["test", "-d", checkpoints], timeout=30).code != 0:
        return False
    group.remote.rsync(source, commands.rsync_pull_argv(source, checkpoints, str(live.folder / "checkpoints"),
                                                        group.remote.options))
    return True


def spread(live: Live) -> None:
    """Give every node the chief's checkpoints (first node) before a restart. A chief that was replaced has none:
    the copy kept here from an earlier restart is given to every node instead, if there is one."""
    group = live.group
    source, others = group.hosts[0], group.hosts[1:]
    checkpoints = live.plan.checkpoint_dir or f"{live.run_dir}/checkpoints"
    local = live.folder / "checkpoints"
    options = group.remote.options
    if not pull(live, source):
        if not local.is_dir():
            return
        others = group.hosts  # a new first node: every node gets the copy kept here
    group.remote.map_or_raise("spread checkpoints", others, lambda h: group.remote.rsync(
        h, commands.rsync_push_argv(str(local), h, checkpoints, options, excludes=(), one_writer=False)))


def keep_chiefs(live: Live, going: Sequence[Host]) -> None:
    """Before the chief's machine is replaced, keep the checkpoints collected from it as the copy every node
    gets (spread); a chief lost without a word took its newest ones with it."""
    chief = live.group.hosts[0]
    if chief not in going:
        return
    collected = live.folder / "hosts" / live.plan.names[0] / "checkpoints"
    kept = live.folder / "checkpoints"
    if chief in live.lost or not collected.is_dir():
        where = "the copy kept here from an earlier restart" if kept.is_dir() else "the start"
        print(f"warning: the chief {chief.label} went with its newest checkpoints; resuming from {where} "
              "(a --checkpoint-dir on shared storage, s3://..., survives a lost node)", file=sys.stderr)
        return
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(collected, kept)


def keep_before_move(live: Live) -> None:
    """Before the whole cluster goes, the first node's checkpoints kept here, pulled from it where it still
    answers (else the copy kept from an earlier restart, or none: the run starts again)."""
    chief = live.group.hosts[0]
    if chief in live.lost or not pull(live, chief):
        where = "the copy kept here from an earlier restart" if (live.folder / "checkpoints").is_dir() else \
            "the start"
        print(f"warning: no checkpoints from {chief.label}; resuming from {where}", file=sys.stderr, flush=True)


def chief_step(live: Live) -> int | None:
    """The last step the chief logged, from the collected metrics."""
    for task in CHIEF_TASKS:
        path = live.folder / "hosts" / live.plan.names[0] / f"metrics.{task}.jsonl"
        lines = read_text(path).strip().splitlines()
        if lines:
            try:
                return int(json.loads(lines[-1])["step"])
            except (ValueError, KeyError):
                return None
    return None


def keep_apart(live: Live, names: Sequence[str], number: int) -> None:
    """The collected files of these nodes' machines moved to replaced/NAME-NUMBER, apart from their
    successors'."""
    for name in names:
        kept = live.folder / "hosts" / name
        if kept.is_dir():
            (live.folder / "replaced").mkdir(exist_ok=True)
            kept.rename(live.folder / "replaced" / f"{name}-{number}")
