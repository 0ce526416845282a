"""What `kiln up` asks AWS for, decided without touching AWS: validation, tags, request dicts.

Everything here is pure and unit-tested for exact output; bootstrap.providers.aws does the calls.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bootstrap.autostop import validate_idle_minutes
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.providers import catalog
from bootstrap.providers.aws import efa as efa_plan
from bootstrap.providers.common import (  # noqa: F401  (the plan's names, as the provider and tests use them)
    DATA_LABEL,
    DATA_MOUNT,
    DATA_SETTINGS,
    MAX_SNAPSHOT_TTL_DAYS,
    MAX_TTL_HOURS,
    MAX_VOLUME_GIB,
    MIN_PREFIX,
    NAME,
    SNAPSHOT_TTL_DAYS,
    SSH_WAIT_S,
    CloudRequest,
    ClusterSummary,
    Snapshot,
    data_volume_file,
    expired_clusters,
    expired_snapshots,
    first_boot_settings,
    format_time,
    latest_snapshot_set,
    matching,
    no_answer_error,
    node_index,
    parse_image_tags,
    parse_time,
    restore_note,
    snapshot_order,
    summarize,
    validate_cidr,
    validate_count,
    validate_max_price,
    validate_name,
    validate_snapshot_ttl,
    validate_ssh_wait,
    validate_start,
    validate_ttl,
    validate_user,
    validate_volume,
)

TAG_CLUSTER = "kiln:cluster"
TAG_OWNER = "kiln:owner"
TAG_EXPIRES = "kiln:expires"
TAG_PROFILE = "kiln:profile"
TAG_DATA = "kiln:data"  # on a data volume and its snapshots: the node's index in launch order
TAG_SNAPSHOT_SET = "kiln:snapshot-set"  # the snapshots of one `down --snapshot`: its time
# The `up` that made a resource (its random part): that up's undo removes what it made alone, never what another
# up of the same name (one that won a race for the name) made.
TAG_ATTEMPT = "kiln:attempt"
TAG_ROLE = "kiln:role"  # "controller" on a queue's controller machine; a node has none
CONTROLLER = "controller"

INSTANCE_TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+")
# `kiln up`'s default: the first of the catalog's EC2 GPU types (kiln up --gpus picks from them all; Blackwell needs
# the matrix's driver branch 570 or later; every other type of EC2 is taken as it is named).
DEFAULT_INSTANCE_TYPE = catalog.default_type("aws")
AMI_ID = re.compile(r"ami-[0-9a-f]{8,17}")
PROFILE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
IMDS_HOP_LIMIT = 2
# A queue's controller: slurmctld and kiln's programs, no GPU (2 vCPUs and 8 GiB: slurmctld's own guidance is a few
# GB for thousands of nodes); no container on it reaches its metadata service (hop limit 1), whose credentials are
# the queue's cloud identity.
CONTROLLER_TYPE = "m7i.large"
CONTROLLER_IMDS_HOP_LIMIT = 1
ROOT_DEVICE = "/dev/sda1"
ROOT_VOLUME_GIB = 100
# The data volume is attached at this device (common.py: how the node finds and mounts it).
DATA_DEVICE = "/dev/sdf"

# Placeholders the dry run prints where AWS would supply the value.
AMI_PLACEHOLDER = "<newest available AMI tagged kiln:profile={profile}>"
PUBLIC_KEY_PLACEHOLDER = "<public key of {path}>"
GROUP_PLACEHOLDER = "<id of security group kiln-{name}>"
TOKEN_PLACEHOLDER = "<kiln-NAME-ATTEMPT: one per launch>"


@dataclass(frozen=True, kw_only=True)
class Request(CloudRequest):
    """What the operator asked for on AWS: an instance type, an AMI (or the newest of the profile's, by its tags),
    a Spot price, a data volume."""

    instance_type: str
    ami: str | None = None
    max_price: str | None = None
    image_tags: tuple[tuple[str, str], ...] = ()
    volume_gib: int | None = None


@dataclass(frozen=True)
class Plan:
    """The exact requests `kiln up` sends, in order. With EFA (`efa`), the security group also lets all traffic
    out to itself, and each instance gets an Elastic IP (AllocateAddress, AssociateAddress: once per instance)."""

    name: str
    tags: dict[str, str]
    import_key_pair: dict
    create_security_group: dict
    authorize_ingress: dict
    create_placement_group: dict
    run_instances: dict
    authorize_egress: dict | None = None
    allocate_address: dict | None = None
    efa: efa_plan.Efa | None = None

    def steps(self) -> list[tuple[str, dict]]:
        steps = [("ImportKeyPair", self.import_key_pair), ("CreateSecurityGroup", self.create_security_group),
                 ("AuthorizeSecurityGroupIngress", self.authorize_ingress)]
        if self.authorize_egress is not None:
            steps.append(("AuthorizeSecurityGroupEgress", self.authorize_egress))
        steps += [("CreatePlacementGroup", self.create_placement_group), ("RunInstances", self.run_instances)]
        if self.allocate_address is not None:
            steps += [("AllocateAddress", self.allocate_address),
                      ("AssociateAddress", {"AllocationId": efa_plan.ALLOCATION_PLACEHOLDER,
                                            "NetworkInterfaceId": efa_plan.INTERFACE_PLACEHOLDER})]
        return steps


def validate_request(name: str, count, instance_type: str, *, ssh_cidr: str | None, ami: str | None = None,
                     image_profile: str = "gpu", spot: bool = False, max_price=None, user: str = "ubuntu",
                     ttl_hours=24.0, image_tags: str | None = None, volume_gib=None,
                     idle_minutes: float | None = None, start: int | None = None) -> Request:
    """Check everything that can be checked without AWS; raise one UsageError line naming the bad input."""
    validate_name(name)
    count = validate_count(count)
    matching(instance_type, INSTANCE_TYPE, "instance-type", "an EC2 instance type", DEFAULT_INSTANCE_TYPE)
    if ami is not None and not AMI_ID.fullmatch(ami):
        raise UsageError(f"--ami {ami!r} is not an AMI id like ami-0123456789abcdef0")
    if ami is None and not PROFILE.fullmatch(image_profile or ""):
        raise UsageError(f"--image-profile {image_profile!r}: use lowercase letters, digits, '-' and '_'")
    if max_price is not None:
        if not spot:
            raise UsageError("--max-price applies to spot instances only: add --spot")
        validate_max_price(max_price)
        max_price = str(max_price)
    validate_user(user)
    ttl_hours = validate_ttl(ttl_hours)
    return Request(name=name, count=count, instance_type=instance_type, ssh_cidr=validate_cidr(ssh_cidr), ami=ami,
                   image_profile=image_profile, spot=bool(spot), max_price=max_price, user=user, ttl_hours=ttl_hours,
                   image_tags=parse_image_tags(image_tags), volume_gib=validate_volume(volume_gib),
                   idle_minutes=validate_idle_minutes(idle_minutes) or None, start=validate_start(start, count))


def launched_now(request: Request) -> Request | None:
    """What `up` launches now: the request, or for a queue's cluster its first machines alone (None: none, each
    made as Slurm asks for it)."""
    if request.start is None:
        return request
    return dataclasses.replace(request, count=request.start) if request.start else None


def cluster_tags(name: str, owner: str, now: datetime, ttl_hours: float) -> dict[str, str]:
    return {TAG_CLUSTER: name, TAG_OWNER: owner, TAG_EXPIRES: format_time(now + timedelta(hours=ttl_hours)),
            "Name": f"kiln-{name}"}


def tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in tags.items()]


def tag_specifications(tags: dict[str, str], *resource_types: str) -> list[dict]:
    return [{"ResourceType": kind, "Tags": tag_list(tags)} for kind in resource_types]


def resource_name(name: str) -> str:
    """The name of the cluster's key pair, security group and placement group."""
    return f"kiln-{name}"


