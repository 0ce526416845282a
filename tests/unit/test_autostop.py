"""The pure part of autostop: input checks, the agent's arguments and check interval, what kiln says."""

import pytest

from bootstrap import autostop, node, providers
from bootstrap.errors import UsageError
from bootstrap.providers.aws import plan


@pytest.mark.parametrize(("given", "expected"), [(None, None), ("30", 30.0), (0, 0.0), ("0.5", 0.5),
                                                 (10080, 10080.0)])
def test_idle_minutes_are_minutes_and_zero_cancels(given, expected):
    assert autostop.validate_idle_minutes(given) == expected


@pytest.mark.parametrize(("given", "message"), [
    ("soon", "--idle-minutes 'soon': give minutes, e.g. 30"),
    (-1, r"--idle-minutes -1: give 0 \(cancel\) to 10080 minutes"),
    (10081, r"--idle-minutes 10081: give 0 \(cancel\) to 10080 minutes"),
])
def test_bad_idle_minutes_are_one_clear_error(given, message):
    with pytest.raises(UsageError, match=f"^{message}$"):
        autostop.validate_idle_minutes(given)


@pytest.mark.parametrize(("idle_s", "interval"), [(3, 1.0), (15, 2.5), (60, 10.0), (180, 30.0), (3600, 30.0)])
def test_the_agent_looks_often_enough_and_not_too_often(idle_s, interval):
    assert autostop.check_interval(idle_s) == interval


def test_the_provider_says_what_powering_off_means():
    aws, local = providers.named("aws").shutdown, providers.named("local").shutdown
    assert autostop.agent_args(30, aws) == ["1800", "30", "system", "~/kiln/autostop.json"]
    assert autostop.agent_args(0.25, local) == ["15", "2.5", "namespace", "~/kiln/autostop.json"]
    assert autostop.agent_args(0, aws) == ["0", "1", "system", "~/kiln/autostop.json"]
    assert autostop.agent_args(30, providers.named("azure").shutdown)[2] == "azure"  # deallocate, not shut down
    assert autostop.agent_args(30, providers.named("gcp").shutdown)[2] == "system"
    assert set(autostop.SHUTDOWNS) == set(node.SHUTDOWNS)  # what kiln asks for, the agent does
    with pytest.raises(UsageError, match="power-off 'reboot': kiln's node agent knows system, namespace, azure"):
        autostop.agent_args(5, "reboot")


def test_what_kiln_says():
    assert autostop.describe(0, ["a", "b"]) == "autostop cancelled on a, b"
    assert autostop.describe(30, ["a"]) == ("autostop: a power off after 30 minute(s) without a kiln run "
                                            "(kiln autostop --cluster NAME --idle-minutes 0 cancels)")


def test_an_idle_aws_node_terminates_when_it_shuts_down():
    request = plan.validate_request("demo", 1, "p3.2xlarge", ssh_cidr="203.0.113.7", idle_minutes=30.0)
    made = plan.run_instances_request(request, ami="ami-1", group_id="sg-1", tags={})
    assert made["InstanceInitiatedShutdownBehavior"] == "terminate"
    plain = plan.validate_request("demo", 1, "p3.2xlarge", ssh_cidr="203.0.113.7")
    assert "InstanceInitiatedShutdownBehavior" not in plan.run_instances_request(plain, ami="ami-1",
                                                                                 group_id="sg-1", tags={})
