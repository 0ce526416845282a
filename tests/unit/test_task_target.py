"""What the tasks read from the command line: hosts from -H, a hostfile or a saved cluster, and a cluster's name."""

from __future__ import annotations

import pytest
from fabric import Config
from invoke import Context

from bootstrap.errors import UsageError
from bootstrap.session import target


def context(hosts: str = "") -> Context:
    config = Config(overrides={"kiln_hosts": hosts})
    return Context(config=config)


@pytest.fixture(autouse=True)
def kiln_home(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_HOME", str(tmp_path / "home"))


def test_a_new_cluster_is_named_when_hosts_are_given():
    goal = target(context("node1,node2"), hostfile=None, cluster="named", slots=None, python="/usr/bin/python3")
    assert goal.name == "named"
    assert [h.address for h in goal.hosts] == ["node1", "node2"]


def test_a_new_cluster_may_be_named_with_a_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\n")
    goal = target(context(), hostfile=str(hostfile), cluster="fromfile", slots=None, python=None)
    assert (goal.name, goal.hosts[0].slots) == ("fromfile", 2)


def test_an_unknown_cluster_without_hosts_says_how_to_make_it():
    with pytest.raises(UsageError, match="no cluster 'missing'.*kiln mesh"):
        target(context(), hostfile=None, cluster="missing", slots=None, python=None)


def test_no_hosts_at_all_is_a_usage_error():
    with pytest.raises(UsageError, match="no hosts"):
        target(context(), hostfile=None, cluster=None, slots=None, python=None)