def ingress_permissions(group_id: str, ssh_cidr: str) -> list[dict]:
    """All traffic among the cluster's members; SSH from the operator's range only."""
    ssh = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22}
    if ipaddress.ip_network(ssh_cidr).version == 6:
        ssh["Ipv6Ranges"] = [{"CidrIpv6": ssh_cidr, "Description": "kiln: SSH from the operator"}]
    else:
        ssh["IpRanges"] = [{"CidrIp": ssh_cidr, "Description": "kiln: SSH from the operator"}]
    members = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id, "Description": "kiln: cluster members"}]}
    return [members, ssh]


def address_request(tags: dict[str, str]) -> dict:
    """AllocateAddress of one instance's Elastic IP, tagged with the cluster (down, sweep and undo find it so)."""
    return {"Domain": "vpc", "TagSpecifications": tag_specifications(tags, "elastic-ip")}


def run_instances_request(request: Request, *, ami: str, group_id: str, tags: dict[str, str],
                          efa: efa_plan.Efa | None = None, client_token: str | None = None) -> dict:
    """RunInstances of the cluster (of one node, for a replacement). With EFA, the security group goes on each of
    the interfaces, not on the request (EC2 refuses both). `client_token` makes the call idempotent: EC2 answers a
    retry of it (the SDK's, after a timeout) with the instances the first one launched, never with more."""
    resources = resource_name(request.name)
    params = {
        **({"ClientToken": client_token} if client_token else {}),
        "ImageId": ami,
        "InstanceType": request.instance_type,
        "MinCount": request.count,
        "MaxCount": request.count,
        "KeyName": resources,
        **({"NetworkInterfaces": efa_plan.network_interfaces(efa, group_id)} if efa else
           {"SecurityGroupIds": [group_id]}),
        "Placement": {"GroupName": resources},
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled",
                            "HttpPutResponseHopLimit": IMDS_HOP_LIMIT},
        "BlockDeviceMappings": [{"DeviceName": ROOT_DEVICE,
                                 "Ebs": {"VolumeSize": ROOT_VOLUME_GIB, "VolumeType": "gp3", "Encrypted": True,
                                         "DeleteOnTermination": True}}],
        "TagSpecifications": tag_specifications(tags, "instance", "volume", "network-interface"),
    }
    if request.volume_gib:
        params["UserData"] = first_boot_settings(request.volume_gib, request.user)
    if request.idle_minutes:
        params["InstanceInitiatedShutdownBehavior"] = "terminate"  # an idle node's shutdown ends its bill
    if request.spot:
        spot = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if request.max_price:
            spot["MaxPrice"] = request.max_price
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
    return params


