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
