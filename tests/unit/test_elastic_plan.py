"""Elastic Horovod's plan (pure): the bounds kiln accepts, horovodrun's elastic argv, the host discovery script,
and a plan that watches no output and names the script instead of a hostfile."""

from __future__ import annotations

import subprocess

import pytest

from bootstrap.commands import ELASTIC_COOLDOWN, horovodrun_argv
from bootstrap.errors import UsageError
from bootstrap.launch import Program, RunSpec, elastic_range, plan_run, validate_elastic
from bootstrap.topology import discovery_script


def test_the_elastic_bounds_default_to_every_slot_and_are_checked():
    assert elastic_range(2, 0, 3) == (2, 3)
    assert elastic_range(1, 8, 3) == (1, 8)  # more may come: a replacement, a node back on the network
    with pytest.raises(UsageError, match="--min-np 4: give 1 to the 3 processes"):
        elastic_range(4, 0, 3)
    with pytest.raises(UsageError, match="--max-np 1 is below --min-np 2"):
        elastic_range(2, 1, 3)


@pytest.mark.parametrize(("mode", "min_np", "max_np", "mpi", "message"), [
    ("tf-config", 2, 0, False, "belong to --mode horovod"),
    ("horovod", 0, 3, False, "--max-np"),
    ("horovod", 2, 0, True, "over Gloo"),
])
def test_elastic_options_outside_elastic_horovod_are_refused(mode, min_np, max_np, mpi, message):
    with pytest.raises(UsageError, match=message):
        validate_elastic(mode, min_np=min_np, max_np=max_np, mpi=mpi)


def test_elastic_horovodrun_asks_the_discovery_script_and_lets_a_lost_host_back_after_a_cooldown():
    argv = horovodrun_argv(["hr"], processes=3, hostfile="sh /r/discover", entry=["x"], nic="eth0",
                           elastic=(2, 3))
    assert argv == ["hr", "-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-script", "sh /r/discover",
                    "--blacklist-cooldown-range", *map(str, ELASTIC_COOLDOWN), "--gloo", "--start-timeout", "60",
                    "--gloo-timeout-seconds", "60",
                    "--network-interfaces", "eth0", "x"]
    low, high = ELASTIC_COOLDOWN
    assert 1 <= low <= high <= 3600  # horovodrun refuses a range outside 1 s to 1 h


def test_the_discovery_script_names_the_first_node_and_each_other_node_that_answers(tmp_path):
    script = discovery_script(["n1", "n2", "n3"], [2, 1, 4])
    fake = tmp_path / "ssh"  # answers for n3 only, as a node's ssh would
    fake.write_text('#!/bin/sh\ncase " $* " in *" n3 true "*) exit 0 ;; esac\nexit 255\n')
    fake.chmod(0o755)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["n1:2", "n3:4"]


def test_an_elastic_plan_runs_horovodrun_over_the_discovery_script_and_watches_no_output():
    spec = RunSpec(run_id="r", mode="horovod", names=("n1", "n2", "n3"), slots=(1, 1, 1), python="/v/bin/python",
                   root="/h/kiln", program=Program(("train.py",)), nic="eth0", min_np=2)
    plan = plan_run(spec)
    [launch] = plan.launches
    assert plan.elastic and not plan.watch_output
    assert list(launch.files) == ["/h/kiln/runs/r/discover"]
    assert "--host-discovery-script" in launch.argv and "--hostfile" not in launch.argv
    fixed = plan_run(RunSpec(**{**spec.__dict__, "min_np": 0}))
    assert not fixed.elastic and fixed.watch_output and list(fixed.launches[0].files) == ["/h/kiln/runs/r/hostfile"]
