"""AWS clusters with boto3: create, find by tag, tear down. Decisions live in bootstrap.providers.aws.plan.

Region, profile and credentials come from botocore's standard chain (boto3's own; AWS_REGION too); kiln never
writes credentials.
`KILN_AWS_ENDPOINT_URL` aims every client at another endpoint (the tests' moto server).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from dataclasses import replace as changed
from datetime import UTC, datetime
from typing import ClassVar

from bootstrap import state
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.providers import meanings, provision
from bootstrap.providers import offerings as offered
from bootstrap.providers.aws import efa as efa_plan
from bootstrap.providers.aws import identity, plan
from bootstrap.providers.common import Rollback, poll_host_keys
from bootstrap.providers.failover import CloudError, Unavailable
from bootstrap.providers.provision import CloudRecord, Nodes, Progress, Swap, Verbs
from kiln.hostkeys import console_host_keys as console_host_keys_of
from kiln.hostkeys import known_hosts_lines
from kiln.shield import shielded

ENDPOINT_ENV = "KILN_AWS_ENDPOINT_URL"
RUNNING_TIMEOUT_S = 600
TERMINATED_TIMEOUT_S = 600
WAITER_DELAY_S = 5
SSH_WAIT_S = plan.SSH_WAIT_S
CONSOLE_POLL_S = 10
SNAPSHOT_TIMEOUT_S = 3600
SNAPSHOT_POLL_S = 15
IDENTITY_WAIT_S = 90  # a new instance profile reaches EC2 within seconds; RunInstances is asked again until then
IDENTITY_POLL_S = 5
ANY_REGION = "us-east-1"  # where the list of regions is asked when none is configured
OFFERING_READERS = 8  # regions asked at once where each type is offered
PRICE_LIST_REGION = "us-east-1"  # where the Price List API answers (it has two others: eu-central-1, ap-south-1)


class AwsError(CloudError):
    """A call to AWS failed; the message names the step."""


@dataclass(frozen=True)
class Record(CloudRecord):
    """What kiln keeps of an AWS cluster it made (aws.json): enough to replace a node as it was launched. The
    instances, their order and their host keys are the cluster file's (state.ClusterRecord), written once there."""

    region: str
    security_group: str
    key_pair: str
    placement_group: str
    ami: str
    tags: dict
    request: dict
    data_volumes: tuple[str, ...] = ()
    restored_from: str | None = None
    efa: dict | None = None  # efa_plan.Efa's fields, where the instance type has EFA

    kind: ClassVar[str] = "aws"
    volumes_field: ClassVar[str] = "data_volumes"

    def planned(self) -> plan.Request:
        tags = tuple(tuple(pair) for pair in self.request.get("image_tags", ()))
        return plan.Request(**{**self.request, "image_tags": tags})

    def network(self) -> efa_plan.Efa | None:
        if not self.efa:
            return None
        return efa_plan.Efa(self.efa["subnet_id"], self.efa["zone"], tuple(self.efa["cards"]))


@dataclass
class Aws:
    """The clients kiln uses; tests may hand in wrapped ones."""

    ec2: object
    sts: object
    region: str
    quotas: object = None  # Service Quotas (the vCPU quotas read before a launch), where connect made one
    iam: object = None  # IAM (a queue controller's identity), where connect made one


@functools.cache
def service_models(data_path: str | None):
    """botocore's loader of the services' models, one per process (and AWS_DATA_PATH): a session of its own reads
    and parses EC2's model again (MBs of JSON, most of a connect's CPU), and a command over several regions
    connects once a region."""
    import botocore.loaders

    return botocore.loaders.create_loader(data_path)


def session_of(profile: str | None):
    """botocore's session for a profile, sharing the process's models."""
    import botocore.exceptions
    import botocore.session

    try:
        session = botocore.session.Session(profile=profile)
        session.register_component("data_loader", service_models(session.get_config_variable("data_path")))
        return session
    except botocore.exceptions.ProfileNotFound as error:
        raise UsageError(f"AWS profile: {error}") from None


def configured_region(session) -> str | None:
    """The region when none is given: AWS_REGION, else the configured one (AWS_DEFAULT_REGION, the profile's)."""
    import botocore.exceptions

    try:
        return os.environ.get("AWS_REGION") or session.get_config_variable("region")
    except botocore.exceptions.ProfileNotFound as error:
        raise UsageError(f"AWS profile: {error}") from None


def default_region(profile: str | None = None) -> str | None:
    """The region a command without --region uses, or None where none is configured (no call is made)."""
    return configured_region(session_of(profile))


def connect(region: str | None = None, profile: str | None = None) -> Aws:
    """EC2 and STS clients for a region (--region, else AWS_REGION, else the configured region) and a profile."""

    session = session_of(profile)
    region = region or configured_region(session)
    if not region:
        raise UsageError("no AWS region: give --region or set AWS_REGION / AWS_DEFAULT_REGION")
    ec2, sts, quotas, iam = (client_of(session, service, region) for service in ("ec2", "sts", "service-quotas", "iam"))
    ec2.meta.events.register("needs-retry.ec2.RunInstances", launch_retried)
    return Aws(ec2, sts, region, quotas, iam)


def client_of(session, service: str, region: str):
    """A client of one of the session's services in `region`, every call bounded (and aimed at KILN_AWS_ENDPOINT_URL
    where it is set)."""
    import botocore.config

    config = botocore.config.Config(connect_timeout=10, read_timeout=60,
                                    retries={"max_attempts": 5, "mode": "standard"})
    return session.create_client(service, region_name=region, endpoint_url=os.environ.get(ENDPOINT_ENV) or None,
                                 config=config)


def launch_retried(response=None, **_) -> bool | None:
    """botocore's question whether to send a failed RunInstances again, asked of kiln first: not where EC2 said
    there is no capacity, no such type here, or a quota (EC2 sends its capacity errors as HTTP 500, which the
    SDK's standard mode retries 5 times): kiln's failover decides what comes next, at once. None leaves the rest
    (throttling, a timeout) to the SDK's policy, which the launch's ClientToken makes safe."""
    if not response:
        return None
    error = (response[1] or {}).get("Error") or {}
    meant = meanings.meaning("aws", error.get("Code", ""), error.get("Message", ""))
    return False if meant.verdict in ("capacity", "unavailable", "quota") else None


def describe_error(error: BaseException) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict) and "Error" in response:
        return f"{response['Error'].get('Code')}: {response['Error'].get('Message')}"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    return str(error) or type(error).__name__


def error_code(error: BaseException) -> str:
    response = getattr(error, "response", None)
    return response.get("Error", {}).get("Code", "") if isinstance(response, dict) else ""


def caller(aws: Aws) -> str:
    """The caller's ARN, which also proves there are credentials."""
    import botocore.exceptions

    try:
        return aws.sts.get_caller_identity()["Arn"]
    except (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError):
        raise UsageError("no AWS credentials: configure them for boto3 (aws configure, AWS_PROFILE, "
                         "or environment variables)") from None
    except botocore.exceptions.ClientError as error:
        raise UsageError(f"AWS refused the credentials: {describe_error(error)}") from None


