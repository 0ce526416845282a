"""A stand-in for the part of Azure Resource Manager kiln uses, served over HTTPS on loopback.

No emulator of Azure compute exists (Azurite is storage only). The official SDK clients are pointed here by their own
options and nothing is patched:

    with Arm() as arm:                                  # https://127.0.0.1:PORT, a throwaway CA: arm.ca_file
        arm.add_image("images", "kiln-gpu-1")
        compute = arm.client("compute")
        # == ComputeManagementClient(arm.credential(), arm.subscription, base_url=arm.endpoint,
        #                            connection_verify=arm.ca_file, polling_interval=...)

It serves one subscription in a few locations: resource groups (create, get, check existence, list with a tag
filter, delete with everything in them); Microsoft.Network virtual networks and their subnets, network security
groups, public IP addresses (Standard, static, from 203.0.113.0/24) and network interfaces; Microsoft.Compute virtual
machines (create or update, get with the instance view, list, delete, power off, deallocate, start, boot diagnostics;
sizes offered per location, listed by Resource SKUs, `restrict_size` closing one to the subscription),
disks, snapshots, proximity placement groups, managed images and gallery image versions (read; `add_image`,
`add_gallery_image` make them); VMs' system-assigned identities and role assignments at any scope, checked on every
call as RBAC checks them (testbed/arm_access.py; `identity_token(vm_id)` is what the VM's metadata service hands
out, `denied(action)` refuses the operator an action); the operation status and result URLs the pollers follow;
and the boot diagnostics blobs behind the SAS URLs it hands out.

How it holds to the real API:
- URLs, verbs, the api-version of each operation and the status codes each accepts are those of the SDKs' own
  operations code (azure-mgmt-compute 39.0.0, azure-mgmt-network 33.1.0, azure-mgmt-resource 26.0.0). A request
  with no api-version, or another one, is refused with 400 as ARM refuses it; a verb or path the stand-in does not
  serve answers 501 with an ARM error body, never an empty success.
- Every request needs `Authorization: Bearer <token>` with the token `credential()` gives (401 otherwise; ARM's
  error codes); the blob URLs are SAS URLs and need no token, only their signature.
- Request bodies are checked against the SDK's own model classes (their fields and JSON types, read from the DPG
  models' `_attr_to_rest_field` and type hints): an unknown member or a wrong type is 400 InvalidRequestContent, as
  ARM's deserializer answers. Read-only members in a request are ignored, as ARM does.
- Errors are ARM's `{"error": {"code", "message", "target"?}}` with ARM's status codes, so azure-core raises
  ResourceNotFoundError, ResourceExistsError, ClientAuthenticationError or HttpResponseError with `.error.code`.
- Long-running operations answer as the providers do: PUT 201 (create) or 200 (update) with the body
  (provisioningState Creating or Updating) and `Azure-AsyncOperation` (disks and snapshots: 202, as DiskRP);
  DELETE and POST actions 202 with `Azure-AsyncOperation` and `Location`; resource group delete 202 with
  `Location` only. The status URL answers `{"status": "InProgress"}` until `op_delay` seconds have passed, then
  Succeeded (or Failed with its error, when a fault says so); the Location URL 202 then 200. All carry
  `Retry-After: 0`: azure-core reads 0 as "not given" and waits its client's `polling_interval` (30 s by default)
  between polls, so `client()` builds clients with a short one. For code under test that builds its own clients,
  `op_delay=0` completes each operation at its first poll (the PUT still answers Creating), whatever the interval.
- DELETE of a resource that is not there is 204, as ARM answers; of a resource in use, the provider's 400/409.
- Back references (a subnet's ipConfigurations, a NIC's virtualMachine, a disk's managedBy and diskState, a public
  IP's ipConfiguration, a placement group's virtualMachines) are derived from the forward ones at each read, so they
  cannot disagree.
- A VM gets real SSH host keys (ssh-keygen) when it is made; with boot diagnostics on, its serial log shows them
  between cloud-init's `-----BEGIN SSH HOST KEY KEYS-----` markers, once per boot, as an Ubuntu VM's console does.

Where it is knowingly not Azure: one subscription and no ARM templates; only Linux; only existing NICs (no
networkInterfaceConfigurations); Spot VMs must name their evictionPolicy (Azure would take Deallocate); a failed
create leaves nothing behind (Azure may keep a Failed VM); provider error codes outside the ones the SDK docs show
are the closest known ones.

Faults for tests: `fail("virtualMachines.createOrUpdate", code="AllocationFailed", status=200, on="operation")`,
`evict(group, vm)`; `calls` lists (verb, path) as served.

As a program (one module for the service, its pure rules in testbed/arm_rules.py):

    python -m testbed.arm --port 8443 --location eastus --image images/kiln-gpu-1
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import hashlib
import ipaddress
import json
import re
import secrets
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from azure.core.credentials import AccessToken
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute import models as compute_models
from azure.mgmt.network import NetworkManagementClient
from azure.mgmt.network import models as network_models
from azure.mgmt.resource.resources import ResourceManagementClient
from azure.mgmt.resource.resources import models as resource_models
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.arm_access import AUTHORIZATION_API, OPERATION_POLLS, Access, authorization_failed
from testbed.arm_access import action_of as access_action
from testbed.arm_rules import (
    COMPUTE_API,
    DISK_API,
    GALLERY_API,
    IMAGE_DISK_GB,
    NETWORK_API,
    RESOURCES_API,
    SKUS_API,
    VM_SIZES,
    ArmError,
    ResourceId,
    VmSize,
    address_space,
    check_group_name,
    check_location,
    check_name,
    check_tags,
    default_security_rules,
    fault_message,
    group_not_found,
    id_of,
    invalid_parameter,
    linux_os_profile,
    marketplace_version,
    next_private_address,
    offered,
    page,
    parse_id,
    parse_tag_filter,
    request_content,
    resource_not_found,
    schema_problem,
    security_rules,
    sku_document,
    spot_settings,
    subnet_network,
    tags_match,
    version_key,
    vm_size,
)
from testbed.guest import QuietServer, cloud_init_host_keys, make_host_keys

GROUP = "Microsoft.Resources/resourceGroups"
VM, DISK, SNAPSHOT = "Microsoft.Compute/virtualMachines", "Microsoft.Compute/disks", "Microsoft.Compute/snapshots"
PPG, IMAGE = "Microsoft.Compute/proximityPlacementGroups", "Microsoft.Compute/images"
GALLERY = "Microsoft.Compute/galleries"
GALLERY_IMAGE, GALLERY_VERSION = GALLERY + "/images", GALLERY + "/images/versions"
VNET, NSG = "Microsoft.Network/virtualNetworks", "Microsoft.Network/networkSecurityGroups"
SUBNET = VNET + "/subnets"
PIP, NIC = "Microsoft.Network/publicIPAddresses", "Microsoft.Network/networkInterfaces"
TYPES = {"virtualMachines": VM, "disks": DISK, "snapshots": SNAPSHOT, "proximityPlacementGroups": PPG,
         "images": IMAGE, "galleries": GALLERY, "galleryImages": GALLERY_IMAGE, "galleryImageVersions": GALLERY_VERSION,
         "virtualNetworks": VNET, "subnets": SUBNET, "networkSecurityGroups": NSG, "publicIPAddresses": PIP,
         "networkInterfaces": NIC}
PUBLIC_RANGE = ipaddress.ip_network("203.0.113.0/24")
POWER_TEXT = {"starting": "VM starting", "running": "VM running", "stopping": "VM stopping", "stopped": "VM stopped",
              "deallocating": "VM deallocating", "deallocated": "VM deallocated"}
SAS_VERSION = "2022-11-02"
SAFE = "'$"  # left unquoted in the query of a nextLink, as ARM writes them


# -------------------------------------------------------------------------------------------------- guest side


def boot_log(host: str, keys: list[str], boot: int, when: datetime) -> tuple[str, str]:
    """The serial console of an Ubuntu 24.04 Azure VM's boot: the kernel's part, then cloud-init's with its keys."""
    early = ("[    0.000000] Linux version 6.8.0-1027-azure (buildd@lcy02-amd64-044) (x86_64-linux-gnu-gcc-13) "
             "#32-Ubuntu SMP Tue Apr 22 18:27:34 UTC 2025\n"
             "[    0.000000] Command line: BOOT_IMAGE=/vmlinuz-6.8.0-1027-azure root=PARTUUID=5a1e2b4c-01 ro "
             "console=tty1 console=ttyS0 earlyprintk=ttyS0 panic=-1\n"
             "[    0.000000] DMI: Microsoft Corporation Virtual Machine/Virtual Machine, BIOS Hyper-V UEFI Release "
             "v4.1 08/23/2024\n[    0.000000] Hypervisor detected: Microsoft Hyper-V\n"
             f"[    3.412871] systemd[1]: Hostname set to <{host}>.\n"
             f"[    6.204417] cloud-init[716]: Cloud-init v. 24.4.1-0ubuntu0~24.04.3 running 'init' (boot {boot}).\n")
    late = "\n".join([*cloud_init_host_keys(host, keys, when),
                      "[   12.902114] cloud-init[1021]: Cloud-init v. 24.4.1-0ubuntu0~24.04.3 finished. Datasource "
                      "DataSourceAzure [seed=/dev/sr0].", f"\nUbuntu 24.04.2 LTS {host} ttyS0\n\n{host} login: "])
    return early, late + "\n"


@dataclass
class _Guest:
    """What runs inside a VM: its host keys, its power state, its console, the SAS signatures of its blobs."""

    keys: list[str]
    host: str
    power: str = "starting"
    boots: list[tuple[str, str, float]] = field(default_factory=list)  # (kernel part, cloud-init part, ready at)
    signatures: dict[str, float] = field(default_factory=dict)  # sig -> expiry (time.time())

    def serial(self, now: float) -> str:
        return "".join(early + (late if now >= ready else "") for early, late, ready in self.boots)


# ---------------------------------------------------------------------------------------------- requests, operations


@dataclass(frozen=True)
class _Route:
    verb: str
    pattern: re.Pattern
    name: str  # the operation, as fail() names it: "virtualMachines.createOrUpdate"
    api: str | None  # the api-version it takes; None for the blob URLs
    handler: Callable
    lro: bool = False


@dataclass(frozen=True)
class _Request:
    op: str
    path: str
    query: dict[str, str]
    params: dict[str, str]
    body: object


@dataclass
class _Reply:
    status: int
    body: object = None  # dict: JSON; str: text; bytes
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json; charset=utf-8"


@dataclass
class _Fault:
    operation: str
    code: str
    status: int
    message: str | None
    countdown: int
    on: str


@dataclass
class _Op:
    name: str
    provider: str  # compute, disk, network, resources: which status URLs it has
    location: str
    due: float
    started: str
    finish: Callable[[], None] | None
    undo: Callable[[], None] | None
    context: dict
    fault: _Fault | None = None
    status: str = "InProgress"
    error: dict | None = None
    ended: str = ""
    caller: str | None = None  # the principal that started it (None: the operator)


class _Credential:
    """A token credential as azure-core takes it: `get_token(*scopes)` gives an AccessToken."""

    def __init__(self, token: str):
        self._token = token

    def get_token(self, *scopes: str, **kwargs) -> AccessToken:
        return AccessToken(self._token, int(time.time()) + 3600)


# ------------------------------------------------------------------------------------------------------ service


