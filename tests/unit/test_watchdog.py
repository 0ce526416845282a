"""The watchdog's verdict with each sign of work: output silence is a stall only when the node shows none."""

from bootstrap.watchdog import CPU_SIGN_RATE, Activity, Progress, Sign, describe_stall, hung


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
    assert describe_stall(["rank-0@node1"], 75.2, [], 60) == ["no step progress for over 75s from rank-0@node1"]
