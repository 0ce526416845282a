"""Azure clusters with the azure-mgmt clients: create, find by tag, tear down. Decisions live in
bootstrap.providers.azure.plan.

Credentials come from azure-identity's DefaultAzureCredential (`az login`, a service principal's environment, a
managed identity); the subscription from --subscription or AZURE_SUBSCRIPTION_ID. kiln never writes credentials.
`KILN_AZURE_ENDPOINT` aims every client at another Resource Manager by the clients' own `base_url` option (the
tests' stand-in, testbed.arm, served over TLS on loopback: `KILN_AZURE_CA_FILE` is the certificate the clients
trust, and `KILN_AZURE_TOKEN` the bearer token it takes, for loopback endpoints only).

Every long-running call is waited on through the SDK's own poller, with a timeout; every other call has one too.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import secrets
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from dataclasses import replace as changed
from datetime import UTC, datetime
from typing import ClassVar
from urllib.parse import urlencode, urlparse

from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host
from bootstrap.providers import offerings as offered
from bootstrap.providers import provision
from bootstrap.providers.azure import plan
from bootstrap.providers.common import (
    SNAPSHOT_TTL_DAYS,
    SSH_WAIT_S,
    ClusterSummary,
    Rollback,
    Snapshot,
    configured,
    expired_snapshots,
    format_time,
    latest_snapshot_set,
    node_index,
    parse_time,
    poll_host_keys,
    restore_note,
    snapshot_order,
    validate_name,
    validate_snapshot_ttl,
)
from bootstrap.providers.failover import CloudError, Unavailable
from bootstrap.providers.provision import CloudRecord, Nodes, Progress, Swap, Verbs
from kiln.hostkeys import console_host_keys

ENDPOINT_ENV = "KILN_AZURE_ENDPOINT"
CA_FILE_ENV = "KILN_AZURE_CA_FILE"
TOKEN_ENV = "KILN_AZURE_TOKEN"
PRICES_ENV = "KILN_AZURE_PRICES"
PRICE_PAGES = 20  # pages of the Retail Prices API read at most per size (one holds a size's meters many times over)
[SUBSCRIPTION_ENV] = plan.ENV["subscription"]
OPERATION_TIMEOUT_S = 900
CALL_TIMEOUT_S = 60
HOST_KEYS_POLL_S = 5
PRINCIPAL_WAIT_S = 120  # how long a new identity may take to reach the directory (PrincipalNotFound until then)
PRINCIPAL_POLL_S = 5


class AzureError(CloudError):
    """A call to Azure failed; the message names the step."""


class StaticToken:
    """A bearer token given in the environment (KILN_AZURE_TOKEN), for a Resource Manager on loopback only."""

    def __init__(self, token: str):
        self.token = token

    def get_token(self, *scopes, **kwargs):
        from azure.core.credentials import AccessToken

        return AccessToken(self.token, int(time.time()) + 3600)

    def get_token_info(self, *scopes, options=None):
        from azure.core.credentials import AccessTokenInfo

        return AccessTokenInfo(self.token, int(time.time()) + 3600)


# the management clients kiln uses, by the name Azure gives them (each imported when first asked for)
CLIENTS = {"compute": ("azure.mgmt.compute", "ComputeManagementClient"),
           "network": ("azure.mgmt.network", "NetworkManagementClient"),
           "authorization": ("azure.mgmt.authorization", "AuthorizationManagementClient"),
           "resources": ("azure.mgmt.resource.resources", "ResourceManagementClient")}


@dataclass
class Azure:
    """The subscription kiln works in and the management clients it uses (made when first asked for)."""

    subscription: str
    credential: object
    endpoint: str | None = None
    ca_file: str | None = None
    owner: str = "unknown"
    _clients: dict = field(default_factory=dict)

    def _client(self, name: str):
        if name not in self._clients:
            module, class_name = CLIENTS[name]
            client = getattr(importlib.import_module(module), class_name)
            # between polls of a long-running operation where ARM gives no Retry-After (a stand-in on loopback
            # answers at once)
            interval = 0.05 if self.endpoint and loopback(self.endpoint) else 5
            options = {"connection_timeout": 10, "read_timeout": CALL_TIMEOUT_S, "polling_interval": interval}
            if self.ca_file:
                options["connection_verify"] = self.ca_file
            self._clients[name] = client(self.credential, self.subscription, base_url=self.endpoint, **options) \
                if self.endpoint else client(self.credential, self.subscription, **options)
        return self._clients[name]

    compute = property(lambda self: self._client("compute"))
    network = property(lambda self: self._client("network"))
    resources = property(lambda self: self._client("resources"))
    authorization = property(lambda self: self._client("authorization"))

    def id(self, group: str, kind: str, name: str) -> str:
        return plan.resource_id(self.subscription, group, kind, name)


def loopback(endpoint: str) -> bool:
    return urlparse(endpoint).hostname in ("127.0.0.1", "localhost", "::1")


def connect(subscription: str | None = None) -> Azure:
    """The clients for `subscription` (or AZURE_SUBSCRIPTION_ID), with DefaultAzureCredential; a Resource Manager
    on loopback (KILN_AZURE_ENDPOINT) takes the token in KILN_AZURE_TOKEN."""
    endpoint = os.environ.get(ENDPOINT_ENV) or None
    subscription = subscription or os.environ.get(SUBSCRIPTION_ENV)
    if not subscription:
        raise UsageError(f"no Azure subscription: give --subscription or set {SUBSCRIPTION_ENV}")
    if not plan.SUBSCRIPTION.fullmatch(subscription):
        raise UsageError(f"--subscription {subscription!r} is not a subscription id (a GUID)")
    if endpoint and urlparse(endpoint).scheme != "https":
        raise UsageError(f"{ENDPOINT_ENV}={endpoint}: Resource Manager is reached over https only")
    if endpoint and loopback(endpoint) and os.environ.get(TOKEN_ENV):
        credential = StaticToken(os.environ[TOKEN_ENV])
    else:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    who = os.environ.get("USER") or "unknown"
    return Azure(subscription, credential, endpoint, os.environ.get(CA_FILE_ENV) or None, owner=who)


def error_code(error: BaseException) -> str:
    """ARM's error code for a failed call (AllocationFailed, SkuNotAvailable, ...), where it gave one."""
    if isinstance(error, AzureError):
        return error.code
    return str(getattr(getattr(error, "error", None), "code", None) or "")


