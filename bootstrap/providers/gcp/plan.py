"""What `kiln up --provider gcp` asks Compute Engine for, decided without touching it: validation, labels, names,
the request bodies (in the Compute v1 API's own JSON, as its reference documents them), and what a listing of
kiln's resources comes to. Pure, and unit-tested for exact output; bootstrap.providers.gcp.cloud makes the calls.

A cluster NAME is: firewall rules kiln-NAME-internal (the cluster's network tag to itself) and kiln-NAME-ssh (SSH
from --ssh-cidr only), a compact placement policy kiln-NAME-compact where the machine family takes one, and
instances kiln-NAME-INDEX-XXXX (Shielded VM, the cluster's own SSH key in their metadata, no service account:
no credentials on the machines), with data disks kiln-NAME-data-INDEX where --volume asks. Everything that takes
labels carries kiln-cluster, kiln-owner and kiln-expires; firewall rules and resource policies take none, so
their description carries the same labels as JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bootstrap.autostop import validate_idle_minutes
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.providers import catalog
from bootstrap.providers.common import (  # noqa: F401  (expired_clusters, summarize: the plan's, as callers use them)
    DATA_MOUNT,
    CloudRequest,
    Snapshot,
    expired_clusters,
    expired_snapshots,
    first_boot_settings,
    matching,
    node_index,
    parse_image_tags,
    snapshot_order,
    summarize,
    validate_cidr,
    validate_count,
    validate_max_price,
    validate_name,
    validate_ttl,
    validate_user,
    validate_volume,
)

# Where gcloud's users keep a place not given on the command line, by option
ENV = {"zone": ("CLOUDSDK_COMPUTE_ZONE",), "project": ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")}
LABEL_CLUSTER = "kiln-cluster"
LABEL_OWNER = "kiln-owner"
LABEL_EXPIRES = "kiln-expires"  # seconds since the epoch: a label value allows no ':' or upper case
LABEL_PROFILE = "kiln-profile"  # on kiln's images (packer/locals.pkr.hcl writes their labels)
LABEL_NODE = "kiln-node"  # on an instance: its node's index in the cluster
LABEL_DATA = "kiln-data"  # on a data disk and its snapshots: the node's index
LABEL_SNAPSHOT_SET = "kiln-snapshot-set"  # the snapshots of one `down --snapshot`: its time, as 20261126t084613z
DESCRIPTION_PREFIX = "kiln: "  # then the labels as JSON, on what takes no labels (firewall rules, policies)

MACHINE_TYPE = re.compile(r"[a-z][a-z0-9]*-[a-z0-9-]+")
ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
PROJECT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
IMAGE = re.compile(r"(projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/global/images/(family/)?)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_TEXT = re.compile(r"[^a-z0-9_-]")
# `kiln up`'s default: the first of the catalog's Compute Engine GPU machine types (kiln up --gpus picks from them).
DEFAULT_MACHINE_TYPE = catalog.default_type("gcp")
# Accelerator machine families (a2, a3, a4, a4x, g2, g4...) cannot live-migrate: their VMs stop for host
# maintenance. The families a compact placement policy takes (others run without one). The machine types whose
# disks must be Hyperdisk (A3 Ultra, A4, A4X, G4: no Persistent Disk).
ACCELERATOR_FAMILY = re.compile(r"[ag]\d+x?")
COMPACT_FAMILIES = ("a2", "a3", "a4", "c2", "c2d", "c3", "c3d", "g2", "h3", "n2", "n2d")
HYPERDISK_ONLY = re.compile(r"(a3-ultragpu|a4-|a4x-|g4-).*")
NETWORK = "global/networks/default"
BOOT_DISK_GB = 100
DISK_TYPE = "pd-balanced"
HYPERDISK_TYPE = "hyperdisk-balanced"
DATA_DEVICE_NAME = "kiln-data"  # the node sees it as /dev/disk/by-id/google-kiln-data
IMAGE_PLACEHOLDER = "<newest image labelled kiln-profile={profile}{more}>"
PUBLIC_KEY_PLACEHOLDER = "<public key of {path}>"


@dataclass(frozen=True, kw_only=True)
class Request(CloudRequest):
    """What the operator asked for on GCP: a zone, a machine type, a source image (or the newest of the profile's,
    by its labels), a data disk."""

    zone: str
    machine_type: str
    source_image: str | None = None
    image_labels: tuple[tuple[str, str], ...] = ()
    volume_gb: int | None = None
    # with spot: the most its machines may cost an hour. GCE takes no bid, so kiln reads the Spot price of the type
    # in the zone's region before making anything and refuses the zone where it is higher (or cannot be read)
    max_price: float | None = None

    @property
    def region(self) -> str:
        return region_of(self.zone)

    @property
    def family(self) -> str:
        return self.machine_type.split("-", 1)[0]

    @property
    def disk_type(self) -> str:
        return HYPERDISK_TYPE if HYPERDISK_ONLY.fullmatch(self.machine_type) else DISK_TYPE


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def label_value(text: str) -> str:
    """Text as a label value may hold it (lowercase letters, digits, '_' and '-'; 63 at most), as the bake labels
    images: kiln:tensorflow=2.21.0 becomes kiln-tensorflow=2-21-0."""
    return LABEL_TEXT.sub("-", text.lower())[:63]


def validate_request(name: str, count, machine_type: str | None, *, zone: str | None, ssh_cidr: str | None,
                     source_image: str | None = None, image_profile: str = "gpu", image_tags: str | None = None,
                     spot: bool = False, max_price=None, user: str = "ubuntu", ttl_hours=24.0, volume_gb=None,
                     idle_minutes: float | None = None) -> Request:
    """Check everything that can be checked without GCE; raise one UsageError line naming the bad input."""
    validate_name(name)
    count = validate_count(count)
    matching(zone, ZONE, "zone", "a Compute Engine zone", "us-central1-a", "set CLOUDSDK_COMPUTE_ZONE")
    machine_type = matching(machine_type or DEFAULT_MACHINE_TYPE, MACHINE_TYPE, "instance-type",
                            "a Compute Engine machine type", DEFAULT_MACHINE_TYPE)
    if source_image is not None and not IMAGE.fullmatch(source_image):
        raise UsageError(f"--source-image {source_image!r}: give an image's name, or projects/P/global/images/NAME "
                         "(or .../images/family/FAMILY)")
    if source_image is None and not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,62}", image_profile or ""):
        raise UsageError(f"--image-profile {image_profile!r}: use lowercase letters, digits, '-' and '_'")
    if max_price is not None:
        if not spot:
            raise UsageError("--max-price applies to Spot VMs only: add --spot")
        max_price = validate_max_price(max_price)
    validate_user(user)
    ttl_hours = validate_ttl(ttl_hours)
    labels = tuple((label_value(key), label_value(value)) for key, value in parse_image_tags(image_tags))
    return Request(name=name, count=count, zone=zone, machine_type=machine_type, ssh_cidr=validate_cidr(ssh_cidr),
                   source_image=source_image, image_profile=image_profile, image_labels=labels, spot=bool(spot),
                   max_price=max_price, user=user, ttl_hours=ttl_hours, volume_gb=validate_volume(volume_gb),
                   idle_minutes=validate_idle_minutes(idle_minutes) or None)


def cluster_labels(name: str, owner: str, now: datetime, ttl_hours: float) -> dict[str, str]:
    expires = int((now + timedelta(hours=ttl_hours)).timestamp())
    return {LABEL_CLUSTER: name, LABEL_OWNER: label_value(owner) or "unknown", LABEL_EXPIRES: str(expires)}


def expiry(labels: Mapping[str, str]) -> datetime | None:
    value = labels.get(LABEL_EXPIRES, "")
    return datetime.fromtimestamp(int(value), UTC) if value.isdigit() else None


def format_expiry(labels: Mapping[str, str]) -> str:
    moment = expiry(labels)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment else "never"


def description(labels: Mapping[str, str]) -> str:
    """The labels of what takes none (firewall rules, resource policies), in its description."""
    return DESCRIPTION_PREFIX + json.dumps(dict(labels), sort_keys=True)


def labels_of_description(text: str | None) -> dict[str, str]:
    if not (text or "").startswith(DESCRIPTION_PREFIX):
        return {}
    try:
        labels = json.loads(text[len(DESCRIPTION_PREFIX):])
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def network_tag(name: str) -> str:
    return f"kiln-{name}"


def firewall_names(name: str) -> tuple[str, str]:
    return f"kiln-{name}-internal", f"kiln-{name}-ssh"


def policy_name(name: str) -> str:
    return f"kiln-{name}-compact"


def instance_name(name: str, index: int, suffix: str) -> str:
    """kiln-NAME-INDEX-SUFFIX: a replacement gets a fresh suffix (a name cannot be taken while the old one lives)."""
    return f"kiln-{name}-{index}-{suffix}"


def disk_name(name: str, index: int) -> str:
    return f"kiln-{name}-data-{index}"


def image_filter(profile: str, labels: Iterable[tuple[str, str]] = ()) -> str:
    """The images.list filter for kiln's images of a profile carrying these labels too (the API takes several
    expressions each in its own parentheses)."""
    return " AND ".join(f'(labels.{key} = "{value}")' for key, value in ((LABEL_PROFILE, profile), *labels))


def newest_image(images: Iterable[Mapping]) -> Mapping | None:
    """The newest image not deprecated (ties: the larger name, so the choice is stable)."""
    usable = [i for i in images if (i.get("deprecated") or {}).get("state", "ACTIVE") == "ACTIVE"
              and i.get("status", "READY") == "READY"]
    return max(usable, key=lambda image: (image.get("creationTimestamp", ""), image["name"]), default=None)


def firewall_bodies(request: Request, labels: Mapping[str, str]) -> list[dict]:
    """All traffic among the cluster's instances (its network tag); SSH from the operator's range only."""
    internal, ssh = firewall_names(request.name)
    tag = network_tag(request.name)
    common = {"network": NETWORK, "direction": "INGRESS", "priority": 1000, "targetTags": [tag],
              "description": description(labels)}
    return [{"name": internal, **common, "sourceTags": [tag],
             "allowed": [{"IPProtocol": "tcp"}, {"IPProtocol": "udp"}, {"IPProtocol": "icmp"}]},
            {"name": ssh, **common, "sourceRanges": [request.ssh_cidr],
             "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}]}]


def takes_compact_placement(request: Request) -> bool:
    return request.count > 1 and request.family in COMPACT_FAMILIES


def policy_body(request: Request, labels: Mapping[str, str]) -> dict:
    """A compact placement policy: the cluster's VMs close together in one zone (low latency between them)."""
    return {"name": policy_name(request.name), "region": request.region, "description": description(labels),
            "groupPlacementPolicy": {"collocation": "COLLOCATED"}}