def controller_request(request: Request, *, ami: str, group_id: str, tags: dict[str, str], profile_name: str,
                       client_token: str | None = None, instance_type: str = CONTROLLER_TYPE) -> dict:
    """RunInstances of a queue's controller machine: one on-demand instance of `instance_type` from the cluster's
    image, in its security group (the nodes reach slurmctld there) with its key pair, holding the instance profile
    `profile_name` (the queue's identity), tagged as the cluster is and as its controller; outside the nodes'
    placement group (another type, whose capacity there would count against theirs); no data volume, no idle
    shutdown."""
    one = dataclasses.replace(request, count=1, instance_type=instance_type, spot=False, max_price=None,
                              volume_gib=None, idle_minutes=None)
    params = run_instances_request(one, ami=ami, group_id=group_id, tags={**tags, TAG_ROLE: CONTROLLER},
                                   client_token=client_token)
    del params["Placement"]
    params["IamInstanceProfile"] = {"Name": profile_name}
    params["MetadataOptions"] = {**params["MetadataOptions"], "HttpPutResponseHopLimit": CONTROLLER_IMDS_HOP_LIMIT}
    return params


def profile_not_seen_yet(code: str, message: str) -> bool:
    """Whether RunInstances refused an instance profile EC2 cannot see yet: IAM's new profiles reach EC2 some
    seconds after they are made (InvalidParameterValue, "Invalid IAM Instance Profile name")."""
    return code == "InvalidParameterValue" and "iam instance profile" in message.lower()


def client_token(name: str, attempt: str) -> str:
    """RunInstances' idempotency token of one launch (at most 64 ASCII characters, as EC2 takes): the cluster's
    name and the attempt's own random part, so no other launch shares it."""
    return f"kiln-{name}-{attempt}"[:64]


def plan_cluster(request: Request, *, tags: dict[str, str], ami: str, public_key: str,
                 group_id: str | None = None, efa: efa_plan.Efa | None = None,
                 token: str = TOKEN_PLACEHOLDER) -> Plan:
    """The requests of `kiln up`; `group_id` is known only once the security group exists; `efa` where the type
    has EFA."""
    resources = resource_name(request.name)
    group_id = group_id or GROUP_PLACEHOLDER.format(name=request.name)
    return Plan(
        name=request.name,
        tags=tags,
        import_key_pair={"KeyName": resources, "PublicKeyMaterial": public_key,
                         "TagSpecifications": tag_specifications(tags, "key-pair")},
        create_security_group={"GroupName": resources,
                               "Description": f"kiln cluster {request.name}: members and operator SSH",
                               "TagSpecifications": tag_specifications(tags, "security-group")},
        authorize_ingress={"GroupId": group_id, "IpPermissions": ingress_permissions(group_id, request.ssh_cidr)},
        create_placement_group={"GroupName": resources, "Strategy": "cluster",
                                "TagSpecifications": tag_specifications(tags, "placement-group")},
        run_instances=run_instances_request(request, ami=ami, group_id=group_id, tags=tags, efa=efa,
                                            client_token=token),
        authorize_egress={"GroupId": group_id, "IpPermissions": efa_plan.egress_permissions(group_id)} if efa else None,
        allocate_address=address_request(tags) if efa else None,
        efa=efa,
    )