def describe_error(error: BaseException) -> str:
    """One line for a failed call: ARM's error code and message where it gave them."""
    inner = getattr(error, "error", None)
    code = getattr(inner, "code", None)
    message = getattr(inner, "message", None) or getattr(error, "message", None) or str(error) or \
        type(error).__name__
    text = " ".join(str(message).split())
    if "ClientAuthenticationError" in type(error).__name__ or "CredentialUnavailable" in type(error).__name__:
        text = "no Azure credentials (az login, or a service principal's AZURE_CLIENT_ID/SECRET/TENANT_ID): " + text
    return f"{code}: {text}" if code and not text.startswith(str(code)) else text


def done(poller, timeout_s: float = OPERATION_TIMEOUT_S):
    """A long-running operation's result, waited for at most timeout_s."""
    result = poller.result(timeout=timeout_s)
    if not poller.done():
        raise AzureError(f"an operation did not finish within {timeout_s:g}s")
    return result


def settle(pollers, timeout_s: float = OPERATION_TIMEOUT_S) -> None:
    """Wait for operations already started (their outcome does not matter here) before undoing what they make:
    Resource Manager refuses to delete a group while a resource in it is still being made."""
    for poller in pollers:
        try:
            poller.result(timeout=timeout_s)
        except Exception:  # a failed operation made nothing; deleting the group removes what did get made
            pass


def tags_of(resource) -> dict[str, str]:
    return dict(getattr(resource, "tags", None) or {})


def find_image(azure: Azure, request: plan.Request) -> str:
    """The image's id: --image-id as given (checked), else the newest managed image tagged with the profile and
    the tags asked for, in the subscription."""
    if request.image_id:
        parts = request.image_id.split("/")
        try:
            if "/galleries/" in request.image_id.lower():
                if parts[-1].lower() != "latest":
                    azure.compute.gallery_image_versions.get(parts[4], parts[8], parts[10], parts[12])
            else:
                azure.compute.images.get(parts[4], parts[8])
        except Exception as error:
            raise AzureError(f"--image-id {request.image_id}: {describe_error(error)}") from None
        return request.image_id
    try:
        found = [image for image in azure.compute.images.list()
                 if plan.image_matches(tags_of(image), request.image_profile, request.image_tags)
                 and image.location == request.location]
    except Exception as error:
        raise AzureError(f"look for kiln's images: {describe_error(error)}") from None
    if not found:
        wanted = ", ".join(f"{k}={v}" for k, v in ((plan.TAG_PROFILE, request.image_profile), *request.image_tags))
        # a place without the image: the next candidate's turn, nothing made (a managed image is in one location)
        raise Unavailable(f"no image in {request.location} tagged {wanted} (make image PROVIDER=azure bakes one; "
                          "or give --image-id)", code="NoImageHere")
    return max(found, key=lambda image: (tags_of(image).get("kiln:built", ""), image.name)).id


def find_size(azure: Azure, request: plan.Request) -> plan.SizeFacts:
    """The asked-for VM size as the location offers it to this subscription (plan.check_size says no first)."""
    try:
        documents = [sku.as_dict() for sku in azure.compute.resource_skus.list(
            filter=f"location eq '{request.location}'")]
    except Exception as error:
        raise AzureError(f"cluster.up {request.name}: could not look up the VM sizes of {request.location}: "
                         f"{describe_error(error)}; nothing was created") from None
    return plan.check_size(request, plan.size_facts(documents, request.location))


@dataclass(frozen=True)
class Resource:
    """One kiln-tagged resource group (a cluster) or snapshot in the subscription."""

    kind: str
    name: str
    group: str
    tags: dict
    state: str = ""

    @property
    def cluster(self) -> str:
        return self.tags.get(plan.TAG_CLUSTER, "")


def cluster_groups(azure: Azure, name: str | None = None) -> list[Resource]:
    """The resource groups kiln made for clusters (of `name`, if given), found by tag."""
    query = f"tagName eq '{plan.TAG_CLUSTER}'" + (f" and tagValue eq '{name}'" if name else "")
    return [Resource("resource-group", g.name, g.name, tags_of(g), getattr(g.properties, "provisioning_state", ""))
            for g in azure.resources.resource_groups.list(filter=query)]


