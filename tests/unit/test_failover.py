"""Failover (bootstrap.providers.failover): the candidates of a `kiln up` in the order kiln tries them, what each
cloud's documented error codes mean for the next try, and the loop that takes the first candidate that comes up,
driven by plain attempt functions that fail with the clouds' codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap import state
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.providers import common, failover
from bootstrap.providers.aws import plan as aws_plan
from bootstrap.providers.failover import Candidate, CloudError, NoCapacity

WHERE = {"region": None, "zone": None, "location": None}
KILN = Path(sys.executable).with_name("kiln")


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
    ("aws", "InsufficientInstanceCapacity", "capacity"), ("aws", "Unsupported", "stop"),
    ("aws", "VcpuLimitExceeded", "quota"), ("aws", "InstanceLimitExceeded", "quota"),
    ("aws", "InvalidAMIID.NotFound", "stop"), ("aws", "UnauthorizedOperation", "stop"),
    ("gcp", "ZONE_RESOURCE_POOL_EXHAUSTED", "capacity"),
    ("gcp", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "capacity"),
    ("gcp", "QUOTA_EXCEEDED", "quota"), ("gcp", "RESOURCE_NOT_FOUND", "stop"),
    ("azure", "SkuNotAvailable", "capacity"), ("azure", "ZonalAllocationFailed", "capacity"),
    ("azure", "AllocationFailed", "capacity"), ("azure", "OperationNotAllowed", "stop"),
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


def test_a_spot_quota_skips_the_regions_spot_tries_only():
    """Spot and on-demand machines have quotas of their own: a spot quota leaves the region's on-demand tries."""
    asked: list[tuple[str, bool]] = []

    def attempt(candidate: Candidate) -> str:
        asked.append((candidate.place, candidate.spot))
        if candidate.spot:
            raise CloudError("...", code="MaxSpotInstanceCountExceeded")
        return "up"

    spot_then_on_demand = failover.candidates(["aws"], {"aws": ["r1"]}, {"aws": ["p5", "p5e"]}, True, True)
    _, chosen, _ = failover.first_fit(spot_then_on_demand, attempt, lambda line: None)
    assert asked == [("r1", True), ("r1", False)] and not chosen.spot  # p5e spot skipped: the spot quota's region


def test_a_round_refused_everywhere_before_anything_was_made_is_not_retried():
    clock, asked = Clock(), []

    def attempt(candidate: Candidate) -> str:
        asked.append(candidate.place)
        raise failover.Unavailable("--instance-type X: not offered in " + candidate.place, code="SkuNotAvailable")

    with pytest.raises(NoCapacity) as refused:
        failover.until_up(order("azure", "eastus", "westus2"), attempt, lambda line: None, 600, sleep=clock.sleep,
                          clock=lambda: clock.now)
    assert refused.value.refused_only and asked == ["eastus", "westus2"] and clock.slept == []
    # bad input, as with one candidate (exit 2), each refusal said once
    assert isinstance(refused.value, UsageError) and str(refused.value) == (
        "no candidate can be made: --instance-type X: not offered in eastus; --instance-type X: not offered in "
        "westus2")

    def no_image(candidate: Candidate) -> str:
        raise failover.Unavailable("no available AMI tagged kiln:profile=gpu in r1: bake one, or give --ami",
                                   code="NoImageHere")

    with pytest.raises(UsageError, match=r"^no candidate can be made: no available AMI tagged kiln:profile=gpu in "
                                         r"r1: bake one, or give --ami$"):
        failover.first_fit(failover.candidates(["aws"], {"aws": ["r1"]}, {"aws": ["p5en", "p5e"]}, False, False),
                           no_image, lambda line: None)


