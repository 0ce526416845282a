"""Task files: a run described once in YAML, checked against the schema with the line of what is wrong, turned into
kiln's own options, and overridden by the flags given on the command line (kiln train --task, kiln launch FILE)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap import launch, taskfile
from bootstrap.errors import UsageError
from bootstrap.main import given_flags, make_program
from kiln.paths import PROJECT

KILN = Path(sys.executable).with_name("kiln")
EXAMPLES = PROJECT / "examples"
TORCHRUN = """\
name: ddp
resources:
  provider: local
  count: 2
workdir: .
setup: pip install -r requirements.txt
run: python torch_ddp.py --epochs 2
mode: torchrun
envs:
  OMP_NUM_THREADS: 1
  NAME: "a b"
checkpoint_dir: /data/ckpt
"""


def read(text: str, folder: Path = Path("/work/t")) -> taskfile.Task:
    return taskfile.parse(text, folder / "task.yaml")


def refused(text: str) -> str:
    with pytest.raises(UsageError) as caught:
        read(text)
    return str(caught.value)


def test_a_task_file_gives_the_options_of_kilns_own_flags():
    task = read(TORCHRUN)
    assert task.command == ("python", "torch_ddp.py", "--epochs", "2")
    assert task.setup == "pip install -r requirements.txt"
    assert task.options == {"name": "ddp", "provider": "local", "count": 2, "code": "/work/t", "mode": "torchrun",
                            "env": ["OMP_NUM_THREADS=1", "NAME=a b"], "checkpoint_dir": "/data/ckpt"}


def test_run_may_be_a_list_of_words_and_workdir_is_from_the_files_folder(tmp_path):
    task = read("run: [python, t.py, 'a b']\nworkdir: sub/dir\n", tmp_path)
    assert task.command == ("python", "t.py", "a b")
    assert task.options["code"] == str(tmp_path / "sub" / "dir")
    assert read("mode: horovod\n").command == ()  # no run: kiln's reference trainer


@pytest.mark.parametrize(("text", "said"), [
    ("name: x\nresources:\n  provider: local\n  gpu: H100:8\n", "task.yaml:4: resources.gpu: no such field (did you "
                                                                "mean gpus?)"),
    ("resources:\n  count: two\n", "task.yaml:2: resources.count: 'two' is not a whole number"),
    ("resources:\n  count: 0\n", "task.yaml:2: resources.count: 0 is below 1"),
    ("resources:\n  spot: maybe\n", "task.yaml:2: resources.spot: 'maybe' is not true or false"),
    ("mode: torch\n", "task.yaml:1: mode: 'torch' is not one of horovod, tf-config, torchrun, jax"),
    ("name: x\nenvs:\n  KILN_RUN_ID: a\n", "task.yaml:3: envs.KILN_RUN_ID: kiln sets it"),
    ("envs:\n  PATH: /bin\n", "task.yaml:2: envs.PATH: kiln sets it"),
    ("envs:\n  my-var: 1\n", "task.yaml:2: envs.my-var: 'my-var' is not a variable name"),
    ("envs:\n  DEBUG: true\n", "task.yaml:2: envs.DEBUG: True is not a string or a number (quote true and false)"),
    ("resources:\n  provider: mars\n", "task.yaml:2: resources.provider: 'mars' is not aws, gcp, azure, local"),
    ("name: My_Cluster\n", "task.yaml:1: name: 'My_Cluster' is not 1-32 of a-z, 0-9, '-'"),
    ("run: []\n", "task.yaml:1: run: [] is not a command"),
    ("workdir: ''\n", "task.yaml:1: workdir: empty"),
    ("name: x\nsetpu: make\n", "task.yaml:2: setpu: no such field (did you mean setup?)"),
    ("name: x\n  mode: [\n", "task.yaml:2: not YAML"),
    ("- python t.py\n", "task.yaml: a task file is a mapping of fields"),
])
def test_a_wrong_field_is_refused_naming_the_file_its_line_and_the_field(text, said):
    assert said in refused(text)


def test_the_first_wrong_field_in_the_file_is_the_one_named():
    said = refused("name: x\nresources:\n  count: 0\nmode: torch\nenvs:\n  PATH: x\n")
    assert ":3: resources.count" in said and "mode" not in said


def test_flags_given_override_the_file_and_envs_merge():
    task = read(TORCHRUN)
    passed = {"name": None, "mode": "horovod", "count": 1, "provider": "aws", "code": None, "env": ["NAME=c", "B=1"],
              "checkpoint_dir": None, "timeout": 3600}
    options = taskfile.merged(task, passed, given={"count", "env"})
    assert options["count"] == 1  # given on the command line
    assert options["mode"] == "torchrun" and options["provider"] == "local"  # not given: the file's
    assert options["timeout"] == 3600  # neither: the flag's default
    assert options["env"] == ["OMP_NUM_THREADS=1", "NAME=c", "B=1"]
    assert launch.parse_env(options["env"]) == (("OMP_NUM_THREADS", "1"), ("NAME", "c"), ("B", "1"))
    assert taskfile.unused(task, {"mode": None}) == ["checkpoint_dir", "code", "count", "env", "name", "provider"]


def test_a_task_files_name_and_launchs_name():
    assert taskfile.is_task_file("examples/task.yaml") and taskfile.is_task_file("t.yml")
    assert not taskfile.is_task_file("ddp") and not taskfile.is_task_file(None)
    assert taskfile.name_from("examples/Task_TorchRun.yaml") == "task-torchrun"
    assert taskfile.name_from("/x/___.yaml") == "task"
    assert len(taskfile.name_from("a" * 50 + ".yml")) == 32


@pytest.mark.parametrize(("items", "said"), [
    (["A"], "--env 'A': give NAME=VALUE"),
    (["KILN_RUN_ID=x"], "kiln sets it"),
    (["1A=x"], "not a variable name"),
])
def test_a_bad_env_flag_is_refused(items, said):
    with pytest.raises(UsageError, match=said):
        launch.parse_env(items)


def test_the_users_env_reaches_every_process_but_not_over_kilns_own():
    program = launch.Program(("python", "t.py"), env=(("OMP_NUM_THREADS", "2"), ("PYTHONUNBUFFERED", "0")))
    env = launch.process_env("r1", "/usr/bin/python3", launch.NodePaths("~/kiln"), program)
    assert env["OMP_NUM_THREADS"] == "2" and env["PYTHONUNBUFFERED"] == "0"
    assert env["KILN_RUN_ID"] == "r1" and env["PATH"].startswith("~/kiln/lib/shim:")


def test_the_examples_task_files_are_valid():
    for path in sorted(EXAMPLES.glob("task-*.yaml")):
        task = taskfile.load(path)
        assert task.command and task.options["mode"] in launch.MODES, path
        script = task.command[1]
        assert (Path(task.options["code"]) / script).is_file(), f"{path}: {script} is not in its workdir"
    assert {p.name for p in EXAMPLES.glob("task-*.yaml")} >= {"task-torchrun.yaml", "task-jax.yaml",
                                                               "task-tf-config.yaml"}


def test_the_flags_given_on_the_command_line_are_known_per_task():
    program = make_program()
    program.run(["kiln", "--help"], exit=False)  # loads the namespace and config, as a run does
    program.parse_core(["kiln", "launch", "t.yaml", "--count", "3", "--env", "A=1"])
    program.parse_collection()
    program.parse_tasks()
    assert given_flags(program.tasks) == {"launch": ["count", "env", "name"]}


def kiln(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(KILN), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "KILN_HOME": str(cwd / ".kiln")})


def test_kiln_train_reads_a_task_file_and_the_command_line_wins(tmp_path):
    (tmp_path / "t.py").write_text("")
    (tmp_path / "u.py").write_text("")
    (tmp_path / "task.yaml").write_text("run: python t.py --epochs 2\nmode: tf-config\nsetup: echo ready\n"
                                        "envs:\n  A: 1\nresources:\n  count: 2\n")
    done = kiln("-H", "n1,n2", "train", "--task", "task.yaml", "--env", "B=2", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "task.yaml: kiln train leaves out count (kiln launch uses them)" in done.stdout
    assert "setup on every node: sh -c 'echo ready'" in done.stdout
    assert f"{sys.executable} t.py --epochs 2" in done.stdout and done.stdout.count("TF_CONFIG=") == 2
    assert "and every process: A=1 B=2" in done.stdout
    other = kiln("-H", "n1,n2", "train", "--task", "task.yaml", "--mode", "horovod", "--dry-run", "--", "python",
                 "u.py", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    assert "u.py" in other.stdout and "t.py" not in other.stdout and "TF_CONFIG=" not in other.stdout


def test_kiln_launch_refuses_a_wrong_task_file_in_one_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("name: x\nresources:\n  provider: local\n  gpu: H100:8\n")
    done = kiln("launch", "bad.yaml", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == "kiln: bad.yaml:4: resources.gpu: no such field (did you mean gpus?)\n", done.stderr


def test_kiln_starts_without_the_schema_validator():
    """jsonschema is a tenth of a second at every kiln command's start: it is imported when a task file is read."""
    done = subprocess.run([sys.executable, "-c", "import sys, bootstrap.main; bootstrap.main.make_program(); "
                           "print('jsonschema' in sys.modules)"], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_a_managed_task_with_a_setup_in_a_container_image_is_refused_before_anything_starts(tmp_path):
    """A new machine's containers would start without the setup: refused, one line. Bare, the setup runs on the new
    machines too (test_managed)."""
    (tmp_path / "t.py").write_text("")
    (tmp_path / "task.yaml").write_text("run: python t.py\nmode: tf-config\nsetup: pip install x\nmanaged: true\n"
                                        "image: registry.example.com/kiln:cpu\n")
    done = kiln("-H", "n1,n2", "train", "--task", "task.yaml", "--dry-run", cwd=tmp_path)
    assert done.returncode == 2 and "a managed run's new machines start new containers without it" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    (tmp_path / "task.yaml").write_text("run: python t.py\nmode: tf-config\nsetup: pip install x\nmanaged: true\n")
    bare = kiln("-H", "n1,n2", "train", "--task", "task.yaml", "--dry-run", cwd=tmp_path)
    assert "setup" not in bare.stderr, bare.stderr  # (refused for want of a cluster kiln made: -H names hosts)


def test_kiln_launch_refuses_a_managed_setup_before_it_makes_anything(tmp_path):
    (tmp_path / "t.py").write_text("")
    (tmp_path / "task.yaml").write_text("name: ms\nresources:\n  provider: local\nimage: r.example.com/k:1\n"
                                        "run: python t.py\nsetup: pip install x\nmanaged: true\n")
    done = kiln("launch", "task.yaml", cwd=tmp_path)
    assert done.returncode == 2 and "a managed run's new machines start new containers without it" in done.stderr
    assert "local node" not in done.stdout and not (tmp_path / ".kiln" / "clusters" / "ms").exists()
