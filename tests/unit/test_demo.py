"""The demo's pure parts: the table of where its time went, and the bake's own lines in its log."""

from __future__ import annotations

from bootstrap.demo import last_bake_line, stage_table


def test_the_stage_table_ends_with_the_wall_time_not_the_sum_of_stages_that_ran_side_by_side():
    table = stage_table([("a local cluster of 3 nodes", 1.04), ("the container image, baked beside the rows above",
                                                                  150.0), ("training: horovod", 16.3)], 160.25)
    lines = table.splitlines()
    assert lines[0].split() == ["stage", "seconds"]
    assert lines[1].endswith("    1.0") and lines[2].endswith("  150.0") and lines[3].endswith("   16.3")
    assert lines[-1].startswith("all of it (wall)") and lines[-1].endswith("  160.2")
    assert len({len(line) for line in lines[1:]}) == 1  # one column of seconds


def test_the_bakes_own_lines_are_told_from_its_tools_output(tmp_path):
    log = tmp_path / "bake.log"
    log.write_text("==> docker.container: Committing the container\nbake: task 12 (base : apt), 40 s\n"
                   "    docker.container: ok: [default]\nimage: baked in 103.7 s: /work/images/docker-cpu-1\n"
                   "--> docker.container: Imported Docker image: sha256:fb\n")
    assert last_bake_line(log) == "image: baked in 103.7 s: /work/images/docker-cpu-1"
    log.write_text("==> docker.container: Pulling the base\n")
    assert last_bake_line(log) == ""
