"""What kiln reads of a Slurm cluster's login node (bootstrap/attached.py: parse_probe, job_root), from answers as
Debian's and a site's Slurm give them."""

from __future__ import annotations

import pytest

from bootstrap.attached import PROBE, Login, job_root, login_shell, parse_probe
from bootstrap.errors import UsageError
from bootstrap.slurm import Partition

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJvb3RAbm9kZTEga2lsbiB0ZXN0IGtleSBmb3IgdW5pdHM"
ECDSA = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY"
ANSWER = f"""\
home=/home/ada
user=ada
slurm=slurm-wlm 22.05.8
rsync=yes
partition=gpu 6
partition=cpu* 10
partition=gpu 2
partition=debug 1
slurmd_timeout=300
hostkey={KEY} root@login1
hostkey={ECDSA} root@login1
"""


def test_the_default_partition_comes_first_and_a_partitions_lines_add_up():
    probed = parse_probe(ANSWER, "ada@login1")
    assert probed.partitions == (Partition("cpu", 10), Partition("gpu", 8), Partition("debug", 1))
    assert (probed.home, probed.user, probed.slurm, probed.slurmd_timeout_s) == ("/home/ada", "ada", "22.05.8", 300)
    assert probed.host_keys == (KEY, ECDSA)  # comments dropped


def test_a_sites_profile_noise_and_a_newer_slurms_version_are_read_past():
    newer = ANSWER.replace("slurm-wlm 22.05.8", "slurm 23.11.4")
    noise = "Welcome to the cluster!\nmodule: loaded slurm/23.11\n" + newer
    assert parse_probe(noise, "login1").slurm == "23.11.4"


def test_slurmd_timeout_defaults_to_slurms_own_where_scontrol_does_not_say():
    assert parse_probe(ANSWER.replace("slurmd_timeout=300\n", ""), "login1").slurmd_timeout_s == 300


@pytest.mark.parametrize(("change", "said"), [
    (("slurm=slurm-wlm 22.05.8", "slurm=bash: sinfo: command not found"),
     "--login login1: Slurm's tools do not run there as this user (bash: sinfo: command not found)"),
    (("rsync=yes\n", ""), "--login login1: rsync is not installed there"),
    (("partition=", "other="), "--login login1: sinfo shows no partition there"),
    (("home=/home/ada", "home="), "--login login1: the user's home is not known there (no HOME)"),
    (("hostkey=", "nokey="), "--login login1: its host keys cannot be read"),
])
def test_what_a_login_node_lacks_is_named(change, said):
    with pytest.raises(UsageError) as refused:
        parse_probe(ANSWER.replace(*change), "login1")
    assert str(refused.value).startswith(said), str(refused.value)


def test_the_jobs_folder_is_under_the_home_unless_absolute():
    assert job_root("kiln-jobs", "/home/ada") == "/home/ada/kiln-jobs"
    assert job_root("/shared/ada/jobs/", "/home/ada") == "/shared/ada/jobs"


def test_tools_run_in_the_users_login_shell_and_a_job_folder_is_the_run_under_the_root():
    assert login_shell("sinfo --version") == "bash -lc 'sinfo --version'"
    login = Login("site", "ada@login1:2222", "/home/ada/kiln-jobs", (Partition("cpu", 2),), 300)
    assert login.job_folder("20261129-1200-ab12") == "/home/ada/kiln-jobs/20261129-1200-ab12"
    assert (login.host.user, login.host.address, login.host.port) == ("ada", "login1", 2222)
    assert login.options.known_hosts[0].endswith("/clusters/site/known_hosts")
    assert "sinfo --noheader" in PROBE and "/etc/ssh/ssh_host_*_key.pub" in PROBE