def check_instance_type(aws: Aws, request: plan.Request) -> None:
    """Refuse, before anything is made, an instance type the region does not offer (EC2's own offerings list, as
    RunInstances would answer Unsupported only after the groups were made): Unavailable, so that failover moves on
    to the next region. A lookup that fails (a role without ec2:DescribeInstanceTypeOfferings) checks nothing."""
    try:
        offered = aws.ec2.describe_instance_type_offerings(LocationType="region", Filters=[
            {"Name": "instance-type", "Values": [request.instance_type]}])["InstanceTypeOfferings"]
    except Exception:  # no right to ask, throttled: RunInstances says it all the same, only later
        return
    if not any(offer.get("InstanceType") == request.instance_type for offer in offered):
        raise Unavailable(f"--instance-type {request.instance_type}: not offered in {aws.region}", code="Unsupported")


def efa_network(aws: Aws, request: plan.Request) -> efa_plan.Efa | None:
    """Where and with which interfaces an instance type with EFA is launched (efa.efa_cards, efa.default_subnet), from
    EC2's own answers; None for a type without EFA. A region with no default subnet in a zone that offers the
    type is Unavailable (failover moves on). Where the type cannot be described (a role without
    ec2:DescribeInstanceTypes), a type the catalog knows has EFA is refused, any other is launched as before."""
    try:
        described = aws.ec2.describe_instance_types(InstanceTypes=[request.instance_type])["InstanceTypes"]
    except Exception as error:
        if request.instance_type not in efa_plan.EFA_NETWORK_CARDS:
            return None
        raise AwsError(f"cluster.up {request.name}: could not read the network cards of {request.instance_type} "
                       f"(DescribeInstanceTypes): {describe_error(error)}; nothing was created") from None
    cards = efa_plan.efa_cards(described[0].get("NetworkInfo") or {}) if described else ()
    if not cards:
        return None
    try:
        zones = [offer["Location"] for offer in aws.ec2.describe_instance_type_offerings(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [request.instance_type]}])[
            "InstanceTypeOfferings"]]
        subnets = aws.ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    except Exception as error:
        raise AwsError(f"cluster.up {request.name}: could not find a subnet for the EFA interfaces of "
                       f"{request.instance_type}: {describe_error(error)}; nothing was created") from None
    subnet = efa_plan.default_subnet(subnets, zones)
    if subnet is None:
        raise Unavailable(f"--instance-type {request.instance_type}: EFA needs a default subnet in a zone of "
                          f"{aws.region} that offers it, and there is none (zones offering it: "
                          f"{', '.join(sorted(zones)) or 'none'})", code="NoDefaultSubnet")
    return efa_plan.Efa(subnet["SubnetId"], subnet["AvailabilityZone"], cards)


def give_addresses(aws: Aws, instances: Sequence[dict], tags: dict[str, str]) -> list[str]:
    """Allocate an Elastic IP (tagged with the cluster) for each instance and associate it with its card-0
    interface: EC2 gives no public IPv4 address to an instance launched with several interfaces. The allocation
    ids, in the instances' order."""
    allocated = []
    for instance in instances:
        interface = efa_plan.primary_interface(instance)
        if interface is None:
            raise AwsError(f"{instance['InstanceId']} has no network interface at card 0, device 0")
        allocation = aws.ec2.allocate_address(**plan.address_request(tags))["AllocationId"]
        allocated.append(allocation)
        try:
            aws.ec2.associate_address(AllocationId=allocation, NetworkInterfaceId=interface)
        except BaseException:  # not left allocated (and billed) where no undo looks for it
            with contextlib.suppress(Exception):
                release_address(aws, allocation)
            raise
    return allocated


def check_addresses(aws: Aws, request: plan.Request) -> None:
    """Refuse, before anything is made, an EFA cluster the region's Elastic IP quota cannot hold (each EFA node
    needs one: efa.addresses_short): a quota error (AddressLimitExceeded), so failover skips the region. A lookup
    that fails (a role without ec2:DescribeAccountAttributes) checks nothing: the launch says it all the same."""
    try:
        attributes = aws.ec2.describe_account_attributes(AttributeNames=["vpc-max-elastic-ips"])["AccountAttributes"]
        limit = int(attributes[0]["AttributeValues"][0]["AttributeValue"])
        used = len(aws.ec2.describe_addresses()["Addresses"])
    except Exception:
        return
    short = efa_plan.addresses_short(limit, used, request.count)
    if short:
        raise AwsError(f"cluster.up {request.name}: {short} in {aws.region}; nothing was created",
                       code="AddressLimitExceeded", detail=short)


def check_vcpus(aws: Aws, request: plan.Request) -> None:
    """Refuse, before anything is made, machines that the region's vCPU quota for their family (plan.VCPU_QUOTAS:
    on-demand or spot) cannot hold beside the family's machines already running: a quota error, as EC2 would
    answer the launch (VcpuLimitExceeded; MaxSpotInstanceCountExceeded for spot), so failover skips the region. A
    quota that cannot be read (a role without servicequotas:GetServiceQuota, a family kiln does not read) checks
    nothing: the launch says it all the same."""
    family = plan.quota_family(request.instance_type)
    quota = plan.VCPU_QUOTAS.get((family, request.spot))
    if quota is None or aws.quotas is None:
        return
    try:
        limit = float(aws.quotas.get_service_quota(ServiceCode="ec2", QuotaCode=quota.code)["Quota"]["Value"])
        pages = aws.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
        instances = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        kinds = sorted({i["InstanceType"] for i in instances} | {request.instance_type})
        vcpus = {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"])
                 for t in aws.ec2.describe_instance_types(InstanceTypes=kinds)["InstanceTypes"]}
    except Exception:  # no right to ask, no such quota here, throttled
        return
    used = plan.vcpus_in_use(instances, vcpus, family, request.spot)
    short = plan.vcpus_short(quota, limit, used, vcpus.get(request.instance_type, 0) * request.count, request.count,
                             request.instance_type)
    if short:
        raise AwsError(f"cluster.up {request.name}: {short} in {aws.region}; nothing was created",
                       code="MaxSpotInstanceCountExceeded" if request.spot else "VcpuLimitExceeded", detail=short)


def described_instances(aws: Aws, instance_ids: Sequence[str]) -> list[dict]:
    return plan.launch_order([i for r in aws.ec2.describe_instances(InstanceIds=list(instance_ids))["Reservations"]
                              for i in r["Instances"]])


def spot_prices(instance_types: Sequence[str], *, region: str | None = None, profile: str | None = None,
                aws: Aws | None = None, now: datetime | None = None) -> dict[str, float]:
    """The spot price now of each type in the region (plan.lowest_spot_prices), from EC2's spot price history."""
    aws = aws or connect(region, profile)
    try:
        history = aws.ec2.describe_spot_price_history(
            InstanceTypes=list(instance_types), ProductDescriptions=["Linux/UNIX"],
            StartTime=now or datetime.now(UTC))["SpotPriceHistory"]
    except Exception as error:
        raise AwsError(f"could not read the spot prices in {aws.region}: {describe_error(error)}") from None
    return plan.lowest_spot_prices(history)


def default_place(*, region: str | None = None, profile: str | None = None) -> str | None:
    """The region an up that names none goes to (AWS_REGION, AWS_DEFAULT_REGION, the profile's), or None."""
    return region or default_region(profile)