def snapshot_records(azure: Azure, name: str | None = None) -> list:
    """Every kiln-tagged snapshot of a data disk (of cluster `name`, if given), as records the common snapshot
    choice reads (id, index, taken_at, state)."""
    found = []
    for snap in azure.compute.snapshots.list():
        tags = tags_of(snap)
        if plan.TAG_DATA not in tags or (name is not None and tags.get(plan.TAG_CLUSTER) != name):
            continue
        index = tags.get(plan.TAG_DATA, "")
        found.append(Snapshot(snap.id, tags.get(plan.TAG_CLUSTER, ""), node_index(index),
                              tags.get(plan.TAG_SNAPSHOT_SET, ""), int(snap.properties.disk_size_gb or 0),
                              snap.properties.provisioning_state or "", tags,
                              parse_time(tags.get(plan.TAG_EXPIRES, "")), name=snap.name, location=snap.location))
    return found


def delete_group(azure: Azure, group: str, timeout_s: float = OPERATION_TIMEOUT_S) -> bool:
    """Delete a resource group and everything in it (the role assignments of its VMs first); False where it was not
    there."""
    try:
        if not azure.resources.resource_groups.check_existence(group):
            return False
        forget_roles(azure, group)
        done(azure.resources.resource_groups.begin_delete(group), timeout_s)
        return True
    except Exception as error:
        if getattr(error, "status_code", None) == 404:
            return False
        raise


def serial_host_keys(azure: Azure, group: str, vm: str) -> list[str]:
    """The host keys cloud-init printed to the VM's serial log (boot diagnostics: a SAS URL to the log); none yet
    where the log is not there yet (a VM still booting)."""
    data = azure.compute.virtual_machines.retrieve_boot_diagnostics_data(group, vm,
                                                                        sas_uri_expiration_time_in_minutes=5)
    uri = data.serial_console_log_blob_uri
    if not uri:
        return []
    context = ssl.create_default_context(cafile=azure.ca_file) if azure.ca_file else ssl.create_default_context()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(
        context=context))
    try:
        with opener.open(uri, timeout=CALL_TIMEOUT_S) as response:
            return console_host_keys(response.read().decode(errors="replace"))
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return []
        raise AzureError(f"the serial log of {vm}: HTTP {error.code}") from None


def spot_prices(sizes: Sequence[str], location: str | None, *, endpoint: str | None = None,
                ca_file: str | None = None) -> dict[str, float]:
    """Each size's Spot price per hour now in `location` (retail_prices); a size without a Linux Spot meter there
    is left out."""
    return plan.lowest_prices(retail_prices(sizes, priced_place(location), endpoint=endpoint, ca_file=ca_file),
                              spot=True)


def on_demand_prices(sizes: Sequence[str], location: str | None, *, endpoint: str | None = None,
                     ca_file: str | None = None) -> dict[str, float]:
    """Each size's pay-as-you-go price per hour in `location` (retail_prices); a size without a Linux
    pay-as-you-go meter there is left out."""
    return plan.lowest_prices(retail_prices(sizes, priced_place(location), endpoint=endpoint, ca_file=ca_file),
                              spot=False)


def priced_place(location: str | None) -> str:
    if not location:
        raise UsageError(f"no location to price: give --location or set {plan.ENV['location'][0]}")
    return location


def retail_prices(sizes: Sequence[str], location: str | None, *, endpoint: str | None = None,
                  ca_file: str | None = None) -> list[dict]:
    """The meters of each size in `location` (None: in every location), from Azure's Retail Prices API (no
    sign-in; every page of the answer). `KILN_AZURE_PRICES` aims it elsewhere (the tests' stand-in, with
    KILN_AZURE_CA_FILE)."""
    base = (endpoint or os.environ.get(PRICES_ENV) or plan.RETAIL_PRICES).rstrip("/")
    ca_file = ca_file or (os.environ.get(CA_FILE_ENV) if loopback(base) else None)
    context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    handlers = [urllib.request.HTTPSHandler(context=context)]
    opener = urllib.request.build_opener(*([urllib.request.ProxyHandler({})] if loopback(base) else []), *handlers)
    items: list[dict] = []
    where = f" in {location}" if location else ""
    for size in sizes:
        url: str | None = f"{base}/api/retail/prices?" + urlencode(
            {"api-version": plan.RETAIL_PRICES_API, "$filter": plan.price_filter(location, size)})
        for _ in range(PRICE_PAGES):
            if not url:
                break
            try:
                with opener.open(url, timeout=CALL_TIMEOUT_S) as response:
                    page = json.loads(response.read())
            except urllib.error.HTTPError as error:
                raise AzureError(f"Azure's retail prices of {size}{where}: HTTP {error.code}") from None
            except (OSError, ValueError) as error:
                raise AzureError(f"Azure's retail prices of {size}{where}: {error}") from None
            items += page.get("Items") or []
            url = page.get("NextPageLink")
    return items


def host_keys(azure: Azure, group: str, names: Sequence[str], timeout_s: float,
              poll_s: float = HOST_KEYS_POLL_S) -> dict[str, list[str]]:
    """Each VM's host keys from its serial log (common.poll_host_keys)."""
    return poll_host_keys(lambda name: serial_host_keys(azure, group, name), names, timeout_s, poll_s)


