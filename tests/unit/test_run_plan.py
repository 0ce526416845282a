"""`kiln run`: the even, ordered split of inputs, processes spread over hosts, and what each process is told."""

from __future__ import annotations

import pytest

from bootstrap.errors import UsageError
from bootstrap.inputs import list_inputs
from bootstrap.launch import NodePaths, Program, plan_processes, shard, spread

PY = "/v/bin/python"


@pytest.mark.parametrize(("count", "items"), [(3, 100), (5, 7), (4, 2), (1, 0), (7, 7)])
def test_every_item_goes_to_exactly_one_process_in_order(count, items):
    names = [f"i{n}" for n in range(items)]
    parts = shard(names, count)
    assert len(parts) == count
    assert [item for part in parts for item in part] == names
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_processes_take_the_hosts_slots_in_turn():
    assert spread(5, [1, 1, 1]) == [0, 1, 2, 0, 1]
    assert spread(4, [2, 1]) == [0, 0, 1, 0]
    assert spread(2, [1, 1, 1]) == [0, 1]


def test_each_process_is_told_its_shard_and_gets_its_inputs_file():
    plan = plan_processes("r", ("n1", "n2"), (1, 1), python=PY, paths=NodePaths("/h/kiln"),
                          program=Program(("work.py", "--fast")), processes=3, inputs=["a", "b", "c", "d"])
    assert plan.mode == "run" and plan.finishing == ("shard-0", "shard-1", "shard-2")
    assert [(launch.host, launch.task) for launch in plan.launches] == [(0, "shard-0"), (1, "shard-1"),
                                                                        (0, "shard-2")]
    first = plan.launches[0]
    assert first.argv == (PY, "work.py", "--fast") and first.cwd == "/h/kiln/code"
    assert (first.env["KILN_SHARD_INDEX"], first.env["KILN_SHARD_COUNT"]) == ("0", "3")
    assert first.env["KILN_OUTPUT_DIR"] == "/h/kiln/runs/r/output/shard-0"
    assert [launch.files for launch in plan.launches] == [
        {"/h/kiln/runs/r/shard-0.inputs": "a\nb\n"}, {"/h/kiln/runs/r/shard-1.inputs": "c\n"},
        {"/h/kiln/runs/r/shard-2.inputs": "d\n"}]
    bare = plan_processes("r", ("n1", "n2"), (1, 1), python=PY, paths=NodePaths("/h/kiln"), program=Program(("x",)))
    assert len(bare.launches) == 2 and "KILN_SHARD_INPUTS" not in bare.launches[0].env


def test_inputs_come_from_a_list_file_or_a_folder(tmp_path):
    listing = tmp_path / "items.txt"
    listing.write_text("# a comment\nb\n\na\n")
    assert list_inputs(str(listing)) == ["b", "a"]
    data = tmp_path / "project" / "data"
    (data / "sub").mkdir(parents=True)
    for name in ("z.txt", "a.txt", "sub/m.txt"):
        (data / name).write_text("")
    assert list_inputs(str(data), tmp_path / "project") == ["data/a.txt", "data/sub/m.txt", "data/z.txt"]
    assert list_inputs(str(data)) == [str(data / "a.txt"), str(data / "sub/m.txt"), str(data / "z.txt")]
    with pytest.raises(UsageError, match="no such file or folder"):
        list_inputs(str(tmp_path / "missing"))
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(UsageError, match="no items"):
        list_inputs(str(tmp_path / "empty.txt"))