def test_a_type_one_place_lacks_moves_on_where_the_same_code_from_a_try_would_stop():
    """A zone that does not offer the type (Unavailable, GCE's notFound) passes to the next zone, said with its
    reason; the same code from a call that may have made something (a CloudError) stops at once."""
    said: list[str] = []

    def attempt(candidate: Candidate) -> str:
        if candidate.place == "us-central1-a":
            raise failover.Unavailable("--instance-type t: not offered in us-central1-a", code="notFound")
        return "up in " + candidate.place

    made, _, tried = failover.first_fit(order("gcp", "us-central1-a", "us-central1-b"), attempt, said.append)
    assert made == "up in us-central1-b" and [(t.verdict, t.code, t.refused) for t in tried] == [
        ("unavailable", "notFound", True)]
    assert said[1] == ("up: gcp us-central1-a t on-demand: --instance-type t: not offered in us-central1-a; nothing "
                       "was made")
    attempt, asked = fails({"us-central1-a": "notFound"})
    with pytest.raises(CloudError):
        failover.first_fit(order("gcp", "us-central1-a", "us-central1-b"), attempt, lambda line: None)
    assert asked == ["us-central1-a"]


def test_options_that_hold_in_one_place_are_refused_with_several_places():
    failover.refuse_across_places(order("aws", "r1"), {"volume": 100, "ami": "ami-1"})  # one place: fine
    failover.refuse_across_places(order("aws", "r1", "r2"), {"volume": None, "ami": None})
    with pytest.raises(UsageError, match="--volume, --ami: holds in one place .* may try 2"):
        failover.refuse_across_places(order("aws", "r1", "r2"), {"volume": 100, "ami": "ami-1"})


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
    assert failover.places_of(["aws", "azure"], None, "aws:us-east-1,azure:eastus,azure:westus", WHERE) == {
        "aws": ["us-east-1"], "azure": ["eastus", "westus"]}
    assert failover.places_of(["aws"], None, "us-east-1,aws:us-west-2,us-east-1", WHERE) == {
        "aws": ["us-east-1", "us-west-2"]}  # a place named twice is tried once
    for regions, said in (("westus", "say whose it is .aws:westus or azure:westus."),
                          ("azur:eastus", "azur is not a cloud of --provider aws,azure that --regions places"),
                          ("gcp:us-east1", "gcp is not a cloud of --provider aws,azure")):
        with pytest.raises(UsageError, match=said):
            failover.places_of(["aws", "azure"], None, regions, WHERE)
    assert failover.places_of(["aws"], None, None, {**WHERE, "region": "eu-west-1"}) == {"aws": ["eu-west-1"]}
    assert failover.places_of(["local"], None, None, WHERE) == {"local": [""]}
    assert failover.places_of(["local"], "a,b", None, WHERE) == {"local": ["a", "b"]}, "local zones, labels"
    with pytest.raises(UsageError, match="--zones z: no cloud of --provider aws is placed by it .*--regions"):
        failover.places_of(["aws"], "z", None, WHERE)
    with pytest.raises(UsageError, match="--zone us-central1-a and --zones: give one"):
        failover.places_of(["gcp"], "us-east1-b", None, {**WHERE, "zone": "us-central1-a"})
    for zones, regions, said in ((",", None, "--zones ',': no zone in the list"),
                                 (None, " , ", "--regions ' , ': no region in the list"),
                                 ("", None, "--zones '': no zone in the list")):
        with pytest.raises(UsageError, match=said):  # an empty list is refused, never read as no list at all
            failover.places_of(["local", "aws"] if regions else ["local"], zones, regions, WHERE)


