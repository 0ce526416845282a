"""Failover (bootstrap.providers.failover): the candidates of a `kiln up` in the order kiln tries them, what each
cloud's documented error codes mean for the next try, and the loop that takes the first candidate that comes up,
driven by plain attempt functions that fail with the clouds' codes."""

from __future__ import annotations

import pytest

from bootstrap.errors import UsageError
from bootstrap.providers import failover
from bootstrap.providers.failover import Candidate, CloudError, NoCapacity

WHERE = {"region": None, "zone": None, "location": None}


def test_candidates_go_cloud_by_cloud_place_by_place_type_by_type_spot_first_then_on_demand():
    order = failover.candidates(["gcp", "aws"], {"gcp": ["z-a", "z-b"], "aws": ["r1"]},
                                {"gcp": ["t1", "t2"], "aws": ["p5"]}, spot=True, on_demand_fallback=True)
    assert [(c.cloud, c.place, c.instance_type, c.spot) for c in order] == [
        ("gcp", "z-a", "t1", True), ("gcp", "z-a", "t2", True), ("gcp", "z-b", "t1", True), ("gcp", "z-b", "t2", True),
        ("aws", "r1", "p5", True),
        ("gcp", "z-a", "t1", False), ("gcp", "z-a", "t2", False), ("gcp", "z-b", "t1", False),
        ("gcp", "z-b", "t2", False), ("aws", "r1", "p5", False)]
    assert [c.spot for c in failover.candidates(["aws"], {}, {"aws": ["p5"]}, True, False)] == [True]
    assert failover.candidates(["aws"], {}, {"aws": ["g6.xlarge"]}, False, True) == [
        Candidate("aws", "", "g6.xlarge", False)]  # no spot asked: nothing to fall back from


@pytest.mark.parametrize(("cloud", "code", "verdict"), [
    ("aws", "InsufficientInstanceCapacity", "capacity"), ("aws", "Unsupported", "capacity"),
    ("aws", "VcpuLimitExceeded", "quota"), ("aws", "InstanceLimitExceeded", "quota"),
    ("aws", "InvalidAMIID.NotFound", "stop"), ("aws", "UnauthorizedOperation", "stop"),
    ("gcp", "ZONE_RESOURCE_POOL_EXHAUSTED", "capacity"),
    ("gcp", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "capacity"),
    ("gcp", "QUOTA_EXCEEDED", "quota"), ("gcp", "RESOURCE_NOT_FOUND", "stop"),
    ("azure", "SkuNotAvailable", "capacity"), ("azure", "ZonalAllocationFailed", "capacity"),
    ("azure", "AllocationFailed", "capacity"), ("azure", "OperationNotAllowed", "quota"),
    ("azure", "InvalidParameter", "stop"), ("aws", "", "stop"),
    ("gcp", "InsufficientInstanceCapacity", "stop"),  # one cloud's code means nothing on another
])
def test_each_clouds_documented_codes_are_capacity_or_quota_and_the_rest_stops(cloud, code, verdict):
    assert failover.classify(cloud, code) == verdict


def test_a_gcp_quota_is_its_zones_region():
    assert Candidate("gcp", "us-central1-a", "t", False).region == "us-central1"
    assert Candidate("aws", "us-east-1", "t", False).region == "us-east-1"
    assert Candidate("azure", "eastus", "t", False).region == "eastus"


def fails(codes: dict[str, str], left: frozenset[str] = frozenset()):
    """An attempt that fails at the places named in `codes` with that code (leaving something behind where `left`
    says) and comes up anywhere else; what it was asked, in order."""
    asked: list[str] = []

    def attempt(candidate: Candidate) -> str:
        asked.append(candidate.place)
        if candidate.place in codes:
            raise CloudError(f"cluster.up x: could not create the instances: {codes[candidate.place]}: ...",
                             code=codes[candidate.place], left=candidate.place in left)
        return f"up in {candidate.place}"

    return attempt, asked


