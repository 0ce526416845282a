"""What a `kiln train` may ask together, and the run it asks for (bootstrap.runspec, pure)."""

from __future__ import annotations

import pytest

from bootstrap import topology
from bootstrap.errors import UsageError
from bootstrap.hosts import parse_hostfile
from bootstrap.runspec import TrainAsk, check_train, train_spec

HOSTS = parse_hostfile("node1\nnode2 slots=2\n", source="hosts")


@pytest.mark.parametrize(("ask", "said"), [
    (TrainAsk(command=("python", "t.py"), args="--epochs 2"), "--args is for kiln's reference trainer"),
    (TrainAsk(mode="torchrun"), "--mode torchrun runs your program"),
    (TrainAsk(no_chief=True), "--no-chief is for a between-graph program"),
    (TrainAsk(command=("python", "t.py"), mode="tf-config", no_chief=True), "--no-chief goes with --ps"),
    (TrainAsk(command=("python", "t.py"), min_np=1, max_restarts=2), "--max-restarts does not go with it"),
    (TrainAsk(managed=True, detach=True), "it cannot --detach"),
    (TrainAsk(relocate=True), "give --managed too"),
    (TrainAsk(down_after=True, detach=True), "--down-after waits for the run to end"),
    (TrainAsk(max_recoveries=-1), "--max-recoveries -1: give 0 or more"),
    (TrainAsk(fabric="myrinet"), "myrinet"),
    (TrainAsk(image="-bad"), "-bad"),
])
def test_each_rule_a_train_breaks_is_named(ask, said):
    with pytest.raises(UsageError, match=said):
        check_train(ask)


def test_the_spec_is_the_run_asked_for_on_the_hosts_as_named():
    spec = train_spec(TrainAsk(mode="tf-config", ps=1, args="--epochs 3 --log-every 1", nic="eth1"), HOSTS,
                      "/usr/bin/python3", "20261129-000000-abcd")
    assert (spec.run_id, spec.mode, spec.ps, spec.nic) == ("20261129-000000-abcd", "tf-config", 1, "eth1")
    assert spec.names == ("node1", "node2") and spec.slots == (None, 2)
    assert spec.program.trainer_args == ("--epochs", "3", "--log-every", "1")
    assert spec.base_port == topology.DEFAULT_BASE_PORT and spec.root == "~/kiln"
    named = train_spec(TrainAsk(command=("python", "t.py"), run_id="mine", base_port=31000), HOSTS, "python3", "x")
    assert (named.run_id, named.base_port, named.nic) == ("mine", 31000, "(found at run time)")
    with pytest.raises(UsageError, match="--args"):
        train_spec(TrainAsk(args="'unclosed"), HOSTS, "python3", "x")