def test_several_clouds_are_asked_for_by_gpus_and_each_gets_the_types_that_carry_them():
    assert failover.types_of(["aws", "gcp"], "H100:8", None) == {"aws": ["p5.48xlarge"],
                                                                 "gcp": ["a3-highgpu-8g", "a3-megagpu-8g"]}
    assert failover.types_of(["aws", "azure"], "T4:1", None) == {"aws": [], "azure": ["Standard_NC4as_T4_v3"]}
    assert failover.types_of(["gcp"], None, None) == {"gcp": ["g2-standard-4"]}
    assert failover.types_of(["local"], None, None) == {"local": [""]}
    with pytest.raises(UsageError, match="several clouds are asked for by GPUs"):
        failover.types_of(["aws", "gcp"], None, "p5.48xlarge")
    with pytest.raises(UsageError, match="kiln's catalog has no T4 on aws; T4:1 is on azure"):
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

    made, chosen, tried = failover.until_up(order("gcp", "z-a", "z-b"), attempt, said.append, 600,
                                            sleep=clock.sleep, clock=lambda: clock.now)
    assert made == "up in z-b" and clock.slept == [10.0, 20.0, 40.0]
    assert "up: round 1: no capacity (any candidate); trying again in 10s (--retry-until-up: 600s left)" in said
    assert [(one.candidate.place, one.round) for one in tried] == [
        ("z-a", 1), ("z-b", 1), ("z-a", 2), ("z-b", 2), ("z-a", 3), ("z-b", 3), ("z-a", 4)]  # every round's
    record = failover.capacity_record(order("gcp", "z-a", "z-b"), chosen, tried)
    assert failover.attempt_log("c", record) == [
        "c: came up at gcp z-b t on-demand after 7 failed tries of 2 candidate(s)",
        *(f"  round {n}: gcp {place} t on-demand: capacity (ZONE_RESOURCE_POOL_EXHAUSTED)"
          for n in (1, 2, 3) for place in ("z-a", "z-b")),
        "  round 4: gcp z-a t on-demand: capacity (ZONE_RESOURCE_POOL_EXHAUSTED)"]


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


def test_a_size_that_cannot_run_as_spot_leaves_the_on_demand_fallback_its_turn():
    """Azure's size facts say no Spot (azure.plan refuses it before anything is made): with --on-demand-fallback
    the on-demand candidate of the same size comes up, as with no spot capacity."""
    spot, on_demand = Candidate("azure", "eastus", "Standard_B2s", True), Candidate("azure", "eastus", "Standard_B2s",
                                                                                     False)

    def attempt(candidate: Candidate) -> str:
        if candidate.spot:
            raise failover.Unavailable("--spot: Standard_B2s cannot run as a Spot VM", code="SpotNotSupported")
        return "up on demand"

    made, chosen, tried = failover.first_fit([spot, on_demand], attempt, lambda line: None)
    assert (made, chosen) == ("up on demand", on_demand) and [(t.verdict, t.refused) for t in tried] == [
        ("unavailable", True)]


def test_retry_until_up_leaves_out_of_later_rounds_what_a_place_does_not_offer():
    """A zone that does not offer the type (GCE's UNSUPPORTED_OPERATION_ZONE_NOT_AVAILABLE) is tried in the first
    round only; the zone that had no capacity is tried again, and taken once it has some."""
    clock, tries = Clock(), []

    def attempt(candidate: Candidate) -> str:
        tries.append(candidate.place)
        if candidate.place == "z-a":
            raise CloudError("...", code="UNSUPPORTED_OPERATION_ZONE_NOT_AVAILABLE")
        if tries.count("z-b") < 3:
            raise CloudError("...", code="ZONE_RESOURCE_POOL_EXHAUSTED")
        return f"up in {candidate.place}"

    made, _, tried = failover.until_up(order("gcp", "z-a", "z-b"), attempt, lambda line: None, 600,
                                       sleep=clock.sleep, clock=lambda: clock.now)
    assert made == "up in z-b" and tries == ["z-a", "z-b", "z-b", "z-b"]
    assert [(one.candidate.place, one.verdict, one.round) for one in tried] == [
        ("z-a", "unavailable", 1), ("z-b", "capacity", 1), ("z-b", "capacity", 2)]