def order(cloud: str, *places: str) -> list[Candidate]:
    return [Candidate(cloud, place, "t", False) for place in places]


def test_capacity_moves_on_quota_skips_the_region_and_what_was_tried_is_said():
    said: list[str] = []
    attempt, asked = fails({"us-central1-a": "ZONE_RESOURCE_POOL_EXHAUSTED", "us-east1-b": "QUOTA_EXCEEDED"})
    made, chosen, tried = failover.first_fit(
        order("gcp", "us-central1-a", "us-east1-b", "us-east1-c", "europe-west4-a"), attempt, said.append)
    assert made == "up in europe-west4-a" and chosen.place == "europe-west4-a"
    assert asked == ["us-central1-a", "us-east1-b", "europe-west4-a"]  # us-east1-c: its region is over the quota
    assert [(t.candidate.place, t.verdict, t.code) for t in tried] == [
        ("us-central1-a", "capacity", "ZONE_RESOURCE_POOL_EXHAUSTED"), ("us-east1-b", "quota", "QUOTA_EXCEEDED")]
    assert "up: gcp us-east1: over a quota (QUOTA_EXCEEDED): skipping the region" in said
    assert said[0] == "up: trying gcp us-central1-a t on-demand (1 of 4)"


def test_an_error_that_is_not_capacity_stops_at_once_as_it_was_raised():
    attempt, asked = fails({"r1": "InvalidAMIID.NotFound"})
    with pytest.raises(CloudError, match="InvalidAMIID.NotFound"):
        failover.first_fit(order("aws", "r1", "r2"), attempt, lambda line: None)
    assert asked == ["r1"]


def test_a_try_that_left_something_behind_stops_the_failover():
    attempt, asked = fails({"r1": "InsufficientInstanceCapacity"}, left=frozenset({"r1"}))
    with pytest.raises(CloudError):
        failover.first_fit(order("aws", "r1", "r2"), attempt, lambda line: None)
    assert asked == ["r1"]


def test_one_candidate_fails_as_it_always_did_and_all_empty_names_every_try():
    attempt, _ = fails({"r1": "InsufficientInstanceCapacity"})
    with pytest.raises(CloudError, match="could not create the instances"):
        failover.first_fit(order("aws", "r1"), attempt, lambda line: None)
    attempt, _ = fails({"r1": "InsufficientInstanceCapacity", "r2": "VcpuLimitExceeded"})
    with pytest.raises(NoCapacity) as refused:
        failover.first_fit(order("aws", "r1", "r2"), attempt, lambda line: None)
    assert str(refused.value) == ("no candidate came up: tried 2: aws r1 t on-demand: capacity "
                                  "(InsufficientInstanceCapacity); aws r2 t on-demand: quota (VcpuLimitExceeded)")


def test_provider_may_name_several_clouds_or_any():
    kinds = ("aws", "azure", "gcp", "local")
    assert failover.parse_clouds("aws", kinds) == ["aws"]
    assert failover.parse_clouds("gcp, aws", kinds) == ["gcp", "aws"]
    assert failover.parse_clouds("any", kinds) == ["aws", "gcp", "azure"]
    for bad, said in (("ibm", "choose one of aws, azure, gcp, local"), ("aws,aws", "a cloud named twice"),
                      ("aws,local", "only clouds"), ("", "choose one of")):
        with pytest.raises(UsageError, match=said):
            failover.parse_clouds(bad, kinds)


