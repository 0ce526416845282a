"""The watchdog on a real 3-node local cluster: a program busy and silent for 90 s is never stopped by default,
nor when --stall-minimum is given (its node's CPU time moves); one asleep forever is stopped when asked, named by
its host. A program that logs kiln metrics and then computes for 80 s without a step (an evaluation) finishes; one
whose steps stop while it spins (a hung collective) is stopped past the busy limit and named. Six runs share the
cluster side by side."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from conftest import KILN, run_processes

from bootstrap.watchdog import CPU_SIGN_RATE

pytestmark = pytest.mark.integration
CLUSTER_NAME = "kw"
# A minute and a half without a word: half as long again as the 60 s after which kiln once stopped a program, and
# three times --stall-minimum 30 (a longer silence tells nothing more: the busy share is the same every second)
BUSY_SECONDS = 90

BUSY = f"""\
import time
SHARE = {1.5 * CPU_SIGN_RATE}  # half as much again as kiln's watchdog counts as work, and light on a 2-core machine
began = time.monotonic()
end = began + {BUSY_SECONDS}
while time.monotonic() < end:  # computing, printing nothing (as an epoch of Keras fit(verbose=2) does)
    if time.process_time() < SHARE * (time.monotonic() - began):  # that share of a core, however busy the machine
        sum(i * i for i in range(10000))
    else:
        time.sleep(0.02)
print("done", flush=True)
"""

ASLEEP = """\
import time
print("started", flush=True)
time.sleep(100000)  # blocked forever, without a word and without work
"""


STEPS_THEN = f"""\
import json, os, sys, time
SHARE = {1.5 * CPU_SIGN_RATE}
metrics = os.path.join(os.path.dirname(os.environ["KILN_HEARTBEAT"]), f"metrics.{{os.environ['KILN_TASK']}}.jsonl")
pause = float(sys.argv[1])  # then busy (computing, no step) this long: an evaluation; forever: a hung collective

def step(number):
    with open(metrics, "a") as out:
        out.write(json.dumps({{"step": number, "loss": 1.0 / (number + 1)}}) + "\\n")

for number in range(25):  # a step every 0.2 s
    step(number)
    time.sleep(0.2)
began = time.monotonic()
while time.monotonic() - began < pause:
    if time.process_time() < SHARE * (time.monotonic() - began):
        sum(i * i for i in range(10000))
    else:
        time.sleep(0.02)
step(25)
print("done", flush=True)
"""


def start(cluster, cwd, *args: str, hosts: str = "node1,node2") -> subprocess.Popen:
    argv = [str(KILN), "-S", cluster.ssh_config, "-H", hosts, *args]
    return subprocess.Popen(argv, cwd=cwd, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_busy_silent_programs_finish_and_a_hung_one_is_stopped_when_asked(cluster, tmp_path):
    (tmp_path / "busy.py").write_text(BUSY)
    (tmp_path / "asleep.py").write_text(ASLEEP)
    (tmp_path / "steps.py").write_text(STEPS_THEN)
    runs = {
        "busy-train": start(cluster, tmp_path, "train", "--mode", "tf-config", "--run-id", "busy-train", "--",
                            "python", "busy.py"),
        # one node each: what the watch decides is per node (a busy program's share of a core, its CPU time kept
        # topped up however busy the machine: more nodes would only spend more of it)
        "busy-run": start(cluster, tmp_path, "run", "--run-id", "busy-run", "--", "python", "busy.py",
                          hosts="node1"),
        "busy-watched": start(cluster, tmp_path, "run", "--run-id", "busy-watched", "--stall-minimum", "30", "--",
                              "python", "busy.py", hosts="node2"),
        "asleep": start(cluster, tmp_path, "run", "--run-id", "asleep", "--stall-minimum", "20", "--",
                        "python", "asleep.py", hosts="node1,node2,node3"),
        # late past the 60 s step limit, but busy: an evaluation, not a stall
        "evaluates": start(cluster, tmp_path, "train", "--mode", "tf-config", "--run-id", "evaluates", "--",
                           "python", "steps.py", "80", hosts="node3"),
        # steps stopped while it spins: stopped once the step is late past the step limit and --stall-busy
        "spins": start(cluster, tmp_path, "train", "--mode", "tf-config", "--run-id", "spins", "--stall-busy", "30",
                       "--", "python", "steps.py", "100000", hosts="node3"),
    }
    began = time.monotonic()
    done = {run_id: (process.wait(timeout=900), *process.communicate()) for run_id, process in runs.items()}
    for run_id in ("busy-train", "busy-run", "busy-watched", "evaluates"):
        code, out, err = done[run_id]
        assert code == 0, f"{run_id}: {out[-3000:]}{err[-3000:]}"
        summary = json.loads((cluster.runs / run_id / "summary.json").read_text())
        assert summary["status"] == "ok", summary
    assert time.monotonic() - began >= BUSY_SECONDS  # they were silent that long, not cut short
    code, out, err = done["asleep"]
    assert code == 1, out + err
    # named by host: whichever of the three went past the limit first (they began within a second of each other)
    stalled = re.search(r"no output and no sign of work \(CPU time, a GPU busy, the heartbeat file\) for over 20s "
                        r"from ((?:shard-\d@node\d(?:, )?)+); stalled: ((?:node\d(?:, )?)+)", err)
    assert stalled, out[-3000:] + err
    assert {s.split("@")[1] for s in stalled.group(1).split(", ")} == set(stalled.group(2).split(", ")), err
    code, out, err = done["spins"]
    assert code == 1, out + err
    assert ("no step progress for over 60s from worker-0@node3 while its processes stay busy (a collective that "
            "hangs keeps its GPU or CPU busy); stalled: node3") in err, out[-3000:] + err
    assert all(run_processes(run_id) == [] for run_id in runs)
