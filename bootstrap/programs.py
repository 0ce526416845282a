"""slurmctld's programs for a kiln queue (its ResumeProgram, SuspendProgram, ResumeFailProgram, the trigger on a
node going down, and on a cloud a job's PrologSlurmctld and EpilogSlurmctld): `python -m bootstrap.programs VERB
CLUSTER HOSTLIST|JOB`.

An entry of its own, not kiln's command line: it imports the queue and the cluster's provider alone (no Fabric, no
Invoke), so it starts at once under slurmctld, and a queue controller machine runs it from the few pure-Python
packages kiln ships there (bootstrap/controller.py). Its errors are one line each, `kiln: ...`, as kiln's are.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from bootstrap import queue
from bootstrap.errors import KilnError, UsageError

VERBS = ("resume", "suspend", "resume-fail", "lost", "job-start", "job-end")


def run(verb: str, name: str, nodes: str | None) -> list[str]:
    """kiln started with slurmctld's blocked signals would hand them on to every daemon it starts (which then could
    not be stopped): they are cleared first. A line per node."""
    if verb not in VERBS:
        raise UsageError(f"{verb}: not one of slurmctld's programs ({', '.join(VERBS)})")
    if not nodes:
        raise UsageError(f"{verb}: give the nodes' hostlist, or the job's number (slurmctld gives it)")
    # A program stopped by a kill undoes what it made (slurmctld's own end of a program, SIGTERM to its group then
    # SIGKILL 10 ms later, leaves no such time: its nodes are then powered down and suspended). Set before the
    # signals are unblocked, so one already waiting meets it.
    signal.signal(signal.SIGTERM, stopped)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if verb in ("job-start", "job-end"):  # the job's folder and nodes, as slurmctld gives its prolog and epilog
        where = os.environ.get("SLURM_JOB_WORK_DIR", ""), os.environ.get("SLURM_JOB_NODELIST", "")
        lines = (queue.job_start if verb == "job-start" else queue.job_end)(name, nodes, *where)
    elif verb == "resume":
        lines = queue.resume(name, nodes)
    elif verb == "lost":
        lines = queue.lost(name, nodes)
    else:
        lines = queue.suspend(name, nodes, why="suspended" if verb == "suspend" else "not up in time")
    return [f"kiln queue {verb} {name}: {line}" for line in lines]


def stopped(signum, frame) -> None:
    """SIGTERM as an exception: the program's finally blocks (a resume's removal of machines it made and did not
    join) run before it ends."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print("kiln: usage: python -m bootstrap.programs VERB CLUSTER HOSTLIST", file=sys.stderr)
        return 2
    try:
        print("\n".join(run(*args)), flush=True)
    except KilnError as error:
        print(f"kiln: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