@dataclass(frozen=True)
class Record(CloudRecord):
    """What kiln keeps of an Azure cluster it made (azure.json): enough to replace a node as it was made. The VMs,
    their order and their host keys are the cluster file's (state.ClusterRecord), written once there."""

    subscription: str
    group: str
    image: str
    tags: dict
    request: dict
    data_disks: tuple[str, ...] = ()
    subnet_id: str = ""
    placement_id: str = ""
    autostop: bool = False  # the VMs may deallocate themselves (a replacement gets the same)
    accelerated_networking: bool = True  # the size has it: the interfaces are made with it
    scale_set_id: str = ""  # an RDMA size's: every VM, a replacement too, joins it (one InfiniBand fabric)

    kind: ClassVar[str] = "azure"
    volumes_field: ClassVar[str] = "data_disks"

    def planned(self) -> plan.Request:
        return plan.Request(**{**self.request, "image_tags": tuple(tuple(p) for p in self.request["image_tags"])})


def make_node(azure: Azure, request: plan.Request, *, group: str, index: int, name: str, image: str,
              public_key: str, tags: dict, subnet_id: str, placement_id: str, data_disk: str | None,
              timeout_s: float, identity: bool = False, accelerated: bool = True, scale_set_id: str = ""):
    """Start making one node (its address, interface and VM, in the scale set if the cluster has one): the VM's
    poller."""
    address = done(azure.network.public_ip_addresses.begin_create_or_update(
        group, f"{name}-ip", plan.public_address_body(request, tags)), timeout_s)
    interface = done(azure.network.network_interfaces.begin_create_or_update(
        group, f"{name}-nic", plan.interface_body(request, tags, subnet_id=subnet_id, address_id=address.id,
                                                  accelerated=accelerated)),
        timeout_s)
    body = plan.vm_body(request, index=index, image_id=image, public_key=public_key, tags=tags,
                        interface_id=interface.id, placement_id=placement_id,
                        data_disk_id=azure.id(group, "Microsoft.Compute/disks", data_disk) if data_disk else None,
                        identity=identity, scale_set_id=scale_set_id or None)
    body["properties"]["osProfile"]["computerName"] = name
    return azure.compute.virtual_machines.begin_create_or_update(group, name, body)


def address_of(azure: Azure, group: str, name: str) -> str:
    return azure.network.public_ip_addresses.get(group, f"{name}-ip").ip_address


def suffix() -> str:
    return secrets.token_hex(2)