def place_names(*, region: str | None = None, profile: str | None = None, near: str | None = None) -> Sequence[str]:
    """Every region AWS has, from the SDK's own endpoint data (no call: plan.sdk_regions)."""
    return plan.sdk_regions()


def on_demand_prices(instance_types: Sequence[str], *, region: str | None = None,
                     profile: str | None = None) -> dict[str, float]:
    """Each type's on-demand price per hour in the region, from the Price List's table of every region
    (known_prices: read once per command)."""
    region = region or default_region(profile)
    if not region:
        raise UsageError("no AWS region to price: give --region or set AWS_REGION / AWS_DEFAULT_REGION")
    table = known_prices(profile, tuple(instance_types))
    if isinstance(table, str):
        raise AwsError(table)
    return {kind: usd for (kind, where), usd in table.items() if where == region}


@functools.cache
def known_prices(profile: str | None, instance_types: tuple[str, ...]) -> dict[tuple[str, str], float] | str:
    """The price table of the types in every region (price_table), asked once per command (an up prices each
    candidate's region from it), or why it could not be read."""
    try:
        return price_table(session_of(profile), instance_types)
    except AwsError as error:
        return str(error)


def price_table(session, instance_types: Sequence[str]) -> dict[tuple[str, str], float]:
    """Each (type, region)'s Linux on-demand price per hour in every region, from AWS's Price List (GetProducts
    of AmazonEC2 by type, asked at its us-east-1 endpoint: no charge, the account's credentials)."""
    found: dict[tuple[str, str], float] = {}
    try:
        pricing = client_of(session, "pricing", PRICE_LIST_REGION)
        for kind in instance_types:
            pages = pricing.get_paginator("get_products").paginate(
                ServiceCode="AmazonEC2", Filters=plan.price_list_filters(kind), FormatVersion="aws_v1")
            found.update(plan.on_demand_price_table(text for page in pages for text in page["PriceList"]))
    except Exception as error:
        raise AwsError(f"could not read the on-demand prices: {error_code(error) or describe_error(error)}") \
            from None
    return found


