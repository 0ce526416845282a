import json

import pytest

from bootstrap import topology
from bootstrap.launch import (
    Launch,
    NodePaths,
    Program,
    RunPlan,
    Verdict,
    describe_failure,
    exited_ok,
    judge,
    launch_command,
    plan_horovod,
    plan_tf_config,
    process_env,
)

REFERENCE = Program()

PATHS = NodePaths("/root/kiln")
NAMES = ("node1", "node2", "node3")
PY = "/v/bin/python"


def test_process_env_puts_the_shim_first_and_tags_the_run():
    assert process_env("r1", PY, PATHS) == {
        "KILN_RUN_ID": "r1",
        "KILN_MODEL_DIR": "/root/kiln/runs/r1/model",
        "KILN_CHECKPOINT_DIR": "/root/kiln/runs/r1/checkpoints",
        "KILN_OUTPUT_DIR": "/root/kiln/runs/r1/output",
            "KILN_HEARTBEAT": "/root/kiln/runs/r1/heartbeat",
        "PYTHONPATH": "/root/kiln/lib",
        "PYTHONUNBUFFERED": "1",
        "TF_USE_LEGACY_KERAS": "1",
        "PATH": "/root/kiln/lib/shim:/v/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }


def test_a_user_program_runs_from_the_project_with_its_checkpoint_dir():
    env = process_env("r1", PY, PATHS, Program(("python", "train.py"), checkpoint_dir="/data/ckpt"))
    assert env["PYTHONPATH"] == "/root/kiln/code"
    assert env["KILN_CHECKPOINT_DIR"] == "/data/ckpt"


def test_horovod_plan_is_one_horovodrun_on_the_first_node():
    plan = plan_horovod("r1", NAMES, [1, 1, 1], python=PY, paths=PATHS, program=Program(trainer_args=("--epochs", "2")),
                        nic="eth0")
    run = "/root/kiln/runs/r1"
    assert plan == RunPlan("r1", "horovod", NAMES, (Launch(
        0, "horovodrun",
        (PY, "/root/kiln/lib/shim/horovodrun.py", "-np", "3", "--hostfile", f"{run}/hostfile", "--gloo",
         "--start-timeout", "60", "--gloo-timeout-seconds", "60",
         "--network-interfaces", "eth0", "--output-filename", f"{run}/ranks", "/root/kiln/lib/shim/kiln-rank",
         PY, "-m", "trainer", "--strategy", "horovod", "--run-dir", run, "--model-dir", f"{run}/model",
         "--epochs", "2"),
        {**process_env("r1", PY, PATHS), "KILN_NUM_NODES": "3", "KILN_HOST_NAMES": "node1,node2,node3",
         "KILN_HOST_SLOTS": "1,1,1", "KILN_HOST_GPUS": "0,0,0"},
        {f"{run}/hostfile": "node1 slots=1\nnode2 slots=1\nnode3 slots=1\n"},
        "/root/kiln/lib",
    ),), ("horovodrun",), ("node1", "node2", "node3"), checkpoint_dir=f"{run}/checkpoints")


def test_tf_config_plan_gives_each_process_its_own_tf_config():
    topo = topology.plan_tf_config(NAMES, [1, 1, 1], ps=1)
    plan = plan_tf_config("r2", topo, python=PY, paths=PATHS, program=REFERENCE)
    assert [(launch.host, launch.task) for launch in plan.launches] == [
        (0, "chief-0"), (0, "worker-0"), (1, "worker-1"), (2, "worker-2"), (0, "ps-0")]
    assert plan.finishing == ("chief-0",)
    configs = [json.loads(launch.env["TF_CONFIG"]) for launch in plan.launches]
    assert configs[4] == {"cluster": {"chief": ["node1:23456"],
                                      "worker": ["node1:23457", "node2:23456", "node3:23456"],
                                      "ps": ["node1:23458"]},
                          "task": {"type": "ps", "index": 0}}
    assert plan.launches[1].argv == (PY, "-m", "trainer", "--strategy", "ps", "--run-dir", "/root/kiln/runs/r2",
                                     "--model-dir", "/root/kiln/runs/r2/model")


def test_multiworker_plan_uses_the_multiworker_strategy():
    topo = topology.plan_tf_config(NAMES[:2], [1, 1])
    plan = plan_tf_config("r3", topo, python=PY, paths=PATHS, program=Program(trainer_args=("--epochs", "1")))
    assert {launch.argv[4] for launch in plan.launches} == {"multiworker"}
    assert plan.finishing == ("worker-0", "worker-1")


def test_launch_command_writes_files_before_starting():
    launch = Launch(0, "horovodrun", ("hr",), {}, {"/r/hostfile": "node1 slots=1\n"})
    command = launch_command(launch, NodePaths("/r0"), "x")
    assert command.startswith("printf %s 'node1 slots=1\n' > /r/hostfile && mkdir -p /r0/runs/x && {")
    assert command.endswith("; [ -s /r0/runs/x/horovodrun.pid ]")


def _plan():
    topo = topology.plan_tf_config(NAMES, [1, 1, 1], ps=1)
    return plan_tf_config("r", topo, python=PY, paths=PATHS, program=REFERENCE)


def test_judge_running_done_and_failed():
    plan = _plan()
    running = {0: {"chief-0": {"state": "running"}, "worker-0": {"state": "running"}, "ps-0": {"state": "running"}},
               1: {"worker-1": {"state": "running"}}, 2: {"worker-2": {"state": "starting"}}}
    assert judge(plan, running) == Verdict(False)
    done = {**running, 0: {**running[0], "chief-0": {"state": "exited", "code": 0}}}
    assert judge(plan, done) == Verdict(True)
    killed = {**running, 2: {"worker-2": {"state": "exited", "code": 137}}}
    assert judge(plan, killed) == Verdict(True, (("node3", "worker-2", 137),))
    lost = {**running, 1: {"worker-1": {"state": "lost"}}}
    assert judge(plan, lost) == Verdict(True, (("node2", "worker-1", None),))
    assert exited_ok(plan, running) == set() and exited_ok(plan, done) == {"chief-0"}
    assert exited_ok(plan, killed) == set()  # exited, but not well: that is judge's to say


def test_with_parameter_servers_a_worker_that_ends_on_its_own_is_finished_not_failed():
    """The between-graph shape: each worker stops once the global step is reached, at its own time, and the
    servers never end; the run is done when the chief has, and a worker that fails still fails it."""
    plan = _plan()
    assert plan.may_finish == {"worker-0", "worker-1", "worker-2"} and plan.finishing == ("chief-0",)
    states = {0: {"chief-0": {"state": "running"}, "worker-0": {"state": "exited", "code": 0},
                  "ps-0": {"state": "running"}},
              1: {"worker-1": {"state": "exited", "code": 0}}, 2: {"worker-2": {"state": "running"}}}
    assert judge(plan, states) == Verdict(False)
    states[0]["chief-0"] = {"state": "exited", "code": 0}
    assert judge(plan, states) == Verdict(True)
    states[2]["worker-2"] = {"state": "exited", "code": 1}
    assert judge(plan, states) == Verdict(True, (("node3", "worker-2", 1),))
    states[0]["ps-0"] = {"state": "exited", "code": 0}
    assert ("node1", "ps-0", 0) in judge(plan, states).failed, "a server that ends is no finished worker"


def test_without_parameter_servers_every_worker_must_finish():
    topo = topology.plan_tf_config(NAMES, [1, 1, 1])
    plan = plan_tf_config("r", topo, python=PY, paths=PATHS, program=REFERENCE)
    assert plan.may_finish == frozenset() and set(plan.finishing) == {"worker-0", "worker-1", "worker-2"}
    states = {0: {"worker-0": {"state": "exited", "code": 0}}, 1: {"worker-1": {"state": "running"}},
              2: {"worker-2": {"state": "exited", "code": 0}}}
    assert judge(plan, states) == Verdict(False)


def test_failure_message_names_host_and_horovod_rank():
    plan = plan_horovod("r", NAMES, [1, 1, 1], python=PY, paths=PATHS, program=REFERENCE, nic=None)
    verdict = Verdict(True, (("node1", "horovodrun", 1),))
    log = ("[1]<stderr>:Killed\nProcess 2 exit with status code 137.\n"
           "Terminating remaining workers after failure of Process 2.\n")
    assert describe_failure(plan, verdict, log) == (
        "horovodrun on node1 exited with status 1; rank 2 on node3 failed first")
    verdict = Verdict(True, (("node2", "worker-1", None), ("node3", "ps-0", 0)))
    assert describe_failure(_plan(), verdict) == (
        "worker-1 on node2 vanished without an exit code; ps-0 on node3 exited 0 before the run was done")


def test_progress_flags_streams_past_the_stall_limit():
    from bootstrap.watchdog import Progress, blame

    progress = Progress()
    for t, step in ((0, 1), (1, 11), (2, 21), (3, 31)):
        progress.observe(t, {"rank-0@node1": step, "rank-1@node2": step})
    progress.observe(4, {"rank-0@node1": 41, "rank-1@node2": 31})
    assert progress.stalled(5, factor=3, minimum=0.5) == ([], 3)
    assert progress.stalled(6.5, factor=3, minimum=0.5) == (["rank-1@node2"], 3)
    assert progress.stalled(6.5, factor=3, minimum=10) == ([], 10)
    assert blame(["rank-1@node2"], []) == ["node2"]
    assert blame(["rank-0@node1", "rank-1@node2"], ["node2"]) == ["node2"]
    assert Progress().stalled(100, factor=3, minimum=1) == ([], 1)


def test_a_process_frozen_after_steps_seen_in_one_look_is_still_found():
    """Its first steps all came between two looks (the launcher's frozen rank-1 test: steps 1-5 in 0.2 s), so no
    stream ever moved twice: the time to its first step (start-up included) stands in for its pace."""
    from bootstrap.watchdog import Progress

    progress = Progress()
    progress.observe(0, {})  # the watch begins: TensorFlow is still importing
    progress.observe(15, {"rank-0@node1": 5, "rank-1@node2": 5})  # steps 1-5 since the last look, then frozen
    assert progress.stalled(60, factor=5, minimum=5) == ([], 75)
    assert progress.stalled(91, factor=5, minimum=5) == (["rank-0@node1", "rank-1@node2"], 75)
    assert progress.stalled(91, factor=5, minimum=120) == ([], 120)
    present = Progress()  # steps there at the first look: nothing to measure a pace by yet
    present.observe(0, {"rank-0@node1": 5})
    assert present.stalled(1000, factor=5, minimum=5) == ([], 5)


def test_failed_hosts_blame_the_rank_horovod_names():
    from bootstrap.launch import failed_hosts

    plan = plan_horovod("r", NAMES, [1, 1, 1], python=PY, paths=PATHS, program=REFERENCE, nic=None)
    verdict = Verdict(True, (("node1", "horovodrun", 1),))
    assert failed_hosts(plan, verdict, "Terminating remaining workers after failure of Process 1.") == ["node2"]
    assert failed_hosts(plan, verdict, "") == ["node1"]


def test_a_single_node_horovod_run_names_no_interface():
    plan = plan_horovod("r", ("node1",), [2], python=PY, paths=PATHS, program=REFERENCE, nic="eth0")
    assert "--network-interfaces" not in plan.launches[0].argv
    assert plan.launches[0].argv[2:4] == ("-np", "2")


def test_a_single_process_horovod_run_keeps_its_log_in_one_file():
    plan = plan_horovod("r", ("node1",), [1], python=PY, paths=PATHS, program=REFERENCE, nic="eth0")
    assert "--output-filename" not in plan.launches[0].argv


def test_plan_run_decides_the_ports_once_for_preflight():
    from bootstrap.launch import RunSpec, plan_run

    spec = RunSpec("r1", "tf-config", ("n1", "n2"), (1, 2), "/v/bin/python", "/root/kiln", ps=1, base_port=4000)
    plan = plan_run(spec)
    listened = {int(address.rsplit(":", 1)[1]) for launch in plan.launches
                for addresses in json.loads(launch.env["TF_CONFIG"])["cluster"].values() for address in addresses}
    assert plan.ports == tuple(sorted(listened)) and plan.ports[0] == 4000
    assert plan_run(RunSpec("r2", "horovod", ("n1",), (2,), "/v/bin/python", "/root/kiln")).ports == ()


@pytest.mark.parametrize(("mode", "names", "logs_in"), [
    ("horovod", ("n1", "n2"), True),  # horovodrun starts n2's ranks over SSH
    ("horovod", ("n1",), False),
    ("tf-config", ("n1", "n2"), False), ("torchrun", ("n1", "n2"), False), ("jax", ("n1", "n2"), False)])
def test_only_a_horovod_run_across_nodes_logs_in_between_them(mode, names, logs_in):
    from bootstrap.launch import Program, RunSpec, plan_run

    spec = RunSpec("r1", mode, names, (1,) * len(names), "/v/bin/python", "/root/kiln",
                   Program(argv=("python", "p.py")))
    assert plan_run(spec).logs_in_between_nodes is logs_in


def test_an_attempt_names_the_frozen_host_and_is_not_restarted_when_processes_survive():
    from bootstrap.launch import Attempt, RunPlan, Verdict, judge_attempt, should_restart

    plan = RunPlan("r", "tf-config", ("n1", "n2"), (), ("worker-0",))
    failed = Verdict(True, (("n1", "worker-0", 1),))
    attempt = judge_attempt(plan, failed, frozen=["n2"])
    assert attempt == Attempt("worker-0 on n1 exited with status 1; stalled: n2 (a process there is stopped)",
                              ("n2",))
    assert should_restart(attempt, 0, 1) and not should_restart(attempt, 1, 1)
    stuck = judge_attempt(plan, Verdict(True, ()), error="no step progress", error_hosts=["n1"], left=["n2"])
    assert stuck.failure == "no step progress; could not stop: n2" and not should_restart(stuck, 0, 3)
    assert not should_restart(judge_attempt(plan, Verdict(True, ())), 0, 3)


def test_a_lost_host_is_replaced_not_restarted_on_and_only_up_to_the_limit():
    from bootstrap.launch import RunPlan, Verdict, judge_attempt, next_action

    plan = RunPlan("r", "tf-config", ("n1", "n2", "n3"), (), ("worker-0",))
    gone = judge_attempt(plan, Verdict(True, ()), error="status failed on 1 host(s)", error_hosts=["n2"],
                         left=["n2"])
    assert next_action(gone, lost=["n2"], max_restarts=5) == "finish"  # no restart where a node is gone
    assert next_action(gone, lost=["n2"], max_recoveries=1) == "recover"
    assert next_action(gone, lost=["n2"], recoveries_done=1, max_recoveries=1) == "finish"
    stuck = judge_attempt(plan, Verdict(True, ()), error="lost", error_hosts=["n2"], left=["n2", "n3"])
    assert next_action(stuck, lost=["n2"], max_recoveries=3) == "finish"  # n3 answers but would not stop
    crashed = judge_attempt(plan, Verdict(True, (("n3", "worker-2", 1),)))
    assert next_action(crashed, max_restarts=1, max_recoveries=1) == "restart"
    assert next_action(crashed, max_recoveries=1) == "finish"
    assert next_action(judge_attempt(plan, Verdict(True, ())), lost=["n2"], max_recoveries=1) == "finish"


def test_a_user_command_runs_in_every_process_with_the_nodes_python():
    from bootstrap.launch import user_argv

    assert user_argv(["train.py", "--epochs", "3"], PY) == [PY, "train.py", "--epochs", "3"]
    assert user_argv(["python", "-m", "mypkg.train"], PY) == [PY, "-m", "mypkg.train"]
    assert user_argv(["python3", "t.py"], PY) == [PY, "t.py"]
    assert user_argv(["./run.sh", "a b"], PY) == ["./run.sh", "a b"]
    topo = topology.plan_tf_config(NAMES, [1, 1, 1], chief=True)
    plan = plan_tf_config("u", topo, python=PY, paths=PATHS, program=Program(("python", "mwms.py", "--x", "a b")))
    assert {launch.argv for launch in plan.launches} == {(PY, "mwms.py", "--x", "a b")}
    assert {launch.cwd for launch in plan.launches} == {"/root/kiln/code"}
    outputs = [(launch.env["KILN_TASK"], launch.env["KILN_OUTPUT_DIR"]) for launch in plan.launches]
    assert outputs == [(t, f"/root/kiln/runs/u/output/{t}") for t in ("chief-0", "worker-0", "worker-1", "worker-2")]


def test_horovod_runs_a_user_command_through_the_rank_shim():
    plan = plan_horovod("u", NAMES, [1, 1, 1], python=PY, paths=PATHS, program=Program(("hvd.py",)), nic=None)
    argv = plan.launches[0].argv
    assert argv[-3:] == ("/root/kiln/lib/shim/kiln-rank", PY, "hvd.py")
    assert plan.launches[0].cwd == "/root/kiln/code"
    command = launch_command(plan.launches[0], PATHS, "u")
    assert "mkdir -p /root/kiln/runs/u/output && " in command


def test_the_program_check_names_what_is_missing():
    from bootstrap.launch import program_check

    assert program_check(REFERENCE, PY, PATHS) is None
    check = program_check(Program(("python", "train.py")), "/bin/sh", PATHS)
    assert check.startswith("cd /root/kiln/code && PATH=") and "[ -f train.py ]" in check


def test_the_program_check_runs_in_a_shell(tmp_path):
    import subprocess

    from bootstrap.launch import program_check

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("")

    def run(*argv, python="/bin/sh"):
        command = program_check(Program(argv), python, NodePaths(str(tmp_path)))
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=10)

    assert run("python", "train.py").returncode == 0
    missing = run("python", "other.py")
    assert missing.returncode == 1 and missing.stdout.strip() == f"other.py: no such file in {tmp_path}/code"
    assert run("python", "train.py", python="/nonexistent/python").stdout.startswith("/nonexistent/python: no such")
    unknown = run("no-such-command-kiln", "x")
    assert unknown.returncode == 1 and unknown.stdout.startswith("no-such-command-kiln: command not found (PATH=")
    assert run("./run.sh").stdout.strip() == f"./run.sh: no such executable (from {tmp_path}/code)"
    assert run("true").returncode == 0