def up(request: plan.Request, *, subscription: str | None = None, python: str = "python3", azure: Azure | None = None,
       now: datetime | None = None, ssh_wait_s: float = SSH_WAIT_S,
       timeout_s: float = OPERATION_TIMEOUT_S, say: Callable[[str], None] | None = None) -> provision.Up:
    """Create the cluster in its own resource group, wait until SSH answers on every VM (unless ssh_wait_s is 0),
    pin the host keys their serial logs show, write its cluster file, and return what was made. On any failure
    (Ctrl-C too), delete the resource group: nothing of the cluster lives outside it."""
    azure = azure or connect(subscription)
    group = plan.group_name(request.name)
    image = find_image(azure, request)
    size = find_size(azure, request)
    try:
        taken = cluster_groups(azure, request.name) or azure.resources.resource_groups.check_existence(group)
    except Exception as error:
        raise AzureError(f"cluster.up {request.name}: could not look for its resource group: "
                         f"{describe_error(error)}; nothing was created") from None
    if taken:
        raise UsageError(f"cluster name {request.name!r} is taken: resource group {group} exists in subscription "
                         f"{azure.subscription} (kiln down {request.name} --provider azure)")
    try:
        restored = latest_snapshot_set([s for s in snapshot_records(azure, request.name)
                                        if s.location == request.location], "Succeeded") if request.volume_gb else {}
    except Exception as error:
        raise AzureError(f"cluster.up {request.name}: could not look for snapshots of its data disks: "
                         f"{describe_error(error)}; nothing was created") from None
    note = restore_note(request.name, request.count, restored) if request.volume_gb else None
    tags = plan.cluster_tags(request.name, azure.owner, now or datetime.now(UTC), request.ttl_hours)
    pollers: list = []  # every long-running operation this call started: waited for before anything is undone
    disks: list[str] = []
    made: dict = {}  # what make() learns that the record needs

    def start(poller):
        pollers.append(poller)
        return poller

    def make(progress: Progress, rollback: Rollback, public_key: str) -> Nodes:
        progress.step = "create the resource group"
        # registered before the call: a Ctrl-C while it is under way (no answer yet) leaves a group that may be
        # ours; one Resource Manager answered anything but 201 (200: there already; 409: there in another
        # location) is another `up`'s of this name, not ours to undo
        answered: list[int] = []
        rollback.push(f"delete the resource group {group}",
                      lambda: answered[:1] in ([], [201]) and delete_group(azure, group, timeout_s))
        try:
            status = azure.resources.resource_groups.create_or_update(
                group, {"location": request.location, "tags": tags},
                cls=lambda response, *_: response.http_response.status_code)
        except Exception as error:
            if getattr(error, "status_code", None):  # refused: it made nothing (no answer at all: it may have)
                answered.append(error.status_code)
            raise
        answered.append(status)
        if status != 201:
            raise UsageError(f"cluster name {request.name!r} is taken: resource group {group} was made meanwhile")

        progress.step = "create the network security group"
        nsg = done(azure.network.network_security_groups.begin_create_or_update(
            group, f"{group}-nsg", plan.security_group_body(request, tags)), timeout_s)

        progress.step = "create the virtual network"
        network = done(azure.network.virtual_networks.begin_create_or_update(
            group, f"{group}-vnet", plan.network_body(request, tags, nsg.id)), timeout_s)
        made["subnet_id"] = network.subnets[0].id

        progress.step = "create the proximity placement group"
        made["placement_id"] = azure.compute.proximity_placement_groups.create_or_update(
            group, f"{group}-ppg", plan.placement_group_body(request, tags)).id

        made["scale_set_id"] = ""
        if size.rdma:  # its VMs reach each other over InfiniBand only within one scale set
            progress.step = "create the scale set"
            made["scale_set_id"] = done(start(azure.compute.virtual_machine_scale_sets.begin_create_or_update(
                group, plan.scale_set_name(request.name),
                plan.scale_set_body(request, tags, made["placement_id"]))), timeout_s).id

        if request.volume_gb:
            progress.step = "create the data disks"
            started = []
            for index in range(request.count):
                snapshot = restored.get(index)
                started.append(start(azure.compute.disks.begin_create_or_update(
                    group, plan.disk_name(request.name, index), plan.disk_body(
                        request, index=index, tags=tags, snapshot_id=snapshot.id if snapshot else None,
                        snapshot_gb=snapshot.gigabytes if snapshot else 0))))
                disks.append(plan.disk_name(request.name, index))
            for poller in started:
                done(poller, timeout_s)

        progress.step = "create the VMs"
        names = tuple(plan.vm_name(request.name, index) for index in range(request.count))
        vms = [start(make_node(azure, request, group=group, index=index, name=name, image=image,
                               public_key=public_key, tags=tags, subnet_id=made["subnet_id"],
                               placement_id=made["placement_id"], data_disk=disks[index] if disks else None,
                               timeout_s=timeout_s, accelerated=size.accelerated_networking,
                               identity=bool(request.idle_minutes), scale_set_id=made["scale_set_id"]))
               for index, name in enumerate(names)]
        for poller in vms:
            done(poller, timeout_s)
        return Nodes(names, tuple(Host(address_of(azure, group, name), user=request.user) for name in names))

    def save(nodes: Nodes) -> None:
        Record(azure.subscription, group, image, tags, asdict(request), tuple(disks), made["subnet_id"],
               made["placement_id"], accelerated_networking=size.accelerated_networking,
               scale_set_id=made["scale_set_id"]).save(request.name)

    cluster = provision.up(request.name, Verbs(
        "azure", AzureError, make, lambda names, timeout_s: host_keys(azure, group, names, timeout_s), save,
        describe_error, error_code, keys_step="read the host keys from the serial logs",
        settle=lambda: settle(pollers, timeout_s),
        place={"subscription": azure.subscription, "location": request.location}),
        region=request.location, user=request.user, node_type=request.vm_size, python=python,
        ssh_wait_s=ssh_wait_s, say=say)
    return cluster.made(request.name, where=f"resource group {group} ({request.location})",
                        image=image, expires=tags[plan.TAG_EXPIRES], ssh_wait=ssh_wait_s,
                        volumes=disks, restore_note=note)


def replace(name: str, address: str, *, subscription: str | None = None, azure: Azure | None = None,
            ssh_wait_s: float = SSH_WAIT_S, timeout_s: float = OPERATION_TIMEOUT_S) -> tuple[Host, list[str]]:
    """Put a new VM, made as `up` made the cluster's (image, size, Spot, network, tags, placement), in place of the
    one at `address`, and delete the old one (its address and interface go with it); its data disk moves to the
    new VM; update the cluster's files. (the new host, the host keys its serial log shows)

    The new VM must run, answer SSH and show its host keys; otherwise it is deleted and the cluster is left as it
    was."""
    record, kept = Record.of_cluster(name)
    _, index = provision.node_at(record, address)
    azure = azure or connect(subscription or kept.subscription)
    return provision.replace(record, address, kept.data_disks, swap(azure, name, kept, index, timeout_s),
                             ssh_wait_s=ssh_wait_s)


def grow(name: str, count: int, *, subscription: str | None = None, azure: Azure | None = None,
         ssh_wait_s: float = SSH_WAIT_S, timeout_s: float = OPERATION_TIMEOUT_S) -> list[tuple[str, Host, list[str]]]:
    """Add `count` VMs to the cluster, each made as `up` made the cluster's (provision.grow: all of them, or
    none)."""
    record, kept = Record.of_cluster(name)
    azure = azure or connect(subscription or kept.subscription)
    return provision.grow(record, count, lambda index: swap(azure, name, kept, index, timeout_s),
                          volumes=kept.data_disks, ssh_wait_s=ssh_wait_s)


def shrink(name: str, addresses: Sequence[str], *, subscription: str | None = None, azure: Azure | None = None,
           timeout_s: float = OPERATION_TIMEOUT_S) -> list[str]:
    """Delete the cluster's VMs at `addresses` (their interfaces and addresses with them); the names removed."""
    record, kept = Record.of_cluster(name)
    azure = azure or connect(subscription or kept.subscription)
    return provision.shrink_by(record, addresses, swap(azure, name, kept, 0, timeout_s), volumes=kept.data_disks)