def image_filters(profile: str, tags: Iterable[tuple[str, str]] = ()) -> list[dict]:
    return [{"Name": f"tag:{TAG_PROFILE}", "Values": [profile]},
            *({"Name": f"tag:{key}", "Values": [value]} for key, value in tags),
            {"Name": "state", "Values": ["available"]}]


def lowest_spot_prices(history: Iterable[dict]) -> dict[str, float]:
    """Each instance type's spot price now in the region, from DescribeSpotPriceHistory's entries: the newest entry
    of each zone, and of those the lowest (EC2 places a cluster's instances in one zone of its choosing)."""
    newest: dict[tuple[str, str], dict] = {}
    for entry in history:
        key = (entry["InstanceType"], entry.get("AvailabilityZone", ""))
        if key not in newest or (entry.get("Timestamp") and newest[key].get("Timestamp")
                                 and entry["Timestamp"] > newest[key]["Timestamp"]):
            newest[key] = entry
    lowest: dict[str, float] = {}
    for (kind, _), entry in newest.items():
        lowest[kind] = min(lowest.get(kind, float("inf")), float(entry["SpotPrice"]))
    return lowest


def price_list_filters(instance_type: str, region: str | None = None) -> list[dict]:
    """The Price List's GetProducts filters for one type's Linux on-demand price in one region (None: in every
    region; a region, not a Local Zone): shared tenancy, no software or licence of its own, capacity as used (not a
    reservation's), bought on demand (not a Capacity Block)."""
    terms = {"instanceType": instance_type, "regionCode": region, "locationType": "AWS Region",
             "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
             "licenseModel": "No License required", "capacitystatus": "Used", "marketoption": "OnDemand"}
    return [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in terms.items() if value]


def on_demand_price_table(price_list: Iterable[str]) -> dict[tuple[str, str], float]:
    """Each (instance type, region)'s on-demand price per hour (USD) from GetProducts' PriceList (each product a
    JSON document): its OnDemand terms' price dimensions by the hour; the lowest above 0 where it has several."""
    lowest: dict[tuple[str, str], float] = {}
    for text in price_list:
        product = json.loads(text)
        attributes = product.get("product", {}).get("attributes", {})
        key = (attributes.get("instanceType"), attributes.get("regionCode"))
        for term in (product.get("terms", {}).get("OnDemand") or {}).values():
            for dimension in (term.get("priceDimensions") or {}).values():
                usd = float(dimension.get("pricePerUnit", {}).get("USD") or 0)
                if all(key) and usd > 0 and dimension.get("unit") == "Hrs":
                    lowest[key] = min(lowest.get(key, usd), usd)
    return lowest


def on_demand_prices(price_list: Iterable[str]) -> dict[str, float]:
    """Each instance type's on-demand price per hour (USD) from GetProducts' PriceList of one region (the lowest
    of its products' hourly on-demand terms above 0)."""
    lowest: dict[str, float] = {}
    for (kind, _), usd in on_demand_price_table(price_list).items():
        lowest[kind] = min(lowest.get(kind, usd), usd)
    return lowest


def newest_image(images: Iterable[dict]) -> dict | None:
    """The image with the latest CreationDate (ties: the larger id, so the choice is stable)."""
    return max(images, key=lambda image: (image.get("CreationDate", ""), image["ImageId"]), default=None)


def tags_of(resource: dict) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in resource.get("Tags") or []}


@dataclass(frozen=True)
class Resource:
    """One kiln-tagged thing in AWS."""

    kind: str
    id: str
    tags: dict
    state: str = ""

    @property
    def cluster(self) -> str:
        return self.tags.get(TAG_CLUSTER, "")

    @property
    def expires(self) -> datetime | None:
        return parse_time(self.tags.get(TAG_EXPIRES, ""))

    @property
    def owner(self) -> str:
        return self.tags.get(TAG_OWNER, "")

    @property
    def label(self) -> str:
        return self.id


