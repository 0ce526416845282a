"""make demo's stage table: where the demo's time went, a stage a line and the whole, as .ci/run's table says it
for CI."""

from __future__ import annotations

from bootstrap.demo import stage_table


def test_the_stage_table_gives_each_stage_and_the_whole():
    table = stage_table([("a local cluster of 3 nodes", 12.04), ("training: horovod", 30.5), ("the mesh", 1.0)])
    assert table.splitlines() == [
        "stage                       seconds",
        "a local cluster of 3 nodes     12.0",
        "training: horovod              30.5",
        "the mesh                        1.0",
        "all of it                      43.5",
    ]