def test_places_come_from_the_lists_else_each_providers_own_option():
    assert failover.places_of(["gcp"], "a-b-c,d-e-f", None, WHERE) == {"gcp": ["a-b-c", "d-e-f"]}
    assert failover.places_of(["aws", "azure"], None, "aws:us-east-1,azure:eastus,westus", WHERE) == {
        "aws": ["us-east-1", "westus"], "azure": ["eastus", "westus"]}  # unmarked: every cloud --regions places
    assert failover.places_of(["aws"], None, None, {**WHERE, "region": "eu-west-1"}) == {"aws": ["eu-west-1"]}
    assert failover.places_of(["local"], None, None, WHERE) == {}
    with pytest.raises(UsageError, match="--zones z: no cloud of --provider aws is placed by it .*--regions"):
        failover.places_of(["aws"], "z", None, WHERE)
    with pytest.raises(UsageError, match="--zone us-central1-a and --zones: give one"):
        failover.places_of(["gcp"], "us-east1-b", None, {**WHERE, "zone": "us-central1-a"})


def test_several_clouds_are_asked_for_by_gpus_and_each_gets_the_types_that_carry_them():
    assert failover.types_of(["aws", "gcp"], "H100:8", None) == {"aws": ["p5.48xlarge"],
                                                                 "gcp": ["a3-highgpu-8g", "a3-megagpu-8g"]}
    assert failover.types_of(["aws", "azure"], "T4:1", None) == {"aws": [], "azure": ["Standard_NC4as_T4_v3"]}
    assert failover.types_of(["gcp"], None, None) == {"gcp": ["g2-standard-4"]}
    assert failover.types_of(["local"], None, None) == {"local": [""]}
    with pytest.raises(UsageError, match="several clouds are asked for by GPUs"):
        failover.types_of(["aws", "gcp"], None, "p5.48xlarge")
    with pytest.raises(UsageError, match="aws offers no T4; azure has T4:1"):
        failover.types_of(["aws", "gcp"], "T4:1", None)  # no cloud asked has it: what the first offers
    with pytest.raises(UsageError, match="--provider local has no GPUs"):
        failover.types_of(["local"], "L4:1", None)


class Clock:
    """Time that passes only when slept: the waits until_up asks for, in order."""

    def __init__(self):
        self.now, self.slept = 0.0, []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_retry_until_up_waits_longer_each_round_and_takes_capacity_that_returns():
    clock, said = Clock(), []
    rounds = {"n": 0}

    def attempt(candidate: Candidate) -> str:
        if candidate.place == "z-b":
            rounds["n"] += 1
        if rounds["n"] < 4:  # zone b has capacity again in the fourth round
            raise CloudError("...", code="ZONE_RESOURCE_POOL_EXHAUSTED")
        return f"up in {candidate.place}"

    made, chosen, _ = failover.until_up(order("gcp", "z-a", "z-b"), attempt, said.append, 600, sleep=clock.sleep,
                                        clock=lambda: clock.now)
    assert made == "up in z-b" and clock.slept == [10.0, 20.0, 40.0]
    assert "up: round 1: no capacity (any candidate); trying again in 10s (--retry-until-up: 600s left)" in said


def test_retry_until_up_stops_at_its_deadline_and_never_retries_what_is_not_capacity():
    clock = Clock()
    attempt, asked = fails({"r1": "InsufficientInstanceCapacity"})
    with pytest.raises(CloudError, match="could not create the instances"):
        failover.until_up(order("aws", "r1"), attempt, lambda line: None, 25, sleep=clock.sleep,
                          clock=lambda: clock.now)
    assert clock.slept == [10.0, 15.0] and asked == ["r1"] * 3  # the last wait is what was left
    attempt, asked = fails({"r1": "InvalidAMIID.NotFound"})
    with pytest.raises(CloudError):
        failover.until_up(order("aws", "r1", "r2"), attempt, lambda line: None, 600, sleep=clock.sleep,
                          clock=lambda: clock.now)
    assert asked == ["r1"]
    attempt, asked = fails({"r1": "InsufficientInstanceCapacity"})
    with pytest.raises(CloudError):
        failover.until_up(order("aws", "r1"), attempt, lambda line: None, 0, sleep=clock.sleep,
                          clock=lambda: clock.now)
    assert asked == ["r1"]  # no --retry-until-up: once
