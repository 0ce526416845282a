"""The cloud-neutral skeleton of up and replace (bootstrap.providers.provision), with a cloud's verbs that record
what they are asked: every step's undo runs on a failure, the error names the step, the cluster file is written
once all is made, and a replacement that shows no host keys is removed."""

from __future__ import annotations

import dataclasses

import pytest

from bootstrap import state
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.providers import provision
from bootstrap.providers.failover import CloudError
from bootstrap.providers.provision import Nodes, Progress, Swap, Verbs

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


class Boom(CloudError):
    pass


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_HOME", str(tmp_path / "kiln"))
    return tmp_path / "kiln"


def verbs(log: list[str], *, fail_at: str | None = None, undo_fails: bool = False, usage: bool = False,
          keys: bool = True) -> Verbs:
    def make(progress: Progress, rollback, public_key: str) -> Nodes:
        assert public_key.startswith("ssh-ed25519 ")
        def undo(step: str) -> None:
            log.append(f"undo {step}")
            if undo_fails and step == "create the nodes":
                raise RuntimeError("still there")

        for step in ("create the network", "create the nodes"):
            progress.step = step
            rollback.push(f"undo {step}", lambda step=step: undo(step))
            if usage and step == "create the nodes":
                raise UsageError("name taken meanwhile")
            if step == fail_at:
                raise RuntimeError(f"{step} refused")
            log.append(step)
        return Nodes(("n-1", "n-2"), (Host("10.0.0.1", user="u"), Host("10.0.0.2", user="u")))

    return Verbs("test", Boom, make, lambda ids, timeout_s: {i: [KEY] for i in ids} if keys else {},
                 lambda nodes: log.append(f"save {','.join(nodes.ids)}"), str, lambda error: "CODE-1",
                 settle=lambda: log.append("settle"), place={"region": "r1"})


def test_up_makes_pins_and_writes_the_cluster_file_last():
    log: list[str] = []
    made = provision.up("c", verbs(log), region="r1", user="u", node_type="t1", python="python3", ssh_wait_s=0)
    assert log == ["create the network", "create the nodes", "save n-1,n-2"]
    assert made.pinned == {"10.0.0.1": "shown", "10.0.0.2": "shown"}
    record = state.load_cluster("c")
    assert (record.provider, record.region, record.node_type) == ("test", "r1", "t1")
    assert record.where == {"region": "r1"}
    assert [(i.id, i.address) for i in record.instances] == [("n-1", "10.0.0.1"), ("n-2", "10.0.0.2")]
    assert KEY.split()[1] in (state.cluster_dir("c") / "known_hosts").read_text()


def test_up_says_each_step_as_it_begins_and_each_node_as_its_ssh_answers(home):
    said: list[str] = []
    provision.up("c", verbs([]), region="r1", user="u", node_type="t1", python="python3", ssh_wait_s=0,
                 say=said.append)
    assert said == ["cluster c: create the network", "cluster c: create the nodes",
                    "cluster c: read the host keys the nodes show", "cluster c: write the cluster file"]
    answered = provision.answering("c", Nodes(("n-1", "n-2"), (Host("10.0.0.1"), Host("10.0.0.2", port=2222))),
                                   said.append)
    answered("10.0.0.2:2222")
    assert said[-1].startswith("cluster c: n-2 (10.0.0.2) answers SSH after ") and said[-1].endswith(" s (1 of 2)")
    assert provision.Progress().step == "generate the cluster key"  # without say, silent


def test_a_failed_step_undoes_every_step_before_it_in_reverse_and_names_itself(home):
    log: list[str] = []
    with pytest.raises(Boom) as failed:
        provision.up("c", verbs(log, fail_at="create the nodes"), region="r1", user="u", node_type="t1",
                     python="python3", ssh_wait_s=0)
    assert str(failed.value) == ("cluster.up c: could not create the nodes: create the nodes refused; everything it "
                                 "had created was removed")
    assert (failed.value.code, failed.value.left) == ("CODE-1", False)
    assert log == ["create the network", "settle", "undo create the nodes", "undo create the network"]
    assert state.load_cluster("c") is None and not (home / "clusters" / "c").exists()


