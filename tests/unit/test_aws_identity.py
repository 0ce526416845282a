"""The queue controller's IAM policy (bootstrap.providers.aws.identity), checked against AWS's Service Authorization
Reference (the list of each service's actions, the resource types each takes, which of them it requires, and the
condition keys each takes), as parliament ships it in iam_definition.json: every action exists, every resource is
one its action takes, every resource type an action requires is named by some statement that allows it (AWS judges
a request against all the statements together), and every condition key is one the action takes on the resources
named. parliament's own checker is not used: it imports pkg_resources, which setuptools no longer ships."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path

import pytest

from bootstrap.providers.aws import identity, plan

AMI, GROUP, ACCOUNT = "ami-0123456789abcdef0", "sg-0123456789abcdef0", "123456789012"
# Where AWS's own pages ask for more than the reference parliament ships (1.6.4, of 2025-04) lists: "Tag your Spot
# Instances" has RunInstances of a Spot Instance name its spot-instances-request too.
NEWER_THAN_THE_REFERENCE = {("ec2:RunInstances", "spot-instances-request")}


@functools.cache
def reference() -> dict[str, dict]:
    """The Service Authorization Reference, by service prefix."""
    spec = importlib.util.find_spec("parliament")
    if spec is None:
        pytest.skip("parliament (AWS's Service Authorization Reference) is not installed: make setup")
    data = Path(spec.submodule_search_locations[0]) / "iam_definition.json"
    return {service["prefix"]: service for service in json.loads(data.read_text())}


def pattern(template: str) -> re.Pattern:
    """A reference's ARN or condition key template (${Partition}, ${TagKey}) as a pattern."""
    return re.compile(".+".join(re.escape(part) for part in re.split(r"\$\{[^}]+\}", template)))