def swap(azure: Azure, name: str, kept: Record, index: int, timeout_s: float) -> Swap:
    """How the cluster's VMs are made and removed one at a time (a replacement, a node added or removed): a new
    one as `up` made node `index`, under a name of its own."""
    public_key = provision.cluster_public_key(name)
    request = kept.planned()
    new_name = plan.vm_name(name, index, suffix())

    def make(making: Progress) -> tuple[str, Host]:
        making.made = new_name
        made = done(make_node(azure, request, group=kept.group, index=index, name=new_name, image=kept.image,
                              public_key=public_key, tags=kept.tags, subnet_id=kept.subnet_id,
                              placement_id=kept.placement_id, data_disk=None, timeout_s=timeout_s,
                              identity=kept.autostop, accelerated=kept.accelerated_networking,
                              scale_set_id=kept.scale_set_id), timeout_s)
        if kept.autostop:
            making.step = "let it deallocate itself (autostop)"
            allow_self_deallocation(azure, made)
        return new_name, Host(address_of(azure, kept.group, new_name), user=request.user)

    def attach(vm_name: str, disk: str) -> None:
        vm = azure.compute.virtual_machines.get(kept.group, vm_name)
        body = vm.as_dict(exclude_readonly=True)
        body["properties"]["storageProfile"]["dataDisks"] = [{
            "lun": plan.DATA_LUN, "createOption": "Attach", "deleteOption": "Detach",
            "managedDisk": {"id": azure.id(kept.group, "Microsoft.Compute/disks", disk)}}]
        done(azure.compute.virtual_machines.begin_create_or_update(kept.group, vm_name, body), timeout_s)

    return Swap(AzureError, describe_error, make, lambda names, wait_s: host_keys(azure, kept.group, names, wait_s),
                lambda vm_name, _: delete_node(azure, kept.group, vm_name, timeout_s), attach,
                first_step="create the VM", keys_step="read its host keys from the serial log",
                keys_where="its serial log", node_word="VM", finds_old="removes its resource group",
                volume_kept="in the cluster's resource group", error_code=error_code)


def arm_autostop(name: str, *, subscription: str | None = None, azure: Azure | None = None,
                 timeout_s: float = OPERATION_TIMEOUT_S, principal_wait_s: float = PRINCIPAL_WAIT_S,
                 principal_poll_s: float = PRINCIPAL_POLL_S) -> list[str]:
    """Let each VM of the cluster deallocate itself when its idle agent says so: a system-assigned identity on
    the VM (`up --idle-minutes` made it with one), and the power role (plan.POWER_ROLE) for it on that VM alone.
    Asking again changes nothing. The VMs' ids."""
    record, kept = Record.of_cluster(name)
    azure = azure or connect(subscription or kept.subscription)
    armed = []
    for vm in (i.id for i in record.instances):
        try:
            machine = azure.compute.virtual_machines.get(kept.group, vm)
            kind = getattr(machine.identity, "type", None)
            if not plan.has_system_identity(kind):
                body = machine.as_dict(exclude_readonly=True)
                body["identity"] = {**(body.get("identity") or {}), "type": ", ".join(
                    ["SystemAssigned", *([kind] if kind and kind != "None" else [])])}
                machine = done(azure.compute.virtual_machines.begin_create_or_update(kept.group, vm, body), timeout_s)
            allow_self_deallocation(azure, machine, principal_wait_s, principal_poll_s)
        except Exception as error:
            hint = " (giving a role needs Owner or User Access Administrator on the cluster's resource group)" \
                if "roleAssignments/write" in describe_error(error) else ""
            raise AzureError(f"cluster {name}: autostop: could not let {vm} deallocate itself: "
                             f"{describe_error(error)}{hint}") from None
        armed.append(machine.id)
    changed(kept, autostop=True).save(name)
    return armed


def places(every: bool = False, *, subscription: str | None = None) -> list[str | None]:
    """The subscription `list` and `sweep` look in besides the clusters' files (it holds every location's groups):
    the one given or configured (None: the credentials' own)."""
    return [configured(subscription, plan.ENV["subscription"])]


def default_place(*, subscription: str | None = None) -> str | None:
    """The location an up that names none goes to (AZURE_LOCATION), or None."""
    return configured(None, plan.ENV["location"])


def account(*, subscription: str | None = None) -> str:
    """Which subscription kiln works in (given, or AZURE_SUBSCRIPTION_ID; no call)."""
    return connect(subscription).subscription


def place_names(*, subscription: str | None = None, near: str | None = None,
                azure: Azure | None = None) -> Sequence[str]:
    """Every location where Resource SKUs list a VM size for the subscription; where `near` is one, just it (asked
    with a filter on it: the whole list, every location's sizes, is large)."""
    azure = azure or connect(subscription)
    try:
        if near and plan.LOCATION.fullmatch(near) and any(
                sku.resource_type == "virtualMachines"
                for sku in azure.compute.resource_skus.list(filter=f"location eq '{near}'")):
            return [near.lower()]
        return sorted({place.lower() for sku in azure.compute.resource_skus.list()
                       if sku.resource_type == "virtualMachines" for place in sku.locations or ()})
    except Exception as error:
        raise AzureError(f"could not list the locations: {describe_error(error)}") from None