# The order `down` removes things in: instances first (they hold the rest), then what they used.
# An Elastic IP is released once its instance is gone (an associated one cannot be); a queue controller's instance
# profile before its role (a role in a profile cannot be deleted).
TEARDOWN_ORDER = ("instance", "elastic-ip", "volume", "security-group", "key-pair", "placement-group",
                  "instance-profile", "iam-role")


def teardown_order(resources: Sequence[Resource]) -> list[Resource]:
    return sorted(resources, key=lambda r: (TEARDOWN_ORDER.index(r.kind), r.id))


def hosts_from_instances(instances: Sequence[dict], user: str) -> list[Host]:
    """The cluster's hosts in launch order: public address where there is one, else private."""
    return [Host(i.get("PublicIpAddress") or i["PrivateIpAddress"], user=user) for i in launch_order(instances)]


def launch_order(instances: Sequence[dict]) -> list[dict]:
    return sorted(instances, key=lambda i: (i.get("AmiLaunchIndex", 0), i["InstanceId"]))


def data_volume_request(*, zone: str, size_gib: int, tags: dict[str, str], index: int,
                        snapshot: Snapshot | None = None) -> dict:
    """CreateVolume for node `index`: encrypted gp3, restored from `snapshot` when given (never smaller than it)."""
    params = {"AvailabilityZone": zone, "Size": max(size_gib, snapshot.gigabytes if snapshot else 0),
              "VolumeType": "gp3", "Encrypted": True,
              "TagSpecifications": tag_specifications({**tags, TAG_DATA: str(index)}, "volume")}
    if snapshot is not None:
        params["SnapshotId"] = snapshot.id
    return params


def snapshot_request(volume: Resource, tags: dict[str, str], taken_at: str) -> dict:
    """CreateSnapshot of a data volume, tagged with the cluster, the node's index and the set it belongs to: the
    set of this `down --snapshot`, or, for a volume kept when its snapshot failed, the set it missed (so a retry
    completes that set)."""
    index = volume.tags.get(TAG_DATA, "")
    taken_at = volume.tags.get(TAG_SNAPSHOT_SET) or taken_at
    return {"VolumeId": volume.id, "Description": f"kiln cluster {tags[TAG_CLUSTER]} node {index} data, {taken_at}",
            "TagSpecifications": tag_specifications(
                {**tags, TAG_DATA: index, TAG_SNAPSHOT_SET: taken_at,
                 "Name": f"{tags.get('Name', '')}-data-{index}"}, "snapshot")}


def snapshot_tags(volume_tags: dict[str, str], now: datetime, ttl_days: float) -> dict[str, str]:
    """A snapshot keeps the cluster's name and owner, and expires on its own clock (sweep removes it then)."""
    kept = {key: volume_tags[key] for key in (TAG_CLUSTER, TAG_OWNER, "Name") if key in volume_tags}
    return {**kept, TAG_EXPIRES: format_time(now + timedelta(days=ttl_days))}


def snapshot_of(described: dict) -> Snapshot:
    tags = tags_of(described)
    index = tags.get(TAG_DATA, "")
    return Snapshot(described["SnapshotId"], tags.get(TAG_CLUSTER, ""), node_index(index),
                    tags.get(TAG_SNAPSHOT_SET, ""), int(described.get("VolumeSize") or 0), described.get("State", ""),
                    tags, parse_time(tags.get(TAG_EXPIRES, "")), unit="GiB")


# EC2's vCPU quotas (Service Quotas, service code ec2), one on-demand and one spot per family of instance types:
# what a launch of the family needs in vCPUs, running and pending machines of the family counting against it.
# From EC2's "Amazon EC2 instance type quotas" (docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html);
# the families kiln's catalog launches (its GPUs: P, G; its CPU types: standard). Others are not read before launch.
@dataclass(frozen=True)
class VcpuQuota:
    code: str
    name: str