def listed(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def problems(document: dict) -> list[str]:
    """What the reference says is wrong with an identity policy, as lines."""
    found, named, required = [], {}, {}
    for statement in document["Statement"]:
        resources = listed(statement["Resource"])
        keys = [key for keyed in statement.get("Condition", {}).values() for key in keyed]
        for action in listed(statement["Action"]):
            prefix, name = action.split(":")
            service = reference()[prefix]
            privilege = next((p for p in service["privileges"] if p["privilege"] == name), None)
            if privilege is None:
                found.append(f"{action}: no such action")
                continue
            kinds = {t["resource_type"].rstrip("*"): t for t in privilege["resource_types"]}
            arns = {r["resource"]: r for r in service["resources"]}
            required[action] = {kind for kind, t in kinds.items() if t["resource_type"].endswith("*")}
            matched = []
            for resource in resources:
                if resource == "*":  # AWS takes it; where an action requires a resource type, it can be narrower
                    if required[action]:
                        found.append(f"{action}: Resource * where it takes {sorted(required[action])}")
                    matched += list(kinds)
                    continue
                fits = [kind for kind in kinds if kind and pattern(arns[kind]["arn"]).fullmatch(resource)]
                if (action, resource.rsplit(":", 1)[-1].split("/")[0]) in NEWER_THAN_THE_REFERENCE:
                    continue
                if not fits:
                    found.append(f"{action}: {resource} is no resource it takes")
                matched += fits
            named.setdefault(action, set()).update(matched)
            # the keys of the resources named, and the action's own (its row without a resource type)
            takes = {key for kind in {*matched, ""} & set(kinds) for key in kinds[kind]["condition_keys"]}
            takes |= {key for kind in matched if kind for key in arns[kind]["condition_keys"]}
            found += [f"{action}: condition key {key} is not one it takes on {sorted(set(matched))}" for key in keys
                      if not any(pattern(template).fullmatch(key) for template in takes)]
    found += [f"{action}: no statement names its {kind} resource" for action, kinds in required.items()
              for kind in sorted(kinds - named[action])]
    return found


def policy_of(efa: bool = False, region: str = "us-east-1", cluster: str = "q", spot: bool = False) -> dict:
    return identity.policy(cluster, region=region, account=ACCOUNT, ami=AMI, group_id=GROUP, efa=efa,
                           instance_type="g5.xlarge", spot=spot)


def statement(document: dict, sid: str) -> dict:
    return next(s for s in document["Statement"] if s.get("Sid") == sid)


@pytest.mark.parametrize(("efa", "spot"), [(False, False), (True, False), (False, True)])
def test_the_policy_is_one_aws_takes_as_written(efa, spot):
    assert problems(policy_of(efa, spot=spot)) == []


def test_what_the_reference_refuses_is_caught():
    """The check above can fail: a condition key the action does not take, a resource type RunInstances requires
    left out, an action that does not exist, a resource of another kind, Resource * for an action that takes
    resources."""
    document = policy_of()
    statement(document, "EndAndReadTheClustersInstancesOnly")["Condition"] = {"StringEquals": {"ec2:NoSuchKey": "q"}}
    parts = statement(document, "LaunchFromTheClustersOwnParts")
    parts["Resource"] = [r for r in parts["Resource"] if ":image/" not in r]
    statement(document, "Look")["Action"] = ["ec2:DescribeInstances", "ec2:DescribeEverything"]
    document["Statement"].append({"Effect": "Allow", "Action": "ec2:TerminateInstances", "Resource": [
        f"arn:aws:ec2:us-east-1:{ACCOUNT}:volume/*", "*"]})
    assert problems(document) == [
        "ec2:TerminateInstances: condition key ec2:NoSuchKey is not one it takes on ['instance']",
        "ec2:GetConsoleOutput: condition key ec2:NoSuchKey is not one it takes on ['instance']",
        "ec2:DescribeEverything: no such action",
        f"ec2:TerminateInstances: arn:aws:ec2:us-east-1:{ACCOUNT}:volume/* is no resource it takes",
        "ec2:TerminateInstances: Resource * where it takes ['instance']",
        "ec2:RunInstances: no statement names its image resource"]


def test_launch_and_end_are_bound_to_the_clusters_tag_and_its_own_parts():
    document = policy_of()
    by_sid = {s["Sid"]: s for s in document["Statement"]}
    launch = by_sid["LaunchOnlyWhatCarriesTheClustersTag"]
    assert launch["Condition"] == {"StringEquals": {f"aws:RequestTag/{plan.TAG_CLUSTER}": "q"}}
    assert sorted(r.rsplit(":", 1)[-1] for r in launch["Resource"]) == ["network-interface/*", "volume/*"]
    nodes = by_sid["LaunchOnlyTheClustersNodes"]
    assert nodes["Resource"].endswith(":instance/*") and nodes["Condition"] == {"StringEquals": {
        f"aws:RequestTag/{plan.TAG_CLUSTER}": "q", "ec2:InstanceType": "g5.xlarge"}}
    assert not any(":spot-instances-request/" in r for r in by_sid["LaunchFromTheClustersOwnParts"]["Resource"])
    assert any(":spot-instances-request/" in r for r in statement(policy_of(spot=True),
                                                                   "LaunchFromTheClustersOwnParts")["Resource"])
    never = by_sid["NeverEndTheControllerItself"]
    assert never["Effect"] == "Deny" and never["Condition"] == {"StringEquals": {
        f"ec2:ResourceTag/{plan.TAG_ROLE}": plan.CONTROLLER}}
    parts = by_sid["LaunchFromTheClustersOwnParts"]["Resource"]
    assert f"arn:aws:ec2:us-east-1::image/{AMI}" in parts
    assert f"arn:aws:ec2:us-east-1:{ACCOUNT}:security-group/{GROUP}" in parts
    assert f"arn:aws:ec2:us-east-1:{ACCOUNT}:key-pair/kiln-q" in parts
    assert f"arn:aws:ec2:us-east-1:{ACCOUNT}:placement-group/kiln-q" in parts
    assert by_sid["TagOnlyAtLaunch"]["Condition"] == {"StringEquals": {"ec2:CreateAction": "RunInstances"}}
    end = by_sid["EndAndReadTheClustersInstancesOnly"]
    assert end["Condition"] == {"StringEquals": {f"ec2:ResourceTag/{plan.TAG_CLUSTER}": "q"}}
    # nothing in the policy reaches IAM, or any other cluster: every unconditioned statement is a look or the
    # cluster's own named parts
    assert {a.split(":")[0] for a in identity.actions(document)} == {"ec2"}
    assert not any("Condition" not in s and s["Resource"] == "*" and set(s["Action"]) - set(identity.ACTION_LOOKS)
                   for s in document["Statement"])


def test_elastic_ips_only_for_an_efa_cluster():
    assert "ec2:AllocateAddress" not in identity.actions(policy_of(efa=False))
    addresses = {"ec2:AllocateAddress", "ec2:ReleaseAddress", *identity.ACTIONS_ADDRESS_MOVE}
    assert addresses <= identity.actions(policy_of(efa=True))


def test_arns_follow_the_regions_partition():
    assert identity.partition_of("us-east-1") == "aws"
    assert identity.partition_of("cn-north-1") == "aws-cn"
    assert identity.partition_of("us-gov-west-1") == "aws-us-gov"
    text = identity.as_text(policy_of(region="cn-north-1"))
    assert "arn:aws-cn:ec2:cn-north-1:" in text and "arn:aws:" not in text


def test_names_fit_iam_and_carry_the_region():
    longest = identity.name_of("a" * 32, "ap-southeast-3")
    assert len(longest) <= 64 and longest.endswith("-ap-southeast-3-controller")
    assert identity.path_of("eu-west-1") == "/kiln/eu-west-1/"
    assert len(identity.as_text(policy_of(efa=True, cluster="a" * 32))) <= 10240


def test_account_of_a_callers_arn():
    assert identity.account_of("arn:aws:iam::123456789012:user/ada") == ACCOUNT
    assert identity.account_of("arn:aws:sts::123456789012:assumed-role/r/s") == ACCOUNT
    with pytest.raises(ValueError, match="not an ARN"):
        identity.account_of("ada")
