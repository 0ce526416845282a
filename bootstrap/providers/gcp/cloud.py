"""GCP clusters with google-cloud-compute: create, find by label, tear down. Decisions live in
bootstrap.providers.gcp.plan.

Credentials come from Application Default Credentials (`gcloud auth application-default login`, or
GOOGLE_APPLICATION_CREDENTIALS); the project from --project, GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT or the
credentials'. kiln never writes credentials. `KILN_GCE_ENDPOINT` aims every client at another endpoint by the
client's own `api_endpoint` option (the tests' stand-in, testbed.gce); a plain-http endpoint on loopback gets
anonymous credentials, so real ones never travel unencrypted.

Every mutating call is the API's `*_unary` form: kiln waits on the operation it returns through the operations
clients it made (the library's own polling would reach for the default endpoint).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import ClassVar
from urllib.parse import urlparse

from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.providers import offerings as offered
from bootstrap.providers import provision
from bootstrap.providers.common import (
    SNAPSHOT_TTL_DAYS,
    SSH_WAIT_S,
    Rollback,
    configured,
    latest_snapshot_set,
    poll_host_keys,
    restore_note,
    validate_name,
    validate_snapshot_ttl,
)
from bootstrap.providers.failover import CloudError, Unavailable
from bootstrap.providers.gcp import plan, prices
from bootstrap.providers.provision import CloudRecord, Nodes, Progress, Swap, Verbs
from kiln.hostkeys import console_host_keys

ENDPOINT_ENV = "KILN_GCE_ENDPOINT"
PROJECT_ENVS = plan.ENV["project"]
SCOPES = ("https://www.googleapis.com/auth/compute",
          "https://www.googleapis.com/auth/cloud-billing.readonly")  # the Cloud Billing Catalog: prices
OPERATION_TIMEOUT_S = 600
CALL_TIMEOUT_S = 60  # every API call's; an operations `wait` (which the API holds up to 2 minutes) gets 150
WAIT_CALL_TIMEOUT_S = 150
CATALOG_PAGE = 5000  # SKUs a page of the Cloud Billing Catalog (its most)
HOST_KEYS_POLL_S = 5
CLIENTS = {"instances": "InstancesClient", "disks": "DisksClient", "snapshots": "SnapshotsClient",
           "images": "ImagesClient", "firewalls": "FirewallsClient", "policies": "ResourcePoliciesClient",
           "machine_types": "MachineTypesClient", "zones": "ZonesClient",
           "zone_ops": "ZoneOperationsClient", "region_ops": "RegionOperationsClient",
           "global_ops": "GlobalOperationsClient"}


class GcpError(CloudError):
    """A call to Compute Engine failed; the message names the step."""


@dataclass
class Gce:
    """The project kiln works in and the clients it uses (made when first asked for)."""

    project: str
    credentials: object
    endpoint: str | None = None
    owner: str = "unknown"
    _clients: dict = field(default_factory=dict)

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in CLIENTS:
            raise AttributeError(name)
        if name not in self._clients:
            from google.cloud import compute_v1

            options = {"api_endpoint": self.endpoint} if self.endpoint else None
            self._clients[name] = Timed(getattr(compute_v1, CLIENTS[name])(credentials=self.credentials,
                                                                           client_options=options))
        return self._clients[name]


class Timed:
    """A client whose every call has a timeout (CALL_TIMEOUT_S; WAIT_CALL_TIMEOUT_S for an operation's wait):
    kiln never waits on a remote call without one."""

    def __init__(self, client):
        self.client = client

    def __getattr__(self, name: str):
        method = getattr(self.client, name)
        if not callable(method):
            return method
        seconds = WAIT_CALL_TIMEOUT_S if name == "wait" else CALL_TIMEOUT_S
        return lambda *args, **kwargs: method(*args, **{"timeout": seconds, **kwargs})


def loopback_http(endpoint: str) -> bool:
    parsed = urlparse(endpoint)
    return parsed.scheme == "http" and parsed.hostname in ("127.0.0.1", "localhost", "::1")


def connect(project: str | None = None) -> Gce:
    """The clients for `project` (or the environment's, or the credentials'), with Application Default
    Credentials; a plain-http loopback endpoint (KILN_GCE_ENDPOINT) gets anonymous ones."""
    endpoint = os.environ.get(ENDPOINT_ENV) or None
    project = configured(project, PROJECT_ENVS)
    if endpoint and urlparse(endpoint).scheme == "http" and not loopback_http(endpoint):
        raise UsageError(f"{ENDPOINT_ENV}={endpoint}: plain http only on this machine (127.0.0.1); use https")
    if endpoint and loopback_http(endpoint):
        from google.auth.credentials import AnonymousCredentials

        credentials, found = AnonymousCredentials(), None
    else:
        import google.auth
        import google.auth.exceptions

        try:
            credentials, found = google.auth.default(scopes=list(SCOPES))
        except google.auth.exceptions.DefaultCredentialsError:
            raise UsageError("no Google credentials: run gcloud auth application-default login, or set "
                             "GOOGLE_APPLICATION_CREDENTIALS to a key file") from None
    project = project or found
    if not project:
        raise UsageError("no GCP project: give --project or set GOOGLE_CLOUD_PROJECT")
    if not plan.PROJECT.fullmatch(project):
        raise UsageError(f"--project {project!r} is not a project id like my-project-123")
    who = getattr(credentials, "service_account_email", None) or os.environ.get("USER") or "unknown"
    return Gce(project, credentials, endpoint, owner=who)


def error_code(error: BaseException) -> str:
    """Compute Engine's code for a failed call: an operation's error code (ZONE_RESOURCE_POOL_EXHAUSTED), else the
    reason of a refused call (QUOTA_EXCEEDED)."""
    if isinstance(error, GcpError):
        return error.code
    details = getattr(error, "errors", None) or [{}]  # the REST error's errors[].reason where no ErrorInfo says it
    first = details[0] if isinstance(details[0], dict) else {}
    return str(getattr(error, "reason", None) or first.get("reason") or "")


def describe_error(error: BaseException) -> str:
    """One line for a failed call: the API's message where it gave one."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    code = getattr(error, "code", None)
    text = " ".join(str(message).split())
    return f"{text} (HTTP {int(code)})" if isinstance(code, int) and code and str(int(code)) not in text else text


def as_dict(message) -> dict:
    """A Compute v1 message as the API's JSON (camelCase), the shape plan.py reads and writes."""
    return json.loads(type(message).to_json(message))


def message(kind: str, body: dict):
    """The library's message of `kind` (Instance, Firewall...) from the API's JSON; an unknown field is refused."""
    from google.cloud import compute_v1

    return getattr(compute_v1, kind).from_json(json.dumps(body), ignore_unknown_fields=False)


def wait(gce: Gce, operation, timeout_s: float = OPERATION_TIMEOUT_S) -> None:
    """Wait for an operation to be DONE (the operations API's own wait, called again until then); raise GcpError
    with its error if it failed."""
    from google.cloud import compute_v1

    deadline = time.monotonic() + timeout_s
    while operation.status != compute_v1.Operation.Status.DONE:
        if time.monotonic() > deadline:
            raise GcpError(f"operation {operation.name} ({operation.operation_type}) not done after {timeout_s:g}s")
        if operation.zone:
            operation = gce.zone_ops.wait(project=gce.project, zone=operation.zone.rsplit("/", 1)[-1],
                                          operation=operation.name)
        elif operation.region:
            operation = gce.region_ops.wait(project=gce.project, region=operation.region.rsplit("/", 1)[-1],
                                            operation=operation.name)
        else:
            operation = gce.global_ops.wait(project=gce.project, operation=operation.name)
    errors = list(operation.error.errors) if operation.error else []
    if errors:
        raise GcpError("; ".join(f"{e.code}: {' '.join(e.message.split())}" for e in errors), code=errors[0].code)


def wait_all(gce: Gce, operations: Iterable, timeout_s: float = OPERATION_TIMEOUT_S) -> None:
    """Wait for every operation; the first failure is raised once all are done (so none is left running)."""
    failures: list[GcpError] = []
    for operation in list(operations):
        try:
            wait(gce, operation, timeout_s)
        except GcpError as error:
            failures.append(error)
    if failures:
        raise GcpError("; ".join(dict.fromkeys(map(str, failures))), code=failures[0].code)


def settle(gce: Gce, operations: Iterable, timeout_s: float = OPERATION_TIMEOUT_S) -> None:
    """Wait for operations already started (their outcome does not matter here) before undoing what they make: a
    resource still being made may not be listed yet, and cannot be deleted."""
    for operation in operations:
        try:
            wait(gce, operation, timeout_s)
        except Exception:  # a failed operation made nothing; the undo finds what did get made
            pass


def not_found(error: BaseException) -> bool:
    return getattr(error, "code", None) == 404


def find_image(gce: Gce, request: plan.Request) -> str:
    """The source image's link: --source-image as given (checked), else the newest of kiln's images of the profile
    carrying the labels asked for."""
    if request.source_image:
        image = request.source_image
        project, name = (image.split("/")[1], image.rsplit("/", 1)[-1]) if image.startswith("projects/") else (
            gce.project, image)
        try:
            if "/images/family/" in image:
                return gce.images.get_from_family(project=project, family=name).self_link
            return gce.images.get(project=project, image=name).self_link
        except Exception as error:
            raise GcpError(f"--source-image {image}: {describe_error(error)}") from None
    query = plan.image_filter(request.image_profile, request.image_labels)
    try:
        found = plan.newest_image(as_dict(i) for i in gce.images.list(request={"project": gce.project,
                                                                                "filter": query}))
    except Exception as error:
        raise GcpError(f"look for kiln's images ({query}): {describe_error(error)}") from None
    if found is None:  # bad input with GCP alone; with other clouds among the candidates, their turn
        raise Unavailable(f"no image in project {gce.project} with {query} (make image PROVIDER=gcp bakes one; or "
                          "give --source-image)", code="NoImageHere")
    return found["selfLink"]


def check_machine_type(gce: Gce, request: plan.Request) -> None:
    """Refuse, before anything is made, a machine type the zone does not offer (an insert would fail only after the
    firewall rules and disks were made): Unavailable, so that failover moves on to the next zone. A lookup that fails
    otherwise checks nothing."""
    try:
        gce.machine_types.get(project=gce.project, zone=request.zone, machine_type=request.machine_type)
    except Exception as error:
        if not_found(error):
            raise Unavailable(f"--instance-type {request.machine_type}: not offered in {request.zone}",
                              code=error_code(error)) from None
        # no right to ask (compute.machineTypes.get), throttled: the insert says it all the same, only later


def check_spot_price(gce: Gce, request: plan.Request) -> None:
    """With --max-price, refuse before anything is made a zone whose region's Spot price of the machine type is
    above it, or cannot be read: GCE takes no bid, so this look is what holds the price, at `up` and at every
    instance the cluster gets later (a replacement, a queue's node; the record keeps --max-price). Unavailable:
    the next candidate's turn; with one, the reason to the user."""
    if not request.max_price:
        return
    where = f"{request.machine_type} in {request.region}"
    try:
        price = spot_prices([request.machine_type], zone=request.zone, gce=gce).get(request.machine_type)
    except GcpError as error:
        raise Unavailable(f"--max-price {request.max_price:g}: the Spot price of {where} could not be read ({error}), "
                          "so the price cannot be held there", code="SpotPriceUnknown") from None
    if price is None:
        raise Unavailable(f"--max-price {request.max_price:g}: the Cloud Billing Catalog has no Spot price of {where}, "
                          "so the price cannot be held there", code="SpotPriceUnknown")
    if price > request.max_price:
        raise Unavailable(f"--max-price {request.max_price:g}: the Spot price of {where} is {price:.4g} USD an hour",
                          code="SpotPriceAboveMax")


def scope_name(scope: str) -> str:
    """`zones/us-central1-a` (an aggregated list's key) or a zone's URL: us-central1-a."""
    return scope.rsplit("/", 1)[-1]


def find_resources(gce: Gce, name: str | None = None) -> list[plan.Resource]:
    """Everything kiln labelled (of the cluster `name`, if given), in every zone: instances and data disks by
    label, firewall rules and placement policies by the labels in their description. Snapshots are not here:
    they outlive the cluster."""
    query = f'labels.{plan.LABEL_CLUSTER} = "{name}"' if name else f"labels.{plan.LABEL_CLUSTER}:*"
    found = []
    for kind, client in (("instance", gce.instances), ("disk", gce.disks)):
        for scope, listed in client.aggregated_list(request={"project": gce.project, "filter": query}):
            for item in (listed.instances if kind == "instance" else listed.disks):
                found.append(plan.Resource(kind, item.name, scope_name(scope), dict(item.labels), item.status))
    for item in gce.firewalls.list(project=gce.project):
        labels = plan.labels_of_description(item.description)
        if labels.get(plan.LABEL_CLUSTER) and (name is None or labels[plan.LABEL_CLUSTER] == name):
            found.append(plan.Resource("firewall", item.name, "", labels))
    for scope, listed in gce.policies.aggregated_list(project=gce.project):
        for item in listed.resource_policies:
            labels = plan.labels_of_description(item.description)
            if labels.get(plan.LABEL_CLUSTER) and (name is None or labels[plan.LABEL_CLUSTER] == name):
                found.append(plan.Resource("resource-policy", item.name, scope_name(scope), labels))
    return found  # an instance's boot disk carries the labels too: it goes with its instance, or on its own


def find_snapshots(gce: Gce, name: str | None = None) -> list[plan.Snapshot]:
    query = f'labels.{plan.LABEL_CLUSTER} = "{name}"' if name else f"labels.{plan.LABEL_DATA}:*"
    return [plan.snapshot_of(as_dict(s)) for s in gce.snapshots.list(request={"project": gce.project,
                                                                             "filter": query})
            if plan.LABEL_DATA in s.labels]


def delete(gce: Gce, resource: plan.Resource):
    """Start deleting one resource (its operation); None where it is already gone."""
    calls = {"instance": lambda: gce.instances.delete_unary(project=gce.project, zone=resource.scope,
                                                            instance=resource.name),
             "disk": lambda: gce.disks.delete_unary(project=gce.project, zone=resource.scope, disk=resource.name),
             "firewall": lambda: gce.firewalls.delete_unary(project=gce.project, firewall=resource.name),
             "resource-policy": lambda: gce.policies.delete_unary(project=gce.project, region=resource.scope,
                                                                  resource_policy=resource.name)}
    try:
        return calls[resource.kind]()
    except Exception as error:
        if not_found(error):
            return None
        raise


def remove(gce: Gce, resources: Sequence[plan.Resource], timeout_s: float = OPERATION_TIMEOUT_S) -> list[str]:
    """Delete the instances and wait until they are gone (their boot disks go with them), then the rest, kind by
    kind; what was removed."""
    ordered = plan.teardown_order(resources)
    for kind in plan.TEARDOWN_ORDER:
        wait_all(gce, [op for op in (delete(gce, r) for r in ordered if r.kind == kind) if op is not None],
                 timeout_s)
    return [f"{r.kind} {r.name}" + (f" ({r.scope})" if r.scope else "") for r in ordered]


def host_keys(gce: Gce, zone: str, names: Sequence[str], timeout_s: float,
              poll_s: float = HOST_KEYS_POLL_S) -> dict[str, list[str]]:
    """The host keys each instance shows: its guest attributes (hostkeys/), else the keys cloud-init printed to
    its serial port (common.poll_host_keys)."""
    return poll_host_keys(lambda name: shown_host_keys(gce, zone, name), names, timeout_s, poll_s)


def shown_host_keys(gce: Gce, zone: str, name: str) -> list[str]:
    try:
        attributes = gce.instances.get_guest_attributes(request={"project": gce.project, "zone": zone,
                                                                 "instance": name, "query_path": "hostkeys/"})
        keys = plan.guest_attribute_keys(as_dict(attributes))
        if keys:
            return keys
    except Exception as error:
        if not not_found(error):
            raise
    serial = gce.instances.get_serial_port_output(request={"project": gce.project, "zone": zone, "instance": name,
                                                           "port": 1})
    return console_host_keys(serial.contents)


@dataclass(frozen=True)
class Record(CloudRecord):
    """What kiln keeps of a GCP cluster it made (gcp.json): enough to replace a node as it was made. The
    instances, their order and their host keys are the cluster file's (state.ClusterRecord), written once there."""

    project: str
    zone: str
    image: str
    labels: dict
    request: dict
    data_disks: tuple[str, ...] = ()

    kind: ClassVar[str] = "gcp"
    volumes_field: ClassVar[str] = "data_disks"

    def planned(self) -> plan.Request:
        return plan.Request(**{**self.request, "image_labels": tuple(tuple(p) for p in self.request["image_labels"])})


def suffix() -> str:
    return secrets.token_hex(2)


def up(request: plan.Request, *, project: str | None = None, python: str = "python3", gce: Gce | None = None,
       now: datetime | None = None, ssh_wait_s: float = SSH_WAIT_S,
       timeout_s: float = OPERATION_TIMEOUT_S, say: Callable[[str], None] | None = None) -> provision.Up:
    """Create the cluster, wait until SSH answers on every instance (unless ssh_wait_s is 0), pin the host keys
    the instances show, write its cluster file, and return what was made. On any failure (Ctrl-C too), undo it
    all: each step's undo is registered before the step, and finds what it removes by the cluster's labels."""
    gce = gce or connect(project)
    check_machine_type(gce, request)
    check_spot_price(gce, request)
    image = find_image(gce, request)
    try:
        taken = find_resources(gce, request.name)
    except Exception as error:
        raise GcpError(f"cluster.up {request.name}: could not look for resources labelled with its name: "
                       f"{describe_error(error)}; nothing was created") from None
    if taken:
        data = [r.name for r in taken if r.kind == "disk" and plan.LABEL_DATA in r.labels]
        raise UsageError(f"cluster name {request.name!r} is taken: {len(taken)} resource(s) labelled "
                         f"{plan.LABEL_CLUSTER}={request.name} exist in project {gce.project} " + (
                             f"(kiln down {request.name} --snapshot keeps its data disks {', '.join(data)} as "
                             f"snapshots; kiln down {request.name} deletes them; add --provider gcp where this machine "
                             "has no cluster file)" if data else f"(kiln down {request.name} --provider gcp)"))
    try:
        restored = latest_snapshot_set(find_snapshots(gce, request.name), "READY") if request.volume_gb else {}
    except Exception as error:
        raise GcpError(f"cluster.up {request.name}: could not look for snapshots of its data disks: "
                       f"{describe_error(error)}; nothing was created") from None
    note = restore_note(request.name, request.count, restored) if request.volume_gb else None
    labels = plan.cluster_labels(request.name, gce.owner, now or datetime.now(UTC), request.ttl_hours)
    operations: list = []  # every operation this call started: waited for before anything is undone
    disks: list[str] = []

    def start(call, **kwargs):
        operation = call(**kwargs)
        operations.append(operation)
        return operation

    def made(kind: str, names: Iterable[str], scope: str = "") -> Callable[[], object]:
        """Undo: delete what this call named (never another `up`'s of the same name), kind by kind."""
        return lambda: remove(gce, [plan.Resource(kind, name, scope, {}) for name in names], timeout_s)

    def make(progress: Progress, rollback: Rollback, public_key: str) -> Nodes:
        progress.step = "create the firewall rules"
        rules = plan.firewall_bodies(request, labels)
        rollback.push("delete the firewall rules", made("firewall", [body["name"] for body in rules]))
        wait_all(gce, [start(gce.firewalls.insert_unary, project=gce.project,
                             firewall_resource=message("Firewall", body)) for body in rules], timeout_s)

        if plan.takes_compact_placement(request):
            progress.step = "create the compact placement policy"
            policy = plan.policy_body(request, labels)
            rollback.push("delete the placement policy", made("resource-policy", [policy["name"]], request.region))
            wait(gce, start(gce.policies.insert_unary, project=gce.project, region=request.region,
                            resource_policy_resource=message("ResourcePolicy", policy)), timeout_s)

        if request.volume_gb:
            progress.step = "create the data disks"
            bodies = [plan.disk_body(request, index=i, labels=labels, snapshot=restored.get(i))
                      for i in range(request.count)]
            disks.extend(body["name"] for body in bodies)
            rollback.push("delete the data disks", made("disk", disks, request.zone))
            wait_all(gce, [start(gce.disks.insert_unary, project=gce.project, zone=request.zone,
                                 disk_resource=message("Disk", body)) for body in bodies], timeout_s)

        progress.step = "create the instances"
        bodies = [plan.instance_body(request, index=i, suffix=suffix(), image=image, public_key=public_key,
                                     labels=labels, project=gce.project, data_disk=disks[i] if disks else None)
                  for i in range(request.count)]
        rollback.push("delete the instances", made("instance", [body["name"] for body in bodies], request.zone))
        wait_all(gce, [start(gce.instances.insert_unary, project=gce.project, zone=request.zone,
                             instance_resource=message("Instance", body)) for body in bodies], timeout_s)
        names = tuple(body["name"] for body in bodies)
        described = [as_dict(gce.instances.get(project=gce.project, zone=request.zone, instance=name))
                     for name in names]
        return Nodes(names, tuple(plan.hosts_from_instances(described, request.user)))

    def save(nodes: Nodes) -> None:
        Record(gce.project, request.zone, image, labels, asdict(request), tuple(disks)).save(request.name)

    cluster = provision.up(request.name, Verbs(
        "gcp", GcpError, make, lambda names, timeout_s: host_keys(gce, request.zone, names, timeout_s), save,
        describe_error, error_code, keys_step="read the host keys the instances show",
        settle=lambda: settle(gce, operations), place={"project": gce.project, "zone": request.zone}),
        region=request.zone, user=request.user, node_type=request.machine_type, python=python,
        ssh_wait_s=ssh_wait_s, say=say)
    return cluster.made(request.name, where=f"{gce.project}/{request.zone}", image=image,
                        expires=plan.format_expiry(labels), ssh_wait=ssh_wait_s, volumes=disks, restore_note=note)


def replace(name: str, address: str, *, project: str | None = None, gce: Gce | None = None,
            ssh_wait_s: float = SSH_WAIT_S, timeout_s: float = OPERATION_TIMEOUT_S) -> tuple[Host, list[str]]:
    """Put a new instance, made as `up` made the cluster's (image, machine type, spot, network, labels, placement),
    in place of the one at `address`, and delete the old one; its data disk moves to the new one; update the
    cluster's files. (the new host, the host keys it shows)

    The new instance must run, answer SSH and show its host keys (kiln never trusts a replacement on first
    contact); otherwise it is deleted and the cluster is left as it was."""
    record, kept = Record.of_cluster(name)
    _, index = provision.node_at(record, address)
    gce = gce or connect(project or kept.project)
    check_spot_price(gce, kept.planned())  # --max-price holds for every instance the cluster gets
    return provision.replace(record, address, kept.data_disks, swap(gce, name, kept, index, timeout_s),
                             ssh_wait_s=ssh_wait_s)


def grow(name: str, count: int, *, project: str | None = None, gce: Gce | None = None,
         ssh_wait_s: float = SSH_WAIT_S, timeout_s: float = OPERATION_TIMEOUT_S) -> list[tuple[str, Host, list[str]]]:
    """Add `count` instances to the cluster, each made as `up` made the cluster's (provision.grow: all of them,
    or none)."""
    record, kept = Record.of_cluster(name)
    gce = gce or connect(project or kept.project)
    check_spot_price(gce, kept.planned())  # --max-price holds for every instance the cluster gets
    return provision.grow(record, count, lambda index: swap(gce, name, kept, index, timeout_s),
                          volumes=kept.data_disks, ssh_wait_s=ssh_wait_s)


def shrink(name: str, addresses: Sequence[str], *, project: str | None = None, gce: Gce | None = None,
           timeout_s: float = OPERATION_TIMEOUT_S) -> list[str]:
    """Delete the cluster's instances at `addresses`; the names removed."""
    record, kept = Record.of_cluster(name)
    gce = gce or connect(project or kept.project)
    return provision.shrink_by(record, addresses, swap(gce, name, kept, 0, timeout_s), volumes=kept.data_disks)


def swap(gce: Gce, name: str, kept: Record, index: int, timeout_s: float) -> Swap:
    """How the cluster's instances are made and removed one at a time (a replacement, a node added or removed): a
    new one as `up` made node `index`, under a name of its own."""
    request = kept.planned()
    body = plan.instance_body(request, index=index, suffix=suffix(), image=kept.image,
                              public_key=provision.cluster_public_key(name), labels=kept.labels, project=kept.project)

    def make(making: Progress) -> tuple[str, Host]:
        making.made = body["name"]
        wait(gce, gce.instances.insert_unary(project=kept.project, zone=kept.zone,
                                             instance_resource=message("Instance", body)), timeout_s)
        [host] = plan.hosts_from_instances([as_dict(gce.instances.get(project=kept.project, zone=kept.zone,
                                                                      instance=body["name"]))], request.user)
        return body["name"], host

    def attach(new_name: str, disk: str) -> None:
        wait(gce, gce.instances.attach_disk_unary(
            project=kept.project, zone=kept.zone, instance=new_name, attached_disk_resource=message(
                "AttachedDisk", {"source": f"projects/{kept.project}/zones/{kept.zone}/disks/{disk}",
                                 "deviceName": plan.DATA_DEVICE_NAME, "autoDelete": False, "mode": "READ_WRITE"})),
             timeout_s)

    return Swap(GcpError, describe_error, make, lambda names, wait_s: host_keys(gce, kept.zone, names, wait_s),
                lambda instance, _: remove(gce, [plan.Resource("instance", instance, kept.zone, {})], timeout_s),
                attach, first_step="create the instance", keys_step="read the host keys it shows",
                keys_where="guest attributes, serial port", error_code=error_code)


def arm_autostop(name: str, *, project: str | None = None) -> list[str]:
    """Nothing to arm: a GCE VM that powers itself off stops (TERMINATED) and its GPUs and CPUs stop billing;
    `kiln list` shows it, `kiln down` removes it and its disks."""
    return []


def places(every: bool = False, *, project: str | None = None) -> list[str | None]:
    """The project `list` and `sweep` look in besides the clusters' files (a project holds every zone's): the one
    given or configured (None: the credentials' own)."""
    return [configured(project, PROJECT_ENVS)]


def default_place(*, project: str | None = None) -> str | None:
    """The zone an up that names none goes to (CLOUDSDK_COMPUTE_ZONE), or None."""
    return configured(None, plan.ENV["zone"])


def account(*, project: str | None = None) -> str:
    """Which project the credentials work in (given, configured, or the credentials' own; no call)."""
    return connect(project).project


def place_names(*, project: str | None = None, near: str | None = None, gce: Gce | None = None) -> Sequence[str]:
    """Every zone of Compute Engine the project sees (zones.list)."""
    gce = gce or connect(project)
    try:
        return sorted(zone.name for zone in gce.zones.list(project=gce.project))
    except Exception as error:
        raise GcpError(f"could not list the zones: {describe_error(error)}") from None


def offerings(instance_types: Sequence[str], *, project: str | None = None, gce: Gce | None = None,
              now: datetime | None = None) -> offered.Record:
    """Where the types are offered to the project: the zones that have each (machineTypes.aggregatedList, one
    type at a time by its name)."""
    gce = gce or connect(project)
    items: dict[str, dict] = {}
    for kind in instance_types:
        try:
            for scope, scoped in gce.machine_types.aggregated_list(request={"project": gce.project,
                                                                            "filter": f'name = "{kind}"'}):
                items.setdefault(scope, {"machineTypes": []})["machineTypes"] += as_dict(scoped).get(
                    "machineTypes", [])
        except Exception as error:
            raise GcpError(f"could not read the zones that offer {kind}: {describe_error(error)}") from None
    found, unread, priced_from = offered.gcp_offerings(items), (), ""
    try:
        table = prices.zone_prices(found, prices.shapes(items), catalog_rates(gce))
        found, priced_from = offered.priced(found, table), "GCP's Cloud Billing Catalog, on demand"
    except GcpError as error:
        unread = (f"the prices ({error})",)
    return offered.Record("gcp", gce.project, (now or datetime.now(UTC)).isoformat(timespec="seconds"),
                          "GCE's machineTypes.aggregatedList", tuple(instance_types), tuple(found), unread,
                          priced_from)


def spot_prices(instance_types: Sequence[str], *, project: str | None = None, zone: str | None = None,
                gce: Gce | None = None) -> dict[str, float]:
    """Each type's Spot price an hour in the zone's region (priced_in_zone, its Spot SKUs); {} without a zone."""
    return priced_in_zone(instance_types, project=project, zone=zone, gce=gce, spot=True)


def on_demand_prices(instance_types: Sequence[str], *, project: str | None = None, zone: str | None = None,
                     gce: Gce | None = None) -> dict[str, float]:
    """Each type's on-demand price an hour in the zone's region (priced_in_zone); {} without a zone."""
    return priced_in_zone(instance_types, project=project, zone=zone, gce=gce, spot=False)


def priced_in_zone(instance_types: Sequence[str], *, project: str | None, zone: str | None, gce: Gce | None,
                   spot: bool) -> dict[str, float]:
    """Each type the zone has, priced from the Cloud Billing Catalog at its region's rates (its vCPUs, memory and
    GPUs as machineTypes.get gives them); a type the zone lacks, or whose rates are not all there, is left out."""
    if not zone:
        return {}
    gce = gce or connect(project)
    shapes = {}
    for kind in instance_types:
        try:
            found = as_dict(gce.machine_types.get(project=gce.project, zone=zone, machine_type=kind))
        except Exception as error:
            if not_found(error):  # the zone has no such type
                continue
            raise GcpError(f"could not read {kind} in {zone}: {describe_error(error)}") from None
        shapes.update(prices.shapes({f"zones/{zone}": {"machineTypes": [found]}}))
    if not shapes:
        return {}
    rated = catalog_rates(gce)
    found = {kind: prices.machine_price(kind, shape, plan.region_of(zone), rated, spot=spot)
             for kind, shape in shapes.items()}
    return {kind: price for kind, price in found.items() if price is not None}


_RATES: dict[tuple[str | None, str], dict] = {}  # the Catalog's rates, read once a command (by endpoint, project)


def catalog_rates(gce: Gce) -> dict[tuple[str, str, bool, str], float]:
    """The Catalog's hourly rates (prices.rates), read once per command however many zones ask: every page of
    Compute Engine's SKUs is tens of thousands of them."""
    key = (gce.endpoint, gce.project)
    if key not in _RATES:
        _RATES[key] = prices.rates(catalog_skus(gce))
    return _RATES[key]


def catalog_skus(gce: Gce) -> list[dict]:
    """Compute Engine's SKUs in the Cloud Billing Catalog (services.skus.list, in USD, every page), as the API's
    JSON: what prices.rates reads. Google's own Cloud Billing client, by REST at the same endpoint as the rest."""
    try:
        from google.cloud import billing_v1
    except ImportError:
        raise GcpError("could not read Compute Engine's prices: google-cloud-billing is not installed (make setup)") \
            from None

    options = {"api_endpoint": gce.endpoint} if gce.endpoint else None
    client = Timed(billing_v1.CloudCatalogClient(credentials=gce.credentials, transport="rest",
                                                 client_options=options))
    try:
        pages = client.list_skus(request={"parent": prices.COMPUTE_SERVICE, "currency_code": prices.CURRENCY,
                                          "page_size": CATALOG_PAGE})
        return [json.loads(billing_v1.Sku.to_json(sku)) for sku in pages]
    except Exception as error:
        raise GcpError(f"could not read Compute Engine's prices from the Cloud Billing Catalog: "
                       f"{describe_error(error)}") from None


def down(name: str, *, project: str | None = None, gce: Gce | None = None,
         timeout_s: float = OPERATION_TIMEOUT_S) -> list[str]:
    """Remove everything labelled with the cluster's name (its snapshots stay); an empty list when there was
    nothing."""
    validate_name(name)
    kept = Record.load(name)
    gce = gce or connect(project or (kept.project if kept else None))
    try:
        removed = remove(gce, find_resources(gce, name), timeout_s)
    except Exception as error:
        raise GcpError(f"cluster.down {name}: {describe_error(error)}") from None
    provision.forget_local(name, "gcp", found=bool(removed), looked=f"project {gce.project}")
    return removed


def down_with_snapshots(name: str, *, ttl_days: float = SNAPSHOT_TTL_DAYS, project: str | None = None,
                        gce: Gce | None = None, now: datetime | None = None,
                        timeout_s: float = OPERATION_TIMEOUT_S) -> provision.Teardown:
    """Delete the instances (their shutdown unmounts the data disks), snapshot each data disk, and remove the rest.
    A disk whose snapshot fails is kept, labelled with the cluster and the set it missed, and named."""
    validate_name(name)
    ttl_days = validate_snapshot_ttl(ttl_days)
    kept_record = Record.load(name)
    gce = gce or connect(project or (kept_record.project if kept_record else None))
    moment = now or datetime.now(UTC)
    snapshots: list[plan.Snapshot] = []
    kept: list[tuple[str, str, str]] = []
    try:
        resources = find_resources(gce, name)
        removed = remove(gce, [r for r in resources if r.kind == "instance"], timeout_s)
        data = sorted((r for r in resources if r.kind == "disk" and plan.LABEL_DATA in r.labels),
                      key=lambda r: (r.labels[plan.LABEL_DATA], r.name))
        for disk in data:
            body = plan.snapshot_body(disk, gce.project, moment, ttl_days)
            try:
                wait(gce, gce.snapshots.insert_unary(project=gce.project, snapshot_resource=message("Snapshot", body)),
                     timeout_s)
                snapshots.append(plan.snapshot_of(as_dict(gce.snapshots.get(project=gce.project,
                                                                            snapshot=body["name"]))))
            except Exception as error:
                kept.append((disk.name, disk.labels[plan.LABEL_DATA], describe_error(error)))
                mark_missed_set(gce, disk, body["labels"])
        keep = {disk for disk, _, _ in kept}
        removed += remove(gce, [r for r in resources if r.kind != "instance" and r.name not in keep], timeout_s)
    except Exception as error:
        raise GcpError(f"cluster.down {name}: {describe_error(error)}"
                       + (f" (snapshots made: {', '.join(s.id for s in snapshots)})" if snapshots else "")) from None
    if not kept:  # a kept disk keeps the cluster's files, so `kiln down NAME --snapshot` finds its provider
        provision.forget_local(name, "gcp", found=bool(removed), looked=f"project {gce.project}")
    return provision.Teardown(removed, snapshots, kept)


def mark_missed_set(gce: Gce, disk: plan.Resource, snapshot_labels: dict) -> None:
    """Label a kept disk with the snapshot set it missed, so a retry completes that set, and with the snapshot's
    expiry, so `sweep` does not remove the only copy of its data at the cluster's."""
    wanted = {plan.LABEL_SNAPSHOT_SET: snapshot_labels[plan.LABEL_SNAPSHOT_SET],
              plan.LABEL_EXPIRES: snapshot_labels[plan.LABEL_EXPIRES]}
    if all(disk.labels.get(key) == value for key, value in wanted.items()):
        return
    from google.cloud import compute_v1

    current = gce.disks.get(project=gce.project, zone=disk.scope, disk=disk.name)
    wait(gce, gce.disks.set_labels_unary(
        project=gce.project, zone=disk.scope, resource=disk.name,
        zone_set_labels_request_resource=compute_v1.ZoneSetLabelsRequest(
            labels={**current.labels, **wanted}, label_fingerprint=current.label_fingerprint)))


def list_clusters(*, project: str | None = None, gce: Gce | None = None) -> list:
    gce = gce or connect(project)
    try:
        return plan.summarize(find_resources(gce))
    except Exception as error:
        raise GcpError(f"list the clusters in project {gce.project}: {describe_error(error)}") from None


def list_snapshots(*, project: str | None = None, gce: Gce | None = None) -> list[plan.Snapshot]:
    gce = gce or connect(project)
    try:
        return sorted(find_snapshots(gce), key=plan.snapshot_order)
    except Exception as error:
        raise GcpError(f"list the data snapshots: {describe_error(error)}") from None


def sweep(now: datetime | None = None, dry_run: bool = False, *, project: str | None = None,
          gce: Gce | None = None) -> list:
    """The clusters past their expiry; removed unless dry_run."""
    gce = gce or connect(project)
    try:
        expired = plan.expired_clusters(find_resources(gce), now or datetime.now(UTC))
    except Exception as error:
        raise GcpError(f"sweep: list the clusters in project {gce.project}: {describe_error(error)}") from None
    if not dry_run:
        for summary in expired:
            down(summary.name, gce=gce)
    return expired


def sweep_snapshots(now: datetime | None = None, dry_run: bool = False, *, project: str | None = None,
                    gce: Gce | None = None) -> list[plan.Snapshot]:
    """The data snapshots past their expiry; deleted unless dry_run (every one tried; the failures named)."""
    gce = gce or connect(project)
    try:
        expired = plan.expired_snapshots(find_snapshots(gce), now or datetime.now(UTC))
    except Exception as error:
        raise GcpError(f"sweep: list the data snapshots: {describe_error(error)}") from None
    failed = []
    for snapshot in [] if dry_run else expired:
        try:
            wait(gce, gce.snapshots.delete_unary(project=gce.project, snapshot=snapshot.id))
        except Exception as error:
            if not not_found(error):
                failed.append(f"{snapshot.id}: {describe_error(error)}")
    if failed:
        raise GcpError(f"sweep: could not delete {len(failed)} expired snapshot(s): {'; '.join(failed)}")
    return expired