def account(*, region: str | None = None, profile: str | None = None) -> str:
    """Which account the credentials are, as kiln keeps it beside what it read with them: the profile and a digest
    of the access key id (no call; none where there are no credentials)."""
    credentials = session_of(profile).get_credentials()
    if credentials is None:
        raise UsageError("no AWS credentials (aws configure, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
    return f"{profile or 'default'}:{hashlib.sha256(credentials.access_key.encode()).hexdigest()[:12]}"


def offerings(instance_types: Sequence[str], *, region: str | None = None, profile: str | None = None,
              now: datetime | None = None) -> offered.Record:
    """Where the types are offered to the account: every region it can use (DescribeRegions), in each the zones
    that have each type (DescribeInstanceTypeOfferings by availability zone), the regions asked side by side; a
    region that does not answer is left out and named."""
    own = region or default_region(profile)
    names = regions(region=own or ANY_REGION, profile=profile)
    session = session_of(profile)
    clients = {name: client_of(session, "ec2", name) for name in names}  # made here: a session is not thread-safe
    skipped: list[str] = []

    def offered_in(name: str) -> list[offered.Offering]:
        try:
            pages = clients[name].get_paginator("describe_instance_type_offerings").paginate(
                LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": list(instance_types)}])
            return offered.aws_offerings(name, [row for page in pages for row in page["InstanceTypeOfferings"]])
        except Exception as error:
            skipped.append(f"{name} ({describe_error(error)})")
            return []

    with ThreadPoolExecutor(OFFERING_READERS) as pool:
        found = [row for rows in pool.map(offered_in, names) for row in rows]
    if skipped and len(skipped) == len(names):
        raise AwsError(f"could not read the instance types offered in any region: {skipped[0]}")
    priced_from = "AWS's Price List, on demand"
    try:
        found = offered.priced(found, price_table(session, instance_types))
    except AwsError as error:
        skipped.append(f"the prices ({error})")
        priced_from = ""
    return offered.Record("aws", "", (now or datetime.now(UTC)).isoformat(timespec="seconds"),
                          "EC2's DescribeInstanceTypeOfferings", tuple(instance_types), tuple(found),
                          tuple(sorted(skipped)), priced_from)


def find_image(aws: Aws, request: plan.Request) -> str:
    import botocore.exceptions

    if request.ami:
        try:
            images = aws.ec2.describe_images(ImageIds=[request.ami])["Images"]
        except botocore.exceptions.ClientError as error:
            if error_code(error).startswith("InvalidAMIID"):
                images = []
            else:
                raise
        if not images:
            raise UsageError(f"AMI {request.ami} does not exist in {aws.region}")
        return request.ami
    filters = plan.image_filters(request.image_profile, request.image_tags)
    images = aws.ec2.describe_images(Owners=["self"], Filters=filters)["Images"]
    newest = plan.newest_image(images)
    if newest is None:
        wanted = ", ".join(f"{k}={v}" for k, v in ((plan.TAG_PROFILE, request.image_profile), *request.image_tags))
        # a place without the image: the next candidate's turn, nothing made (an image is baked into one region)
        raise Unavailable(f"no available AMI tagged {wanted} in {aws.region}: bake one, or give --ami",
                          code="NoImageHere")
    return newest["ImageId"]


def find_resources(aws: Aws, name: str | None = None, *, identities: bool = True) -> list[plan.Resource]:
    """Every kiln-tagged resource (of the cluster `name`, if given), found by tags alone; with `identities`, a queue
    controller's IAM role and instance profile too (find_identities: what `up` makes is in EC2 alone, so its looks
    ask EC2 alone)."""
    if name is None:
        tagged = [{"Name": "tag-key", "Values": [plan.TAG_CLUSTER]}]
    else:
        tagged = [{"Name": f"tag:{plan.TAG_CLUSTER}", "Values": [name]}]
    found = []
    live = ["pending", "running", "stopping", "stopped", "shutting-down"]
    for page in aws.ec2.get_paginator("describe_instances").paginate(
            Filters=[*tagged, {"Name": "instance-state-name", "Values": live}]):
        for reservation in page["Reservations"]:
            found += [plan.Resource("instance", i["InstanceId"], plan.tags_of(i), i["State"]["Name"])
                      for i in reservation["Instances"]]
    for page in aws.ec2.get_paginator("describe_volumes").paginate(Filters=tagged):
        found += [plan.Resource("volume", v["VolumeId"], plan.tags_of(v), v["State"]) for v in page["Volumes"]]
    for page in aws.ec2.get_paginator("describe_security_groups").paginate(Filters=tagged):
        found += [plan.Resource("security-group", g["GroupId"], plan.tags_of(g)) for g in page["SecurityGroups"]]
    found += [plan.Resource("key-pair", k["KeyName"], plan.tags_of(k))
              for k in aws.ec2.describe_key_pairs(Filters=tagged)["KeyPairs"]]
    found += [plan.Resource("placement-group", g["GroupName"], plan.tags_of(g), g.get("State", ""))
              for g in aws.ec2.describe_placement_groups(Filters=tagged)["PlacementGroups"]]
    found += [plan.Resource("elastic-ip", a["AllocationId"], plan.tags_of(a))
              for a in aws.ec2.describe_addresses(Filters=tagged)["Addresses"] if a.get("AllocationId")]
    return found + (find_identities(aws, name) if identities else [])


def find_identities(aws: Aws, name: str | None = None) -> list[plan.Resource]:
    """The IAM role and instance profile of a queue controller of the region (of the cluster `name`, if given),
    found by their path (identity.path_of) and the cluster's tag. Credentials that may not read IAM see none: a
    cluster without a queue on a cloud has none."""
    import botocore.exceptions

    if aws.iam is None:
        return []
    path = identity.path_of(aws.region)
    try:
        if name is not None:
            own = identity.name_of(name, aws.region)
            roles = named_entity(lambda: aws.iam.get_role(RoleName=own)["Role"])
            profiles = named_entity(lambda: aws.iam.get_instance_profile(InstanceProfileName=own)["InstanceProfile"])
        else:
            roles = [{**role, "Tags": aws.iam.list_role_tags(RoleName=role["RoleName"])["Tags"]}
                     for page in aws.iam.get_paginator("list_roles").paginate(PathPrefix=path)
                     for role in page["Roles"] if role["Path"] == path]
            profiles = [entity for page in aws.iam.get_paginator("list_instance_profiles").paginate(PathPrefix=path)
                        for listed in page["InstanceProfiles"] if listed["Path"] == path
                        for entity in named_entity(lambda listed=listed: aws.iam.get_instance_profile(
                            InstanceProfileName=listed["InstanceProfileName"])["InstanceProfile"])]
    except botocore.exceptions.ClientError as error:
        if error_code(error) in ("AccessDenied", "AccessDeniedException"):
            return []
        raise
    found = [plan.Resource("instance-profile", p["InstanceProfileName"], plan.tags_of(p)) for p in profiles
             if p["Path"] == path]
    found += [plan.Resource("iam-role", r["RoleName"], plan.tags_of(r)) for r in roles if r["Path"] == path]
    return [r for r in found if r.cluster and (name is None or r.cluster == name)]


def named_entity(get: Callable[[], dict]) -> list[dict]:
    """An IAM entity asked for by name: [it], or [] where IAM has none of that name."""
    import botocore.exceptions

    try:
        return [get()]
    except botocore.exceptions.ClientError as error:
        if error_code(error) != "NoSuchEntity":
            raise
        return []


def make_controller_identity(name: str, *, region: str | None = None, profile: str | None = None,
                             aws: Aws | None = None) -> str:
    """Make the IAM role, with its policy (identity.policy), and the instance profile a queue's controller
    machine holds to grow and shrink the cluster `name`, tagged as the cluster is; the profile's name. All of it or
    nothing: a step that fails (or a Ctrl-C) removes what was made before it."""
    _, cloud = Record.of_cluster(name)
    aws = aws or connect(region or cloud.region, profile)
    own, path = identity.name_of(name, aws.region), identity.path_of(aws.region)
    request = cloud.planned()
    document = identity.policy(name, region=aws.region, account=identity.account_of(caller(aws)), ami=cloud.ami,
                               group_id=cloud.security_group, efa=cloud.network() is not None,
                               instance_type=request.instance_type, spot=request.spot)
    tags = plan.tag_list(cloud.tags)
    rollback = Rollback()
    step = "create the role"
    try:
        aws.iam.create_role(RoleName=own, Path=path, AssumeRolePolicyDocument=json.dumps(identity.TRUST), Tags=tags,
                            Description=f"kiln: the queue controller of cluster {name} in {aws.region}")
        rollback.push("delete the role", lambda: remove_role(aws, own))  # this call's own: one that was there stays
        step = "give the role its policy"
        aws.iam.put_role_policy(RoleName=own, PolicyName=identity.POLICY_NAME,
                                PolicyDocument=identity.as_text(document))
        step = "create the instance profile"
        aws.iam.create_instance_profile(InstanceProfileName=own, Path=path, Tags=tags)
        rollback.push("delete the instance profile", lambda: remove_instance_profile(aws, own))
        step = "put the role in the instance profile"
        aws.iam.add_role_to_instance_profile(InstanceProfileName=own, RoleName=own)
    except (Exception, KeyboardInterrupt) as error:
        with shielded(f"removing what was made of cluster {name}'s controller identity",
                      f"leaves it for kiln down {name}"):
            failures = rollback.run(describe_error, stoppable=True)
        left = f"; left: {'; '.join(failures)} (kiln down {name} removes it)" if failures else ""
        if error_code(error) == "EntityAlreadyExists":  # an earlier controller's: left as it is
            raise UsageError(f"cluster {name}: could not {step} of its queue controller: {own} exists already "
                             f"(an earlier controller's: kiln down {name} removes it){left}") from None
        raise AwsError(f"cluster {name}: could not {step} of its queue controller: {describe_error(error)}"
                       f"{left or '; nothing of it is left'}", code=error_code(error)) from None
    return own


def make_controller(name: str, *, instance_type: str = plan.CONTROLLER_TYPE, region: str | None = None,
                    profile: str | None = None, aws: Aws | None = None, running_timeout_s: float = RUNNING_TIMEOUT_S,
                    ssh_wait_s: float = SSH_WAIT_S, identity_wait_s: float = IDENTITY_WAIT_S,
                    identity_poll_s: float = IDENTITY_POLL_S) -> tuple[Host, list[str]]:
    """Make the queue controller machine of the cluster `name`: its identity (make_controller_identity), then one
    instance holding it (plan.controller_request) that must run, answer SSH and show its host keys on its console
    (kiln never trusts a new machine on first contact); the cluster file records it as the controller and its
    keys are pinned beside the nodes'. All of it or nothing: a step that fails (or a Ctrl-C) removes what was made
    before it. (its host, its host keys)"""
    import botocore.exceptions

    record, cloud = Record.of_cluster(name)
    if record.controller:
        raise UsageError(f"cluster {name} has a controller already ({record.controller.id} at "
                         f"{record.controller.address})")
    aws = aws or connect(region or cloud.region, profile)
    request = cloud.planned()
    attempt = secrets.token_hex(8)  # this call's own: the undo removes what it made alone
    rollback = Rollback()
    making = Progress("make its identity")
    try:
        instance_profile = make_controller_identity(name, aws=aws)
        rollback.push("remove its identity", lambda: remove(aws, find_identities(aws, name)))
        making.step = "run the instance"
        params = plan.controller_request(request, ami=cloud.ami, group_id=cloud.security_group,
                                         tags={**cloud.tags, plan.TAG_ATTEMPT: attempt}, profile_name=instance_profile,
                                         instance_type=instance_type, client_token=plan.client_token(name, attempt))
        rollback.push("terminate the instance", lambda: remove(aws, [
            r for r in controllers(find_resources(aws, name, identities=False))
            if r.tags.get(plan.TAG_ATTEMPT) == attempt]))
        deadline = time.monotonic() + identity_wait_s
        while True:
            try:
                instance_id = aws.ec2.run_instances(**params)["Instances"][0]["InstanceId"]
                break
            except botocore.exceptions.ClientError as error:
                seen = error.response.get("Error", {})
                if not plan.profile_not_seen_yet(seen.get("Code", ""), seen.get("Message", "")) or \
                        time.monotonic() >= deadline:
                    raise
                time.sleep(identity_poll_s)
        making.step = "wait until it runs"
        wait(aws, "instance_running", [instance_id], running_timeout_s)
        [host] = plan.hosts_from_instances(described_instances(aws, [instance_id]), request.user)
        keys = provision.answered_keys([(instance_id, host)], lambda ids, timeout_s: console_host_keys(
            aws, ids, timeout_s), AwsError, making, "read its host keys from the console", ssh_wait_s).get(instance_id)
        if not keys:
            raise AwsError(f"{instance_id} shows no host keys on its console: kiln does not trust a new machine on "
                           "first contact")
    except (Exception, KeyboardInterrupt) as error:
        with shielded(f"removing what was made of cluster {name}'s queue controller",
                      f"leaves it for kiln down {name}"):
            failures = rollback.run(describe_error, stoppable=True)
        if isinstance(error, UsageError) and not failures:
            raise
        said = "interrupted" if isinstance(error, KeyboardInterrupt) else describe_error(error)
        left = f"; left: {'; '.join(failures)} (kiln down {name} removes it)" if failures else \
            "; nothing of it is left"
        raise AwsError(f"cluster {name}: could not make its queue controller: could not {making.step}: {said}{left}",
                       code=error_code(error)) from None
    state.write_known_hosts(name, state.read_known_hosts(name) + "".join(
        known_hosts_lines([host.address], keys, host.port)))  # pinned before the record names it
    state.save_cluster(changed(state.load_cluster(name) or record,
                               controller=state.Instance(instance_id, host.address, "console")))
    return host, keys


def controllers_ended(aws: Aws, name: str, timeout_s: float) -> tuple[list[str], list[plan.Resource]]:
    """What `down` removes first, and what it finds for the rest: a cluster's queue controllers are terminated,
    and waited for until they are gone, before it looks again (a resume they run launches nothing more once they
    are, and what one launched before is tagged, found then); without one, the one look. (what was removed, what
    is left)"""
    found = find_resources(aws, name)
    if not controllers(found):
        return [], found
    return remove(aws, controllers(found), timeout_s), find_resources(aws, name)


def controllers(resources: Sequence[plan.Resource]) -> list[plan.Resource]:
    """The queue controller machines among a cluster's resources (by their kiln:role tag)."""
    return [r for r in resources if r.kind == "instance" and r.tags.get(plan.TAG_ROLE) == plan.CONTROLLER]


def remove_instance_profile(aws: Aws, profile_name: str) -> None:
    """Take its roles out of an instance profile, then delete it; one already gone is fine."""
    for found in named_entity(lambda: aws.iam.get_instance_profile(InstanceProfileName=profile_name)[
            "InstanceProfile"]):
        for role in found.get("Roles", []):
            aws.iam.remove_role_from_instance_profile(InstanceProfileName=profile_name, RoleName=role["RoleName"])
        aws.iam.delete_instance_profile(InstanceProfileName=profile_name)


def remove_role(aws: Aws, role_name: str) -> None:
    """Delete a role, after its inline policies and the instance profiles it is in let go of it; one already
    gone is fine."""
    if not named_entity(lambda: aws.iam.get_role(RoleName=role_name)["Role"]):
        return
    for held in aws.iam.list_instance_profiles_for_role(RoleName=role_name)["InstanceProfiles"]:
        aws.iam.remove_role_from_instance_profile(InstanceProfileName=held["InstanceProfileName"], RoleName=role_name)
    for policy_name in aws.iam.list_role_policies(RoleName=role_name)["PolicyNames"]:
        aws.iam.delete_role_policy(RoleName=role_name, PolicyName=policy_name)
    aws.iam.delete_role(RoleName=role_name)


def find_snapshots(aws: Aws, name: str | None = None) -> list[plan.Snapshot]:
    """Every kiln-tagged snapshot of a data volume (of the cluster `name`, if given). They outlive the cluster:
    `down` leaves them, `sweep` removes them once they expire."""
    if name is None:
        tagged = [{"Name": "tag-key", "Values": [plan.TAG_DATA]}]
    else:
        tagged = [{"Name": f"tag:{plan.TAG_CLUSTER}", "Values": [name]}, {"Name": "tag-key", "Values": [plan.TAG_DATA]}]
    return [plan.snapshot_of(s) for page in aws.ec2.get_paginator("describe_snapshots").paginate(
        OwnerIds=["self"], Filters=tagged) for s in page["Snapshots"]]


def wait(aws: Aws, waiter: str, instance_ids: list[str], timeout_s: float) -> None:
    if instance_ids:
        aws.ec2.get_waiter(waiter).wait(InstanceIds=instance_ids, WaiterConfig={
            "Delay": WAITER_DELAY_S, "MaxAttempts": max(1, int(timeout_s // WAITER_DELAY_S))})


def delete(aws: Aws, resource: plan.Resource) -> None:
    """Delete one resource; one that is already gone is fine."""
    import botocore.exceptions

    calls = {"volume": lambda: aws.ec2.delete_volume(VolumeId=resource.id),
             "security-group": lambda: aws.ec2.delete_security_group(GroupId=resource.id),
             "key-pair": lambda: aws.ec2.delete_key_pair(KeyName=resource.id),
             "placement-group": lambda: aws.ec2.delete_placement_group(GroupName=resource.id),
             "elastic-ip": lambda: release_address(aws, resource.id),
             "instance-profile": lambda: remove_instance_profile(aws, resource.id),
             "iam-role": lambda: remove_role(aws, resource.id)}
    try:
        calls[resource.kind]()
    except botocore.exceptions.ClientError as error:
        if "NotFound" not in error_code(error):
            raise


def release_address(aws: Aws, allocation_id: str) -> None:
    """Release an Elastic IP, first parting it from an interface it is still associated with (a terminated
    instance's interface lets go of it a little after the instance is gone)."""
    import botocore.exceptions

    for address in aws.ec2.describe_addresses(AllocationIds=[allocation_id])["Addresses"]:
        if address.get("AssociationId"):
            try:
                aws.ec2.disassociate_address(AssociationId=address["AssociationId"])
            except botocore.exceptions.ClientError as error:
                if "NotFound" not in error_code(error):
                    raise
    aws.ec2.release_address(AllocationId=allocation_id)


def remove(aws: Aws, resources: list[plan.Resource], timeout_s: float = TERMINATED_TIMEOUT_S) -> list[str]:
    """Terminate the instances, wait until they are gone, then delete the rest; what was removed."""
    ordered = plan.teardown_order(resources)
    instances = [r.id for r in ordered if r.kind == "instance"]
    if instances:
        aws.ec2.terminate_instances(InstanceIds=instances)
        wait(aws, "instance_terminated", instances, timeout_s)
    left = aws.ec2.describe_volumes(
        Filters=[{"Name": "volume-id", "Values": [r.id for r in ordered if r.kind == "volume"]}])["Volumes"] \
        if any(r.kind == "volume" for r in ordered) else []
    # a terminated instance's volumes detach a little after it is gone; one still in use cannot be deleted
    wait_volumes(aws, "volume_available", [v["VolumeId"] for v in left if v["State"] == "in-use"], timeout_s)
    remaining = {v["VolumeId"] for v in left}
    for resource in ordered:
        if resource.kind == "volume" and resource.id not in remaining:
            continue  # deleted with its instance
        if resource.kind != "instance":
            delete(aws, resource)
    return [f"{r.kind} {r.id}" for r in ordered]


def up(request: plan.Request, *, ssh_wait_s: float = SSH_WAIT_S, region: str | None = None,
       profile: str | None = None, python: str = "python3", aws: Aws | None = None, now: datetime | None = None,
       running_timeout_s: float = RUNNING_TIMEOUT_S, say: Callable[[str], None] | None = None) -> provision.Up:
    """Create the cluster, wait until SSH answers on every instance (unless ssh_wait_s is 0), pin the host keys
    the consoles show, write its cluster file, and return what was made. On any failure, undo it all.

    With volume_gib, each node gets an encrypted data volume of its own, restored from the cluster's newest
    complete set of snapshots where there is one (`down --snapshot` makes them), else empty."""
    import botocore.exceptions

    ssh_wait_s = plan.validate_ssh_wait(ssh_wait_s)
    aws = aws or connect(region, profile)
    owner = caller(aws)
    check_instance_type(aws, request)
    now_ = plan.launched_now(request)  # a queue's cluster: its first machines, or none
    try:  # what AWS answers these looks with (a policy denying the region, throttling) is its error, as any call's
        image = find_image(aws, request)  # a region without the type or the image refuses before any quota is asked
        if now_:
            check_vcpus(aws, now_)
        network = efa_network(aws, request)
        if network and now_:
            check_addresses(aws, now_)
        taken = find_resources(aws, request.name, identities=False)
    except botocore.exceptions.BotoCoreError as error:
        raise AwsError(f"cluster.up {request.name}: {describe_error(error)}; nothing was created") from None
    except botocore.exceptions.ClientError as error:
        raise AwsError(f"cluster.up {request.name}: {describe_error(error)}; nothing was created",
                       code=error_code(error)) from None
    if taken:
        data = [r.id for r in taken if r.kind == "volume" and plan.TAG_DATA in r.tags]
        raise UsageError(f"cluster name {request.name!r} is taken: {len(taken)} resource(s) tagged "
                         f"{plan.TAG_CLUSTER}={request.name} exist in {aws.region} " + (
                             f"(kiln down {request.name} --snapshot keeps its data volumes {', '.join(data)} as "
                             f"snapshots; kiln down {request.name} deletes them)" if data else
                             f"(kiln down --name {request.name})"))
    try:
        restored = plan.latest_snapshot_set(find_snapshots(aws, request.name)) if request.volume_gib else {}
    except Exception as error:
        raise AwsError(f"cluster.up {request.name}: could not look for snapshots of its data volumes: "
                       f"{describe_error(error)}; nothing was created") from None
    note = plan.restore_note(request.name, request.count, restored) if request.volume_gib else None
    attempt = secrets.token_hex(8)
    tags = {**plan.cluster_tags(request.name, owner, now or datetime.now(UTC), request.ttl_hours),
            plan.TAG_ATTEMPT: attempt}
    token = plan.client_token(request.name, attempt)
    made: dict = {}  # what make() learns that the record and the answer need

    def mine(kind: str) -> list[plan.Resource]:
        """What this up made of a kind (its tags name this attempt): the undo removes that alone."""
        return [r for r in find_resources(aws, request.name, identities=False) if r.kind == kind
                and r.tags.get(plan.TAG_ATTEMPT) == attempt]

    def make(progress: Progress, rollback: Rollback, public_key: str) -> Nodes:
        steps = plan.plan_cluster(now_ or request, tags=tags, ami=image, public_key=public_key, efa=network,
                                  token=token)

        progress.step = "import the key pair"
        rollback.push("delete the key pair", lambda: [delete(aws, r) for r in mine("key-pair")])
        aws.ec2.import_key_pair(**steps.import_key_pair)

        progress.step = "create the security group"
        rollback.push("delete the security group", lambda: [delete(aws, r) for r in mine("security-group")])
        made["group_id"] = aws.ec2.create_security_group(**steps.create_security_group)["GroupId"]
        steps = plan.plan_cluster(now_ or request, tags=tags, ami=image, public_key=public_key,
                                  group_id=made["group_id"], efa=network, token=token)

        progress.step = "allow SSH and cluster traffic in the security group"
        aws.ec2.authorize_security_group_ingress(**steps.authorize_ingress)
        if steps.authorize_egress:
            progress.step = "allow EFA traffic out to the security group"
            aws.ec2.authorize_security_group_egress(**steps.authorize_egress)

        progress.step = "create the placement group"
        rollback.push("delete the placement group", lambda: [delete(aws, r) for r in mine("placement-group")])
        aws.ec2.create_placement_group(**steps.create_placement_group)
        made["volumes"] = []
        if not now_:  # a queue's cluster whose machines Slurm asks for, each in turn (grow)
            return Nodes((), ())

        progress.step = "run the instances"
        rollback.push("terminate the instances",  # and release their Elastic IPs, once they are gone
                      lambda: remove(aws, mine("instance") + mine("volume") + mine("elastic-ip")))
        launched = aws.ec2.run_instances(**steps.run_instances)["Instances"]
        made["instances"] = [i["InstanceId"] for i in launched]

        progress.step = "wait until the instances run"
        wait(aws, "instance_running", made["instances"], running_timeout_s)
        described = described_instances(aws, made["instances"])
        if network:
            progress.step = "give each instance an Elastic IP"
            give_addresses(aws, described, tags)
            described = described_instances(aws, made["instances"])
        if request.volume_gib:
            progress.step = "create the data volumes"
            made["volumes"] = attach_data_volumes(aws, described, request.volume_gib, tags, restored,
                                                  running_timeout_s)
        return Nodes(tuple(i["InstanceId"] for i in described),
                     tuple(plan.hosts_from_instances(described, request.user)))

    def save(nodes: Nodes) -> None:
        Record(aws.region, made["group_id"], plan.resource_name(request.name), plan.resource_name(request.name),
               image, tags, asdict(request), tuple(made["volumes"]), note,
               efa=asdict(network) if network else None).save(request.name)

    cluster = provision.up(request.name, Verbs(
        "aws", AwsError, make, lambda ids, timeout_s: console_host_keys(aws, ids, timeout_s), save, describe_error,
        error_code, keys_step="read the host keys from the consoles", keys_source="console",
        place={"region": aws.region, **({"profile": profile} if profile else {})}),
        region=aws.region, user=request.user, node_type=request.instance_type, python=python, ssh_wait_s=ssh_wait_s,
        say=say)
    return cluster.made(request.name, where=aws.region, image=image, expires=tags[plan.TAG_EXPIRES],
                        ssh_wait=ssh_wait_s, volumes=made["volumes"], restore_note=note)


def attach_data_volumes(aws: Aws, instances: Sequence[dict], size_gib: int, tags: dict[str, str],
                        restored: dict[int, plan.Snapshot], timeout_s: float) -> list[str]:
    """Create node i's data volume (from restored[i] where there is one) in its instance's zone and attach it at
    plan.DATA_DEVICE; the image mounts it when the disk appears. The volume ids, in node order."""
    volume_ids = [aws.ec2.create_volume(**plan.data_volume_request(
        zone=instance["Placement"]["AvailabilityZone"], size_gib=size_gib, tags=tags, index=index,
        snapshot=restored.get(index)))["VolumeId"] for index, instance in enumerate(instances)]
    wait_volumes(aws, "volume_available", volume_ids, timeout_s)
    for instance, volume_id in zip(instances, volume_ids, strict=True):
        aws.ec2.attach_volume(Device=plan.DATA_DEVICE, InstanceId=instance["InstanceId"], VolumeId=volume_id)
    return volume_ids


def wait_volumes(aws: Aws, waiter: str, volume_ids: list[str], timeout_s: float) -> None:
    if volume_ids:
        aws.ec2.get_waiter(waiter).wait(VolumeIds=volume_ids, WaiterConfig={
            "Delay": WAITER_DELAY_S, "MaxAttempts": max(1, int(timeout_s // WAITER_DELAY_S))})


def replace(name: str, address: str, *, region: str | None = None, profile: str | None = None,
            aws: Aws | None = None, running_timeout_s: float = RUNNING_TIMEOUT_S, ssh_wait_s: float = SSH_WAIT_S,
            terminated_timeout_s: float = TERMINATED_TIMEOUT_S) -> tuple[Host, list[str]]:
    """Put a new instance, launched as `up` launched the cluster's, in place of the one at `address`, and
    terminate the old one; update the cluster's files. (the new host, the host keys its console shows)

    The new instance must run, answer SSH and show its host keys (kiln never trusts a replacement on first
    contact); otherwise it is terminated and the cluster is left as it was."""
    record, cloud = Record.of_cluster(name)
    provision.node_at(record, address)
    aws = aws or connect(region or record.region, profile)
    return provision.replace(record, address, cloud.data_volumes,
                             swap(aws, name, cloud, running_timeout_s, terminated_timeout_s), ssh_wait_s=ssh_wait_s)


def grow(name: str, count: int, *, region: str | None = None, profile: str | None = None, aws: Aws | None = None,
         running_timeout_s: float = RUNNING_TIMEOUT_S, ssh_wait_s: float = SSH_WAIT_S,
         terminated_timeout_s: float = TERMINATED_TIMEOUT_S) -> list[tuple[str, Host, list[str]]]:
    """Add `count` instances to the cluster, each launched as `up` launched the cluster's (provision.grow: all of
    them, or none)."""
    record, cloud = Record.of_cluster(name)
    aws = aws or connect(region or record.region, profile)
    return provision.grow(record, count, lambda _: swap(aws, name, cloud, running_timeout_s, terminated_timeout_s),
                          volumes=cloud.data_volumes, ssh_wait_s=ssh_wait_s)


def shrink(name: str, addresses: Sequence[str], *, region: str | None = None, profile: str | None = None,
           aws: Aws | None = None, terminated_timeout_s: float = TERMINATED_TIMEOUT_S) -> list[str]:
    """Terminate the cluster's instances at `addresses` (and release their Elastic IPs); the ids removed."""
    record, cloud = Record.of_cluster(name)
    aws = aws or connect(region or record.region, profile)
    return provision.shrink_by(record, addresses, swap(aws, name, cloud, RUNNING_TIMEOUT_S, terminated_timeout_s),
                               volumes=cloud.data_volumes)


def swap(aws: Aws, name: str, cloud: Record, running_timeout_s: float, terminated_timeout_s: float) -> Swap:
    """How the cluster's instances are made and removed one at a time (a replacement, a node added or removed):
    launched as `up` launched them, and each one's Elastic IP released with it."""
    request = changed(cloud.planned(), count=1)
    network = cloud.network()
    allocated: dict[str, list[str]] = {}  # each new instance's Elastic IP

    def make(making: Progress) -> tuple[str, Host]:
        params = plan.run_instances_request(request, ami=cloud.ami, group_id=cloud.security_group, tags=cloud.tags,
                                            efa=network,
                                            client_token=plan.client_token(name, secrets.token_hex(8)))
        new_id = making.made = aws.ec2.run_instances(**params)["Instances"][0]["InstanceId"]
        making.step = "wait until it runs"
        wait(aws, "instance_running", [new_id], running_timeout_s)
        described = described_instances(aws, [new_id])
        if network:
            making.step = "give it an Elastic IP"
            allocated[new_id] = give_addresses(aws, described, cloud.tags)
            described = described_instances(aws, [new_id])
        [host] = plan.hosts_from_instances(described, request.user)
        return new_id, host

    def drop(instance_id: str, address: str) -> None:
        """Terminate an instance and then release its Elastic IP: one made here, or an older one's, found by the
        address it was reached at."""
        if not network or not address:  # one just made: its own Elastic IPs, if it got any (no call)
            addresses = allocated.get(instance_id, [])
        else:
            addresses = efa_plan.addresses_at(aws.ec2.describe_addresses(Filters=[
                {"Name": f"tag:{plan.TAG_CLUSTER}", "Values": [name]}])["Addresses"], address)
        remove(aws, [plan.Resource("instance", instance_id, {}),
                     *(plan.Resource("elastic-ip", allocation, {}) for allocation in addresses)], terminated_timeout_s)

    def attach(new_id: str, volume: str) -> None:
        wait_volumes(aws, "volume_available", [volume], terminated_timeout_s)
        aws.ec2.attach_volume(Device=plan.DATA_DEVICE, InstanceId=new_id, VolumeId=volume)

    return Swap(AwsError, describe_error, make, lambda ids, timeout_s: console_host_keys(aws, ids, timeout_s),
                drop, attach, first_step="run the instance", keys_step="read its host keys from the console",
                keys_where="its console", keys_source="console", volume_word="data volume",
                finds_old="finds it by its tags", volume_kept="tagged with the cluster", error_code=error_code)


def console_text(aws: Aws, instance_id: str) -> str:
    """The instance's console output as text (botocore decodes it; a raw base64 answer is decoded here)."""
    console = aws.ec2.get_console_output(InstanceId=instance_id).get("Output") or ""
    if "BEGIN SSH HOST KEY KEYS" not in console:
        import base64
        import binascii
        try:
            console = base64.b64decode(console, validate=True).decode(errors="replace")
        except (binascii.Error, ValueError):
            pass
    return console


def console_host_keys(aws: Aws, instance_ids: Sequence[str], timeout_s: float,
                      poll_s: float = CONSOLE_POLL_S) -> dict[str, list[str]]:
    """The host keys cloud-init printed to each instance's console (common.poll_host_keys)."""
    return poll_host_keys(lambda instance_id: console_host_keys_of(console_text(aws, instance_id)), instance_ids,
                          timeout_s, poll_s)


def down(name: str, *, region: str | None = None, profile: str | None = None, aws: Aws | None = None,
         timeout_s: float = TERMINATED_TIMEOUT_S) -> list[str]:
    """Remove everything tagged with the cluster's name (its snapshots stay); an empty list when there was
    nothing."""
    plan.validate_name(name)
    aws = aws or connect(region, profile)
    caller(aws)
    try:
        removed, found = controllers_ended(aws, name, timeout_s)
        removed += remove(aws, found, timeout_s)
    except Exception as error:
        raise AwsError(f"cluster.down {name}: {describe_error(error)}") from None
    provision.forget_local(name, "aws", found=bool(removed), looked=f"region {aws.region}")
    return removed


def down_with_snapshots(name: str, *, ttl_days: float = plan.SNAPSHOT_TTL_DAYS, region: str | None = None,
                        profile: str | None = None, aws: Aws | None = None, now: datetime | None = None,
                        timeout_s: float = TERMINATED_TIMEOUT_S,
                        snapshot_timeout_s: float = SNAPSHOT_TIMEOUT_S) -> provision.Teardown:
    """Terminate the instances (their shutdown unmounts the data volumes), snapshot each data volume, and remove
    the rest. A volume whose snapshot fails is kept, tagged with the cluster, and named; the rest goes."""
    plan.validate_name(name)
    ttl_days = plan.validate_snapshot_ttl(ttl_days)
    aws = aws or connect(region, profile)
    caller(aws)
    moment = now or datetime.now(UTC)
    taken_at = plan.format_time(moment)
    snapshots: list[plan.Snapshot] = []
    kept: list[tuple[str, str, str]] = []
    try:
        removed, resources = controllers_ended(aws, name, timeout_s)
        instances = [r for r in resources if r.kind == "instance"]
        removed += remove(aws, instances, timeout_s)
        started: dict[str, plan.Resource] = {}
        for volume in sorted((r for r in resources if r.kind == "volume" and plan.TAG_DATA in r.tags),
                             key=lambda r: (r.tags[plan.TAG_DATA], r.id)):
            try:
                started[aws.ec2.create_snapshot(**plan.snapshot_request(
                    volume, plan.snapshot_tags(volume.tags, moment, ttl_days), taken_at))["SnapshotId"]] = volume
            except Exception as error:
                kept.append((volume.id, volume.tags[plan.TAG_DATA], describe_error(error)))
        for snapshot_id, volume in started.items():
            try:
                aws.ec2.get_waiter("snapshot_completed").wait(SnapshotIds=[snapshot_id], WaiterConfig={
                    "Delay": SNAPSHOT_POLL_S, "MaxAttempts": max(1, int(snapshot_timeout_s // SNAPSHOT_POLL_S))})
                [described] = aws.ec2.describe_snapshots(SnapshotIds=[snapshot_id])["Snapshots"]
                snapshots.append(plan.snapshot_of(described))
            except Exception as error:
                kept.append((volume.id, volume.tags[plan.TAG_DATA], f"snapshot {snapshot_id}: {describe_error(error)}"))
        by_id = {r.id: r for r in resources}
        for volume_id, _, _ in kept:  # a retry completes the set this one missed
            missed = by_id[volume_id].tags.get(plan.TAG_SNAPSHOT_SET) or taken_at
            aws.ec2.create_tags(Resources=[volume_id], Tags=[{"Key": plan.TAG_SNAPSHOT_SET, "Value": missed}])
        keep = {volume_id for volume_id, _, _ in kept}
        removed += remove(aws, [r for r in resources if r.kind != "instance" and r.id not in keep], timeout_s)
    except Exception as error:
        raise AwsError(f"cluster.down {name}: {describe_error(error)}"
                       + (f" (snapshots made: {', '.join(s.id for s in snapshots)})" if snapshots else "")) from None
    if not kept:  # a kept volume keeps the cluster's files, so `kiln down NAME --snapshot` finds where it is
        provision.forget_local(name, "aws", found=bool(removed), looked=f"region {aws.region}")
    return provision.Teardown(removed, snapshots, kept)


def arm_autostop(name: str, *, region: str | None = None, profile: str | None = None,
                 aws: Aws | None = None) -> list[str]:
    """Make a shutdown from inside the cluster's instances terminate them (autostop's power-off then ends them:
    a stopped instance's disks would still bill)."""
    record = state.load_cluster(plan.validate_name(name))
    if record is None or not record.instances:
        raise UsageError(f"cluster {name}: no instances on record")
    aws = aws or connect(region or record.region, profile)
    try:
        for instance in record.instances:
            aws.ec2.modify_instance_attribute(InstanceId=instance.id, Attribute="instanceInitiatedShutdownBehavior",
                                              Value="terminate")
    except Exception as error:
        raise AwsError(f"cluster {name}: could not make a shutdown terminate its instances: "
                       f"{describe_error(error)}") from None
    return [i.id for i in record.instances]


def list_snapshots(*, region: str | None = None, profile: str | None = None,
                   aws: Aws | None = None) -> list[plan.Snapshot]:
    aws = aws or connect(region, profile)
    caller(aws)
    try:
        return sorted(find_snapshots(aws), key=plan.snapshot_order)
    except Exception as error:
        raise AwsError(f"list the data snapshots: {describe_error(error)}") from None


def sweep_snapshots(now: datetime | None = None, dry_run: bool = False, *, region: str | None = None,
                    profile: str | None = None, aws: Aws | None = None) -> list[plan.Snapshot]:
    """The data snapshots past their expiry; deleted unless dry_run (every one tried; the failures named)."""
    aws = aws or connect(region, profile)
    caller(aws)
    try:
        expired = plan.expired_snapshots(find_snapshots(aws), now or datetime.now(UTC))
    except Exception as error:
        raise AwsError(f"sweep: list the data snapshots: {describe_error(error)}") from None
    failed = []
    for snapshot in [] if dry_run else expired:
        try:
            aws.ec2.delete_snapshot(SnapshotId=snapshot.id)
        except Exception as error:
            failed.append(f"{snapshot.id}: {describe_error(error)}")
    if failed:
        raise AwsError(f"sweep: could not delete {len(failed)} expired snapshot(s): {'; '.join(failed)}")
    return expired


def places(every: bool = False, *, region: str | None = None, profile: str | None = None) -> list[str | None]:
    """The regions `list` and `sweep` look in besides the clusters' files: the one given or configured (none
    where none is), or with `every` every region the account can use (any region answers DescribeRegions)."""
    own = region or default_region(profile)
    if every:
        return list(regions(region=own or ANY_REGION, profile=profile))
    return [own] if own else []


def regions(*, region: str | None = None, profile: str | None = None, aws: Aws | None = None) -> list[str]:
    """Every region the account can use (EC2's DescribeRegions: those enabled for it), by name."""
    aws = aws or connect(region, profile)
    try:
        return sorted(r["RegionName"] for r in aws.ec2.describe_regions()["Regions"])
    except Exception as error:
        raise AwsError(f"list the regions of the account: {describe_error(error)}") from None


def list_clusters(*, region: str | None = None, profile: str | None = None,
                  aws: Aws | None = None) -> list[plan.ClusterSummary]:
    aws = aws or connect(region, profile)
    caller(aws)
    return plan.summarize(find_resources(aws))


def sweep(now: datetime | None = None, dry_run: bool = False, *, region: str | None = None,
          profile: str | None = None, aws: Aws | None = None) -> list[plan.ClusterSummary]:
    """The clusters past their expiry; removed unless dry_run."""
    aws = aws or connect(region, profile)
    caller(aws)
    expired = plan.expired_clusters(find_resources(aws), now or datetime.now(UTC))
    if not dry_run:
        for summary in expired:
            down(summary.name, aws=aws)
    return expired