def test_silent_processes_of_a_user_program_are_watched_by_their_output():
    from bootstrap.watchdog import Progress, output_streams

    topo = topology.plan_tf_config(NAMES, [1, 1, 1], ps=1)
    plan = plan_tf_config("u", topo, python=PY, paths=PATHS, program=Program(("ps.py",)))
    found = {"node1": {"metrics": {}, "output": {"chief-0": 10, "worker-0": 0, "ps-0": 0}},
             "node2": {"metrics": {}, "output": {"worker-1": 0}}}
    assert output_streams(plan, found) == {"chief-0@node1": 10}  # servers wait in silence
    reference = plan_tf_config("r", topo, python=PY, paths=PATHS, program=REFERENCE)
    assert output_streams(reference, found) == {}  # kiln's trainer is watched by its steps

    hvd = plan_horovod("h", NAMES, [1, 1, 1], python=PY, paths=PATHS, program=Program(("hvd.py",)), nic=None)
    ranks = {"node1": {"metrics": {"rank-0": {"step": 3}},
                       "output": {"horovodrun": 50, "rank-0": 20, "rank-1": 5, "rank-2": 7}}}
    assert output_streams(hvd, ranks) == {"rank-1@node2": 5, "rank-2@node3": 7}
    single = plan_horovod("h", NAMES[:1], [1], python=PY, paths=PATHS, program=Program(("hvd.py",)), nic=None)
    assert output_streams(single, {"node1": {"metrics": {}, "output": {"horovodrun": 9}}}) == {"horovodrun@node1": 9}

    progress = Progress()
    progress.observe(0, {"a@n1": 0, "b@n2": 0})
    progress.observe(4, {"a@n1": 10, "b@n2": 0})
    assert progress.silent(5, minimum=3) == ["b@n2"]
    assert progress.silent(5, minimum=6) == []


