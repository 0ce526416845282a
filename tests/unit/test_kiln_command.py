"""The `kiln` command from any folder: Fabric's core flags, kiln's tasks at the top level, and the user's command
after `--` kept word for word (and `fab cluster.train -- CMD` from the repository, too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.main import help_before_task, split_command
from kiln.paths import PROJECT

KILN = Path(sys.executable).with_name("kiln")
FAB = Path(sys.executable).with_name("fab")


def kiln(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(KILN), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home), "KILN_HOME": str(home / ".kiln")})


@pytest.mark.parametrize(("argv", "own", "command"), [
    (["kiln", "-H", "a", "train"], ["kiln", "-H", "a", "train"], []),
    (["kiln", "train", "--", "python", "t.py", "a b"], ["kiln", "train"], ["python", "t.py", "a b"]),
    (["kiln", "run", "--", "sh", "-c", "x -- y"], ["kiln", "run"], ["sh", "-c", "x -- y"]),
    (["kiln", "train", "--"], ["kiln", "train"], []),
])
def test_the_users_command_is_what_follows_the_first_double_dash(argv, own, command):
    assert split_command(argv) == (own, command)


def test_kiln_lists_its_tasks_and_version_from_any_folder(tmp_path):
    listed = kiln("--list", cwd=tmp_path, home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines()[1:] if line.startswith("  ")}
    assert {"mesh", "check", "sync", "train", "status", "logs", "stop", "up", "down", "list", "sweep"} <= names
    version = kiln("-V", cwd=tmp_path, home=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("kiln ")
    helped = kiln("--help", "train", cwd=tmp_path, home=tmp_path)
    assert helped.returncode == 0 and "--mode=STRING" in helped.stdout and "--code=STRING" in helped.stdout


def test_a_dry_run_shows_the_users_command_word_for_word(tmp_path):
    (tmp_path / "t.py").write_text("")
    done = kiln("-H", "n1,n2", "train", "--mode", "tf-config", "--dry-run", "--run-id", "dry", "--",
                "python", "t.py", "--name", "a b", cwd=tmp_path, home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"{sys.executable} t.py --name 'a b'" in done.stdout
    assert done.stdout.count("TF_CONFIG=") == 2


def test_fab_from_the_repository_hands_the_command_to_the_task(tmp_path):
    (tmp_path / "t.py").write_text("")
    done = subprocess.run([str(FAB), "-H", "n1", "cluster.train", "--dry-run", "--run-id", "dry", "--code",
                           str(tmp_path), "--", "python", "t.py", "--epochs", "2"], cwd=PROJECT, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "KILN_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert f"{sys.executable} t.py --epochs 2" in done.stdout


def test_a_command_without_a_task_or_a_missing_script_is_refused(tmp_path):
    bare = kiln("-H", "n1", "--", "hostname", cwd=tmp_path, home=tmp_path)
    assert bare.returncode == 2 and "name a task" in bare.stderr
    missing = kiln("-H", "n1", "train", "--dry-run", "--", "python", "nosuch.py", cwd=tmp_path, home=tmp_path)
    assert missing.returncode == 2 and f"nosuch.py: no such file in {tmp_path}" in missing.stderr
    both = kiln("-H", "n1", "train", "--args", "--epochs 1", "--", "true", cwd=tmp_path, home=tmp_path)
    assert both.returncode == 2 and "--args is for kiln's reference trainer" in both.stderr


def test_an_option_kiln_cannot_parse_is_one_line_and_exit_2(tmp_path):
    for argv, message in ((["train", "--timeout", "abc"], "kiln: --timeout wants a whole number, not 'abc'"),
                          (["train", "--nosuch"], "kiln: No idea what '--nosuch' is!")):
        done = kiln("-H", "n1", *argv, "--dry-run", cwd=tmp_path, home=tmp_path)
        assert done.returncode == 2 and done.stderr.strip() == message, done.stderr


@pytest.mark.parametrize(("argv", "expected"), [
    (["kiln", "up", "--help"], ["kiln", "--help", "up"]),
    (["kiln", "-H", "h1,h2", "train", "--mode", "tf-config", "-h"], ["kiln", "-H", "h1,h2", "--help", "train"]),
    (["kiln", "--help", "up"], ["kiln", "--help", "up"]),
    (["kiln", "up", "exp", "--provider", "local"], ["kiln", "up", "exp", "--provider", "local"]),
    (["kiln", "-H", "up"], ["kiln", "-H", "up"]),  # a host called up, no task: left to invoke
])
def test_help_after_a_task_is_help_for_that_task(argv, expected):
    assert help_before_task(argv, {"up": None, "train": None}) == expected


def test_kiln_lifts_its_open_file_limit_to_the_hard_one():
    """About four descriptors per node: the usual soft limit of 1024 would end a mesh near 250 nodes."""
    code = ("import resource; from kiln.proc import raise_descriptor_limit; "
            "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)); raise_descriptor_limit(); "
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard or hard == resource.RLIM_INFINITY)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=PROJECT)
    assert done.stdout.strip() == "True", done.stdout + done.stderr


def test_options_that_do_not_go_together_are_refused_before_anything_starts(tmp_path):
    (tmp_path / "x.py").write_text("")
    for argv, message in (
            (["train", "--min-np", "2", "--max-restarts", "1", "--", "python", "x.py"],
             "an elastic run (--min-np) goes on without lost nodes"),
            (["train", "--min-np", "2", "--mpi", "--", "python", "x.py"], "elastic Horovod runs over Gloo"),
            (["train", "--mode", "tf-config", "--ps", "1", "--no-chief"], "--no-chief is for a between-graph"),
            (["train", "--mode", "tf-config", "--no-chief", "--", "python", "x.py"], "--no-chief goes with --ps")):
        done = kiln("-H", "n1,n2", *argv[:1], "--dry-run", *argv[1:], cwd=tmp_path, home=tmp_path)
        assert done.returncode == 2 and message in done.stderr, (argv, done.stderr)


def test_a_number_that_is_no_number_is_refused_before_anything_starts(tmp_path):
    """`inf` reads as a float but is no count of minutes: one line naming it, exit 2, no queue made."""
    done = kiln("queue", "up", "kq", "--idle-minutes", "inf", cwd=tmp_path, home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--idle-minutes wants a number of 0 or more, not 'inf'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "queues").exists() and not list(tmp_path.glob("**/queue.json"))