VCPU_QUOTAS = {
    ("P", False): VcpuQuota("L-417A185B", "Running On-Demand P instances"),
    ("P", True): VcpuQuota("L-7212CCBC", "All P Spot Instance Requests"),
    ("G", False): VcpuQuota("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("G", True): VcpuQuota("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("Standard", False): VcpuQuota("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ("Standard", True): VcpuQuota("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}
# Families whose letters start as a standard one's but that have quotas of their own (Inf, HPC, DL, Mac, Trn).
OWN_QUOTA_FAMILIES = ("inf", "hpc", "dl", "mac", "trn")


def quota_family(instance_type: str) -> str | None:
    """The vCPU quota family of an instance type, from the letters before its generation (p5.48xlarge: P;
    g6e.xlarge, gr6.4xlarge, vt1.3xlarge: G; c7gn.large, im4gn.large: Standard); None for a family kiln does not
    check (trn1, inf2, x2idn, hpc7a, u-6tb1)."""
    letters = re.match(r"[a-z]*", instance_type).group()
    if letters == "p":
        return "P"
    if letters in ("g", "gr", "vt"):
        return "G"
    if letters[:1] and letters[:1] in "acdhimrtz" and letters not in OWN_QUOTA_FAMILIES:
        return "Standard"
    return None


def vcpus_in_use(instances: Iterable[dict], vcpus: dict[str, int], family: str, spot: bool) -> int:
    """vCPUs that count against a family's quota: pending and running machines of the family, spot ones against
    the spot quota, the others against the on-demand one (DescribeInstances' entries; `vcpus`: per type)."""
    return sum(vcpus.get(i["InstanceType"], 0) for i in instances
               if i.get("State", {}).get("Name") in ("pending", "running")
               and quota_family(i["InstanceType"]) == family and (i.get("InstanceLifecycle") == "spot") == spot)


def vcpus_short(quota: VcpuQuota, limit: float, used: int, wanted: int, count: int, instance_type: str) -> str | None:
    """What is wrong where `count` machines of `wanted` vCPUs in all do not fit the quota's `limit` with `used`
    taken; None where they fit."""
    if used + wanted <= limit:
        return None
    return (f"{count} {instance_type} need {wanted} vCPUs of the quota {quota.name!r} ({quota.code}), which is "
            f"{limit:g} here with {used} in use: ask Service Quotas for more")


@functools.cache
def sdk_regions() -> tuple[str, ...]:
    """Every region botocore's endpoint data names for EC2, in each of its partitions: the SDK's own list (no call
    to AWS), as new as the botocore kiln pins (a region AWS opens later is refused until the pin moves). Read once
    (a third of a second): an up prepares every candidate."""
    import botocore.session

    session = botocore.session.get_session()
    return tuple(sorted(region for partition in session.get_available_partitions()
                        for region in session.get_available_regions("ec2", partition_name=partition)))


def from_options(name: str, count, options: Mapping[str, Any], idle_minutes: float | None,
                 place: Mapping[str, str | None]) -> Request:
    """A `kiln up`'s request on EC2 from its options (validate_request; the region is the connection's)."""
    return validate_request(
        name, count, options.get("instance_type") or DEFAULT_INSTANCE_TYPE, ssh_cidr=options.get("ssh_cidr"),
        ami=options.get("ami"), image_profile=options.get("image_profile") or "gpu", spot=bool(options.get("spot")),
        max_price=options.get("max_price"), user=options.get("user") or "ubuntu",
        ttl_hours=options.get("ttl_hours", 24.0), image_tags=options.get("image_tags"),
        volume_gib=options.get("volume"), idle_minutes=idle_minutes, start=options.get("start"))


def dry_run(request: Request, *, key: str, place: Mapping[str, str | None], now: datetime) -> list[str]:
    """What `up` would do on EC2 (up --dry-run), up to the wait: the calls, in order, with their parameters."""
    tags = cluster_tags(request.name, "<caller ARN>", now, request.ttl_hours)
    steps = plan_cluster(request, tags=tags, ami=request.ami or AMI_PLACEHOLDER.format(profile=request.image_profile),
                         public_key=PUBLIC_KEY_PLACEHOLDER.format(path=f"{key}.pub"),
                         efa=efa_plan.expected_efa(request.instance_type))
    lines = [f"cluster {request.name}: key {key} (made if missing), then these EC2 calls; any failure undoes them"]
    if steps.efa:
        lines.append(efa_plan.efa_note(steps.efa))
    lines += [f"{action} {json.dumps(params)}" for action, params in steps.steps()]
    if request.volume_gib:
        example = data_volume_request(zone="<instance's zone>", size_gib=request.volume_gib, tags=tags, index=0)
        lines.append(f"then per node: CreateVolume {json.dumps(example)} (from the cluster's newest snapshot of "
                     f"that node, if any), AttachVolume at {DATA_DEVICE}; the image mounts it at {DATA_MOUNT}")
    return lines
