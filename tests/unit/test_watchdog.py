"""The watchdog's verdict with each sign of work: output silence is a stall only when the node shows none."""

from bootstrap.watchdog import CPU_SIGN_S, Activity, Progress, Sign, describe_stall, hung


def silent_streams(now: float) -> list[str]:
    output = Progress()
    output.observe(0, {"worker-0@node1": 10, "worker-1@node2": 10})
    return output.silent(now, minimum=60)


def test_a_silent_process_whose_node_spends_cpu_time_is_busy_not_hung():
    activity = Activity()
    for t in range(0, 200, 10):  # node2 computes a second of CPU every 10 s, node1 sleeps
        activity.observe(t, "node1", Sign(cpu=0.5))
        activity.observe(t, "node2", Sign(cpu=0.5 + t / 10 * CPU_SIGN_S))
    assert silent_streams(190) == ["worker-0@node1", "worker-1@node2"]
    assert hung(silent_streams(190), activity, 190, 60) == ["worker-0@node1"]


def test_cpu_time_below_the_sign_over_a_while_is_no_work():
    activity = Activity()
    for t in range(0, 200, 10):  # an idle agent's heartbeat thread: a hundredth of a second now and then
        activity.observe(t, "node1", Sign(cpu=1 + t * 0.001))
    assert activity.idle(190, "node1") == 190
    assert hung(["a@node1"], activity, 190, 60) == ["a@node1"]


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


def test_signs_read_from_a_node_answer_and_an_old_node_without_them():
    assert Sign.from_answer({"cpu": 2.5, "gpu_busy": True, "beat": 7}) == Sign(2.5, True, 7.0)
    assert Sign.from_answer({}) == Sign()


def test_the_stall_message_names_what_was_looked_at():
    assert describe_stall([], 60, ["worker-1@node2"], 6) == [
        "no output and no sign of work (CPU time, a GPU busy, the heartbeat file) for over 6s from worker-1@node2"]
    assert describe_stall(["rank-0@node1"], 75.2, [], 60) == ["no step progress for over 75s from rank-0@node1"]