class Arm:
    """The service: state under one lock, a route table, one group of handlers per resource kind."""

    def __init__(self, subscription: str = "00000000-0000-0000-0000-000000000000",
                 locations: Iterable[str] = ("eastus", "westus2"), op_delay: float = 0.05, *,
                 host: str = "127.0.0.1", port: int = 0, boot_delay: float = 0.0):
        """`op_delay`: seconds until a long-running operation completes; `boot_delay`: how long after a VM runs
        cloud-init prints its host keys on the serial console."""
        self.subscription = subscription
        self.locations = tuple(locations)
        self.op_delay = op_delay
        self.boot_delay = boot_delay
        self.calls: list[tuple[str, str]] = []
        self._token = secrets.token_urlsafe(32)
        self._groups: dict[str, dict] = {}  # lower-case name -> resource group
        self._resources: dict[str, dict] = {}  # lower-case id -> resource, as ARM writes it
        self._guests: dict[str, _Guest] = {}  # VM id (lower case) -> its guest
        self._ops: dict[str, _Op] = {}
        self._faults: list[_Fault] = []
        self._next_public = 0
        self._lock = threading.RLock()
        self._fault_now: _Fault | None = None
        self._access = Access(subscription)
        self._restricted: dict[tuple[str, str], str] = {}  # (size, location) -> the restriction's reason code
        self._caller: str | None = None  # the principal of the call being served; None: the operator
        self._tmp = tempfile.TemporaryDirectory(prefix="arm-standin-")
        self.ca_file, cert, key = make_tls(Path(self._tmp.name), host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._routes = self._route_table()
        self._server = _Server((host, port), _handler(self), context)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    # ------------------------------------------------------------------------------------------- for tests

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"https://{host}:{port}"

    def credential(self, token: str | None = None) -> _Credential:
        """A credential whose token the stand-in takes (or, given `token`, one it refuses)."""
        return _Credential(token or self._token)

    def client(self, kind: str | type, credential: object | None = None):
        """A management client ("compute", "network", "resource", or the class) pointed here by its own options."""
        classes = {"compute": ComputeManagementClient, "network": NetworkManagementClient,
                   "resource": ResourceManagementClient}
        cls = classes[kind] if isinstance(kind, str) else kind
        return cls(credential or self.credential(), self.subscription, base_url=self.endpoint,
                   connection_verify=self.ca_file, polling_interval=max(self.op_delay / 3, 0.005))

    def identity_token(self, vm_id: str) -> str | None:
        """A token for the VM's system-assigned identity, as its metadata service hands it out (None: it has no
        identity); ARM allows its calls what the principal's role assignments grant."""
        with self._lock:
            return self._access.token_for(vm_id)

    @contextlib.contextmanager
    def denied(self, action: str):
        """Refuse the operator an action while in the block (403 AuthorizationFailed), as ARM refuses a
        Contributor `Microsoft.Authorization/roleAssignments/write`."""
        with self._lock:
            self._access.denied.add(action)
        try:
            yield
        finally:
            with self._lock:
                self._access.denied.discard(action)

    def delay_principals(self, seconds: float) -> None:
        """Keep each new identity's principal out of the directory this long (PrincipalNotFound), as Entra ID's
        replication does."""
        with self._lock:
            self._access.principal_delay = seconds

    def role_assignments(self) -> list[dict]:
        """Every role assignment, as ARM shows it."""
        with self._lock:
            return copy.deepcopy(list(self._access.assignments.values()))

    def restrict_size(self, size: str, location: str, reason: str = "NotAvailableForSubscription") -> None:
        """Restrict a VM size in a location for this subscription, as Azure does for a size not open to it: the
        SKU list shows the restriction, a VM of it there is 409 SkuNotAvailable."""
        with self._lock:
            self._restricted[(vm_size(size)[0], location)] = reason

    def host_keys(self, resource_group: str, vm_name: str) -> list[str]:
        """The host keys the VM really has: `<type> <base64>` lines."""
        with self._lock:
            return list(self._guests[self._id(resource_group, VM, vm_name).key].keys)

    def add_image(self, resource_group: str, name: str, tags: dict[str, str] | None = None, *,
                  location: str | None = None, disk_size_gb: int = IMAGE_DISK_GB) -> str:
        """Add a generalized Linux managed image (and its group, if missing); its id."""
        with self._lock:
            location = self._ensure_group(resource_group, location)
            rid = self._id(resource_group, IMAGE, name)
            self._resources[rid.key] = self._tracked(rid, location, check_tags(tags), {
                "storageProfile": {"osDisk": {"osType": "Linux", "osState": "Generalized", "diskSizeGB": disk_size_gb,
                                              "caching": "ReadWrite", "storageAccountType": "Premium_LRS"},
                                   "dataDisks": [], "zoneResilient": False},
                "hyperVGeneration": "V2", "provisioningState": "Succeeded"})
            return str(rid)

    def add_gallery_image(self, resource_group: str, gallery: str, definition: str, version: str,
                          tags: dict[str, str] | None = None, *, location: str | None = None,
                          regions: Iterable[str] | None = None, exclude_from_latest: bool = False) -> str:
        """Add a gallery image version (and its gallery, definition and group, if missing), replicated to `regions`
        (default: the gallery's location); its id."""
        with self._lock:
            location = self._ensure_group(resource_group, location)
            gallery_id = self._id(resource_group, GALLERY, gallery)
            definition_id = gallery_id.child("images", definition)
            version_id = definition_id.child("versions", version)
            self._resources.setdefault(gallery_id.key, self._tracked(gallery_id, location, {}, {
                "identifier": {"uniqueName": f"{self.subscription}-{gallery.upper()}"},
                "provisioningState": "Succeeded"}))
            self._resources.setdefault(definition_id.key, self._tracked(definition_id, location, {}, {
                "osType": "Linux", "osState": "Generalized", "hyperVGeneration": "V2", "architecture": "x64",
                "identifier": {"publisher": "kiln", "offer": gallery, "sku": definition},
                "provisioningState": "Succeeded"}))
            targets = [{"name": r, "regionalReplicaCount": 1, "storageAccountType": "Standard_LRS"}
                       for r in (regions or [location])]
            self._resources[version_id.key] = self._tracked(version_id, location, check_tags(tags), {
                "publishingProfile": {"targetRegions": targets, "replicaCount": 1,
                                      "excludeFromLatest": exclude_from_latest, "publishedDate": self._now(),
                                      "storageAccountType": "Standard_LRS"},
                "storageProfile": {"osDiskImage": {"sizeInGB": IMAGE_DISK_GB, "hostCaching": "ReadWrite"}},
                "safetyProfile": {"allowDeletionOfReplicatedLocations": True},
                "provisioningState": "Succeeded"})
            return str(version_id)

    def fail(self, operation: str, *, code: str, status: int, message: str | None = None, nth: int = 1,
             on: str = "call") -> None:
        """Make the nth call of `operation` from now ("virtualMachines.createOrUpdate") fail: at once with HTTP
        `status` and error `code` (on="call"), or as a long-running operation that ends Failed with that code
        (on="operation": OperationNotAllowed for quota, AllocationFailed, SkuNotAvailable, ZonalAllocationFailed...)
        while nothing is made. A 5xx or 429 on="call" is retried by azure-core, as against Azure."""
        routes = {route.name: route for route in self._routes}
        if operation not in routes:
            raise ValueError(f"no operation {operation!r}: one of {sorted(routes)}")
        if on not in ("call", "operation") or nth < 1:
            raise ValueError("on is 'call' or 'operation', nth at least 1")
        if on == "operation" and not routes[operation].lro:
            raise ValueError(f"{operation} answers at once, with no long-running operation")
        with self._lock:
            self._faults.append(_Fault(operation, code, status, message, nth, on))

    def evict(self, resource_group: str, vm_name: str) -> None:
        """Evict a running Spot VM as Azure does: deallocated, or, with evictionPolicy Delete, deleted with what its
        deleteOptions delete."""
        with self._lock:
            self._settle()
            rid = self._id(resource_group, VM, vm_name)
            vm, guest = self._resources.get(rid.key), self._guests.get(rid.key)
            if vm is None or vm["properties"]["priority"] not in ("Spot", "Low") or guest.power != "running":
                raise ValueError(f"{rid} is no running Spot VM")
            if vm["properties"]["evictionPolicy"] == "Delete":
                self._remove_vm(rid.key)
            else:
                guest.power = "deallocated"

    # -------------------------------------------------------------------------------------------- plumbing

    def __enter__(self) -> Arm:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._tmp.cleanup()

    def _id(self, group: str, type_name: str, *names: str) -> ResourceId:
        stored = self._groups.get(group.lower())
        namespace, *types = type_name.split("/")
        return ResourceId(self.subscription, stored["name"] if stored else group, namespace, tuple(types), names)

    @staticmethod
    def _now() -> str:
        return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")

    def _ensure_group(self, name: str, location: str | None) -> str:
        check_group_name(name)
        group = self._groups.get(name.lower())
        if group is None:
            location = check_location(location or self.locations[0], self.locations, GROUP)
            self._groups[name.lower()] = group = self._group_body(name, location, {})
        return check_location(location, self.locations, IMAGE) if location else group["location"]

    def _group_body(self, name: str, location: str, tags: dict) -> dict:
        return {"id": f"/subscriptions/{self.subscription}/resourceGroups/{name}", "name": name, "type": GROUP,
                "location": location, "tags": tags, "properties": {"provisioningState": "Succeeded"}}

    @staticmethod
    def _tracked(rid: ResourceId, location: str, tags: dict, properties: dict, **extra) -> dict:
        return {"id": str(rid), "name": rid.name, "type": rid.type, "location": location, "tags": tags, **extra,
                "properties": properties}

    def _route_table(self) -> list[_Route]:
        sub = "/subscriptions/{subscription}"
        rg = sub + "/resourcegroups/{group}"
        cp, np = rg + "/providers/Microsoft.Compute", rg + "/providers/Microsoft.Network"
        vm = cp + "/virtualMachines/{n1}"
        table = [
            ("GET", sub + "/resourcegroups", "resourceGroups.list", RESOURCES_API, self._groups_list),
            ("PUT", rg, "resourceGroups.createOrUpdate", RESOURCES_API, self._groups_put),
            ("GET", rg, "resourceGroups.get", RESOURCES_API, self._groups_get),
            ("HEAD", rg, "resourceGroups.checkExistence", RESOURCES_API, self._groups_head),
            ("DELETE", rg, "resourceGroups.delete", RESOURCES_API, self._groups_delete, True),
            ("GET", sub + "/operationresults/{operation}", "operationResults.get", RESOURCES_API, self._op_result),
            ("PUT", vm, "virtualMachines.createOrUpdate", COMPUTE_API, self._vm_put, True),
            ("GET", vm, "virtualMachines.get", COMPUTE_API, self._vm_get),
            ("DELETE", vm, "virtualMachines.delete", COMPUTE_API, self._delete, True),
            ("GET", vm + "/instanceView", "virtualMachines.instanceView", COMPUTE_API, self._vm_instance_view),
            ("POST", vm + "/powerOff", "virtualMachines.powerOff", COMPUTE_API, self._vm_power, True),
            ("POST", vm + "/deallocate", "virtualMachines.deallocate", COMPUTE_API, self._vm_power, True),
            ("POST", vm + "/start", "virtualMachines.start", COMPUTE_API, self._vm_power, True),
            ("POST", vm + "/retrieveBootDiagnosticsData", "virtualMachines.retrieveBootDiagnosticsData",
             COMPUTE_API, self._vm_boot_diagnostics),
            ("GET", cp + "/virtualMachines", "virtualMachines.list", COMPUTE_API, self._list),
            ("GET", sub + "/providers/Microsoft.Compute/virtualMachines", "virtualMachines.listAll", COMPUTE_API,
             self._list),
            ("GET", sub + "/providers/Microsoft.Compute/skus", "resourceSkus.list", SKUS_API, self._skus_list),
            ("PUT", cp + "/proximityPlacementGroups/{n1}", "proximityPlacementGroups.createOrUpdate", COMPUTE_API,
             self._ppg_put),
            ("GET", cp + "/proximityPlacementGroups/{n1}", "proximityPlacementGroups.get", COMPUTE_API, self._get),
            ("DELETE", cp + "/proximityPlacementGroups/{n1}", "proximityPlacementGroups.delete", COMPUTE_API,
             self._ppg_delete),
            ("GET", cp + "/proximityPlacementGroups", "proximityPlacementGroups.listByResourceGroup", COMPUTE_API,
             self._list),
            ("GET", cp + "/images/{n1}", "images.get", COMPUTE_API, self._get),
            ("GET", cp + "/images", "images.listByResourceGroup", COMPUTE_API, self._list),
            ("GET", sub + "/providers/Microsoft.Compute/images", "images.list", COMPUTE_API, self._list),
            ("GET", cp + "/galleries/{n1}", "galleries.get", GALLERY_API, self._get),
            ("GET", cp + "/galleries/{n1}/images/{n2}", "galleryImages.get", GALLERY_API, self._get),
            ("GET", cp + "/galleries/{n1}/images/{n2}/versions/{n3}", "galleryImageVersions.get", GALLERY_API,
             self._get),
            ("GET", cp + "/galleries/{n1}/images/{n2}/versions", "galleryImageVersions.listByGalleryImage",
             GALLERY_API, self._list),
            ("GET", sub + "/providers/Microsoft.Compute/locations/{location}/operations/{operation}",
             "computeOperations.get", COMPUTE_API, self._op_poll),
            ("GET", sub + "/providers/Microsoft.Compute/locations/{location}/DiskOperations/{operation}",
             "diskOperations.get", DISK_API, self._op_poll),
            ("GET", sub + "/providers/Microsoft.Network/locations/{location}/operations/{operation}",
             "networkOperations.get", NETWORK_API, self._op_status),
            ("GET", sub + "/providers/Microsoft.Network/locations/{location}/operationResults/{operation}",
             "networkOperationResults.get", NETWORK_API, self._op_result),
            ("GET", "/blobs/{n1}/{blob}", "blobs.get", None, self._blob_get),
        ]
        for kind, put in (("disks", self._disk_put), ("snapshots", self._snapshot_put)):
            table += [("PUT", cp + f"/{kind}/{{n1}}", f"{kind}.createOrUpdate", DISK_API, put, True),
                      ("GET", cp + f"/{kind}/{{n1}}", f"{kind}.get", DISK_API, self._get),
                      ("DELETE", cp + f"/{kind}/{{n1}}", f"{kind}.delete", DISK_API, self._delete, True),
                      ("GET", cp + f"/{kind}", f"{kind}.listByResourceGroup", DISK_API, self._list),
                      ("GET", sub + f"/providers/Microsoft.Compute/{kind}", f"{kind}.list", DISK_API, self._list)]
        for kind, put in (("virtualNetworks", self._vnet_put), ("networkSecurityGroups", self._nsg_put),
                          ("publicIPAddresses", self._pip_put), ("networkInterfaces", self._nic_put)):
            table += [("PUT", np + f"/{kind}/{{n1}}", f"{kind}.createOrUpdate", NETWORK_API, put, True),
                      ("GET", np + f"/{kind}/{{n1}}", f"{kind}.get", NETWORK_API, self._get),
                      ("DELETE", np + f"/{kind}/{{n1}}", f"{kind}.delete", NETWORK_API, self._delete, True),
                      ("GET", np + f"/{kind}", f"{kind}.list", NETWORK_API, self._list),
                      ("GET", sub + f"/providers/Microsoft.Network/{kind}", f"{kind}.listAll", NETWORK_API,
                       self._list)]
        subnet = np + "/virtualNetworks/{n1}/subnets/{n2}"
        table += [("PUT", subnet, "subnets.createOrUpdate", NETWORK_API, self._subnet_put, True),
                  ("GET", subnet, "subnets.get", NETWORK_API, self._subnet_get),
                  ("DELETE", subnet, "subnets.delete", NETWORK_API, self._subnet_delete, True),
                  ("GET", np + "/virtualNetworks/{n1}/subnets", "subnets.list", NETWORK_API, self._subnet_list)]
        routes = [_Route(verb, re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", uri) + "/?", re.IGNORECASE),
                         name, api, handler, bool(rest and rest[0]))
                  for verb, uri, name, api, handler, *rest in table]
        assignment = re.compile(r"(?P<scope>/subscriptions/(?P<subscription>[^/]+)(?:/.+?)?)/providers/"
                                r"Microsoft\.Authorization/roleAssignments/(?P<n1>[^/]+)/?", re.IGNORECASE)
        return routes + [_Route(verb, assignment, f"roleAssignments.{name}", AUTHORIZATION_API, handler)
                         for verb, name, handler in (("PUT", "create", self._assignment_put),
                                                     ("GET", "get", self._assignment_get),
                                                     ("DELETE", "delete", self._assignment_delete))]

    # -------------------------------------------------------------------------------------------- serving

    def _serve(self, verb: str, target: str, headers, raw: bytes) -> _Reply:
        split = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        found = next(((route, match) for route in self._routes
                      if route.verb == verb and (match := route.pattern.fullmatch(split.path))), None)
        with self._lock:
            self.calls.append((verb, split.path))
            try:
                self._settle()
                if found is None or found[0].api:
                    self._caller = self._authenticate(headers.get("Authorization"))
                if found is None:
                    raise ArmError(501, "NotImplemented", f"The ARM stand-in does not serve {verb} {split.path}.")
                route, match = found
                params = {k: unquote(v) for k, v in match.groupdict().items()}
                if route.api:
                    self._check_scope(route, params, query)
                    if route.name not in OPERATION_POLLS:  # a poll is checked against who started it
                        self._access.check(self._caller, route.name, verb, split.path)
                try:
                    body = json.loads(raw) if raw.strip() else None
                except ValueError as error:
                    raise request_content(f"Unexpected character in the JSON content: {error}.") from None
                return self._call(route, _Request(route.name, split.path, query, params, body))
            except ArmError as error:
                reply = _Reply(error.status, error.body())
                if error.status == 401:
                    reply.headers["WWW-Authenticate"] = ('Bearer authorization_uri="https://login.microsoftonline.com'
                                                         '/common", error="invalid_token", error_description='
                                                         f'"{error.message}"')
                return reply
            except Exception:  # a bug of the stand-in: say so, as ARM's 500 the client shows
                return _Reply(500, {"error": {"code": "InternalServerError", "message": traceback.format_exc()}})

    def _authenticate(self, header: str | None) -> str | None:
        """The caller's principal (None: the operator); 401 for no token or one the stand-in did not give."""
        if not header:
            raise ArmError(401, "AuthenticationFailed", "Authentication failed. The 'Authorization' header is missing.")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ArmError(401, "AuthenticationFailed",
                           "Authentication failed. The 'Authorization' header is provided in an invalid format.")
        if secrets.compare_digest(token.strip(), self._token):
            return None
        principal = self._access.tokens.get(token.strip())
        if principal is None:
            raise ArmError(401, "InvalidAuthenticationToken", "The access token is invalid.")
        return principal

    def _check_scope(self, route: _Route, params: dict[str, str], query: dict[str, str]) -> None:
        if params["subscription"] != self.subscription:
            raise ArmError(404, "SubscriptionNotFound", f"The subscription '{params['subscription']}' could not be "
                                                        "found.")
        given = query.get("api-version")
        if not given:
            raise ArmError(400, "MissingApiVersionParameter",
                           "The api-version query parameter (?api-version=) is required for all requests.")
        if given == route.api:
            return
        if route.api == RESOURCES_API:
            raise ArmError(400, "InvalidApiVersionParameter",
                           f"The api-version '{given}' is invalid. The supported versions are '{route.api}'.")
        kind = route.name.split(".")[0]
        raise ArmError(400, "NoRegisteredProviderFound",
                       f"No registered resource provider found for location '{self.locations[0]}' and API version "
                       f"'{given}' for type '{kind}'. The supported api-versions are '{route.api}'. The supported "
                       f"locations are '{', '.join(self.locations)}'.")

    def _call(self, route: _Route, request: _Request) -> _Reply:
        fault = self._take_fault(route.name)
        if fault and fault.on == "call":
            context = self._fault_context(request.body)
            raise ArmError(fault.status, fault.code, fault.message or fault_message(fault.code, fault.status,
                                                                                    **context))
        self._fault_now = fault
        try:
            return route.handler(request)
        finally:
            self._fault_now = None

    def _take_fault(self, operation: str) -> _Fault | None:
        """The fault this call of `operation` meets, if any (nth counts the calls since the fault was set)."""
        mine = [fault for fault in self._faults if fault.operation == operation]
        for fault in mine:
            fault.countdown -= 1
        due = [fault for fault in mine if fault.countdown == 0]
        for fault in due:
            self._faults.remove(fault)
        return due[0] if due else None

    @staticmethod
    def _fault_context(body: object) -> dict:
        """What a quota or capacity message names, from a VM request body: size, cores, family, location."""
        if not isinstance(body, dict):
            return {}
        try:
            size_name, size = vm_size(((body.get("properties") or {}).get("hardwareProfile") or {}).get("vmSize"))
        except ArmError:
            return {"location": str(body.get("location") or "")}
        return {"size": size_name, "cores": size.vcpus, "family": size.family, "location": body.get("location", "")}

    # -------------------------------------------------------------------------------------------- operations

    def _begin(self, provider: str, location: str, finish: Callable[[], None] | None = None,
               undo: Callable[[], None] | None = None, context: dict | None = None) -> _Op:
        """Start a long-running operation: InProgress now, done op_delay from now; then `finish` runs, or, where a
        fault fails it, `undo`."""
        op = _Op(str(uuid.uuid4()), provider, location, time.monotonic() + self.op_delay, self._now(), finish, undo,
                 context or {}, self._fault_now, caller=self._caller)
        self._fault_now = None
        self._ops[op.name] = op
        return op

    def _urls(self, op: _Op) -> tuple[str, str]:
        """(Azure-AsyncOperation, Location) of an operation, as each provider writes them."""
        sub = f"{self.endpoint}/subscriptions/{self.subscription}"
        if op.provider == "network":
            base = f"{sub}/providers/Microsoft.Network/locations/{op.location}"
            return (f"{base}/operations/{op.name}?api-version={NETWORK_API}",
                    f"{base}/operationResults/{op.name}?api-version={NETWORK_API}")
        if op.provider == "resources":
            token = base64.urlsafe_b64encode(f"RGDELETE|{op.name}".encode()).decode().rstrip("=")
            op_url = f"{sub}/operationresults/{token}?api-version={RESOURCES_API}"
            return op_url, op_url
        kind, api = ("DiskOperations", DISK_API) if op.provider == "disk" else ("operations", COMPUTE_API)
        base = f"{sub}/providers/Microsoft.Compute/locations/{op.location}/{kind}/{op.name}?p={uuid.uuid4()}"
        return f"{base}&api-version={api}", f"{base}&monitor=true&api-version={api}"

    def _op_headers(self, op: _Op, *, status: bool = True, location: bool = True) -> dict[str, str]:
        status_url, location_url = self._urls(op)
        return {**({"Azure-AsyncOperation": status_url} if status else {}),
                **({"Location": location_url} if location else {}), "Retry-After": "0"}

    def _settle(self) -> None:
        """Complete the operations that are due, in the order they began."""
        now = time.monotonic()
        for op in list(self._ops.values()):
            if op.status == "InProgress" and op.due <= now:
                self._complete(op)

    def _complete(self, op: _Op) -> None:
        fault = op.fault
        if fault:
            if op.undo:
                op.undo()
            op.status = "Failed"
            op.error = {"code": fault.code, "message": fault.message or fault_message(fault.code, fault.status,
                                                                                        **op.context)}
        else:
            if op.finish:
                op.finish()
            op.status = "Succeeded"
        op.ended = self._now()

    def _op_of(self, request: _Request) -> _Op:
        name = request.params["operation"]
        if request.op == "operationResults.get":
            with contextlib.suppress(ValueError):
                name = base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode().split("|")[-1]
        if name not in self._ops:
            raise ArmError(404, "NotFound", f"The operation '{request.params['operation']}' was not found.")
        if self._caller not in (None, self._ops[name].caller):  # the operator reads every operation
            raise authorization_failed(self._caller, access_action(request.op, "GET", request.path), request.path)
        return self._ops[name]

    def _op_poll(self, request: _Request) -> _Reply:
        """Compute and disk operations: the status, or, with monitor=true, the result (Location)."""
        return self._op_result(request) if request.query.get("monitor") == "true" else self._op_status(request)

    def _op_status(self, request: _Request) -> _Reply:
        op = self._op_of(request)
        body = {"name": op.name, "status": op.status, "startTime": op.started}
        if op.status != "InProgress":
            body["endTime"] = op.ended
        if op.error:
            body["error"] = op.error
        return _Reply(200, body, {"Retry-After": "0"} if op.status == "InProgress" else {})

    def _op_result(self, request: _Request) -> _Reply:
        op = self._op_of(request)
        if op.status == "InProgress":
            return _Reply(202, None, {"Location": self.endpoint + request.path + "?" + urlencode(request.query),
                                      "Retry-After": "0"})
        if op.status == "Failed":
            return _Reply(op.fault.status if op.fault.status >= 400 else 409, {"error": op.error})
        return _Reply(200)

    # ------------------------------------------------------------------------------------------- common verbs

    def _group(self, name: str, *, live: bool = False) -> dict:
        group = self._groups.get(name.lower())
        if group is None:
            raise group_not_found(name)
        if live and group["properties"]["provisioningState"] == "Deleting":
            raise ArmError(409, "ResourceGroupBeingDeleted", f"The resource group '{group['name']}' is in "
                                                             "deprovisioning state and cannot perform this operation.")
        return group

    def _rid(self, request: _Request, type_name: str | None = None) -> ResourceId:
        names = [request.params[k] for k in ("n1", "n2", "n3") if k in request.params]
        return self._id(request.params["group"], type_name or TYPES[request.op.split(".")[0]], *names)

    def _missing(self, rid: ResourceId) -> ArmError:
        if rid.namespace.lower() == "microsoft.network" and len(rid.types) > 1:
            return ArmError(404, "NotFound", f"Resource {rid} not found.")
        path = "/".join(f"{t}/{n}" for t, n in zip(rid.types, rid.names, strict=True))
        return resource_not_found(rid.namespace, path, rid.group)

    def _existing(self, request: _Request) -> ResourceId:
        self._group(request.params["group"])
        rid = self._rid(request)
        if rid.key not in self._resources:
            raise self._missing(rid)
        return rid

    def _get(self, request: _Request) -> _Reply:
        return _Reply(200, self._view(self._existing(request).key))

    def _in_group(self, key: str, group: str) -> bool:
        return parse_id(key).group.lower() == group.lower()

    def _list(self, request: _Request) -> _Reply:
        type_name = TYPES[request.op.split(".")[0]]
        if "$filter" in request.query:
            raise ArmError(400, "InvalidFilterInQueryString",
                           f"Invalid $filter '{request.query['$filter']}' specified in the query string.")
        group = self._group(request.params["group"])["name"] if "group" in request.params else None
        parent = self._rid(request, GALLERY_IMAGE).key if "n2" in request.params else None
        keys = sorted(k for k, r in self._resources.items() if r["type"] == type_name
                      and (group is None or self._in_group(k, group))
                      and (parent is None or parse_id(k).parent.key == parent))
        expand = request.query.get("$expand") == "instanceView" or request.query.get("statusOnly") == "true"
        return self._paged(request, [self._view(k, expand=expand) for k in keys])

    def _paged(self, request: _Request, items: list) -> _Reply:
        chosen, following = page(items, request.query.get("$skiptoken", ""))
        body: dict = {"value": chosen}
        if following is not None:
            query = {k: v for k, v in request.query.items() if k != "$skiptoken"} | {"$skiptoken": following}
            body["nextLink"] = f"{self.endpoint}{request.path}?{urlencode(query, quote_via=quote, safe=SAFE)}"
        return _Reply(200, body)

    def _parse(self, model: type, body: object) -> dict:
        """A request body as the SDK's model takes it, less its read-only members; 400 where the schema refuses."""
        problem = schema_problem(model, body if body is not None else "")
        if problem:
            raise problem
        encoder = sys.modules[model.__module__.rsplit(".", 2)[0] + "._utils.model_base"].SdkJSONEncoder
        return json.loads(json.dumps(model(body), cls=encoder, exclude_readonly=True))

    def _put_prologue(self, request: _Request, model: type) -> tuple[ResourceId, dict, dict | None]:
        """The id, body (location and tags checked) and former state of a tracked resource's PUT."""
        self._group(request.params["group"], live=True)
        rid = self._rid(request)
        check_name(rid.type, rid.name)
        body = self._parse(model, request.body)
        body["location"] = check_location(body.get("location"), self.locations, rid.type)
        body["tags"] = check_tags(body.get("tags"))
        old = self._resources.get(rid.key)
        if old and old["location"] != body["location"]:
            raise ArmError(409, "InvalidResourceLocation",
                           f"The resource '{rid.name}' already exists in location '{old['location']}' in resource "
                           f"group '{rid.group}'. A resource with the same name cannot be created in location "
                           f"'{body['location']}'. Please select a new resource name.")
        if old and old["properties"].get("provisioningState") == "Deleting":
            raise ArmError(409, "OperationNotAllowed", f"The resource {rid} is being deleted.")
        return rid, body, old

    def _store(self, rid: ResourceId, stored: dict, old: dict | None, provider: str, *, state: str,
               finish: Callable[[], None] | None = None, undo: Callable[[], None] | None = None,
               context: dict | None = None) -> tuple[_Op, int]:
        """Store a resource being made or changed (provisioningState `state` until its operation is done): the
        operation, and the status the PUT answers."""
        stored["properties"]["provisioningState"] = state
        self._resources[rid.key] = stored

        def done() -> None:
            if self._resources.get(rid.key) is stored:
                stored["properties"]["provisioningState"] = "Succeeded"
            if finish:
                finish()

        def undone() -> None:
            if undo:
                undo()
            if self._resources.get(rid.key) is stored:
                if old is None:
                    self._resources.pop(rid.key)
                else:
                    self._resources[rid.key] = old

        return self._begin(provider, stored["location"], done, undone, context), 200 if old else 201

    def _delete(self, request: _Request) -> _Reply:
        self._group(request.params["group"])
        rid = self._rid(request)
        stored = self._resources.get(rid.key)
        if stored is None:
            return _Reply(204)
        self._check_deletable(rid)
        before = stored["properties"].get("provisioningState")
        stored["properties"]["provisioningState"] = "Deleting"

        def finish() -> None:
            if rid.type == VM:
                self._remove_vm(rid.key)
            else:
                self._resources.pop(rid.key, None)

        def undo() -> None:
            stored["properties"]["provisioningState"] = before

        op = self._begin(self._provider(rid), stored["location"], finish, undo)
        return _Reply(202, None, self._op_headers(op))

    @staticmethod
    def _provider(rid: ResourceId) -> str:
        if rid.namespace == "Microsoft.Network":
            return "network"
        return "disk" if rid.type in (DISK, SNAPSHOT) else "compute"

    def _check_deletable(self, rid: ResourceId) -> None:
        """400/409 where the provider refuses to delete a resource still in use."""
        if rid.type == NIC and (user := self._nic_user(rid.key)):
            raise ArmError(400, "NicInUse", f"Network Interface {rid} is used by existing resource {user}. In order "
                                            "to delete the network interface, it must be dissociated from the "
                                            "resource. To learn more, see aka.ms/deletenic.")
        if rid.type == DISK and (user := self._disk_user(rid.key)):
            raise ArmError(409, "OperationNotAllowed", f"Disk {rid.name} is attached to VM {user}.")
        if rid.type == PIP and (users := self._ipconfigs(lambda c: self._same(id_of(c.get("publicIPAddress")),
                                                                             rid))):
            raise ArmError(400, "PublicIPAddressCannotBeDeleted",
                           f"Public IP address {rid} can not be deleted since it is still allocated to resource "
                           f"{users[0]}. In order to delete the public IP, disassociate/detach the Public IP address "
                           "from the resource. To learn how to do this, see aka.ms/deletepublicip.")
        if rid.type == NSG and (users := self._nsg_users(rid)):
            raise ArmError(400, "InUseNetworkSecurityGroupCannotBeDeleted",
                           f"Network security group {rid} cannot be deleted because it is in use by the following "
                           f"resources: {', '.join(users)}. In order to delete the Network security group, remove "
                           "the association with the resource(s). To learn how to do this, see aka.ms/deletensg.")
        if rid.type == VNET:
            for subnet in self._resources[rid.key]["properties"]["subnets"]:
                self._check_subnet_unused(subnet)

    # -------------------------------------------------------------------------------------------- references

    @staticmethod
    def _same(ref: str, rid: ResourceId | str) -> bool:
        return bool(ref) and ref.lower() == (rid.key if isinstance(rid, ResourceId) else rid.lower())

    def _of_type(self, type_name: str) -> list[tuple[str, dict]]:
        return [(k, r) for k, r in self._resources.items() if r["type"] == type_name]

    def _ipconfigs(self, wanted: Callable[[dict], bool]) -> list[str]:
        """The ids of the NIC ip configurations whose properties `wanted` picks."""
        return [c["id"] for _, nic in self._of_type(NIC) for c in nic["properties"]["ipConfigurations"]
                if wanted(c["properties"])]

    def _nic_user(self, nic_key: str) -> str:
        """The id of the VM a NIC is attached to, or ""."""
        return next((vm["id"] for _, vm in self._of_type(VM)
                     for ref in vm["properties"]["networkProfile"]["networkInterfaces"]
                     if self._same(ref["id"], nic_key)), "")

    def _disk_user(self, disk_key: str) -> str:
        """The id of the VM a disk is attached to, or ""."""
        for _, vm in self._of_type(VM):
            storage = vm["properties"]["storageProfile"]
            if any(self._same(d["managedDisk"]["id"], disk_key) for d in [storage["osDisk"], *storage["dataDisks"]]):
                return vm["id"]
        return ""

    def _nsg_users(self, rid: ResourceId) -> list[str]:
        nics = [nic["id"] for _, nic in self._of_type(NIC)
                if self._same(id_of(nic["properties"].get("networkSecurityGroup")), rid)]
        subnets = [s["id"] for _, vnet in self._of_type(VNET) for s in vnet["properties"]["subnets"]
                   if self._same(id_of(s["properties"].get("networkSecurityGroup")), rid)]
        return nics + subnets

    def _reference(self, ref: str, type_name: str, user: ResourceId, location: str) -> dict:
        """The resource a network reference names; 400 InvalidResourceReference where none is, or in another
        region."""
        rid = parse_id(ref)
        stored = self._resources.get(rid.key) if rid and rid.type.lower() == type_name.lower() else None
        if stored is None or stored["location"] != location:
            raise ArmError(400, "InvalidResourceReference",
                           f"Resource {ref} referenced by resource {user} was not found. Please make sure that the "
                           "referenced resource exists, and that both resources are in the same region.")
        return stored

    def _subnet_of(self, ref: str, user: ResourceId, location: str) -> dict:
        rid = parse_id(ref)
        vnet = self._resources.get(rid.parent.key) if rid and rid.type.lower() == SUBNET.lower() else None
        subnet = next((s for s in vnet["properties"]["subnets"] if self._same(s["id"], rid)), None) if vnet else None
        if subnet is None or vnet["location"] != location:
            raise ArmError(400, "InvalidResourceReference",
                           f"Resource {ref} referenced by resource {user} was not found. Please make sure that the "
                           "referenced resource exists, and that both resources are in the same region.")
        return subnet

    def _view(self, key: str, *, expand: bool = False) -> dict:
        """A resource as ARM answers it: its back references derived from the forward ones."""
        view = copy.deepcopy(self._resources[key])
        props = view["properties"]
        if view["type"] == VNET:
            for subnet in props["subnets"]:
                self._subnet_view(subnet)
        elif view["type"] == NSG:
            rid = parse_id(key)
            props["networkInterfaces"] = [{"id": n} for n in self._nsg_users(rid) if "/networkInterfaces/" in n]
            props["subnets"] = [{"id": s} for s in self._nsg_users(rid) if "/subnets/" in s]
        elif view["type"] == PIP:
            users = self._ipconfigs(lambda c: self._same(id_of(c.get("publicIPAddress")), key))
            if users:
                props["ipConfiguration"] = {"id": users[0]}
        elif view["type"] == NIC:
            user = self._nic_user(key)
            if user:
                vm = self._resources[user.lower()]
                refs = vm["properties"]["networkProfile"]["networkInterfaces"]
                ref = next(r for r in refs if self._same(r["id"], key))
                props["virtualMachine"] = {"id": user}
                props["primary"] = len(refs) == 1 or bool(ref.get("properties", {}).get("primary"))
                digest = hashlib.sha256(key.encode()).hexdigest().upper()
                props["macAddress"] = "-".join(["00", "0D", "3A", digest[0:2], digest[2:4], digest[4:6]])
        elif view["type"] == DISK:
            user = self._disk_user(key)
            if user:
                view["managedBy"] = user
            power = self._guests[user.lower()].power if user else ""
            props["diskState"] = "Reserved" if power == "deallocated" else "Attached" if user else "Unattached"
        elif view["type"] == PPG:
            props["virtualMachines"] = [{"id": vm["id"]} for _, vm in self._of_type(VM)
                                        if self._same(id_of(vm["properties"].get("proximityPlacementGroup")), key)]
        elif view["type"] == VM and expand:
            props["instanceView"] = self._instance_view(key)
        return view

    def _subnet_view(self, subnet: dict) -> dict:
        configs = self._ipconfigs(lambda c: self._same(id_of(c.get("subnet")), subnet["id"]))
        if configs:
            subnet["properties"]["ipConfigurations"] = [{"id": c} for c in configs]
        return subnet

    # -------------------------------------------------------------------------------------------- resource groups

    def _groups_put(self, request: _Request) -> _Reply:
        name = request.params["group"]
        check_group_name(name)
        body = self._parse(resource_models.ResourceGroup, request.body)
        location = check_location(body.get("location"), self.locations, GROUP)
        tags = check_tags(body.get("tags"))
        group = self._groups.get(name.lower())
        if group is None:
            self._groups[name.lower()] = group = self._group_body(name, location, tags)
            if body.get("managedBy"):
                group["managedBy"] = body["managedBy"]
            return _Reply(201, group)
        self._group(name, live=True)
        if group["location"] != location:
            raise ArmError(409, "InvalidResourceGroupLocation",
                           f"Invalid resource group location '{location}'. The Resource group already exists in "
                           f"location '{group['location']}'.")
        group["tags"] = tags
        return _Reply(200, group)

    def _groups_get(self, request: _Request) -> _Reply:
        return _Reply(200, self._group(request.params["group"]))

    def _groups_head(self, request: _Request) -> _Reply:
        return _Reply(204 if request.params["group"].lower() in self._groups else 404)

    def _groups_list(self, request: _Request) -> _Reply:
        wanted = parse_tag_filter(request.query.get("$filter", ""))
        groups = [g for _, g in sorted(self._groups.items()) if tags_match(g["tags"], wanted)]
        top = request.query.get("$top")
        if top:
            if not top.isdigit():
                raise ArmError(400, "InvalidTopInQueryString", f"Invalid $top '{top}' specified in the query string.")
            groups = groups[:int(top)]
        return self._paged(request, groups)

    def _groups_delete(self, request: _Request) -> _Reply:
        group = self._group(request.params["group"])
        name = group["name"]
        before = group["properties"]["provisioningState"]
        group["properties"]["provisioningState"] = "Deleting"

        def finish() -> None:
            for key in [k for k in self._resources if self._in_group(k, name)]:
                self._access.forget(self._resources.pop(key)["id"])
                self._guests.pop(key, None)
            self._groups.pop(name.lower(), None)

        def undo() -> None:
            group["properties"]["provisioningState"] = before

        op = self._begin("resources", group["location"], finish, undo)
        return _Reply(202, None, self._op_headers(op, status=False))

    # -------------------------------------------------------------------------------------------- network

    def _network_put(self, rid: ResourceId, stored: dict, old: dict | None) -> _Reply:
        stored["properties"]["resourceGuid"] = (old or {}).get("properties", {}).get("resourceGuid") or \
            str(uuid.uuid4())
        stored["etag"] = f'W/"{uuid.uuid4()}"'
        op, status = self._store(rid, stored, old, "network", state="Updating")  # NRP says Updating for a create too
        return _Reply(status, self._view(rid.key), self._op_headers(op, location=False))

    def _vnet_put(self, request: _Request) -> _Reply:
        rid, body, old = self._put_prologue(request, network_models.VirtualNetwork)
        props = body.get("properties") or {}
        space = address_space((props.get("addressSpace") or {}).get("addressPrefixes"), str(rid))
        subnets, taken = [], []
        for given in props.get("subnets") or []:
            name = given.get("name") or ""
            check_name(SUBNET, name)
            if any(name.lower() == other.lower() for other, _ in taken):
                raise ArmError(400, "InvalidRequestFormat", f"Subnet name {name} is used twice in {rid}.")
            network = subnet_network(given, space, rid.name, taken)
            taken.append((name, network))
            subnets.append(self._subnet_body(rid.child("subnets", name), given, network, body["location"]))
        for subnet in (old or {}).get("properties", {}).get("subnets", []):
            kept = next((s for s in subnets if self._same(s["id"], subnet["id"])), None)
            if kept is None:
                self._check_subnet_unused(subnet)
            elif kept["properties"]["addressPrefix"] != subnet["properties"]["addressPrefix"]:
                self._check_subnet_unused(subnet, "InUseSubnetCannotBeUpdated")
        stored = self._tracked(rid, body["location"], body["tags"], {
            **props, "addressSpace": {"addressPrefixes": [str(n) for n in space]}, "subnets": subnets,
            "virtualNetworkPeerings": props.get("virtualNetworkPeerings") or [],
            "enableDdosProtection": bool(props.get("enableDdosProtection"))})
        return self._network_put(rid, stored, old)

    def _subnet_body(self, rid: ResourceId, given: dict, network, location: str) -> dict:
        props = dict(given.get("properties") or {})
        nsg = id_of(props.get("networkSecurityGroup"))
        if nsg:
            props["networkSecurityGroup"] = {"id": self._reference(nsg, NSG, rid, location)["id"]}
        props.pop("addressPrefixes", None)
        props.update(addressPrefix=str(network), provisioningState="Succeeded",
                     privateEndpointNetworkPolicies=props.get("privateEndpointNetworkPolicies") or "Disabled",
                     privateLinkServiceNetworkPolicies=props.get("privateLinkServiceNetworkPolicies") or "Enabled")
        return {"name": rid.name, "id": str(rid), "etag": f'W/"{uuid.uuid4()}"', "type": SUBNET, "properties": props}

    def _check_subnet_unused(self, subnet: dict, code: str = "InUseSubnetCannotBeDeleted") -> None:
        users = self._ipconfigs(lambda c: self._same(id_of(c.get("subnet")), subnet["id"]))
        if users:
            verb = "deleted" if code.endswith("Deleted") else "updated"
            raise ArmError(400, code, f"Subnet {subnet['name']} is in use by {users[0]} and cannot be {verb}. In "
                                      "order to delete the subnet, delete all the resources within the subnet. See "
                                      "aka.ms/deletesubnet.")

    def _vnet_of(self, request: _Request) -> tuple[ResourceId, dict]:
        self._group(request.params["group"])
        vnet_id = self._id(request.params["group"], VNET, request.params["n1"])
        if vnet_id.key not in self._resources:
            raise self._missing(vnet_id)
        return vnet_id, self._resources[vnet_id.key]

    def _subnet_put(self, request: _Request) -> _Reply:
        self._group(request.params["group"], live=True)
        vnet_id, vnet = self._vnet_of(request)
        rid = vnet_id.child("subnets", request.params["n2"])
        check_name(SUBNET, rid.name)
        given = {**self._parse(network_models.Subnet, request.body), "name": rid.name}
        subnets = vnet["properties"]["subnets"]
        old = next((s for s in subnets if self._same(s["id"], rid)), None)
        space = [ipaddress.ip_network(p) for p in vnet["properties"]["addressSpace"]["addressPrefixes"]]
        taken = [(s["name"], ipaddress.ip_network(s["properties"]["addressPrefix"])) for s in subnets if s is not old]
        subnet = self._subnet_body(rid, given, subnet_network(given, space, vnet_id.name, taken), vnet["location"])
        if old and old["properties"]["addressPrefix"] != subnet["properties"]["addressPrefix"]:
            self._check_subnet_unused(old, "InUseSubnetCannotBeUpdated")
        before = list(subnets)
        vnet["properties"]["subnets"] = [s for s in subnets if s is not old] + [subnet]
        subnet["properties"]["provisioningState"] = "Updating"

        def undo() -> None:
            vnet["properties"]["subnets"] = before

        op = self._begin("network", vnet["location"], lambda: subnet["properties"].update(
            provisioningState="Succeeded"), undo)
        return _Reply(200 if old else 201, self._subnet_view(copy.deepcopy(subnet)),
                      self._op_headers(op, location=False))

    def _subnet_get(self, request: _Request) -> _Reply:
        vnet_id, vnet = self._vnet_of(request)
        rid = vnet_id.child("subnets", request.params["n2"])
        subnet = next((s for s in vnet["properties"]["subnets"] if self._same(s["id"], rid)), None)
        if subnet is None:
            raise self._missing(rid)
        return _Reply(200, self._subnet_view(copy.deepcopy(subnet)))

    def _subnet_list(self, request: _Request) -> _Reply:
        _, vnet = self._vnet_of(request)
        return self._paged(request, [self._subnet_view(copy.deepcopy(s)) for s in vnet["properties"]["subnets"]])

    def _subnet_delete(self, request: _Request) -> _Reply:
        vnet_id, vnet = self._vnet_of(request)
        rid = vnet_id.child("subnets", request.params["n2"])
        subnet = next((s for s in vnet["properties"]["subnets"] if self._same(s["id"], rid)), None)
        if subnet is None:
            return _Reply(204)
        self._check_subnet_unused(subnet)
        subnet["properties"]["provisioningState"] = "Deleting"

        def finish() -> None:
            vnet["properties"]["subnets"] = [s for s in vnet["properties"]["subnets"] if s is not subnet]

        op = self._begin("network", vnet["location"], finish,
                         lambda: subnet["properties"].update(provisioningState="Succeeded"))
        return _Reply(202, None, self._op_headers(op))

    def _nsg_put(self, request: _Request) -> _Reply:
        rid, body, old = self._put_prologue(request, network_models.NetworkSecurityGroup)
        props = body.get("properties") or {}
        stored = self._tracked(rid, body["location"], body["tags"], {
            **props, "securityRules": security_rules(props.get("securityRules"), str(rid)),
            "defaultSecurityRules": default_security_rules(str(rid))})
        return self._network_put(rid, stored, old)

    def _pip_put(self, request: _Request) -> _Reply:
        rid, body, old = self._put_prologue(request, network_models.PublicIPAddress)
        sku = body.get("sku") or {}
        if (sku.get("name") or "Standard") != "Standard":
            raise invalid_parameter(f"Public IP address {rid}: this stand-in serves the Standard SKU only (Basic SKU "
                                    "public IP addresses were retired on 30 September 2025).", "sku")
        props = body.get("properties") or {}
        if (props.get("publicIPAllocationMethod") or "Static") != "Static":
            raise ArmError(400, "StandardSkuPublicIPAddressesMustBeStatic",
                           f"Standard sku publicIp {rid} must have AllocationMethod set to Static.")
        if (props.get("publicIPAddressVersion") or "IPv4") != "IPv4":
            raise invalid_parameter("This stand-in serves IPv4 public IP addresses only.", "publicIPAddressVersion")
        address = (old or {}).get("properties", {}).get("ipAddress") or self._public_address()
        stored = self._tracked(rid, body["location"], body["tags"], {
            **props, "publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4", "ipAddress": address,
            "idleTimeoutInMinutes": props.get("idleTimeoutInMinutes") or 4, "ipTags": props.get("ipTags") or [],
            "ddosSettings": props.get("ddosSettings") or {"protectionMode": "VirtualNetworkInherited"}},
            sku={"name": "Standard", "tier": sku.get("tier") or "Regional"},
            **({"zones": body["zones"]} if body.get("zones") else {}))
        return self._network_put(rid, stored, old)

    def _public_address(self) -> str:
        """The next free address of PUBLIC_RANGE, round robin (a deleted address is not handed out at once)."""
        used = {p["properties"]["ipAddress"] for _, p in self._of_type(PIP)}
        hosts = list(PUBLIC_RANGE.hosts())
        for step in range(len(hosts)):
            address = str(hosts[(self._next_public + step) % len(hosts)])
            if address not in used:
                self._next_public = (self._next_public + step + 1) % len(hosts)
                return address
        raise ArmError(409, "PublicIPCountLimitReached", "Cannot create more than 254 public IP addresses for this "
                                                         "subscription in this region.")

    def _nic_put(self, request: _Request) -> _Reply:
        rid, body, old = self._put_prologue(request, network_models.NetworkInterface)
        location, props = body["location"], body.get("properties") or {}
        configs = props.get("ipConfigurations") or []
        if not configs:
            raise ArmError(400, "InvalidRequestFormat", f"Network interface {rid} must have one or more IP "
                                                        "configurations.")
        if len(configs) > 1 and sum(bool((c.get("properties") or {}).get("primary")) for c in configs) != 1:
            raise ArmError(400, "InvalidRequestFormat", f"Network interface {rid} must have exactly one primary IP "
                                                        "configuration.")
        nsg = id_of(props.get("networkSecurityGroup"))
        others = [c for k, nic in self._of_type(NIC) if k != rid.key for c in nic["properties"]["ipConfigurations"]]
        used = {c["properties"]["privateIPAddress"] for c in others}
        former = {c["name"].lower(): c["properties"] for c in (old or {}).get("properties", {}).get(
            "ipConfigurations", [])}
        kept = []
        for index, config in enumerate(configs):
            name = config.get("name") or f"ipconfig{index + 1}"
            if any(name.lower() == k["name"].lower() for k in kept):
                raise ArmError(400, "InvalidRequestFormat", f"IP configuration name {name} is used twice in {rid}.")
            given = config.get("properties") or {}
            config_id = f"{rid}/ipConfigurations/{name}"
            subnet = self._subnet_of(id_of(given.get("subnet")), rid, location)
            network = ipaddress.ip_network(subnet["properties"]["addressPrefix"])
            method = given.get("privateIPAllocationMethod") or "Dynamic"
            before = former.get(name.lower(), {})
            if method == "Static":
                address = given.get("privateIPAddress") or ""
                try:
                    inside = ipaddress.ip_address(address) in network
                except ValueError:
                    inside = False
                if not inside:
                    raise ArmError(400, "PrivateIPAddressNotInSubnet",
                                   f"IP configuration {config_id} is referencing private IP address {address} which "
                                   f"does not belong to subnet {subnet['id']}.")
                if address in used:
                    raise ArmError(400, "PrivateIPAddressInUse",
                                   f"IP configuration {config_id} is using the private IP address {address} which "
                                   "is already allocated to another resource.")
            elif self._same(id_of(before.get("subnet")), subnet["id"]):
                address = before["privateIPAddress"]
            else:
                address = next_private_address(network, used)
            used.add(address)
            stored_config = {**given, "privateIPAddress": address, "privateIPAllocationMethod": method,
                             "privateIPAddressVersion": "IPv4", "subnet": {"id": subnet["id"]},
                             "primary": len(configs) == 1 or bool(given.get("primary")),
                             "provisioningState": "Succeeded"}
            public = id_of(given.get("publicIPAddress"))
            if public:
                stored_config["publicIPAddress"] = {"id": self._reference(public, PIP, rid, location)["id"]}
                holder = next((c["id"] for c in others
                               if self._same(id_of(c["properties"].get("publicIPAddress")), public)), None)
                if holder:
                    raise ArmError(400, "PublicIPAddressInUse",
                                   f"Resource {public} is referenced by resource {holder}. A public IP address can "
                                   "be associated with one IP configuration only.")
            kept.append({"name": name, "id": config_id, "etag": f'W/"{uuid.uuid4()}"',
                         "type": "Microsoft.Network/networkInterfaces/ipConfigurations", "properties": stored_config})
        nic_props = {**props, "ipConfigurations": kept, "dnsSettings": props.get("dnsSettings") or {
            "dnsServers": [], "appliedDnsServers": []}, "enableAcceleratedNetworking": bool(
            props.get("enableAcceleratedNetworking")), "enableIPForwarding": bool(props.get("enableIPForwarding")),
            "nicType": "Standard", "hostedWorkloads": [], "tapConfigurations": [], "disableTcpStateTracking": False,
            "vnetEncryptionSupported": False, "auxiliaryMode": "None", "auxiliarySku": "None"}
        if nsg:
            nic_props["networkSecurityGroup"] = {"id": self._reference(nsg, NSG, rid, location)["id"]}
        return self._network_put(rid, self._tracked(rid, location, body["tags"], nic_props), old)

    # -------------------------------------------------------------------------------------------- disks

    def _disk_body(self, rid: ResourceId, location: str, tags: dict, sku: str, size_gb: int, creation: dict,
                   extra: dict | None = None) -> dict:
        props = {**(extra or {}), "creationData": creation, "diskSizeGB": size_gb, "diskSizeBytes": size_gb * 2**30,
                 "uniqueId": str(uuid.uuid4()), "timeCreated": self._now(), "provisioningState": "Succeeded",
                 "encryption": {"type": "EncryptionAtRestWithPlatformKey"}, "networkAccessPolicy": "AllowAll",
                 "publicNetworkAccess": "Enabled"}
        if rid.type == DISK:
            props.update(diskIOPSReadWrite=500, diskMBpsReadWrite=100)
        tier = "Premium" if sku.startswith("Premium") else "Standard"
        return self._tracked(rid, location, tags, props, sku={"name": sku, "tier": tier})

    def _source(self, ref: str, types: tuple[str, ...], location: str) -> dict:
        rid = parse_id(ref)
        if not rid or rid.type not in types:
            raise invalid_parameter(f"The value '{ref}' of parameter 'creationData.sourceResourceId' is not a "
                                    f"{' or '.join(t.split('/')[-1][:-1] for t in types)} id.",
                                    "creationData.sourceResourceId")
        stored = self._resources.get(rid.key)
        if stored is None:
            raise self._missing(rid)
        if stored["location"] != location:
            raise invalid_parameter(f"The source {ref} is in location '{stored['location']}', not in '{location}'.",
                                    "creationData.sourceResourceId")
        return stored

    def _disk_put(self, request: _Request) -> _Reply:
        rid, body, old = self._put_prologue(request, compute_models.Disk)
        props = body.get("properties") or {}
        creation = dict(props.get("creationData") or {})
        option = creation.get("createOption")
        size = props.get("diskSizeGB")
        extra = {k: v for k, v in props.items() if k not in ("creationData", "diskSizeGB")}
        if old:
            former = old["properties"]["creationData"]
            if option != former["createOption"] or (creation.get("sourceResourceId") or "").lower() != (
                    former.get("sourceResourceId") or "").lower():
                raise ArmError(409, "PropertyChangeNotAllowed", "Changing property 'creationData' is not allowed.",
                               "creationData")
            size = size or old["properties"]["diskSizeGB"]
            if size != old["properties"]["diskSizeGB"] and self._disk_user(rid.key):
                raise ArmError(409, "OperationNotAllowed", f"Disk {rid.name} is attached to VM "
                                                           f"{self._disk_user(rid.key)}: it can be resized only when "
                                                           "unattached or its VM is deallocated.")
            if size < old["properties"]["diskSizeGB"]:
                raise ArmError(400, "BadRequest", f"Disk {rid.name}: shrinking a disk is not supported.")
            stored = copy.deepcopy(old)
            stored.update(tags=body["tags"])
            stored["properties"].update(diskSizeGB=size, diskSizeBytes=size * 2**30)
        elif option == "Empty":
            if not isinstance(size, int) or not 1 <= size <= 32767:
                raise invalid_parameter("Required parameter 'diskSizeGB' is missing (null) or not between 1 and "
                                        "32767.", "diskSizeGB")
            stored = self._disk_body(rid, body["location"], body["tags"], self._sku(body), size, creation, extra)
        elif option == "Copy":
            source = self._source(creation.get("sourceResourceId"), (SNAPSHOT, DISK), body["location"])
            size = size or source["properties"]["diskSizeGB"]
            if size < source["properties"]["diskSizeGB"]:
                raise invalid_parameter(f"The disk size {size} GB is smaller than the source's "
                                        f"{source['properties']['diskSizeGB']} GB.", "diskSizeGB")
            creation.update(sourceResourceId=source["id"], sourceUniqueId=source["properties"]["uniqueId"])
            for key in ("osType", "hyperVGeneration"):
                if key in source["properties"]:
                    extra.setdefault(key, source["properties"][key])
            stored = self._disk_body(rid, body["location"], body["tags"], self._sku(body), size, creation, extra)
        else:
            raise invalid_parameter(f"The value '{option}' of parameter 'creationData.createOption' is not served: "
                                    "this stand-in makes disks Empty or as a Copy.", "creationData.createOption")
        if body.get("zones"):
            stored["zones"] = body["zones"]
        op, _ = self._store(rid, stored, old, "disk", state="Updating")
        return _Reply(202, self._view(rid.key), self._op_headers(op))  # DiskRP answers 202 to a PUT

    @staticmethod
    def _sku(body: dict) -> str:
        sku = (body.get("sku") or {}).get("name") or "Standard_LRS"
        known = ("Standard_LRS", "Premium_LRS", "StandardSSD_LRS", "UltraSSD_LRS", "Premium_ZRS", "StandardSSD_ZRS",
                 "PremiumV2_LRS")
        if sku not in known:
            raise invalid_parameter(f"The value '{sku}' of parameter 'sku.name' is invalid. Allowed values are "
                                    f"{', '.join(known)}.", "sku.name")
        return sku

    def _snapshot_put(self, request: _Request) -> _Reply:
        rid, body, old = self._put_prologue(request, compute_models.Snapshot)
        props = body.get("properties") or {}
        creation = dict(props.get("creationData") or {})
        if old:
            stored = copy.deepcopy(old)
            stored["tags"] = body["tags"]
        else:
            if creation.get("createOption") != "Copy":
                raise invalid_parameter(f"The value '{creation.get('createOption')}' of parameter "
                                        "'creationData.createOption' is not served: this stand-in makes snapshots "
                                        "as a Copy of a disk or snapshot.", "creationData.createOption")
            source = self._source(creation.get("sourceResourceId"), (DISK, SNAPSHOT), body["location"])
            creation.update(sourceResourceId=source["id"], sourceUniqueId=source["properties"]["uniqueId"])
            extra = {k: v for k, v in props.items() if k not in ("creationData", "diskSizeGB")}
            extra.setdefault("incremental", False)
            for key in ("osType", "hyperVGeneration"):
                if key in source["properties"]:
                    extra.setdefault(key, source["properties"][key])
            sku = (body.get("sku") or {}).get("name") or "Standard_LRS"
            stored = self._disk_body(rid, body["location"], body["tags"], sku, source["properties"]["diskSizeGB"],
                                     creation, extra)
        op, _ = self._store(rid, stored, old, "disk", state="Updating")
        return _Reply(202, self._view(rid.key), self._op_headers(op))

    # -------------------------------------------------------------------------------------------- placement groups

    def _ppg_put(self, request: _Request) -> _Reply:
        rid, body, old = self._put_prologue(request, compute_models.ProximityPlacementGroup)
        props = body.get("properties") or {}
        kind = props.get("proximityPlacementGroupType") or "Standard"
        if kind not in ("Standard", "Ultra"):
            raise invalid_parameter(f"The value '{kind}' of parameter 'proximityPlacementGroupType' is invalid.",
                                    "proximityPlacementGroupType")
        stored = self._tracked(rid, body["location"], body["tags"], {**props, "proximityPlacementGroupType": kind},
                               **({"zones": body["zones"]} if body.get("zones") else {}))
        self._resources[rid.key] = stored  # CRP makes placement groups at once; they carry no provisioningState
        return _Reply(200 if old else 201, self._view(rid.key))

    def _ppg_delete(self, request: _Request) -> _Reply:
        self._group(request.params["group"])
        rid = self._rid(request)
        if rid.key in self._resources:
            users = self._view(rid.key)["properties"]["virtualMachines"]
            if users:
                raise ArmError(409, "OperationNotAllowed", f"Proximity placement group {rid.name} cannot be deleted "
                                                           f"while it is used by {users[0]['id']}.")
            self._resources.pop(rid.key)
        return _Reply(200)

    # -------------------------------------------------------------------------------------------- virtual machines

    def _vm_put(self, request: _Request) -> _Reply:
        rid, body, old = self._put_prologue(request, compute_models.VirtualMachine)
        location, props = body["location"], body.get("properties") or {}
        size_name, size = self._size_here((props.get("hardwareProfile") or {}).get("vmSize"), location)
        storage = props.get("storageProfile") or {}
        spot = spot_settings(props)
        if spot["priority"] == "Spot" and not size.spot:
            raise invalid_parameter(f"The VM size '{size_name}' cannot be used with priority 'Spot'.", "priority")
        if old:
            os_profile, image, os_disk = self._vm_unchanged(old, props, spot)
        else:
            os_profile = linux_os_profile(props.get("osProfile"), rid.name)
            image, image_gb = self._image_for(storage.get("imageReference"), location)
        nics = self._vm_nics(props, rid, location)
        if not size.accelerated_networking and any(
                self._resources[n["id"].lower()]["properties"].get("enableAcceleratedNetworking") for n in nics):
            raise ArmError(400, "VMSizeIsNotPermittedToEnableAcceleratedNetworking",
                           f"VM size {size_name} is not compatible with enabling Accelerated Networking on network "
                           f"interface(s) on the VM. Compatible VM sizes: "
                           f"{', '.join(n for n, v in VM_SIZES.items() if v.accelerated_networking)}.")
        ppg = id_of(props.get("proximityPlacementGroup"))
        if ppg:
            ppg_id = parse_id(ppg)
            stored_ppg = self._resources.get(ppg_id.key) if ppg_id and ppg_id.type == PPG else None
            if stored_ppg is None:
                raise ArmError(404, "NotFound", f"The Resource '{ppg}' was not found.", "proximityPlacementGroup")
            if stored_ppg["location"] != location:
                raise invalid_parameter(f"Proximity placement group {ppg} is in location '{stored_ppg['location']}', "
                                        f"not in the virtual machine's '{location}'.", "proximityPlacementGroup")
        data_disks, new_disks = self._vm_data_disks(storage.get("dataDisks") or [], rid, location)
        made = []
        if not old:
            os_disk, disk_body = self._vm_os_disk(storage.get("osDisk") or {}, rid, location, image, image_gb)
            made.append(disk_body)
        made += new_disks
        stored_props = {k: v for k, v in props.items() if k not in ("userData", "evictionPolicy", "billingProfile")}
        stored_props.update(
            hardwareProfile={**(props.get("hardwareProfile") or {}), "vmSize": size_name},
            storageProfile={**storage, "imageReference": image, "osDisk": os_disk, "dataDisks": data_disks,
                            "diskControllerType": storage.get("diskControllerType") or "SCSI"},
            osProfile=os_profile, networkProfile={"networkInterfaces": nics}, **spot,
            vmId=old["properties"]["vmId"] if old else str(uuid.uuid4()),
            timeCreated=old["properties"]["timeCreated"] if old else self._now())
        if ppg:
            stored_props["proximityPlacementGroup"] = {"id": stored_ppg["id"]}
        identity = self._access.identity(str(rid), body.get("identity"), (old or {}).get("identity"))
        extra = {"zones": body["zones"]} if body.get("zones") else {}
        stored = self._tracked(rid, location, body["tags"], stored_props, **extra,
                               **({"identity": identity} if identity else {}))
        for disk in made:
            self._resources[disk["id"].lower()] = disk
        if not old:
            self._guests[rid.key] = _Guest(make_host_keys(), os_profile["computerName"])

        def finish() -> None:
            guest = self._guests.get(rid.key)
            if guest and guest.power == "starting":
                self._boot(rid.key)

        def undo() -> None:
            for disk in made:
                self._resources.pop(disk["id"].lower(), None)
            if not old:
                self._guests.pop(rid.key, None)
                self._access.forget(str(rid))
            elif old.get("identity") != identity:
                self._access.identity(str(rid), old.get("identity") or {"type": "None"}, old.get("identity"))

        context = {"size": size_name, "cores": size.vcpus, "family": size.family, "location": location}
        op, status = self._store(rid, stored, old, "compute", state="Updating" if old else "Creating",
                                 finish=finish, undo=undo, context=context)
        return _Reply(status, self._view(rid.key), self._op_headers(op, location=False))

    def _vm_unchanged(self, old: dict, props: dict, spot: dict) -> tuple[dict, dict, dict]:
        """The parts an update keeps (osProfile, image, OS disk); 409 PropertyChangeNotAllowed where it changes
        one that cannot change."""
        kept = old["properties"]
        given = props.get("osProfile") or {}
        for name in ("computerName", "adminUsername"):
            if given.get(name) and given[name] != kept["osProfile"][name]:
                raise ArmError(409, "PropertyChangeNotAllowed", f"Changing property 'osProfile.{name}' is not "
                                                                "allowed.", f"osProfile.{name}")
        if spot["priority"] != kept["priority"]:
            raise ArmError(409, "PropertyChangeNotAllowed", "Changing property 'priority' is not allowed.", "priority")
        image = (props.get("storageProfile") or {}).get("imageReference")
        if image and {k: str(v).lower() for k, v in image.items() if k != "exactVersion"} != {
                k: str(v).lower() for k, v in kept["storageProfile"]["imageReference"].items() if k != "exactVersion"}:
            raise ArmError(409, "PropertyChangeNotAllowed", "Changing property 'imageReference' is not allowed.",
                           "imageReference")
        os_disk = dict(kept["storageProfile"]["osDisk"])
        delete_option = ((props.get("storageProfile") or {}).get("osDisk") or {}).get("deleteOption")
        if delete_option:
            os_disk["deleteOption"] = delete_option
        return kept["osProfile"], kept["storageProfile"]["imageReference"], os_disk

    def _image_for(self, ref: dict | None, location: str) -> tuple[dict, int]:
        """The imageReference as CRP keeps it and the image's OS disk size; 404 as CRP answers for an image it
        cannot find in the VM's location."""
        if not ref:
            raise invalid_parameter("Required parameter 'imageReference' is missing (null).", "imageReference")
        if not ref.get("id"):
            if ref.get("sharedGalleryImageId") or ref.get("communityGalleryImageId"):
                raise invalid_parameter("This stand-in serves managed images, gallery images of this subscription "
                                        "and Canonical's Ubuntu 24.04 only.", "imageReference")
            exact = marketplace_version(ref)
            reference = {k: ref[k] for k in ("publisher", "offer", "sku", "version")} | {"exactVersion": exact}
            return reference, IMAGE_DISK_GB
        rid = parse_id(ref["id"])
        types = tuple(t.lower() for t in rid.types) if rid and rid.namespace.lower() == "microsoft.compute" else ()
        if types == ("images",):
            image = self._resources.get(rid.key)
            if image is None or image["location"] != location:
                raise ArmError(404, "NotFound", f"The Image '{ref['id']}' cannot be found in '{location}' region.",
                               "imageReference")
            return {"id": image["id"]}, image["properties"]["storageProfile"]["osDisk"]["diskSizeGB"]
        if types in (("galleries", "images"), ("galleries", "images", "versions")):
            version = self._gallery_version(rid, location)
            return {"id": ref["id"]}, version["properties"]["storageProfile"]["osDiskImage"]["sizeInGB"]
        raise invalid_parameter(f"The value '{ref['id']}' of parameter 'imageReference.id' is invalid.",
                                "imageReference.id")

    def _gallery_version(self, rid: ResourceId, location: str) -> dict:
        """The gallery image version an image id names (a definition or `versions/latest`: its newest one not
        excluded from latest), replicated to `location`; 404 GalleryImageNotFound otherwise."""
        whole = len(rid.types) == 2 or rid.name.lower() == "latest"
        definition = rid if len(rid.types) == 2 else rid.parent
        versions = [v for k, v in self._of_type(GALLERY_VERSION) if parse_id(k).parent.key == definition.key
                    and (not whole or not v["properties"]["publishingProfile"]["excludeFromLatest"])
                    and (whole or k == rid.key)
                    and location in {t["name"].replace(" ", "").lower()
                                     for t in v["properties"]["publishingProfile"]["targetRegions"]}]
        if not versions:
            raise ArmError(404, "GalleryImageNotFound",
                           f"The gallery image {rid} is not available in {location} region. Please contact image "
                           "owner to replicate to this region, or change your requested region.", "imageReference")
        return max(versions, key=lambda v: version_key(v["name"]))

    def _vm_os_disk(self, given: dict, rid: ResourceId, location: str, image: dict,
                    image_gb: int) -> tuple[dict, dict]:
        """The OS disk entry of a new VM and the disk it makes from its image."""
        if (given.get("createOption") or "FromImage") != "FromImage":
            raise invalid_parameter("This stand-in makes OS disks FromImage only.", "osDisk.createOption")
        name = given.get("name") or f"{rid.name}_OsDisk_1_{uuid.uuid4().hex}"
        disk_id = self._id(rid.group, DISK, name)
        if disk_id.key in self._resources:
            raise ArmError(409, "ConflictingUserInput",
                           f"A disk with name {name} already exists in Resource Group {rid.group.upper()}. 'Name' is "
                           "an optional property for a disk and a unique name will be generated if not provided.",
                           "/disks/" + name)
        size = given.get("diskSizeGB") or image_gb
        if size < image_gb:
            raise invalid_parameter(f"The specified disk size {size} GB is smaller than the size of the "
                                    f"corresponding disk in the VM image: {image_gb} GB.", "osDisk.diskSizeGB")
        sku = (given.get("managedDisk") or {}).get("storageAccountType") or "Premium_LRS"
        source = {"imageReference": {"id": image["id"]}} if "id" in image else {"imageReference": {
            "id": f"/Subscriptions/{self.subscription}/Providers/Microsoft.Compute/Locations/{location}/Publishers/"
                  f"{image['publisher']}/ArtifactTypes/VMImage/Offers/{image['offer']}/Skus/{image['sku']}/"
                  f"Versions/{image['exactVersion']}"}}
        disk = self._disk_body(disk_id, location, {}, sku, size, {"createOption": "FromImage", **source},
                               {"osType": "Linux", "hyperVGeneration": "V2"})
        entry = {"osType": "Linux", "name": name, "createOption": "FromImage",
                 "caching": given.get("caching") or "ReadWrite", "writeAcceleratorEnabled": False,
                 "managedDisk": {"storageAccountType": sku, "id": disk["id"]},
                 "deleteOption": given.get("deleteOption") or "Detach", "diskSizeGB": size}
        return entry, disk

    def _vm_data_disks(self, given: list, rid: ResourceId, location: str) -> tuple[list, list]:
        """The data disk entries of a VM and the new disks they make; 400/404/409 where CRP refuses one."""
        entries, made, luns = [], [], set()
        for disk in given:
            lun = disk.get("lun")
            if not isinstance(lun, int) or not 0 <= lun <= 63:
                raise invalid_parameter(f"The value {lun} of parameter 'dataDisk.lun' is invalid: 0 to 63.",
                                        "dataDisks.lun")
            if lun in luns:
                raise invalid_parameter(f"A disk at LUN {lun} already exists.", "dataDisks")
            luns.add(lun)
            ref = (disk.get("managedDisk") or {}).get("id")
            option = disk.get("createOption")
            entry = {"lun": lun, "caching": disk.get("caching") or "None", "writeAcceleratorEnabled": False,
                     "deleteOption": disk.get("deleteOption") or "Detach", "toBeDetached": False}
            if ref:
                disk_id = parse_id(ref)
                stored = self._resources.get(disk_id.key) if disk_id and disk_id.type == DISK else None
                if stored is None:
                    raise ArmError(404, "NotFound", f"Disk {disk_id.name if disk_id else ref} is not found.",
                                   "dataDisks.managedDisk.id")
                user = self._disk_user(disk_id.key)
                if user and user.lower() != rid.key:
                    raise ArmError(409, "OperationNotAllowed", f"Disk {stored['name']} is already attached to VM "
                                                               f"{user}.", "dataDisks")
                if stored["location"] != location:
                    raise invalid_parameter(f"Disk {stored['id']} is in location '{stored['location']}'; it can be "
                                            f"attached to a virtual machine in that location only, not in "
                                            f"'{location}'.", "dataDisks")
                entries.append({**entry, "name": stored["name"], "createOption": option or "Attach",
                                "managedDisk": {"storageAccountType": stored["sku"]["name"], "id": stored["id"]},
                                "diskSizeGB": stored["properties"]["diskSizeGB"]})
            elif option == "Empty":
                size = disk.get("diskSizeGB")
                if not isinstance(size, int) or size < 1:
                    raise invalid_parameter("Required parameter 'dataDisk.diskSizeGB' is missing (null).",
                                            "dataDisks.diskSizeGB")
                name = disk.get("name") or f"{rid.name}_disk{lun + 2}_{uuid.uuid4().hex}"
                disk_id = self._id(rid.group, DISK, name)
                if disk_id.key in self._resources or any(m["id"].lower() == disk_id.key for m in made):
                    raise ArmError(409, "ConflictingUserInput", f"A disk with name {name} already exists in Resource "
                                                                f"Group {rid.group.upper()}.", "/disks/" + name)
                sku = (disk.get("managedDisk") or {}).get("storageAccountType") or "Premium_LRS"
                made.append(self._disk_body(disk_id, location, {}, sku, size, {"createOption": "Empty"}))
                entries.append({**entry, "name": name, "createOption": "Empty", "diskSizeGB": size,
                                "managedDisk": {"storageAccountType": sku, "id": made[-1]["id"]}})
            else:
                raise invalid_parameter(f"The value '{option}' of parameter 'dataDisk.createOption' is not served: "
                                        "Attach (with managedDisk.id) or Empty.", "dataDisks.createOption")
        return entries, made

    def _vm_nics(self, props: dict, rid: ResourceId, location: str) -> list[dict]:
        network = props.get("networkProfile") or {}
        if network.get("networkInterfaceConfigurations"):
            raise invalid_parameter("This stand-in attaches existing network interfaces only.",
                                    "networkProfile.networkInterfaceConfigurations")
        refs = network.get("networkInterfaces") or []
        if not refs:
            raise invalid_parameter("Required parameter 'networkProfile' is missing (null).", "networkProfile")
        entries = []
        for ref in refs:
            nic_id = parse_id(ref.get("id"))
            nic = self._resources.get(nic_id.key) if nic_id and nic_id.type == NIC else None
            if nic is None:
                raise ArmError(404, "NotFound", f"Resource {ref.get('id')} not found.", "networkProfile")
            if nic["location"] != location:
                raise invalid_parameter(f"Network interface {nic['id']} is in location '{nic['location']}'; a "
                                        f"virtual machine in '{location}' cannot use it.", "networkProfile")
            user = self._nic_user(nic_id.key)
            if user and user.lower() != rid.key:
                raise ArmError(400, "NicInUse", f"Network Interface {nic['id']} is used by existing resource {user}. "
                                                "A network interface can be attached to one virtual machine only.")
            given = ref.get("properties") or {}
            entries.append({"id": nic["id"], "properties": {
                **given, "deleteOption": given.get("deleteOption") or "Detach"}})
        if len(entries) > 1 and sum(bool(e["properties"].get("primary")) for e in entries) != 1:
            raise invalid_parameter(f"Virtual machine {rid.name} must have one network interface set as the "
                                    "primary.", "networkProfile.networkInterfaces")
        return entries

    def _boot(self, key: str) -> None:
        """The VM boots: running, a new boot on its serial console."""
        guest = self._guests[key]
        guest.power = "running"
        early, late = boot_log(guest.host, guest.keys, len(guest.boots), datetime.now(UTC))
        guest.boots.append((early, late, time.monotonic() + self.boot_delay))

    def _remove_vm(self, key: str) -> None:
        """The VM goes, and with it the OS disk, data disks and NICs whose deleteOption says Delete."""
        vm = self._resources.pop(key, None)
        self._guests.pop(key, None)
        if vm is None:
            return
        self._access.forget(vm["id"])
        storage = vm["properties"]["storageProfile"]
        for disk in [storage["osDisk"], *storage["dataDisks"]]:
            if disk.get("deleteOption") == "Delete":
                self._resources.pop(disk["managedDisk"]["id"].lower(), None)
        for nic in vm["properties"]["networkProfile"]["networkInterfaces"]:
            if nic["properties"].get("deleteOption") == "Delete":
                self._resources.pop(nic["id"].lower(), None)

    def _size_here(self, name: object, location: str) -> tuple[str, VmSize]:
        """A VM size offered in `location` and open to this subscription: 400 as vm_size where it is not offered,
        409 SkuNotAvailable where it is restricted."""
        size_name, size = vm_size(name)
        if not offered(size, location):
            raise invalid_parameter(f"The requested VM size {size_name} is not available in the current region. "
                                    "Find out more on the available VM sizes in each region at "
                                    "https://aka.ms/azure-regions.", "vmSize")
        if (size_name, location) in self._restricted:
            raise ArmError(409, "SkuNotAvailable",
                           f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: "
                           f"{size_name}' is currently not available in location '{location}'. Please try another "
                           "size or deploy to a different location or different zone. See "
                           "https://aka.ms/azureskunotavailable for details.")
        return size_name, size

    def _skus_list(self, request: _Request) -> _Reply:
        wanted = request.query.get("$filter")
        found = re.fullmatch(r"location eq '([^']*)'", wanted or "")
        if wanted and not found:
            raise ArmError(400, "InvalidFilterInQueryString", f"Invalid $filter '{wanted}': only location eq "
                                                              "'<location>' is supported.")
        places = [found[1]] if found else list(self.locations)
        return self._paged(request, [sku_document(name, size, place, self._restricted.get((name, place), ""))
                                     for place in places for name, size in VM_SIZES.items()
                                     if offered(size, place) and place in self.locations])

    def _vm_get(self, request: _Request) -> _Reply:
        rid = self._existing(request)
        expand = request.query.get("$expand", "")
        if expand not in ("", "instanceView", "userData", "resiliencyPolicy"):
            raise invalid_parameter(f"The value '{expand}' of parameter '$expand' is invalid.", "$expand")
        return _Reply(200, self._view(rid.key, expand=expand == "instanceView"))

    def _vm_instance_view(self, request: _Request) -> _Reply:
        return _Reply(200, self._instance_view(self._existing(request).key))

    def _instance_view(self, key: str) -> dict:
        vm, guest = self._resources[key], self._guests[key]
        state = vm["properties"]["provisioningState"]
        when = self._now()
        statuses = [{"code": f"ProvisioningState/{state.lower()}", "level": "Info",
                     "displayStatus": f"Provisioning {state.lower()}", "time": when},
                    {"code": f"PowerState/{guest.power}", "level": "Info", "displayStatus": POWER_TEXT[guest.power]}]
        storage = vm["properties"]["storageProfile"]
        view = {"computerName": guest.host, "osName": "ubuntu", "osVersion": "24.04", "hyperVGeneration": "V2",
                "disks": [{"name": d["name"], "statuses": [{"code": "ProvisioningState/succeeded", "level": "Info",
                                                            "displayStatus": "Provisioning succeeded", "time": when}]}
                          for d in [storage["osDisk"], *storage["dataDisks"]]],
                "statuses": statuses}
        if guest.power == "running":
            view["vmAgent"] = {"vmAgentVersion": "2.13.1.1", "statuses": [{
                "code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Ready",
                "message": "Guest Agent is running", "time": when}]}
        return view

    def _vm_power(self, request: _Request) -> _Reply:
        rid = self._existing(request)
        vm, guest = self._resources[rid.key], self._guests[rid.key]
        action = request.op.split(".")[1]
        state = vm["properties"]["provisioningState"]
        if state in ("Creating", "Deleting"):
            raise ArmError(409, "OperationNotAllowed", f"Operation '{action}' is not allowed on VM '{rid.name}' since "
                                                       f"the VM is being {state.lower()[:-3]}ed.")
        target, passing = {"powerOff": ("stopped", "stopping"), "deallocate": ("deallocated", "deallocating"),
                           "start": ("running", "starting")}[action]
        before = guest.power
        if before == "deallocated" and target == "stopped":
            target = passing = before  # a deallocated VM stays deallocated
        if before != target:
            guest.power = passing
        vm["properties"]["provisioningState"] = "Updating"

        def finish() -> None:
            if self._guests.get(rid.key) is guest and guest.power == passing:
                if target == "running":
                    self._boot(rid.key)
                else:
                    guest.power = target
            vm["properties"]["provisioningState"] = "Succeeded"

        def undo() -> None:
            guest.power = before
            vm["properties"]["provisioningState"] = state

        context = self._fault_context(vm)
        op = self._begin("compute", vm["location"], finish, undo, context)
        return _Reply(202, None, self._op_headers(op))

    # -------------------------------------------------------------------------------------------- role assignments

    def _scope_of(self, request: _Request, *, existing: bool = False) -> str:
        """The scope of a role assignment call; for a new assignment it must exist (a subscription, a group or a
        resource), while one whose scope was deleted can still be read and deleted."""
        scope = request.path[:request.path.lower().rindex("/providers/microsoft.authorization/")]
        parts = scope.strip("/").split("/")
        if not existing:
            return scope
        if len(parts) > 2:
            self._group(parts[3])
        if len(parts) > 4 and scope.lower() not in self._resources:
            rid = parse_id(scope)
            raise resource_not_found(rid.type if rid else scope, parts[-1], parts[3])
        return scope

    def _assignment_put(self, request: _Request) -> _Reply:
        status, made = self._access.put(self._scope_of(request, existing=True), request.params["n1"], request.body)
        return _Reply(status, made)

    def _assignment_get(self, request: _Request) -> _Reply:
        return _Reply(200, self._access.get(self._scope_of(request), request.params["n1"]))

    def _assignment_delete(self, request: _Request) -> _Reply:
        gone = self._access.delete(self._scope_of(request), request.params["n1"])
        return _Reply(200, gone) if gone else _Reply(204)

    def _vm_boot_diagnostics(self, request: _Request) -> _Reply:
        rid = self._existing(request)
        vm, guest = self._resources[rid.key], self._guests[rid.key]
        diagnostics = (vm["properties"].get("diagnosticsProfile") or {}).get("bootDiagnostics") or {}
        if not diagnostics.get("enabled"):
            raise ArmError(409, "OperationNotAllowed", f"Boot diagnostics is not enabled for the virtual machine "
                                                       f"'{rid.name}'. Enable diagnosticsProfile.bootDiagnostics to "
                                                       "retrieve its boot diagnostics data.")
        minutes = request.query.get("sasUriExpirationTimeInMinutes") or "120"
        if not minutes.isdigit() or not 1 <= int(minutes) <= 1440:
            raise invalid_parameter(f"The value {minutes} of parameter 'sasUriExpirationTimeInMinutes' is invalid.",
                                    "sasUriExpirationTimeInMinutes")
        signature = secrets.token_urlsafe(24)
        guest.signatures[signature] = time.time() + int(minutes) * 60
        expiry = (datetime.now(UTC) + timedelta(minutes=int(minutes))).strftime("%Y-%m-%dT%H:%M:%SZ")
        query = urlencode({"sv": SAS_VERSION, "sr": "b", "se": expiry, "sp": "r", "sig": signature})
        base = f"{self.endpoint}/blobs/{quote(rid.name)}"
        return _Reply(200, {"consoleScreenshotBlobUri": f"{base}/screenshot.bmp?{query}",
                            "serialConsoleLogBlobUri": f"{base}/serial.log?{query}"})

    def _blob_get(self, request: _Request) -> _Reply:
        """A boot diagnostics blob, as Blob Storage answers a SAS URL (XML errors, no bearer token)."""
        signature = request.query.get("sig", "")
        guest = next((g for k, g in self._guests.items() if signature in g.signatures
                      and parse_id(k).name.lower() == request.params["n1"].lower()), None)
        if guest is None or guest.signatures[signature] < time.time() or request.query.get("sp") != "r":
            return _Reply(403, "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>AuthenticationFailed</Code>"
                               "<Message>Server failed to authenticate the request. Make sure the value of "
                               "Authorization header is formed correctly including the signature.</Message></Error>",
                          content_type="application/xml")
        headers = {"x-ms-blob-type": "BlockBlob", "x-ms-version": SAS_VERSION}
        if request.params["blob"] == "serial.log":
            return _Reply(200, guest.serial(time.monotonic()), headers, "text/plain")
        if request.params["blob"] == "screenshot.bmp":
            pixel = b"BM:\x00\x00\x00\x00\x00\x00\x006\x00\x00\x00(\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00" \
                    b"\x01\x00\x18\x00\x00\x00\x00\x00\x04\x00\x00\x00\x13\x0b\x00\x00\x13\x0b" + bytes(12)
            return _Reply(200, pixel, headers, "image/bmp")
        return _Reply(404, "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>BlobNotFound</Code><Message>The "
                           "specified blob does not exist.</Message></Error>", content_type="application/xml")


# ---------------------------------------------------------------------------------------------------------- TLS, HTTP


def make_tls(directory: Path, host: str = "127.0.0.1") -> tuple[str, str, str]:
    """A throwaway CA and a server certificate it signs for `host` (and localhost): (CA file, cert file, key file)."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    server_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kiln ARM stand-in CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
          .not_valid_after(now + timedelta(days=7))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    with contextlib.suppress(ValueError):
        names.insert(0, x509.IPAddress(ipaddress.ip_address(host)))
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=7))
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                           crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
              .sign(ca_key, hashes.SHA256()))
    files = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    files[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    files[2].write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    files[2].chmod(0o600)
    return str(files[0]), str(files[1]), str(files[2])


class _Server(QuietServer):
    """HTTPS: the TLS handshake in each connection's thread."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, context: ssl.SSLContext):
        self.context = context
        super().__init__(address, handler)

    def finish_request(self, request, client_address) -> None:
        request.settimeout(30)
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle wait between headers and body
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return  # a client that does not trust the CA, or went away
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                tls.close()


def _handler(arm: Arm) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30
        wbufsize = 1 << 16  # headers and body leave in one write

        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            reply = arm._serve(self.command, self.path, self.headers, raw)
            body = reply.body
            data = (json.dumps(body).encode() if isinstance(body, dict) else body.encode() if isinstance(body, str)
                    else body or b"")
            self.send_response(reply.status)
            if data:
                self.send_header("Content-Type", reply.content_type)
            for name, value in {"Cache-Control": "no-cache", "x-ms-request-id": str(uuid.uuid4()), **reply.headers
                                }.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = do_HEAD = _reply

        def log_message(self, *args) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.arm", description="a stand-in Azure Resource Manager")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    parser.add_argument("--subscription", default="00000000-0000-0000-0000-000000000000")
    parser.add_argument("--location", action="append", dest="locations", help="a location served (repeatable)")
    parser.add_argument("--op-delay", type=float, default=0.05, help="seconds until an operation completes")
    parser.add_argument("--image", action="append", default=[], metavar="GROUP/NAME", help="a managed image to serve")
    args = parser.parse_args(argv)
    arm = Arm(args.subscription, args.locations or ("eastus", "westus2"), args.op_delay, host=args.host,
              port=args.port)
    for image in args.image:
        group, _, name = image.partition("/")
        arm.add_image(group, name)
    print(f"serving ARM for subscription {arm.subscription} at {arm.endpoint}\nCA file: {arm.ca_file}\n"
          f"bearer token: {arm.credential().get_token().token}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so the CA's temporary directory goes too
    try:
        arm._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        arm._tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