def offerings(instance_types: Sequence[str], *, subscription: str | None = None, azure: Azure | None = None,
              now: datetime | None = None) -> offered.Record:
    """Where the sizes are offered to the subscription: every location (and its zones) of each, and the locations
    where it is not open to this subscription, with ARM's reason (Resource SKUs, every location at once)."""
    azure = azure or connect(subscription)
    try:
        documents = [sku.as_dict() for sku in azure.compute.resource_skus.list()]
    except Exception as error:
        raise AzureError(f"could not read the VM sizes of the subscription's locations: {describe_error(error)}") \
            from None
    found, unread, priced_from = offered.azure_offerings(documents, instance_types), (), ""
    try:
        table = plan.lowest_prices_by_place(retail_prices(instance_types, None), spot=False)
        found, priced_from = offered.priced(found, table), "Azure's Retail Prices, pay-as-you-go"
    except KilnError as error:
        unread = (f"the prices ({error})",)
    return offered.Record("azure", azure.subscription, (now or datetime.now(UTC)).isoformat(timespec="seconds"),
                          "ARM's Resource SKUs", tuple(instance_types), tuple(found), unread, priced_from)


def allow_self_deallocation(azure: Azure, machine, wait_s: float = PRINCIPAL_WAIT_S,
                            poll_s: float = PRINCIPAL_POLL_S) -> None:
    """Give the VM's own identity the right to deallocate that VM (an assignment already there is fine). A new
    identity reaches the directory a little after the VM has it: PrincipalNotFound is asked again, for wait_s."""
    from azure.core.exceptions import HttpResponseError

    assignment, body = plan.self_deallocation(azure.subscription, machine.id, machine.identity.principal_id)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            azure.authorization.role_assignments.create(machine.id, assignment, body)
            return
        except HttpResponseError as error:
            code = getattr(error.error, "code", None)
            if code == "RoleAssignmentExists":
                return
            if code != "PrincipalNotFound" or time.monotonic() + poll_s > deadline:
                raise
        time.sleep(poll_s)


def forget_role(azure: Azure, machine) -> None:
    """Delete the VM's autostop role assignment, which would outlive it (granting nothing, but counted against
    the subscription's limit). Best effort: one left behind is harmless."""
    principal = getattr(machine.identity, "principal_id", None)
    if principal:
        with contextlib.suppress(Exception):
            azure.authorization.role_assignments.delete(machine.id, plan.assignment_name(machine.id, principal))


def forget_roles(azure: Azure, group: str) -> None:
    """forget_role for every VM of the group."""
    with contextlib.suppress(Exception):
        for machine in list(azure.compute.virtual_machines.list(group)):
            forget_role(azure, machine)


def delete_node(azure: Azure, group: str, vm: str, timeout_s: float) -> None:
    """Delete a VM (its role assignment, OS disk, interface and, after it, its public address); one already gone
    is fine."""
    with contextlib.suppress(Exception):
        forget_role(azure, azure.compute.virtual_machines.get(group, vm))
    for delete, target in ((azure.compute.virtual_machines.begin_delete, vm),
                           (azure.network.network_interfaces.begin_delete, f"{vm}-nic"),
                           (azure.network.public_ip_addresses.begin_delete, f"{vm}-ip")):
        try:
            done(delete(group, target), timeout_s)
        except Exception as error:
            if getattr(error, "status_code", None) != 404:
                raise


def down(name: str, *, subscription: str | None = None, azure: Azure | None = None,
         timeout_s: float = OPERATION_TIMEOUT_S) -> list[str]:
    """Delete the cluster's resource group (everything in it; its snapshots, elsewhere, stay); an empty list when
    there was nothing."""
    validate_name(name)
    kept = Record.load(name)
    azure = azure or connect(subscription or (kept.subscription if kept else None))
    group = plan.group_name(name)
    try:
        removed = [f"resource-group {group}"] if delete_group(azure, group, timeout_s) else []
    except Exception as error:
        raise AzureError(f"cluster.down {name}: {describe_error(error)}") from None
    provision.forget_local(name, "azure", found=bool(removed),
                           looked=f"subscription {azure.subscription} (resource group {group})")
    return removed