def test_a_round_tries_max_attempts_candidates_and_says_how_many_it_left():
    """--max-attempts caps the tries of a round; a candidate skipped for a quota is not a try."""
    attempt, asked = fails({"r1": "InsufficientInstanceCapacity", "r2": "VcpuLimitExceeded",
                               "r3": "InsufficientInstanceCapacity", "r4": "InsufficientInstanceCapacity"})
    said: list[str] = []
    candidates = [*order("aws", "r1", "r2"), Candidate("aws", "r2", "t2", False), *order("aws", "r3", "r4", "r5")]
    with pytest.raises(NoCapacity, match=r"tried 3, 2 not tried \(--max-attempts 3\)"):
        failover.first_fit(candidates, attempt, said.append, max_attempts=3)
    assert asked == ["r1", "r2", "r3"]  # r2's second type skipped for r2's quota
    assert said[-1] == "up: 3 tried, the most a round tries (--max-attempts); 2 not tried"
    later_in_r2 = [*order("aws", "r1", "r2", "r3"), Candidate("aws", "r2", "t2", False), *order("aws", "r4")]
    with pytest.raises(NoCapacity, match=r"tried 2, 2 not tried"):  # r2's second type would be skipped: not counted
        failover.first_fit(later_in_r2, attempt, lambda line: None, max_attempts=2)
    made, chosen, _ = failover.first_fit(candidates, attempt, lambda line: None, max_attempts=6)
    assert chosen.place == "r5" and made == "up in r5"
    assert "a round tries 3 at most: --max-attempts" in failover.describe_order(candidates, max_attempts=3)[0]
    assert "at most" not in failover.describe_order(candidates)[0]


def test_a_place_that_refuses_before_anything_is_made_is_not_an_attempt():
    """A candidate whose place refused the request itself (no image there, a type it does not offer) cost a look,
    not a try: the cap counts the tries that made something."""
    asked: list[str] = []

    def attempt(candidate: Candidate) -> str:
        asked.append(candidate.place)
        if candidate.place in ("r1", "r2"):
            raise failover.Unavailable(f"no available AMI tagged kiln:profile=gpu in {candidate.place}",
                                       code="NoImageHere")
        if candidate.place == "r3":
            raise CloudError("no capacity", code="InsufficientInstanceCapacity")
        return f"up in {candidate.place}"

    said: list[str] = []
    made, chosen, tried = failover.first_fit(order("aws", "r1", "r2", "r3", "r4"), attempt, said.append,
                                             max_attempts=2)
    assert (made, asked) == ("up in r4", ["r1", "r2", "r3", "r4"])
    assert [(t.candidate.place, t.verdict, t.refused) for t in tried] == [
        ("r1", "unavailable", True), ("r2", "unavailable", True), ("r3", "capacity", False)]
    assert said[1] == "up: aws r1 t on-demand: no available AMI tagged kiln:profile=gpu in r1; nothing was made"


def test_a_quota_kiln_read_before_asking_the_cloud_is_a_look_not_an_attempt():
    """A region whose quota kiln's own look found too small (its numbers in the error's detail: AWS's vCPU and
    Elastic IP checks) is skipped as any quota is, but not counted against --max-attempts; a quota the cloud itself
    answered (the launch refused) is an attempt."""
    asked: list[str] = []

    def attempt(candidate: Candidate) -> str:
        asked.append(candidate.place)
        if candidate.place in ("r1", "r2"):
            raise CloudError("cluster.up x: 8 vCPUs short", code="VcpuLimitExceeded", detail="8 vCPUs short")
        if candidate.place == "r3":
            raise CloudError("the launch said no", code="VcpuLimitExceeded")
        return f"up in {candidate.place}"

    made, chosen, tried = failover.first_fit(order("aws", "r1", "r2", "r3", "r4"), attempt, lambda line: None,
                                             max_attempts=2)
    assert (made, asked) == ("up in r4", ["r1", "r2", "r3", "r4"])
    assert [(t.candidate.place, t.verdict, t.looked) for t in tried] == [
        ("r1", "quota", True), ("r2", "quota", True), ("r3", "quota", False)]
    with pytest.raises(NoCapacity, match=r"tried 3, 1 not tried \(--max-attempts 1\)"):
        failover.first_fit(order("aws", "r1", "r2", "r3", "r4"), attempt, lambda line: None, max_attempts=1)


def test_max_attempts_below_one_is_refused_before_anything_is_planned(tmp_path):
    for value, said in (("0", "--max-attempts 0: give how many candidates an up may try, a whole number of at "
                              "least 1"),
                        ("many", "--max-attempts wants a whole number, not 'many'")):
        refused = kiln("up", "x", "--provider", "local", "--max-attempts", value, home=tmp_path)
        assert refused.returncode == 2 and refused.stderr == f"kiln: {said}\n", refused.stderr