def metadata_items(request: Request, public_key: str) -> list[dict]:
    """The cluster's own key for its login user (never the operator's, never the project's keys); the guest agent
    publishes the host keys as guest attributes; cloud-init writes the data disk's settings."""
    items = [{"key": "ssh-keys", "value": f"{request.user}:{public_key} kiln-{request.name}"},
             {"key": "block-project-ssh-keys", "value": "TRUE"},
             {"key": "enable-oslogin", "value": "FALSE"},
             {"key": "enable-guest-attributes", "value": "TRUE"}]
    if request.volume_gb:
        items.append({"key": "user-data", "value": first_boot_settings(request.volume_gb, request.user)})
    return items


def scheduling(request: Request) -> dict:
    """Spot VMs are deleted when preempted (a stopped one still bills for its disks); GPU families stop for host
    maintenance, others migrate."""
    terminate = request.spot or bool(ACCELERATOR_FAMILY.fullmatch(request.family))
    rules = {"onHostMaintenance": "TERMINATE" if terminate else "MIGRATE", "automaticRestart": not request.spot,
             "provisioningModel": "SPOT" if request.spot else "STANDARD"}
    if request.spot:
        rules["instanceTerminationAction"] = "DELETE"
    return rules


def instance_body(request: Request, *, index: int, suffix: str, image: str, public_key: str,
                  labels: Mapping[str, str], project: str, data_disk: str | None = None) -> dict:
    """instances.insert's body for node `index`. Shielded VM with vTPM and integrity monitoring; Secure Boot off,
    as the NVIDIA modules kiln builds are not signed (packer/variables.pkr.hcl, gcp_secure_boot). Compute Engine
    encrypts every disk."""
    zone = request.zone
    disks = [{"boot": True, "autoDelete": True, "deviceName": "boot",
              "initializeParams": {"sourceImage": image, "diskSizeGb": str(BOOT_DISK_GB),
                                   "diskType": f"zones/{zone}/diskTypes/{request.disk_type}",
                                   "labels": dict(labels)}}]
    if data_disk:
        disks.append({"boot": False, "autoDelete": False, "deviceName": DATA_DEVICE_NAME, "mode": "READ_WRITE",
                      "source": f"projects/{project}/zones/{zone}/disks/{data_disk}"})
    body = {
        "name": instance_name(request.name, index, suffix),
        "machineType": f"zones/{zone}/machineTypes/{request.machine_type}",
        "labels": {**labels, LABEL_NODE: str(index)},
        "tags": {"items": [network_tag(request.name)]},
        "disks": disks,
        "networkInterfaces": [{"network": NETWORK, "accessConfigs": [{"type": "ONE_TO_ONE_NAT",
                                                                      "name": "External NAT"}]}],
        "metadata": {"items": metadata_items(request, public_key)},
        "shieldedInstanceConfig": {"enableSecureBoot": False, "enableVtpm": True, "enableIntegrityMonitoring": True},
        "scheduling": scheduling(request),
        "serviceAccounts": [],
    }
    if takes_compact_placement(request):
        body["resourcePolicies"] = [f"projects/{project}/regions/{request.region}/resourcePolicies/"
                                    f"{policy_name(request.name)}"]
    return body


