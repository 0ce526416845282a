"""A program for a job that loses a node: each task counts its steps into its own checkpoint (KILN_CHECKPOINT_DIR)
and starts from it, and, as a collective would, fails at once when another task's count stops moving (its node is
gone). What each task did goes to KILN_OUTPUT_DIR: the step it started from and Slurm's count of the job's runs.

    kiln submit NAME --nodes 2 -- python slurm_steps.py --steps 40
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

STEP_S = 0.5
PEER_SILENT_S = 5.0  # a peer whose count has not moved this long is gone


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    mine = Path(os.environ["KILN_CHECKPOINT_DIR"]) / "step"
    tasks = int(os.environ["KILN_NUM_NODES"])
    start = int(mine.read_text()) if mine.exists() else 0
    began = time.time()
    for step in range(start, args.steps):
        time.sleep(STEP_S)
        mine.write_text(str(step + 1))
        peers = [p for p in Path(mine.parent.parent).glob("node-*/step") if p != mine]
        if len(peers) == tasks - 1 and time.time() - began > PEER_SILENT_S:
            silent = [str(p.parent.name) for p in peers if time.time() - p.stat().st_mtime > PEER_SILENT_S]
            finished = [p for p in peers if int(p.read_text() or 0) >= args.steps]
            if silent and not finished:
                print(f"{os.environ['KILN_TASK']}: {', '.join(silent)} silent: the collective failed", flush=True)
                return 1
    out = Path(os.environ["KILN_OUTPUT_DIR"])
    (out / "result.json").write_text(json.dumps({"task": os.environ["KILN_TASK"], "started_at": start,
                                                 "runs": int(os.environ.get("SLURM_RESTART_COUNT", 0)) + 1}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