def test_an_undo_that_fails_is_named_with_how_to_find_it_and_marks_the_error_left():
    failing = dataclasses.replace(verbs([], fail_at="create the nodes", undo_fails=True), place={"region": "r1"})
    with pytest.raises(Boom) as failed:
        provision.up("c", failing, region="r1", user="u", node_type="t1", python="python3", ssh_wait_s=0)
    assert failed.value.left
    assert str(failed.value).endswith("rolling back left things behind (run kiln down c --provider test --region "
                                      "r1): undo create the nodes: still there")


def press_ctrl_c(times: int):
    """A settle during which the operator presses Ctrl-C `times` times: real SIGINTs to this process."""
    import os
    import signal

    def settle() -> None:
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)
    return settle


def test_a_ctrl_c_during_the_undo_is_told_to_wait_and_the_undo_runs_to_its_end(capfd):
    """The first Ctrl-C (here: the failure itself) started the undo; the next one, pressed while it settles, does
    not skip it: every step is undone and nothing is left."""
    log: list[str] = []
    pressed = dataclasses.replace(verbs(log, fail_at="create the nodes"), settle=press_ctrl_c(1))
    with pytest.raises(Boom) as failed:
        provision.up("c", pressed, region="r1", user="u", node_type="t1", python="python3", ssh_wait_s=0)
    assert not failed.value.left and str(failed.value).endswith("everything it had created was removed")
    assert log == ["create the network", "undo create the nodes", "undo create the network"]
    assert ("kiln: undoing what cluster.up c made; Ctrl-C again stops it, which leaves it for kiln down c "
            "--provider test --region r1") in capfd.readouterr().err


def test_a_second_ctrl_c_during_the_undo_stops_it_and_names_what_is_left_with_the_kiln_down_to_run():
    log: list[str] = []
    pressed = dataclasses.replace(verbs(log, fail_at="create the nodes"), settle=press_ctrl_c(2))
    with pytest.raises(Boom) as failed:
        provision.up("c", pressed, region="r1", user="u", node_type="t1", python="python3", ssh_wait_s=0)
    assert failed.value.left and log == ["create the network"]
    assert str(failed.value).endswith(
        "rolling back left things behind (run kiln down c --provider test --region r1): undo create the nodes: not "
        "done (Ctrl-C); undo create the network: not done (Ctrl-C); remove the local files: not done (Ctrl-C)")


def test_an_undo_stopped_between_its_steps_names_the_step_it_cut_and_those_after_it():
    from bootstrap.providers.common import Rollback

    done: list[str] = []
    rollback = Rollback()
    rollback.push("first", lambda: done.append("first"))
    rollback.push("second", lambda: (_ for _ in ()).throw(KeyboardInterrupt))
    rollback.push("third", lambda: done.append("third"))
    assert rollback.run(stoppable=True) == ["second: not done (Ctrl-C)", "first: not done (Ctrl-C)"]
    assert done == ["third"]
    with pytest.raises(KeyboardInterrupt):  # an undo no shield holds: the Ctrl-C goes up as it came
        rollback.run()


def test_bad_input_found_late_is_raised_as_it_is_once_all_is_undone():
    log: list[str] = []
    with pytest.raises(UsageError, match="^name taken meanwhile$"):
        provision.up("c", verbs(log, usage=True), region="r1", user="u", node_type="t1", python="python3",
                     ssh_wait_s=0)
    assert log[-2:] == ["undo create the nodes", "undo create the network"]


def swap(log: list[str], *, keys: bool = True, number: int = 3, fails: bool = False) -> Swap:
    def make(replacing: Progress) -> tuple[str, Host]:
        replacing.made = f"n-{number}"
        log.append(f"make n-{number}")
        if fails:
            raise Boom("no capacity")
        return f"n-{number}", Host(f"10.0.0.{number}", user="u")

    return Swap(Boom, str, make, lambda ids, timeout_s: {i: [KEY] for i in ids} if keys else {},
                lambda node, address: log.append(f"remove {node}" + (f" at {address}" if address else "")),
                lambda node, volume: log.append(f"attach {volume} {node}"),
                first_step="make the node", keys_step="read its host keys", keys_where="its console")


def cluster() -> state.ClusterRecord:
    record = state.ClusterRecord("c", (Host("10.0.0.1", user="u"), Host("10.0.0.2", user="u")), "python3",
                                 instances=(state.Instance("n-1", "10.0.0.1", "shown"),
                                            state.Instance("n-2", "10.0.0.2", "shown")), provider="test")
    state.save_cluster(record)
    return record