def test_list_v_says_how_each_cluster_came_up_and_which_record_it_cannot_read(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_HOME", str(tmp_path / ".kiln"))
    for name in ("a", "b"):
        state.save_cluster(state.ClusterRecord(name, (Host("10.0.0.2"),), "python3", provider="local"))
    candidates = order("local", "z1", "z2")
    state.save_capacity("a", failover.capacity_record(candidates, candidates[1], [
        failover.Tried(candidates[0], "capacity", "NoRoom")]))
    (tmp_path / ".kiln" / "clusters" / "b" / "capacity.json").write_text("{not json")
    listed = kiln("list", "--provider", "local", "-v", home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert ("how the clusters made from here came up:\n"
            "a: came up at local z2 t on-demand after 1 failed try of 2 candidate(s)\n"
            "  round 1: local z1 t on-demand: capacity (NoRoom)\n"
            f"b: cannot read {tmp_path}/.kiln/clusters/b/capacity.json: ") in listed.stdout, listed.stdout


def test_a_region_aws_does_not_have_is_refused_with_the_nearest_real_ones():
    from bootstrap.providers import clouds

    known = aws_plan.sdk_regions()
    assert {"us-east-1", "eu-west-1", "ap-northeast-1", "cn-north-1", "us-gov-west-1"} <= set(known)  # partitions
    clouds.CLOUDS["aws"](region="us-west-2").check_place()
    with pytest.raises(UsageError, match=r"^region us-est-1: not an AWS region \(the nearest: us-west-1, us-east-1"):
        clouds.CLOUDS["aws"](region="us-est-1").check_place()
    common.check_place("EastUS", ["eastus", "westus2"], option="location", listed="regions", word="an Azure location",
                       any_case=True)
    with pytest.raises(UsageError, match="^region US-EAST-1: not an AWS region"):
        clouds.CLOUDS["aws"](region="US-EAST-1").check_place()
    with pytest.raises(UsageError, match=r"^zone us-centrall-a: not a GCP zone \(the nearest: us-central1-a\), as "
                                         r"--zone or --zones named it$"):
        common.check_place("us-centrall-a", ["us-central1-a", "europe-west4-c"], option="zone", listed="zones",
                           word="a GCP zone")


def test_a_made_up_region_in_the_list_is_refused_before_anything_is_planned(tmp_path):
    refused = kiln("up", "x", "--gpus", "H100:8", "--regions", "us-east-1,mars-east-1", "--ssh-cidr",
                   "203.0.113.7/32", "--dry-run", home=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("kiln: region mars-east-1: not an AWS region (the nearest: us-east-1, "), \
        refused.stderr


def kiln(*args: str, home) -> subprocess.CompletedProcess:
    return subprocess.run([str(KILN), *args], cwd=home, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home), "KILN_HOME": str(home / ".kiln")})


def test_up_dry_run_gives_each_candidate_the_options_it_takes(tmp_path):
    """--max-price goes to the spot tries only, and to the clouds that take it; an option no cloud asked takes is
    refused by flag; the candidates are listed in order."""
    common = ("--ssh-cidr", "203.0.113.7/32", "--dry-run", "--count", "2")
    fallback = kiln("up", "x", "--gpus", "H100:8", "--spot", "--max-price", "30", "--on-demand-fallback",
                    "--regions", "us-east-1,us-west-2", *common, home=tmp_path)
    assert fallback.returncode == 0, fallback.stderr
    assert "  4. aws us-west-2 p5.48xlarge on-demand" in fallback.stdout and '"MaxPrice": "30"' in fallback.stdout
    clouds = kiln("up", "x", "--provider", "aws,gcp", "--gpus", "H100:8", "--spot", "--max-price", "30",
                  "--project", "kiln-test", "--zone", "us-central1-a", *common, home=tmp_path)
    assert clouds.returncode == 0, clouds.stderr
    assert "  3. gcp us-central1-a a3-megagpu-8g spot" in clouds.stdout
    for extra, said in ((("--subscription", "00000000-0000-0000-0000-000000000000"), "--subscription: an option of "
                         "none of --provider aws,gcp"),
                        (("--volume", "100"), "--volume: holds in one place"),
                        (("--regions", "aws:us-east-1,gcp:x"), "gcp is not a cloud of --provider aws,gcp that "
                         "--regions places")):
        refused = kiln("up", "x", "--provider", "aws,gcp", "--gpus", "H100:8", "--project", "kiln-test", "--zone",
                       "us-central1-a", *extra, *common, home=tmp_path)
        assert refused.returncode == 2 and said in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr


@pytest.mark.parametrize("provider, said", [("aws", "--max-price applies to spot instances only: add --spot"),
                                            ("azure", "--max-price applies to Spot VMs only: add --spot"),
                                            ("gcp", "--max-price applies to Spot VMs only: add --spot")])
def test_a_max_price_without_spot_is_refused_not_dropped(tmp_path, provider, said):
    """Only an on-demand fallback try drops --max-price; without --spot each provider still refuses it."""
    place = {"aws": (), "azure": ("--location", "eastus"), "gcp": ("--zone", "us-central1-a")}[provider]
    refused = kiln("up", "x", "--provider", provider, "--max-price", "1", "--ssh-cidr", "203.0.113.7/32", "--dry-run",
                   *place, home=tmp_path)
    assert refused.returncode == 2 and refused.stderr.startswith(f"kiln: {said}"), refused.stderr


def test_by_price_puts_the_cheapest_spot_candidates_first_then_the_cheapest_on_demand_ones():
    spot = [Candidate("aws", region, kind, True) for region in ("r1", "r2") for kind in ("p5", "p5e")]
    on_demand = [Candidate("aws", "r1", "p5", False), Candidate("aws", "r2", "p5", False),
                 Candidate("azure", "eastus", "nd", False)]
    gcp = Candidate("gcp", "z1", "a3", True)
    order = [*spot, gcp, *on_demand]
    prices = {spot[0]: 40.0, spot[1]: 30.0, spot[2]: 30.0,  # r2 p5e: no price read
              on_demand[0]: 98.32, on_demand[1]: 55.04}  # azure's: none read
    assert failover.by_price(order, prices) == [spot[1], spot[2], spot[0], spot[3], gcp,
                                                on_demand[1], on_demand[0], on_demand[2]]
    assert failover.price_requests(order) == {
        ("aws", "r1", True): ["p5", "p5e"], ("aws", "r2", True): ["p5", "p5e"], ("gcp", "z1", True): ["a3"],
        ("aws", "r1", False): ["p5"], ("aws", "r2", False): ["p5"], ("azure", "eastus", False): ["nd"]}
    described = failover.describe_order(failover.by_price(order, prices), prices)
    assert described[1] == "  1. aws r1 p5e spot ($30/h now)"
    assert described[6:8] == ["  6. aws r2 p5 on-demand ($55.04/h)", "  7. aws r1 p5 on-demand ($98.32/h)"]


def test_the_on_demand_price_of_a_type_is_its_price_lists_hourly_on_demand_term():
    """GetProducts' PriceList items as the Price List Query API documents them (product attributes, terms by
    offer code, price dimensions by rate code)."""
    import json

    from bootstrap.providers.aws import plan

    def product(kind: str, dimensions: dict) -> str:
        return json.dumps({"product": {"productFamily": "Compute Instance", "sku": "JRTCKXETXF",
                                       "attributes": {"instanceType": kind, "regionCode": "us-east-1",
                                                      "operatingSystem": "Linux", "tenancy": "Shared"}},
                           "serviceCode": "AmazonEC2", "terms": {"OnDemand": {"JRTCKXETXF.JRTCKXETXF": {
                               "offerTermCode": "JRTCKXETXF", "priceDimensions": {
                                   f"JRTCKXETXF.JRTCKXETXF.{code}": {"unit": unit, "pricePerUnit": {"USD": usd}}
                                   for code, (unit, usd) in dimensions.items()}}}}})

    listed = [product("p5.48xlarge", {"6YS6EN2CT7": ("Hrs", "98.3200000000")}),
              product("p5.48xlarge", {"6YS6EN2CT7": ("Hrs", "0.0000000000")}),  # a reservation's used capacity
              product("g6.xlarge", {"6YS6EN2CT7": ("Hrs", "0.8048000000"), "X": ("Quantity", "0.1")})]
    assert plan.on_demand_prices(listed) == {"p5.48xlarge": 98.32, "g6.xlarge": 0.8048}
    assert plan.on_demand_price_table(listed) == {("p5.48xlarge", "us-east-1"): 98.32,
                                                  ("g6.xlarge", "us-east-1"): 0.8048}
    assert "regionCode" not in [f["Field"] for f in plan.price_list_filters("p5.48xlarge")]  # every region
    assert {f["Field"]: f["Value"] for f in plan.price_list_filters("p5.48xlarge", "us-east-1")} == {
        "instanceType": "p5.48xlarge", "regionCode": "us-east-1", "locationType": "AWS Region",
        "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "licenseModel": "No License required",
        "capacitystatus": "Used", "marketoption": "OnDemand"}
    assert {f["Type"] for f in plan.price_list_filters("p5.48xlarge", "us-east-1")} == {"TERM_MATCH"}


def test_the_spot_price_of_a_type_is_the_newest_of_each_zone_and_the_lowest_of_those():
    from datetime import UTC, datetime

    from bootstrap.providers.aws import plan

    early, late = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC)
    history = [{"InstanceType": "p5", "AvailabilityZone": "r1a", "SpotPrice": "10.0", "Timestamp": early},
               {"InstanceType": "p5", "AvailabilityZone": "r1a", "SpotPrice": "35.5", "Timestamp": late},
               {"InstanceType": "p5", "AvailabilityZone": "r1b", "SpotPrice": "31.25", "Timestamp": early},
               {"InstanceType": "g6", "AvailabilityZone": "r1b", "SpotPrice": "0.4", "Timestamp": late}]
    assert plan.lowest_spot_prices(history) == {"p5": 31.25, "g6": 0.4}


