"""The AWS identity of a queue's controller machine (pure): an IAM role, held through an instance profile, whose
policy lets the machine do what a queue's resume and suspend ask of EC2 for its own cluster and nothing else.

What the controller does is the provider's grow and shrink (cloud.swap): RunInstances as the cluster's instances
were launched (its image, security group, key pair and placement group, tagged with the cluster at launch), the
waiters' and the Elastic IPs' lookups, GetConsoleOutput for the new instances' host keys, TerminateInstances, and
for an EFA type the Elastic IP of each instance. So the policy lets it launch only instances, volumes and network
interfaces that carry the cluster's tag as they are made (aws:RequestTag, as AWS's documentation shows for
tag-on-create), with the cluster's own image, group, key pair and placement group, tag nothing after launch, and
terminate or read the console of instances carrying the cluster's tag alone (ec2:ResourceTag), never the
controller itself (an explicit Deny on its kiln:role tag). Describe calls take no resource, as AWS has it. The
nodes get no identity.

The role and the profile share a name made of the cluster's and its region's (IAM names are global to the
account, kiln's cluster names are one per region), under the path /kiln/REGION/, where `down` and `list` look.
"""

from __future__ import annotations

import json

from bootstrap.providers.aws import plan

PATH_ROOT = "/kiln/"
POLICY_NAME = "kiln-queue-controller"  # the role's inline policy (it goes with the role)
ACTION_LOOKS = ("ec2:DescribeInstances", "ec2:DescribeAddresses")
ACTION_TAG_AT_LAUNCH = "ec2:CreateTags"
# What an Elastic IP of an EFA instance takes: allocated tagged, associated with the new instance's interface,
# parted from it and released with the instance (cloud.give_addresses, cloud.release_address)
ACTIONS_ADDRESS_MOVE = ("ec2:AssociateAddress", "ec2:DisassociateAddress")
TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


def name_of(cluster: str, region: str) -> str:
    """The role's and the instance profile's name: at most 64 characters, as IAM takes a role's (a cluster's name
    has at most 32, a region's at most 14)."""
    return f"kiln-{cluster}-{region}-controller"


def path_of(region: str) -> str:
    return f"{PATH_ROOT}{region}/"


def partition_of(region: str) -> str:
    """The ARN partition a region belongs to."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def account_of(arn: str) -> str:
    """The account of a caller's ARN (arn:aws:iam::123456789012:user/ada)."""
    parts = arn.split(":")
    if len(parts) < 6 or not parts[4].isdigit():
        raise ValueError(f"not an ARN with an account: {arn!r}")
    return parts[4]


def policy(cluster: str, *, region: str, account: str, ami: str, group_id: str, efa: bool, instance_type: str,
           spot: bool = False) -> dict:
    """The controller's policy for the cluster `cluster` in `region` of `account`: instances of `instance_type`
    alone, launched from `ami` into the security group `group_id` (its key pair and placement group by kiln's name
    for them); with `spot`, as Spot requests (AWS's Spot tagging guide has RunInstances name the request too); with
    `efa`, the Elastic IP statements too."""
    arn = f"arn:{partition_of(region)}:ec2:{region}"
    own = f"{arn}:{account}"
    tagged_at_launch = [f"{own}:instance/*", f"{own}:volume/*", f"{own}:network-interface/*"]
    spot_requests = [f"{own}:spot-instances-request/*"] if spot else []
    named = plan.resource_name(cluster)
    request_tag = {"StringEquals": {f"aws:RequestTag/{plan.TAG_CLUSTER}": cluster}}
    resource_tag = {"StringEquals": {f"ec2:ResourceTag/{plan.TAG_CLUSTER}": cluster}}
    statements = [
        {"Sid": "LaunchOnlyWhatCarriesTheClustersTag", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": tagged_at_launch[1:], "Condition": request_tag},
        {"Sid": "LaunchOnlyTheClustersNodes", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": tagged_at_launch[0],
         "Condition": {"StringEquals": {**request_tag["StringEquals"], "ec2:InstanceType": instance_type}}},
        {"Sid": "LaunchFromTheClustersOwnParts", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": [f"{arn}::image/{ami}", f"{own}:security-group/{group_id}", f"{own}:key-pair/{named}",
                      f"{own}:placement-group/{named}", f"{own}:subnet/*", *spot_requests]},
        {"Sid": "TagOnlyAtLaunch", "Effect": "Allow", "Action": ACTION_TAG_AT_LAUNCH,
         "Resource": tagged_at_launch, "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances"}}},
        {"Sid": "EndAndReadTheClustersInstancesOnly", "Effect": "Allow",
         "Action": ["ec2:TerminateInstances", "ec2:GetConsoleOutput"], "Resource": f"{own}:instance/*",
         "Condition": resource_tag},
        {"Sid": "Look", "Effect": "Allow", "Action": list(ACTION_LOOKS), "Resource": "*"},
        {"Sid": "NeverEndTheControllerItself", "Effect": "Deny", "Action": "ec2:TerminateInstances",
         "Resource": f"{own}:instance/*",
         "Condition": {"StringEquals": {f"ec2:ResourceTag/{plan.TAG_ROLE}": plan.CONTROLLER}}},
    ]
    if efa:
        statements += [
            {"Sid": "AllocateOnlyTheClustersAddresses", "Effect": "Allow", "Action": "ec2:AllocateAddress",
             "Resource": f"{own}:elastic-ip/*", "Condition": request_tag},
            {"Sid": "TagAddressesOnlyAtAllocation", "Effect": "Allow", "Action": ACTION_TAG_AT_LAUNCH,
             "Resource": f"{own}:elastic-ip/*", "Condition": {"StringEquals": {"ec2:CreateAction": "AllocateAddress"}}},
            {"Sid": "MoveOnlyTheClustersAddresses", "Effect": "Allow", "Action": list(ACTIONS_ADDRESS_MOVE),
             "Resource": [f"{own}:elastic-ip/*", f"{own}:network-interface/*"], "Condition": resource_tag},
            {"Sid": "AssociateOnlyWithTheClustersInstances", "Effect": "Allow", "Action": "ec2:AssociateAddress",
             "Resource": f"{own}:instance/*", "Condition": resource_tag},
            {"Sid": "ReleaseOnlyTheClustersAddresses", "Effect": "Allow", "Action": "ec2:ReleaseAddress",
             "Resource": f"{own}:elastic-ip/*", "Condition": resource_tag},
        ]
    return {"Version": "2012-10-17", "Statement": statements}


def actions(document: dict) -> set[str]:
    """Every action a policy document allows, in any statement."""
    found: set[str] = set()
    for statement in document["Statement"]:
        if statement["Effect"] == "Allow":
            named = statement["Action"]
            found |= {named} if isinstance(named, str) else set(named)
    return found


def as_text(document: dict) -> str:
    """A policy as IAM takes it (compact: an inline policy has at most 10,240 characters)."""
    return json.dumps(document, separators=(",", ":"))