def test_every_node_watches_for_interruption_notices_as_part_of_the_run():
    import shlex

    from bootstrap.launch import NodePaths, watcher_command

    command = watcher_command("r1", "/v/bin/python", NodePaths("/root/kiln"), 600)
    assert command.startswith("mkdir -p /root/kiln/runs/r1 && { setsid sh -c ")
    inner = shlex.split(shlex.split(command.split("setsid ", 1)[1].rsplit(" < /dev/null", 1)[0])[2])
    assert inner[:3] == ["env", "KILN_RUN_ID=r1", "/v/bin/python"]  # so stopping the run stops the watcher
    watcher = inner[3:inner.index("--") + 1]
    assert watcher == ["/root/kiln/lib/shim/interruption.py", "--source", "any", "--interval", "2", "--timeout",
                       "600", "--run-dir", "/root/kiln/runs/r1", "--"]
    # the watcher adds the grace its notice's source leaves (GCE's is shorter than EC2's)
    assert inner[inner.index("--") + 1:inner.index(">>")] == [
        "/v/bin/python", "-S", "/root/kiln/lib/node.py", "stop", "r1"]
    assert inner[inner.index(">>") + 1:] == ["/root/kiln/runs/r1/interruption.log", "2>&1"]
    with_tasks = watcher_command("r1", "/v/bin/python", NodePaths("/root/kiln"), 600, ["worker-0", "ps-0"], "gce")
    assert "--run-dir /root/kiln/runs/r1 --until-exited worker-0,ps-0 --" in with_tasks
    assert "interruption.py --source gce " in with_tasks


