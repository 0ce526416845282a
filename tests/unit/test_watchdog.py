"""The watchdog's verdict with each sign of work: output silence is a stall only when the node shows none."""

from bootstrap.node import runs_gpu_busy
from bootstrap.watchdog import CPU_SIGN_RATE, Activity, Progress, Sign, describe_stall, hung, late_verdicts


def silent_streams(now: float) -> list[str]:
    output = Progress()
    output.observe(0, {"worker-0@node1": 10, "worker-1@node2": 10})
    return output.silent(now, minimum=60)


def test_a_silent_process_whose_node_spends_cpu_time_is_busy_not_hung():
    activity = Activity()
    for t in range(0, 200, 10):  # node2 computes a second of CPU every 10 s, node1 sleeps
        activity.observe(t, "node1", Sign(cpu=0.5))
        activity.observe(t, "node2", Sign(cpu=0.5 + t / 10))
    assert silent_streams(190) == ["worker-0@node1", "worker-1@node2"]
    assert hung(silent_streams(190), activity, 190, 60) == ["worker-0@node1"]


def test_cpu_time_below_the_sign_over_a_while_is_no_work():
    activity = Activity()
    for t in range(0, 2000, 10):  # an idle agent's helper thread: a thousandth of a core, for however long
        activity.observe(t, "node1", Sign(cpu=1 + t * 0.001))
    assert activity.idle(1990, "node1") == 1990
    assert hung(["a@node1"], activity, 1990, 60) == ["a@node1"]


def test_work_is_a_rate_between_two_looks():
    activity = Activity()
    activity.observe(0, "node1", Sign(cpu=10))
    activity.observe(2, "node1", Sign(cpu=10 + 2 * CPU_SIGN_RATE * 0.9))  # just under the rate
    assert activity.idle(2, "node1") == 2
    activity.observe(4, "node1", Sign(cpu=10 + 2 * CPU_SIGN_RATE * 0.9 + 2 * CPU_SIGN_RATE * 1.1))
    assert activity.idle(4, "node1") == 0


def test_a_process_that_ends_takes_its_cpu_time_out_but_the_one_left_still_shows_work():
    activity = Activity()
    activity.observe(0, "node1", Sign(cpu=3000))  # four shards; three end, taking 2999 CPU-s with them
    activity.observe(1, "node1", Sign(cpu=1))
    activity.observe(2, "node1", Sign(cpu=1.5))  # the last one, busy: half a core
    assert activity.idle(2, "node1") == 0


def test_a_busy_gpu_is_work():
    activity = Activity()
    activity.observe(0, "node1", Sign(cpu=3))
    activity.observe(100, "node1", Sign(cpu=3, gpu_busy=True))
    assert activity.idle(150, "node1") == 50
    assert hung(["rank-0@node1"], activity, 150, 60) == []
    assert hung(["rank-0@node1"], activity, 170, 60) == ["rank-0@node1"]


def test_a_touched_heartbeat_file_is_work():
    activity = Activity()
    activity.observe(0, "node1", Sign(beat=1000.0))
    activity.observe(50, "node1", Sign(beat=1000.0))
    activity.observe(90, "node1", Sign(beat=1090.0))
    assert activity.idle(140, "node1") == 50
    assert hung(["a@node1"], activity, 140, 60) == []


def test_a_node_first_seen_now_is_not_idle():
    assert Activity().idle(500, "node3") == 0
    assert hung(["a@node3"], Activity(), 500, 60) == []


def test_a_step_that_goes_back_is_a_restart_not_a_stall():
    steps = Progress()
    steps.observe(0, {"rank-0@node1": 499})
    steps.observe(5, {"rank-0@node1": 1})  # an elastic restart resumed from the checkpoint at step 0
    assert steps.silent(6, minimum=3) == []


def test_signs_read_from_a_node_answer_and_an_old_node_without_them():
    assert Sign.from_answer({"cpu": 2.5, "gpu_busy": True, "beat": 7}) == Sign(2.5, True, 7.0)
    assert Sign.from_answer({}) == Sign()


def test_the_stall_message_names_what_was_looked_at():
    assert describe_stall([], 60, ["worker-1@node2"], 6) == [
        "no output and no sign of work (CPU time, a GPU busy, the heartbeat file) for over 6s from worker-1@node2"]
    assert describe_stall(["rank-0@node1"], 75.2, [], 60) == [
        "no step progress and no sign of work (CPU time, a GPU busy, the heartbeat file) for over 75s from "
        "rank-0@node1"]
    assert describe_stall([], 75.2, [], 60, ["rank-1@node2"], 600) == [
        "no step progress for over 600s from rank-1@node2 while its processes stay busy (a collective that hangs "
        "keeps its GPU or CPU busy)"]


def steps_then(stop_at: float) -> Progress:
    """Two streams stepping every second until `stop_at`, then still."""
    steps = Progress()
    for t in range(0, int(stop_at) + 1):
        steps.observe(t, {"worker-0@node1": t, "worker-1@node2": t})
    return steps


def test_a_late_step_on_a_node_that_shows_no_work_is_a_stall_at_the_limit():
    steps, activity = steps_then(30), Activity()
    for t in range(0, 200, 10):
        activity.observe(t, "node1", Sign(cpu=1.0 + min(t, 30)))  # busy until its steps stop, then idle
        activity.observe(t, "node2", Sign(cpu=1.0 + t))  # busy throughout (an evaluation, a spinning collective)
    late, limit = steps.stalled(190, factor=20, minimum=60)
    assert (late, limit) == (["worker-0@node1", "worker-1@node2"], 60)
    assert late_verdicts(late, steps, activity, 190, limit, 600) == (["worker-0@node1"], [])


def test_a_late_step_on_a_busy_node_is_a_stall_only_past_the_busy_limit():
    steps, activity = steps_then(30), Activity()
    for t in range(0, 700, 10):
        activity.observe(t, "node2", Sign(cpu=1.0 + t))
    assert late_verdicts(["worker-1@node2"], steps, activity, 600, 60, 600) == ([], [])  # an evaluation, say
    assert late_verdicts(["worker-1@node2"], steps, activity, 640, 60, 600) == ([], ["worker-1@node2"])
    assert late_verdicts(["worker-1@node2"], steps, activity, 100, 60, 30) == ([], ["worker-1@node2"]), \
        "never sooner than the step limit itself"


def test_a_gpu_counts_as_the_runs_work_only_where_a_process_of_the_run_computes_on_it():
    apps = "4242, GPU-aaa\n5151, GPU-bbb\n"
    gpus = "GPU-aaa, 0\nGPU-bbb, 100\nGPU-ccc, 97\n"
    assert runs_gpu_busy(apps, gpus, [5151]) is True
    assert runs_gpu_busy(apps, gpus, [4242]) is False, "its GPU is idle; another program's is busy"
    assert runs_gpu_busy(apps, gpus, [7]) is False
    assert runs_gpu_busy("", "", [4242]) is False