def down_with_snapshots(name: str, *, ttl_days: float = SNAPSHOT_TTL_DAYS, subscription: str | None = None,
                        azure: Azure | None = None, now: datetime | None = None,
                        timeout_s: float = OPERATION_TIMEOUT_S) -> provision.Teardown:
    """Delete the VMs (their shutdown unmounts the data disks), snapshot each data disk into kiln_snapshots_LOCATION,
    then delete the resource group. A disk whose snapshot fails keeps the group (named, with the set it missed),
    so a retry completes the set."""
    validate_name(name)
    ttl_days = validate_snapshot_ttl(ttl_days)
    kept_record = Record.load(name)
    azure = azure or connect(subscription or (kept_record.subscription if kept_record else None))
    group = plan.group_name(name)
    moment = now or datetime.now(UTC)
    snapshots: list[Snapshot] = []
    kept: list[tuple[str, str, str]] = []
    try:
        if not azure.resources.resource_groups.check_existence(group):
            provision.forget_local(name, "azure", found=False,
                                   looked=f"subscription {azure.subscription} (resource group {group})")
            return provision.Teardown([], [], [])
        for vm in azure.compute.virtual_machines.list(group):
            delete_node(azure, group, vm.name, timeout_s)
        data = sorted((d for d in azure.compute.disks.list_by_resource_group(group) if plan.TAG_DATA in tags_of(d)),
                      key=lambda d: (tags_of(d)[plan.TAG_DATA], d.name))
        if data:
            snapshot_group = plan.snapshot_group(data[0].location)
            azure.resources.resource_groups.create_or_update(snapshot_group, {
                "location": data[0].location, "tags": {"kiln:purpose": "data snapshots"}})
        # one set for every disk: the one a failed `down --snapshot` began (a retry completes it), else now's
        taken = next((tags_of(d)[plan.TAG_SNAPSHOT_SET] for d in data if plan.TAG_SNAPSHOT_SET in tags_of(d)),
                     format_time(moment))
        have = {s.name: s for s in snapshot_records(azure, name) if s.state == "Succeeded"}
        for disk in data:
            body = plan.snapshot_body(disk.id, disk.location, {**tags_of(disk), plan.TAG_SNAPSHOT_SET: taken},
                                      moment, ttl_days)
            snap_name = plan.snapshot_name(disk.name, taken)
            if snap_name in have:  # taken by the try that failed for another disk
                snapshots.append(have[snap_name])
                continue
            try:
                done(azure.compute.snapshots.begin_create_or_update(snapshot_group, snap_name, body), timeout_s)
                snapshots += [s for s in snapshot_records(azure, name) if s.name == snap_name]
            except Exception as error:
                kept.append((disk.name, tags_of(disk)[plan.TAG_DATA], describe_error(error)))
                mark_missed_set(azure, group, disk, body["tags"], timeout_s)
        removed = []
        if kept:  # the group stays for the disks kept: it expires with their snapshots, so sweep keeps it
            keep_group_until(azure, group, body["tags"][plan.TAG_EXPIRES])
        else:
            removed = [f"resource-group {group}"] if delete_group(azure, group, timeout_s) else []
    except Exception as error:
        raise AzureError(f"cluster.down {name}: {describe_error(error)}"
                         + (f" (snapshots made: {', '.join(s.name for s in snapshots)})" if snapshots else "")) \
            from None
    if not kept:
        provision.forget_local(name, "azure", found=bool(removed),
                               looked=f"subscription {azure.subscription} (resource group {group})")
    return provision.Teardown(removed, snapshots, kept)


def keep_group_until(azure: Azure, group: str, expires: str) -> None:
    current = azure.resources.resource_groups.get(group)
    azure.resources.resource_groups.create_or_update(group, {"location": current.location, "tags": {
        **tags_of(current), plan.TAG_EXPIRES: expires}})


def mark_missed_set(azure: Azure, group: str, disk, snapshot_tags: dict, timeout_s: float) -> None:
    """Tag a kept disk with the snapshot set it missed (a retry completes that set) and the snapshot's expiry."""
    body = disk.as_dict(exclude_readonly=True)
    body["tags"] = {**tags_of(disk), plan.TAG_SNAPSHOT_SET: snapshot_tags[plan.TAG_SNAPSHOT_SET],
                    plan.TAG_EXPIRES: snapshot_tags[plan.TAG_EXPIRES]}
    done(azure.compute.disks.begin_create_or_update(group, disk.name, body), timeout_s)


def list_clusters(*, subscription: str | None = None, azure: Azure | None = None) -> list[ClusterSummary]:
    azure = azure or connect(subscription)
    try:
        groups = cluster_groups(azure)
        summaries = []
        for group in groups:
            vms = tuple(sorted(f"{vm.name} ({vm.hardware_profile.vm_size if vm.hardware_profile else '?'})"
                               for vm in azure.compute.virtual_machines.list(group.name)))
            summaries.append(ClusterSummary(group.cluster, group.tags.get(plan.TAG_OWNER, ""),
                                            parse_time(group.tags.get(plan.TAG_EXPIRES, "")), vms, 1,
                                            f"resource group {group.name}"))
        return sorted(summaries, key=lambda s: s.name)
    except Exception as error:
        raise AzureError(f"list the clusters in subscription {azure.subscription}: {describe_error(error)}") \
            from None


def list_snapshots(*, subscription: str | None = None, azure: Azure | None = None) -> list[Snapshot]:
    azure = azure or connect(subscription)
    try:
        return sorted(snapshot_records(azure), key=snapshot_order)
    except Exception as error:
        raise AzureError(f"list the data snapshots: {describe_error(error)}") from None


def sweep(now: datetime | None = None, dry_run: bool = False, *, subscription: str | None = None,
          azure: Azure | None = None) -> list[ClusterSummary]:
    azure = azure or connect(subscription)
    expired = [s for s in list_clusters(azure=azure) if s.expired(now or datetime.now(UTC))]
    if not dry_run:
        for summary in expired:
            down(summary.name, azure=azure)
    return expired


def sweep_snapshots(now: datetime | None = None, dry_run: bool = False, *, subscription: str | None = None,
                    azure: Azure | None = None) -> list[Snapshot]:
    azure = azure or connect(subscription)
    expired = expired_snapshots(list_snapshots(azure=azure), now or datetime.now(UTC))
    failed = []
    for snapshot in [] if dry_run else expired:
        try:
            done(azure.compute.snapshots.begin_delete(snapshot.id.split("/")[4], snapshot.name))
        except Exception as error:
            if getattr(error, "status_code", None) != 404:
                failed.append(f"{snapshot.name}: {describe_error(error)}")
    if failed:
        raise AzureError(f"sweep: could not delete {len(failed)} expired snapshot(s): {'; '.join(failed)}")
    return expired