def test_placeholders_fill_the_classic_between_graph_flags_per_process():
    """TensorFlow's old distributed MNIST shape: --job_name, --task_index, --ps_hosts, --worker_hosts."""
    from bootstrap.launch import RunSpec, plan_run

    argv = ("python", "mnist_replica.py", "--job_name={kiln:task_type}", "--task_index={kiln:task_index}",
            "--ps_hosts={kiln:ps_hosts}", "--worker_hosts={kiln:worker_hosts}")
    spec = RunSpec("r1", "tf-config", NAMES, (None, None, None), PY, "/root/kiln", Program(argv), ps=1,
                   no_chief=True, base_port=4000)
    plan = plan_run(spec)
    assert [item.task for item in plan.launches] == ["worker-0", "worker-1", "worker-2", "ps-0"]
    assert plan.launches[1].argv[2:] == ("--job_name=worker", "--task_index=1", "--ps_hosts=node1:4001",
                                         "--worker_hosts=node1:4000,node2:4000,node3:4000")
    assert plan.launches[3].argv[2:4] == ("--job_name=ps", "--task_index=0")
    assert set(plan.finishing) == {"worker-0", "worker-1", "worker-2"} and plan.may_finish == frozenset()


@pytest.mark.parametrize(("word", "expected"), [
    ("{kiln:local_rank}", "1"), ("--gpus={kiln:gpus}", "--gpus=0"),
    ("ckpt-{epoch}-{kiln:task}", "ckpt-{epoch}-worker-1"),
    ("python p.py --job_name={kiln:task_type} --n {kiln:num_nodes}", "python p.py --job_name=worker --n 3"),
])
def test_a_placeholder_anywhere_in_a_word_and_a_programs_own_braces_left_alone(word, expected):
    from bootstrap.launch import check_placeholders, fill_placeholders, placeholder_values

    check_placeholders(["sh", "-c", word], "tf-config")
    topo = topology.plan_tf_config(NAMES, [1, 1, 1])
    plan = plan_tf_config("r", topo, python=PY, paths=PATHS, program=Program(("sh", "-c", word)))
    values = placeholder_values({**plan.launches[1].env, "LOCAL_RANK": "1"}, topo, topo.processes[1])
    assert fill_placeholders([word], values) == (expected,)