def test_a_replacement_takes_the_old_nodes_place_and_its_volume():
    log: list[str] = []
    host, keys = provision.replace(cluster(), "10.0.0.2", ("vol-1", "vol-2"), swap(log), ssh_wait_s=0)
    assert (host.address, keys) == ("10.0.0.3", [KEY])
    assert log == ["make n-3", "remove n-2 at 10.0.0.2", "attach vol-2 n-3"]
    assert [(i.id, i.address) for i in state.load_cluster("c").instances] == [("n-1", "10.0.0.1"),
                                                                                ("n-3", "10.0.0.3")]


def test_a_replacement_without_host_keys_is_removed_and_the_cluster_left_as_it_was():
    log: list[str] = []
    before = cluster()
    with pytest.raises(Boom, match=r"^cluster c: could not replace 10.0.0.2 \(n-2\): could not read its host keys: "
                                   r"n-3 shows no host keys \(its console\): kiln does not trust a replacement on "
                                   "first contact; nothing new is left running$"):
        provision.replace(before, "10.0.0.2", (), swap(log, keys=False), ssh_wait_s=0)
    assert log == ["make n-3", "remove n-3"] and state.load_cluster("c") == before
    with pytest.raises(UsageError, match="^cluster c has no instance at 10.0.0.9$"):
        provision.replace(before, "10.0.0.9", (), swap(log), ssh_wait_s=0)


def test_a_cluster_grows_by_nodes_made_as_its_own_all_of_them_or_none():
    log: list[str] = []
    before = cluster()
    grown = provision.grow(before, 2, lambda index: swap(log, number=index + 1), ssh_wait_s=0)
    assert [(new_id, host.address, keys) for new_id, host, keys in grown] == [("n-3", "10.0.0.3", [KEY]),
                                                                              ("n-4", "10.0.0.4", [KEY])]
    after = state.load_cluster("c")
    assert [(i.id, i.address, i.host_keys) for i in after.instances[2:]] == [("n-3", "10.0.0.3", "shown"),
                                                                            ("n-4", "10.0.0.4", "shown")]
    assert state.read_known_hosts("c") == f"10.0.0.3 {KEY}\n10.0.0.4 {KEY}\n"
    log.clear()
    with pytest.raises(Boom, match=r"^cluster c: could not add 2 instance\(s\): could not make the node: no capacity; "
                                   "nothing new is left running$"):
        provision.grow(after, 2, lambda index: swap(log, number=index + 1, fails=index == 5), ssh_wait_s=0)
    assert log == ["make n-5", "make n-6", "remove n-6", "remove n-5"]  # the one being made too, last made first
    log.clear()
    with pytest.raises(Boom, match="n-5, n-6 show.s. no host keys"):
        provision.grow(after, 2, lambda index: swap(log, number=index + 1, keys=False), ssh_wait_s=0)
    assert log == ["make n-5", "make n-6", "remove n-6", "remove n-5"]
    assert state.load_cluster("c") == after and state.read_known_hosts("c").count("\n") == 2
    with pytest.raises(UsageError, match="^cluster c has data volumes, one per node by its place"):
        provision.grow(after, 1, lambda index: swap(log), volumes=("vol-1", "vol-2"), ssh_wait_s=0)
    with pytest.raises(UsageError, match="^cluster c has data volumes"):
        provision.shrink(after, ["10.0.0.3"], lambda node, address: None, volumes=("vol-1",))
    assert state.load_cluster("c") == after


def test_a_shrink_takes_each_node_out_as_it_goes():
    log: list[str] = []
    before = cluster()
    state.write_known_hosts("c", f"10.0.0.1 {KEY}\n10.0.0.2 {KEY}\n")

    def remove(node: str, address: str) -> None:
        if node == "n-2":
            raise Boom("throttled")
        log.append(f"remove {node} at {address}")

    with pytest.raises(Boom, match="^throttled$"):
        provision.shrink(before, ["10.0.0.1", "10.0.0.2"], remove)
    assert log == ["remove n-1 at 10.0.0.1"]
    left = state.load_cluster("c")
    assert [i.id for i in left.instances] == ["n-2"] and state.read_known_hosts("c") == f"10.0.0.2 {KEY}\n"
    assert provision.shrink(left, ["10.0.0.2"], lambda node, address: log.append(f"remove {node}")) == ["n-2"]
    assert state.load_cluster("c").instances == () and state.read_known_hosts("c") == ""