def test_a_cluster_that_must_move_tries_its_other_places_only():
    order = [Candidate("aws", "us-east-1", "p5.48xlarge", True), Candidate("aws", "us-west-2", "p5.48xlarge", True),
             Candidate("gcp", "us-central1-a", "a3-highgpu-8g", True),
             Candidate("aws", "us-east-1", "p5.48xlarge", False)]
    assert failover.moved_order(order, order[0]) == [order[1], order[2]]
    assert failover.moved_order(order[:1], order[0]) == [], "one place: no move (that place just refused)"
    assert failover.moved_order([order[0], order[3]], order[3]) == [], "spot or on demand: the same place"


def test_capacity_json_keeps_what_up_asked_and_reads_back_its_candidates():
    order = [Candidate("local", "", "", False)]
    record = failover.capacity_record(order, order[0], [], {"name": "km", "count": 3, "provider": "local"})
    assert record["asked"] == {"name": "km", "count": 3, "provider": "local"}
    assert failover.candidates_of(record) == (order, order[0])
    assert "asked" not in failover.capacity_record(order, order[0], [])
    assert failover.classify("local", "NoLocalCapacity") == "capacity"


def test_a_cluster_with_no_other_place_is_not_taken_down_to_move(tmp_path, monkeypatch):
    """A managed run's move of a cluster whose up named one place (one zone; every --volume cluster) is refused
    before anything goes: the recovery says why, the cluster stays. Nothing is asked of the cluster or its
    provider (None here: any call would fail)."""
    from types import SimpleNamespace

    from bootstrap import state
    from bootstrap.errors import KilnError
    from bootstrap.recovery import Recovery

    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    only = Candidate("aws", "us-east-1", "p5.48xlarge", False)
    state.save_capacity("one", failover.capacity_record([only], only, [], {"count": 2, "volume": 100}))
    recovery = Recovery(SimpleNamespace(name="one"), None, None, None, None, None, up_again=lambda capacity: "",
                        reopen=lambda: None)
    with pytest.raises(KilnError) as refused:
        recovery.move()
    assert str(refused.value) == (
        "cluster one has no place to move to but aws us-east-1 p5.48xlarge on-demand, which has just refused a "
        "machine (its kiln up named no other: --zones, --regions, --provider): kiln does not take it down; it is "
        "left as it is")