@pytest.mark.parametrize(("argv", "mode", "message"), [
    (["{kiln:nosuch}"], "tf-config", "{kiln:nosuch}: no such placeholder in tf-config mode (known: {kiln:task}"),
    (["--x={kiln:task_type}"], "run", "{kiln:task_type}: no such placeholder in run mode"),
    (["{kiln:task_index}"], "horovod", "{kiln:task_index}: in horovod mode every rank runs the same command"),
    (["--hosts={kiln:ps_hosts"], "tf-config", "a {kiln:...} placeholder without its closing brace"),
])
def test_an_unknown_placeholder_is_refused_before_anything_starts(argv, mode, message):
    from bootstrap.errors import UsageError
    from bootstrap.launch import check_placeholders

    with pytest.raises(UsageError) as error:
        check_placeholders(argv, mode)
    assert message in str(error.value)


def test_kiln_run_fills_its_shard_placeholders():
    from bootstrap.launch import plan_processes

    plan = plan_processes("r", NAMES, (None, None, None), python=PY, paths=PATHS,
                          program=Program(("process.py", "--part", "{kiln:shard_index}/{kiln:shard_count}")))
    assert [item.argv[-1] for item in plan.launches] == ["0/3", "1/3", "2/3"]


def test_a_process_that_died_because_its_port_was_taken_says_so():
    from bootstrap.launch import port_taken

    log = ("2026-11-25 E tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc: UNKNOWN: Could not start "
           "gRPC server\n")
    assert port_taken(log) and port_taken("OSError: [Errno 98] Address already in use") and not port_taken("oom")
    verdict = Verdict(True, (("node2", "worker-1", 1), ("node3", "worker-2", 1)))
    assert describe_failure(_plan(), verdict, logs={"worker-1": log, "worker-2": "Killed"}) == (
        "worker-1 on node2 exited with status 1 (its port was taken: another program listens on it); "
        "worker-2 on node3 exited with status 1")
