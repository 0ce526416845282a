"""aws.connect without a network: the region it settles on, and one loader of botocore's models per process."""

from __future__ import annotations

import pytest

from bootstrap.errors import UsageError
from bootstrap.providers.aws import cloud


@pytest.fixture
def no_config(monkeypatch, tmp_path):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", cloud.ENDPOINT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


def test_the_region_given_wins_then_aws_region_then_aws_default_region(no_config):
    no_config.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert cloud.connect().region == "eu-west-1"
    no_config.setenv("AWS_REGION", "ap-south-1")
    connected = cloud.connect()
    assert connected.region == "ap-south-1" and connected.ec2.meta.region_name == "ap-south-1"
    assert cloud.connect("us-west-2").sts.meta.region_name == "us-west-2"


def test_no_region_anywhere_is_a_usage_error_naming_where_to_give_one(no_config):
    with pytest.raises(UsageError, match="give --region or set AWS_REGION / AWS_DEFAULT_REGION"):
        cloud.connect()


def test_an_unknown_profile_is_a_usage_error(no_config):
    with pytest.raises(UsageError, match=r"AWS profile: The config profile \(nope\) could not be found"):
        cloud.connect("us-east-1", "nope")


def test_every_connect_of_a_process_shares_one_loader_of_the_models(no_config):
    first, second = cloud.connect("us-east-1"), cloud.connect("eu-west-1")
    assert first.ec2._loader is second.ec2._loader is cloud.service_models(None)


@pytest.mark.parametrize(("code", "message", "retried"), [
    ("InsufficientInstanceCapacity", "We currently do not have sufficient p5.48xlarge capacity", False),
    ("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit of 0 allows", False),
    ("Unsupported", "Your requested instance type (p5.48xlarge) is not supported in your requested Availability "
     "Zone (us-east-1e).", False),
    ("RequestLimitExceeded", "Request limit exceeded.", None),  # the SDK's own policy: it backs off and retries
    ("InternalError", "An internal error has occurred.", None),
])
def test_a_launch_the_cloud_refused_for_capacity_or_quota_is_not_sent_again_by_the_sdk(code, message, retried):
    answer = ({"status_code": 500}, {"Error": {"Code": code, "Message": message}})
    assert cloud.launch_retried(response=answer) is retried
    assert cloud.launch_retried(response=None) is None  # no answer (a timeout): the SDK's, with the ClientToken


def test_every_connect_asks_kiln_before_the_sdk_sends_a_launch_again(no_config):
    """The more specific event is asked first, and its False is botocore's answer (the endpoint takes the first
    answer that is not None): no retry, where the SDK's own policy alone would send it again (HTTP 500)."""
    import botocore.awsrequest
    import botocore.hooks

    ec2 = cloud.connect("us-east-1").ec2
    http = botocore.awsrequest.AWSResponse("https://ec2.us-east-1.amazonaws.com/", 500, {}, None)
    answer = (http, {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no capacity"},
                     "ResponseMetadata": {"HTTPStatusCode": 500}})
    responses = ec2.meta.events.emit("needs-retry.ec2.RunInstances", response=answer, attempts=1,
                                     caught_exception=None, request_dict={"context": {}},
                                     operation=ec2.meta.service_model.operation_model("RunInstances"))
    assert botocore.hooks.first_non_none_response(responses) is False
    assert [answer for _, answer in responses if answer is not None][1:], "the SDK alone would have retried it"


def test_a_launchs_client_token_is_its_clusters_and_attempts_within_ec2s_64_characters():
    from bootstrap.providers.aws import plan

    assert plan.client_token("alpha", "0123abcd") == "kiln-alpha-0123abcd"
    assert len(plan.client_token("a" * 32, "f" * 40)) == 64