def disk_body(request: Request, *, index: int, labels: Mapping[str, str], snapshot: Snapshot | None = None) -> dict:
    """disks.insert's body for node `index`'s data disk: restored from `snapshot` when given (never smaller)."""
    body = {"name": disk_name(request.name, index),
            "sizeGb": str(max(request.volume_gb or 0, snapshot.gigabytes if snapshot else 0)),
            "type": f"zones/{request.zone}/diskTypes/{request.disk_type}", "labels": {**labels, LABEL_DATA: str(index)}}
    if snapshot is not None:
        body["sourceSnapshot"] = f"global/snapshots/{snapshot.id}"
    return body


def snapshot_set_label(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y%m%dt%H%M%Sz")


def snapshot_body(disk: Resource, project: str, moment: datetime, ttl_days: float) -> dict:
    """snapshots.insert's body for a data disk: it keeps the cluster's name and owner and the node's index, and
    expires on its own clock (sweep removes it then). A disk kept when its snapshot failed carries the set it
    missed (so a retry completes that set)."""
    taken = disk.labels.get(LABEL_SNAPSHOT_SET) or snapshot_set_label(moment)
    index = disk.labels.get(LABEL_DATA, "")
    labels = {key: disk.labels[key] for key in (LABEL_CLUSTER, LABEL_OWNER) if key in disk.labels}
    labels |= {LABEL_EXPIRES: str(int((moment + timedelta(days=ttl_days)).timestamp())), LABEL_DATA: index,
               LABEL_SNAPSHOT_SET: taken}
    return {"name": f"{disk.name}-{taken}", "sourceDisk": f"projects/{project}/zones/{disk.scope}/disks/{disk.name}",
            "labels": labels, "description": f"kiln cluster {disk.cluster} node {index} data, {taken}"}


@dataclass(frozen=True)
class Resource:
    """One kiln-labelled thing in Compute Engine: its kind, name, zone or region ("" where global), labels."""

    kind: str
    name: str
    scope: str
    labels: Mapping[str, str]
    state: str = ""

    @property
    def cluster(self) -> str:
        return self.labels.get(LABEL_CLUSTER, "")

    @property
    def owner(self) -> str:
        return self.labels.get(LABEL_OWNER, "")

    @property
    def expires(self) -> datetime | None:
        return expiry(self.labels)

    @property
    def label(self) -> str:
        return self.name


# The order `down` removes things in: instances first (they hold the rest), then what they used.
TEARDOWN_ORDER = ("instance", "disk", "firewall", "resource-policy")


def teardown_order(resources: Sequence[Resource]) -> list[Resource]:
    return sorted(resources, key=lambda r: (TEARDOWN_ORDER.index(r.kind), r.name))


def node_order(instances: Sequence[Mapping]) -> list[Mapping]:
    return sorted(instances, key=lambda i: (int((i.get("labels") or {}).get(LABEL_NODE, "0")), i["name"]))


def address_of(instance: Mapping) -> str:
    """The instance's external address where it has one, else its internal one."""
    interface = (instance.get("networkInterfaces") or [{}])[0]
    nat = [c.get("natIP") for c in interface.get("accessConfigs") or [] if c.get("natIP")]
    return nat[0] if nat else interface["networkIP"]


def hosts_from_instances(instances: Sequence[Mapping], user: str) -> list[Host]:
    return [Host(address_of(i), user=user) for i in node_order(instances)]


def guest_attribute_keys(attributes: Mapping) -> list[str]:
    """The host keys the guest agent published (guest attributes under hostkeys/), as `type base64`."""
    from kiln.hostkeys import KEY_TYPES

    items = (attributes.get("queryValue") or {}).get("items") or []
    return [f"{item['key']} {item['value'].split()[0]}" for item in items
            if item.get("namespace") == "hostkeys" and item.get("key") in KEY_TYPES and item.get("value")]


def snapshot_of(described: Mapping) -> Snapshot:
    labels = described.get("labels") or {}
    index = labels.get(LABEL_DATA, "")
    return Snapshot(described["name"], labels.get(LABEL_CLUSTER, ""), node_index(index),
                    labels.get(LABEL_SNAPSHOT_SET, ""), int(described.get("diskSizeGb") or 0),
                    described.get("status", ""), labels, expiry(labels))


def from_options(name: str, count, options: Mapping[str, Any], idle_minutes: float | None,
                 place: Mapping[str, str | None]) -> Request:
    """A `kiln up`'s request on Compute Engine from its options and its zone (validate_request)."""
    return validate_request(
        name, count, options.get("instance_type"), zone=place.get("zone"), ssh_cidr=options.get("ssh_cidr"),
        source_image=options.get("source_image"), image_profile=options.get("image_profile") or "gpu",
        image_tags=options.get("image_tags"), spot=bool(options.get("spot")), max_price=options.get("max_price"),
        user=options.get("user") or "ubuntu",
        ttl_hours=options.get("ttl_hours", 24.0), volume_gb=options.get("volume"), idle_minutes=idle_minutes)


def dry_run(request: Request, *, key: str, place: Mapping[str, str | None], now: datetime) -> list[str]:
    """What `up` would do on Compute Engine (up --dry-run), up to the wait: the calls, with their bodies."""
    project = place.get("project") or "<project>"
    labels = cluster_labels(request.name, "you", now, request.ttl_hours)
    more = "".join(f", {k}={v}" for k, v in request.image_labels)
    image = request.source_image or IMAGE_PLACEHOLDER.format(profile=request.image_profile, more=more)
    lines = [f"cluster {request.name}: key {key} (made if missing), then these Compute Engine calls in project "
             f"{project}; any failure undoes them"]
    if request.max_price:
        lines.insert(0, f"cluster {request.name}: first the Spot price of {request.machine_type} in {request.region} "
                        f"from the Cloud Billing Catalog: above --max-price {request.max_price:g} USD an hour (or not "
                        "read), nothing is made (GCE takes no bid)")
    lines += [f"firewalls.insert {json.dumps(body)}" for body in firewall_bodies(request, labels)]
    if takes_compact_placement(request):
        lines.append(f"resourcePolicies.insert {json.dumps(policy_body(request, labels))}")
    if request.volume_gb:
        lines.append(f"disks.insert {json.dumps(disk_body(request, index=0, labels=labels))} (node 0; each node "
                     f"one, from the cluster's newest snapshot of it if any; mounted at {DATA_MOUNT})")
    body = instance_body(request, index=0, suffix="xxxx", image=image,
                         public_key=PUBLIC_KEY_PLACEHOLDER.format(path=f"{key}.pub"), labels=labels, project=project,
                         data_disk=disk_name(request.name, 0) if request.volume_gb else None)
    lines.append(f"instances.insert {json.dumps(body)} (node 0 of {request.count})")
    return lines
