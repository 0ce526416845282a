"""A stand-in for the part of the Compute Engine v1 REST API kiln uses, served over plain HTTP on loopback.

No emulator of GCE exists (moto covers AWS only). The official client is pointed here by its own option and nothing
is patched:

    with Gce() as gce:                                   # serves on 127.0.0.1, a free port: gce.endpoint
        gce.add_image("kiln-gpu-1", family="kiln-gpu")
        instances = gce.client(compute_v1.InstancesClient)
        # == compute_v1.InstancesClient(credentials=AnonymousCredentials(),
        #                               client_options={"api_endpoint": gce.endpoint})

It serves one project (and, read-only, the images of other projects added with `add_image(project=...)`) in a few
zones: instances (insert, get, list, aggregatedList, delete, getGuestAttributes, getSerialPortOutput, setLabels,
stop, start, attachDisk), disks (insert, get, list, delete, setLabels), resourcePolicies (insert, get, list, delete),
snapshots and firewalls (global: the same), images (get, getFromFamily, list) and the zone, region and global
operations (get, list, wait). A resource's numeric id serves in place of its name, as in GCE.

How it holds to the real API:
- URIs, verbs and query parameters are those of the library's own REST transport (`transports/rest_base.py`).
- Request bodies are parsed with the library's message types, refusing unknown fields (400), and every answer is
  one of them, written with `to_json` (empty lists left out, as the API does).
- Errors are Google API errors (`{"error": {"code", "message", "errors": [{"message", "domain", "reason"}]}}`), so
  google-api-core raises NotFound, Conflict, BadRequest, PreconditionFailed... as against the real thing. A method
  the stand-in does not serve answers 501, never an empty success.
- Self links are full `https://www.googleapis.com/compute/v1/...` URLs; references in requests may be full URLs
  or partial paths (`zones/Z/machineTypes/T`, `projects/P/global/images/family/F`, `global/networks/default`).
- Every mutating call answers an Operation, RUNNING at first, DONE `op_delay` seconds later (checked at each
  request); `wait` blocks until DONE or WAIT_SECONDS. An instance shows PROVISIONING until its insert is DONE,
  then RUNNING; its serial console then shows the cloud-init host key block of a real Ubuntu boot, and with
  `enable-guest-attributes=TRUE` the guest agent's `hostkeys/` guest attributes, both from real keys made at insert.
- Stopping releases ephemeral external addresses and starting assigns new ones, as GCE does.

Faults for tests: `fail("instances.insert", reason="ZONE_RESOURCE_POOL_EXHAUSTED", code=503, on="operation")`,
`preempt(zone, name)`; `calls` lists (method, path) as served.

As a program (one module for the whole API surface, so it is longer than the house's ~400 lines):

    python -m testbed.gce --port 8089 --zone us-central1-a --image kiln-gpu-1=kiln-gpu
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import ipaddress
import json
import re
import secrets
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1
from google.protobuf.json_format import ParseError

from testbed.guest import QuietServer, cloud_init_host_keys, make_host_keys

API_ROOT = "https://www.googleapis.com/compute/v1/"
ROOTS = (API_ROOT, "https://compute.googleapis.com/compute/v1/", "http://www.googleapis.com/compute/v1/")
DONE = compute_v1.Operation.Status.DONE  # the one enum field kiln meets: compare with it, not with "DONE"
WAIT_SECONDS = 2.0  # the real operations.wait waits up to 2 minutes
NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE_RE = re.compile(r"[a-z0-9_-]{0,63}")
METADATA_KEY_RE = re.compile(r"[a-zA-Z0-9_-]{1,128}")
INTERNAL_RANGE = ipaddress.ip_network("10.128.0.0/20")
NAT_RANGE = ipaddress.ip_network("203.0.113.0/24")
DISK_TYPES = {"pd-standard": 500, "pd-balanced": 100, "pd-ssd": 100}  # type -> default size (GB) of a blank disk
TRUE_WORDS = {"1", "t", "true"}  # the guest agent reads booleans as Go's strconv.ParseBool does
QUOTA_MESSAGE = "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally."
POOL_MESSAGE = ("The zone '{zone}' does not have enough resources available to fulfill the request. "
                "Try a different zone, or try again later.")


@dataclass(frozen=True)
class MachineType:
    vcpus: int
    memory_mb: int
    gpus: int = 0
    accelerator: str = ""


MACHINE_TYPES = {
    "e2-standard-4": MachineType(4, 16384),
    "n2-standard-8": MachineType(8, 32768),
    "g2-standard-4": MachineType(4, 16384, 1, "nvidia-l4"),
    "g2-standard-8": MachineType(8, 32768, 1, "nvidia-l4"),
    "a2-highgpu-1g": MachineType(12, 87040, 1, "nvidia-tesla-a100"),
    "a3-highgpu-8g": MachineType(208, 1916928, 8, "nvidia-h100-80gb"),
}


# ---------------------------------------------------------------------------------------------- errors, references


class ApiError(Exception):
    """An error the API answers: HTTP code, Google reason and message."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def body(self) -> str:
        return json.dumps({"error": {"code": self.code, "message": self.message, "errors": [
            {"message": self.message, "domain": "global", "reason": self.reason}]}})


def not_found(path: str) -> ApiError:
    return ApiError(404, "notFound", f"The resource '{path}' was not found")


def already_exists(path: str) -> ApiError:
    return ApiError(409, "alreadyExists", f"The resource '{path}' already exists")


def invalid(field_name: str, value: object, why: str) -> ApiError:
    return ApiError(400, "invalid", f"Invalid value for field '{field_name}': '{value}'. {why}")


def in_use(kind: str, path: str, user: str) -> ApiError:
    return ApiError(400, "resourceInUseByAnotherResource",
                    f"The {kind} resource '{path}' is already being used by '{user}'")


def not_ready(path: str) -> ApiError:
    return ApiError(400, "resourceNotReady", f"The resource '{path}' is not ready")


def api_url(path: str) -> str:
    return API_ROOT + path


def ref_path(ref: str, project: str) -> str:
    """A reference as the API takes it (full URL, `projects/P/...`, or `zones/...`, `regions/...`, `global/...`)
    as a path `projects/P/...`; "" when it is none of these."""
    for root in ROOTS:
        if ref.startswith(root):
            return ref[len(root):]
    if ref.startswith("projects/"):
        return ref
    if ref.startswith(("zones/", "regions/", "global/")):
        return f"projects/{project}/{ref}"
    return ""


def match_ref(ref: str, project: str, pattern: str) -> dict[str, str] | None:
    """The parts of a reference of the shape `pattern` (`zones/{zone}/disks/{name}`), project included; None when
    it has another shape."""
    regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern)
    found = re.fullmatch(f"projects/(?P<project>[^/]+)/{regex}", ref_path(ref, project))
    return found.groupdict() if found else None


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def scope_of(path: str) -> tuple[str, str]:
    """('zones', Z), ('regions', R) or ('global', '') of a resource path `projects/P/...`."""
    parts = path.split("/")
    return (parts[2], "") if parts[2] == "global" else (parts[2], parts[3])


def valid_name(name: str) -> bool:
    return bool(NAME_RE.fullmatch(name))


def check_name(name: str, field_name: str = "resource.name") -> None:
    if not valid_name(name):
        raise invalid(field_name, name, f"Must be a match of regex '(?:{NAME_RE.pattern})'")


def label_problem(labels: Mapping[str, str]) -> str | None:
    """Why GCE refuses these labels, or None."""
    if len(labels) > 64:
        return f"Resources can have at most 64 labels, not {len(labels)}."
    for key, value in labels.items():
        if not LABEL_KEY_RE.fullmatch(key):
            return (f"Label key '{key}' violates format constraints. The key must start with a lowercase character, "
                    "can only contain lowercase letters, numeric characters, underscores and dashes. The key can be "
                    "at most 63 characters long.")
        if not LABEL_VALUE_RE.fullmatch(value):
            return (f"Label value '{value}' violates format constraints. The value can only contain lowercase "
                    "letters, numeric characters, underscores and dashes. The value can be at most 63 characters "
                    "long.")
    return None


def check_labels(labels: Mapping[str, str], field_name: str = "labels") -> None:
    problem = label_problem(labels)
    if problem:
        raise invalid(field_name, "", problem)


def metadata_problem(items: Iterable[tuple[str, str]]) -> str | None:
    """Why GCE refuses these metadata items, or None."""
    seen: set[str] = set()
    for key, _ in items:
        if not METADATA_KEY_RE.fullmatch(key):
            return f"Metadata key '{key}' must match [a-zA-Z0-9_-]{{1,128}}."
        if key in seen:
            return f"Duplicate metadata key '{key}'."
        seen.add(key)
    return None


def fingerprint(*parts: object) -> str:
    """An opaque fingerprint of the content, as GCE gives (8 bytes, base64)."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def scheduling_with_defaults(given: compute_v1.Scheduling, machine: MachineType) -> compute_v1.Scheduling:
    """The scheduling GCE stores for a request's, with its defaults; ApiError where GCE refuses it."""
    model = given.provisioning_model or "STANDARD"
    if model not in ("STANDARD", "SPOT"):
        raise invalid("resource.scheduling.provisioningModel", model, "Unknown provisioning model.")
    spot = model == "SPOT"
    action = given.instance_termination_action
    if spot and action not in ("STOP", "DELETE"):
        raise invalid("resource.scheduling.instanceTerminationAction", action,
                      "Spot VMs must name an instance termination action, STOP or DELETE.")
    if spot and "automatic_restart" in given and given.automatic_restart:
        raise invalid("resource.scheduling.automaticRestart", "true", "Spot VMs cannot be automatically restarted.")
    maintenance = given.on_host_maintenance or ("TERMINATE" if spot else "MIGRATE")
    if maintenance not in ("MIGRATE", "TERMINATE"):
        raise invalid("resource.scheduling.onHostMaintenance", maintenance, "Unknown maintenance policy.")
    if maintenance == "MIGRATE" and spot:
        raise invalid("resource.scheduling.onHostMaintenance", maintenance, "Spot VMs do not support live migration.")
    if maintenance == "MIGRATE" and machine.gpus:
        raise invalid("resource.scheduling.onHostMaintenance", maintenance,
                      "Instances with guest accelerators do not support live migration.")
    stored = compute_v1.Scheduling.deserialize(compute_v1.Scheduling.serialize(given))
    stored.provisioning_model = model
    stored.on_host_maintenance = maintenance
    stored.automatic_restart = given.automatic_restart if "automatic_restart" in given else not spot
    stored.preemptible = given.preemptible
    return stored


# -------------------------------------------------------------------------------------------- list filters, pages


@dataclass(frozen=True)
class Term:
    """One filter expression: `name = "X"`, `labels.KEY = "V"` or (value None) `labels.KEY:*`."""

    attribute: str
    key: str
    value: str | None


FILTER_HELP = 'this stand-in knows only labels.KEY = "VALUE", labels.KEY:* and name = "X", joined by spaces or AND'
_VALUE = r'(?:"(?P<{0}>[^"]*)"|(?P<{0}_bare>[^\s()"]+))'
_TERM = re.compile(r"\s*(?P<open>\(?)\s*(?:labels\.(?P<key>[a-z][a-z0-9_-]*)\s*(?:(?P<has>:\s*\*)|=\s*"
                   + _VALUE.format("lv") + r")|name\s*=\s*" + _VALUE.format("nv") + r")\s*(?P<close>\)?)")


def parse_filter(text: str) -> tuple[Term, ...]:
    """The terms of a list filter; ApiError (400) for any expression outside FILTER_HELP."""
    terms: list[Term] = []
    bare = 0  # terms without parentheses: the API takes several expressions only each in its own
    position = 0
    text = text.strip()
    while position < len(text):
        if terms:
            position = re.compile(r"\s*(?:AND(?=[\s(]))?").match(text, position).end()
        found = _TERM.match(text, position)
        if not found or bool(found["open"]) != bool(found["close"]) or found.end() == position:
            raise invalid("filter", text, f"Invalid list filter expression: {FILTER_HELP}.")
        bare += not found["open"]
        if found["key"]:
            value = None if found["has"] else (found["lv"] if found["lv"] is not None else found["lv_bare"])
            terms.append(Term("labels", found["key"], value))
        else:
            terms.append(Term("name", "", found["nv"] if found["nv"] is not None else found["nv_bare"]))
        position = found.end()
    if len(terms) > 1 and bare:
        raise invalid("filter", text, "Invalid list filter expression: to filter on multiple expressions, provide "
                                      "each separate expression within parentheses.")
    return tuple(terms)


def filter_matches(terms: Iterable[Term], name: str, labels: Mapping[str, str]) -> bool:
    for term in terms:
        if term.attribute == "name" and name != term.value:
            return False
        if term.attribute == "labels" and (term.key not in labels or term.value not in (None, labels[term.key])):
            return False
    return True


def page(items: list, max_results: str, token: str) -> tuple[list, str]:
    """One page of `items` and the token of the next ("" at the end), as maxResults and pageToken ask."""
    size = int(max_results) if max_results.isdigit() else 500 if not max_results else -1
    if not 0 <= size <= 500:
        raise invalid("maxResults", max_results, "Must be between 0 and 500.")
    size = size or 500
    try:
        start = int(base64.urlsafe_b64decode(token.encode()).decode()) if token else 0
    except ValueError:
        raise invalid("pageToken", token, "Invalid page token.") from None
    end = start + size
    return items[start:end], base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else ""


# -------------------------------------------------------------------------------------------------- guest side


def boot_log(name: str, keys: list[str], boot: int, when: datetime) -> tuple[str, str]:
    """Serial port 1 of an Ubuntu VM's boot: the kernel's part, then cloud-init's with its host key block."""
    early = (f"[    0.000000] Linux version 6.8.0-1015-gcp (buildd@lcy02-amd64-051) #17~22.04.1-Ubuntu SMP\n"
             f"[    0.000000] Command line: BOOT_IMAGE=/boot/vmlinuz-6.8.0-1015-gcp root=LABEL=cloudimg-rootfs ro "
             f"console=ttyS0\n[    2.104311] systemd[1]: Hostname set to <{name}>.\n"
             f"[    4.218000] cloud-init[512]: Cloud-init v. 24.1.3-0ubuntu1~22.04.5 running 'init' (boot {boot}).\n")
    late = "\n".join([*cloud_init_host_keys(name, keys, when),
                      "[   11.902114] cloud-init[790]: Cloud-init v. 24.1.3-0ubuntu1~22.04.5 finished. Datasource "
                      "DataSourceGCELocal.", f"\nUbuntu 22.04.5 LTS {name} ttyS0\n\n{name} login: "]) + "\n"
    return early, late


@dataclass
class _Guest:
    """What runs inside an instance: its host keys, its console, when its last boot finished."""

    keys: list[str]
    static_nat: set[str] = field(default_factory=set)
    boots: list[tuple[str, str, float]] = field(default_factory=list)  # (kernel part, cloud-init part, ready at)

    def serial(self, now: float) -> str:
        return "".join(early + (late if now >= ready else "") for early, late, ready in self.boots)

    def booted(self, now: float) -> bool:
        return bool(self.boots) and now >= self.boots[-1][2]


@dataclass
class _Op:
    msg: compute_v1.Operation
    due: float
    finish: Callable[[], None] | None = None
    undo: Callable[[], None] | None = None
    fault: _Fault | None = None


@dataclass
class _Fault:
    method: str
    reason: str
    code: int
    message: str | None
    countdown: int
    on: str


def _parse(kind: type, body: str):
    """A request body as the library's message type; unknown fields and wrong types are the API's 400."""
    try:
        return kind.from_json(body or "{}", ignore_unknown_fields=False)
    except ParseError as error:
        found = re.search(r'has no field named "([^"]+)" at "([^"]+)"', str(error))
        message = (f"Invalid JSON payload received. Unknown name \"{found[1]}\" at '{found[2]}': Cannot find field."
                   if found else f"Invalid JSON payload received. {str(error).splitlines()[0]}")
        raise ApiError(400, "invalid", message) from None


def dump(msg) -> str:
    """The JSON the API answers: enums by name, no empty lists or maps."""
    return type(msg).to_json(msg, use_integers_for_enums=False, always_print_fields_with_no_presence=False)


# ------------------------------------------------------------------------------------------------------ service


class Gce:
    """The service: state under one lock, a route table, one group of handlers per resource kind."""

    def __init__(self, project: str = "kiln-test", zones: Iterable[str] = ("us-central1-a", "us-central1-b"),
                 op_delay: float = 0.05, *, host: str = "127.0.0.1", port: int = 0, boot_delay: float = 0.0,
                 machine_types: Mapping[str, Iterable[str]] | None = None):
        """`machine_types` names the types each zone offers (default: all of MACHINE_TYPES in every zone);
        `boot_delay` is how long after RUNNING cloud-init prints the host keys and the guest agent publishes them."""
        self.project = project
        self.zones = tuple(zones)
        self.regions = tuple(dict.fromkeys(region_of(z) for z in self.zones))
        self.op_delay = op_delay
        self.boot_delay = boot_delay
        offered = machine_types or {}
        self.machine_types = {z: set(offered.get(z, MACHINE_TYPES)) & set(MACHINE_TYPES) for z in self.zones}
        self.calls: list[tuple[str, str]] = []
        self._resources: dict[str, object] = {}  # path projects/P/... -> message
        self._guests: dict[str, _Guest] = {}  # instance path -> its guest
        self._ops: dict[str, _Op] = {}  # operation path -> operation
        self._faults: list[_Fault] = []
        self._request_ids: dict[tuple[str, str], str] = {}  # (method, requestId) -> operation path
        self._last_stamp = datetime.min.replace(tzinfo=UTC)
        self._next_nat = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.add_network("default")
        self._routes = self._route_table()
        self._server = QuietServer((host, port), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    # ------------------------------------------------------------------------------------------- for tests

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def client(self, kind: type):
        """A compute_v1 client of `kind` (InstancesClient, ...) pointed here, with anonymous credentials."""
        return kind(credentials=AnonymousCredentials(), client_options={"api_endpoint": self.endpoint})

    def add_image(self, name: str, family: str | None = None, labels: Mapping[str, str] | None = None, *,
                  project: str | None = None, disk_size_gb: int = 10, deprecated: bool = False) -> str:
        """Add a READY image (to `project`, default this one: public image projects too); its self link."""
        check_name(name)
        check_labels(labels or {})
        with self._lock:
            path = f"projects/{project or self.project}/global/images/{name}"
            image = compute_v1.Image(
                kind="compute#image", id=self._id(), creation_timestamp=self._stamp(), name=name, family=family or "",
                labels=dict(labels or {}), label_fingerprint=fingerprint(labels or {}), self_link=api_url(path),
                status="READY", disk_size_gb=disk_size_gb, source_type="RAW", architecture="X86_64",
                archive_size_bytes=disk_size_gb * 2**28, storage_locations=["us"])
            if deprecated:
                image.deprecated = compute_v1.DeprecationStatus(state="DEPRECATED")
            self._resources[path] = image
            return image.self_link

    def add_network(self, name: str) -> str:
        """Add an auto-mode VPC network (a subnetwork of its name in every region); its self link."""
        check_name(name)
        path = f"projects/{self.project}/global/networks/{name}"
        with self._lock:
            self._resources[path] = compute_v1.Network(
                kind="compute#network", id=self._id(), name=name, self_link=api_url(path),
                creation_timestamp=self._stamp(), auto_create_subnetworks=True,
                subnetworks=[api_url(f"projects/{self.project}/regions/{r}/subnetworks/{name}") for r in self.regions])
        return api_url(path)

    def host_keys(self, zone: str, name: str) -> list[str]:
        """The host keys the instance really has: `<type> <base64>` lines."""
        with self._lock:
            path = self._path("zones", zone, "instances", name)
            if path not in self._guests:
                raise KeyError(path)
            return list(self._guests[path].keys)

    def fail(self, method: str, *, reason: str, code: int, message: str | None = None, nth: int = 1,
             on: str = "call") -> None:
        """Make the nth call of `method` from now ("instances.insert") fail: at once with that HTTP code and
        reason (on="call"), or as a DONE operation with that error (on="operation": reason is the operation's
        error code, e.g. QUOTA_EXCEEDED, ZONE_RESOURCE_POOL_EXHAUSTED) while nothing is made."""
        methods = {name for _, _, name, _ in self._routes}
        if method not in methods:
            raise ValueError(f"no method {method!r}: one of {sorted(methods)}")
        if on not in ("call", "operation") or nth < 1:
            raise ValueError("on is 'call' or 'operation', nth at least 1")
        if on == "operation" and not self._mutating(method):
            raise ValueError(f"{method} answers no operation")
        with self._lock:
            self._faults.append(_Fault(method, reason, code, message, nth, on))

    def preempt(self, zone: str, name: str) -> None:
        """Preempt a running SPOT instance as GCE does: TERMINATED, or deleted if its termination action says so;
        a `compute.instances.preempted` operation records it."""
        with self._lock:
            self._settle()
            path = self._path("zones", zone, "instances", name)
            inst = self._resources.get(path)
            if inst is None or inst.scheduling.provisioning_model != "SPOT" or inst.status != "RUNNING":
                raise ValueError(f"{path} is no running SPOT instance")
            op = self._operation("compute.instances.preempted", path, inst.id)
            if inst.scheduling.instance_termination_action == "DELETE":
                self._remove_instance(path)
            else:
                self._stopped(path)
            self._complete(self._ops[ref_path(op.self_link, self.project)])

    # -------------------------------------------------------------------------------------------- plumbing

    def __enter__(self) -> Gce:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _path(self, scope: str, where: str, collection: str, name: str) -> str:
        middle = "global" if scope == "global" else f"{scope}/{where}"
        return f"projects/{self.project}/{middle}/{collection}/{name}"

    def _id(self) -> int:
        return secrets.randbelow(2**63 - 2**62) + 2**62

    def _stamp(self) -> str:
        """Now, RFC 3339, strictly after the last stamp (so creation order is creationTimestamp order)."""
        now = max(datetime.now(UTC), self._last_stamp + timedelta(milliseconds=1))
        self._last_stamp = now
        return now.isoformat(timespec="milliseconds")

    @staticmethod
    def _mutating(method: str) -> bool:
        return not method.endswith((".get", ".list", ".aggregatedList", ".wait", ".getFromFamily",
                                    ".getGuestAttributes", ".getSerialPortOutput"))

    def _route_table(self) -> list[tuple[str, re.Pattern, str, Callable]]:
        p = "/compute/v1/projects/{project}"
        inst = p + "/zones/{zone}/instances/{instance}"
        table = [
            ("GET", p + "/zones/{zone}/instances", "instances.list", self._list),
            ("POST", p + "/zones/{zone}/instances", "instances.insert", self._instances_insert),
            ("GET", p + "/aggregated/instances", "instances.aggregatedList", self._aggregated),
            ("GET", p + "/aggregated/disks", "disks.aggregatedList", self._aggregated),
            ("GET", p + "/aggregated/resourcePolicies", "resourcePolicies.aggregatedList", self._aggregated),
            ("GET", inst, "instances.get", self._get_one),
            ("DELETE", inst, "instances.delete", self._instances_delete),
            ("GET", inst + "/getGuestAttributes", "instances.getGuestAttributes", self._instances_guest_attributes),
            ("GET", inst + "/serialPort", "instances.getSerialPortOutput", self._instances_serial),
            ("POST", inst + "/setLabels", "instances.setLabels", self._set_labels),
            ("POST", inst + "/stop", "instances.stop", self._instances_stop),
            ("POST", inst + "/start", "instances.start", self._instances_start),
            ("POST", inst + "/attachDisk", "instances.attachDisk", self._instances_attach_disk),
            ("GET", p + "/zones/{zone}/disks", "disks.list", self._list),
            ("POST", p + "/zones/{zone}/disks", "disks.insert", self._disks_insert),
            ("GET", p + "/zones/{zone}/disks/{disk}", "disks.get", self._get_one),
            ("DELETE", p + "/zones/{zone}/disks/{disk}", "disks.delete", self._disks_delete),
            ("POST", p + "/zones/{zone}/disks/{disk}/setLabels", "disks.setLabels", self._set_labels),
            ("GET", p + "/global/snapshots", "snapshots.list", self._list),
            ("POST", p + "/global/snapshots", "snapshots.insert", self._snapshots_insert),
            ("GET", p + "/global/snapshots/{snapshot}", "snapshots.get", self._get_one),
            ("DELETE", p + "/global/snapshots/{snapshot}", "snapshots.delete", self._delete_plain),
            ("GET", p + "/global/images", "images.list", self._list),
            ("GET", p + "/global/images/family/{family}", "images.getFromFamily", self._images_from_family),
            ("GET", p + "/global/images/{image}", "images.get", self._get_one),
            ("GET", p + "/global/firewalls", "firewalls.list", self._list),
            ("POST", p + "/global/firewalls", "firewalls.insert", self._firewalls_insert),
            ("GET", p + "/global/firewalls/{firewall}", "firewalls.get", self._get_one),
            ("DELETE", p + "/global/firewalls/{firewall}", "firewalls.delete", self._delete_plain),
            ("GET", p + "/regions/{region}/resourcePolicies", "resourcePolicies.list", self._list),
            ("POST", p + "/regions/{region}/resourcePolicies", "resourcePolicies.insert", self._policies_insert),
            ("GET", p + "/regions/{region}/resourcePolicies/{policy}", "resourcePolicies.get", self._get_one),
            ("DELETE", p + "/regions/{region}/resourcePolicies/{policy}", "resourcePolicies.delete",
             self._policies_delete),
        ]
        for scope, service in (("/zones/{zone}", "zoneOperations"), ("/regions/{region}", "regionOperations"),
                               ("/global", "globalOperations")):
            ops = p + scope + "/operations"
            table += [("GET", ops, f"{service}.list", self._list),
                      ("GET", ops + "/{operation}", f"{service}.get", self._operations_get),
                      ("POST", ops + "/{operation}/wait", f"{service}.wait", self._operations_wait)]
        return [(verb, re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", uri) + "$"), name, handler)
                for verb, uri, name, handler in table]

    def _serve(self, verb: str, target: str, body: str) -> tuple[int, str]:
        """Answer one request: (status, JSON)."""
        split = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        route = next(((found, method, handler) for route_verb, pattern, method, handler in self._routes
                      if route_verb == verb and (found := pattern.match(split.path))), None)
        if route is None:
            with self._lock:
                self.calls.append((f"{verb} ?", split.path))
            return 501, ApiError(501, "notImplemented", f"The GCE stand-in does not serve {verb} {split.path}").body()
        found, method, handler = route
        params = {k: unquote(v) for k, v in found.groupdict().items()}
        with self._lock:
            self.calls.append((method, split.path))
            try:
                self._settle()
                return 200, dump(self._call(method, handler, params, query, body))
            except ApiError as error:
                return error.code, error.body()
            except Exception:  # a bug of the stand-in: say so, as a 500 the client shows
                return 500, ApiError(500, "backendError", traceback.format_exc()).body()

    def _call(self, method: str, handler: Callable, params: dict[str, str], query: dict[str, str], body: str):
        self._check_scope(method, params)
        request_id = query.get("requestId", "")
        if request_id and (method, request_id) in self._request_ids:  # a retried request: its first operation
            return self._ops[self._request_ids[method, request_id]].msg
        fault = self._take_fault(method)
        if fault and fault.on == "call":
            raise ApiError(fault.code, fault.reason, fault.message or HTTPStatus(fault.code).phrase)
        answer = handler(method, params, query, body)
        if isinstance(answer, compute_v1.Operation):
            op_path = ref_path(answer.self_link, self.project)
            self._ops[op_path].fault = fault
            if request_id:
                self._request_ids[method, request_id] = op_path
                answer.client_operation_id = request_id
        return answer

    def _check_scope(self, method: str, params: dict[str, str]) -> None:
        project = params["project"]
        image_projects = {path.split("/")[1] for path in self._resources if "/global/images/" in path}
        if project != self.project and not (method.startswith("images.") and project in image_projects):
            raise not_found(f"projects/{project}")
        if "zone" in params and params["zone"] not in self.zones:
            raise invalid("zone", params["zone"], "Unknown zone.")
        if "region" in params and params["region"] not in self.regions:
            raise invalid("region", params["region"], "Unknown region.")

    def _take_fault(self, method: str) -> _Fault | None:
        """The fault this call of `method` meets, if any (nth counts the calls since the fault was set)."""
        mine = [fault for fault in self._faults if fault.method == method]
        for fault in mine:
            fault.countdown -= 1
        due = [fault for fault in mine if fault.countdown == 0]
        for fault in due:
            self._faults.remove(fault)
        return due[0] if due else None

    def _target(self, params: dict[str, str], collection: str) -> str:
        """The path of the resource a request names (projects/P/zones/Z/instances/X ...); a numeric id in place
        of the name, as GCE takes it, names the resource of that id."""
        names = [v for k, v in params.items() if k not in ("project", "zone", "region")]
        scope = (f"zones/{params['zone']}" if "zone" in params else
                 f"regions/{params['region']}" if "region" in params else "global")
        parent = f"projects/{params['project']}/{scope}/{collection}"
        if not names:
            return parent
        path = f"{parent}/{names[0]}"
        if path not in self._resources and names[0].isdigit():
            return next((p for p, m in self._resources.items() if p.rsplit("/", 1)[0] == parent
                         and m.id == int(names[0])), path)
        return path

    def _existing(self, path: str):
        if path not in self._resources:
            raise not_found(path)
        return self._resources[path]

    # -------------------------------------------------------------------------------------------- operations

    def _operation(self, op_type: str, target: str, target_id: int, *, finish: Callable[[], None] | None = None,
                   undo: Callable[[], None] | None = None) -> compute_v1.Operation:
        """Start an operation on `target` (a path): RUNNING now, DONE op_delay from now; then `finish` runs, or,
        where a fault fails it, `undo`."""
        scope, where = scope_of(target)
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}-{secrets.token_hex(4)}"
        path = self._path(scope, where, "operations", name)
        now = self._stamp()
        op = compute_v1.Operation(
            kind="compute#operation", id=self._id(), name=name, operation_type=op_type, target_link=api_url(target),
            target_id=target_id, status="RUNNING", user=f"anonymous@{self.project}.iam.gserviceaccount.com",
            progress=0, insert_time=now, start_time=now, self_link=api_url(path))
        if scope == "zones":
            op.zone = api_url(f"projects/{self.project}/zones/{where}")
        elif scope == "regions":
            op.region = api_url(f"projects/{self.project}/regions/{where}")
        self._ops[path] = _Op(op, time.monotonic() + self.op_delay, finish, undo)
        self._resources[path] = op
        return op

    def _settle(self) -> None:
        """Complete the operations that are due, in the order they began."""
        now = time.monotonic()
        for op in list(self._ops.values()):
            if op.msg.status != DONE and op.due <= now:
                self._complete(op)

    def _complete(self, op: _Op) -> None:
        fault = op.fault
        if fault:
            if op.undo:
                op.undo()
            default = {"QUOTA_EXCEEDED": QUOTA_MESSAGE, "ZONE_RESOURCE_POOL_EXHAUSTED": POOL_MESSAGE
                       }.get(fault.reason, HTTPStatus(fault.code).phrase)
            message = fault.message or default.format(zone=ref_path(op.msg.zone, self.project))
            error = compute_v1.Errors(code=fault.reason, message=message)
            if fault.reason == "QUOTA_EXCEEDED" and not fault.message:
                error.error_details = [compute_v1.ErrorDetails(quota_info=compute_v1.QuotaExceededInfo(
                    metric_name="compute.googleapis.com/gpus_all_regions", limit_name="GPUS-ALL-REGIONS-per-project",
                    limit=0.0))]
            op.msg.error = compute_v1.Error(errors=[error])
            op.msg.http_error_status_code = fault.code
            op.msg.http_error_message = HTTPStatus(fault.code).phrase.upper()
        elif op.finish:
            op.finish()
        op.msg.status = DONE
        op.msg.progress = 100
        op.msg.end_time = self._stamp()
        self._changed.notify_all()

    def _operations_get(self, method, params, query, body):
        return self._op_of(params).msg

    def _op_of(self, params: dict[str, str]) -> _Op:
        path = self._target(params, "operations")
        if path not in self._ops:
            raise not_found(path)
        return self._ops[path]

    def _operations_wait(self, method, params, query, body):
        op = self._op_of(params)
        deadline = time.monotonic() + WAIT_SECONDS
        while op.msg.status != DONE and (left := deadline - time.monotonic()) > 0:
            self._changed.wait(min(left, max(op.due - time.monotonic(), 0.001)))  # releases the lock meanwhile
            self._settle()
        return op.msg

    # ------------------------------------------------------------------------------------------- common verbs

    @staticmethod
    def _collection(method: str) -> str:
        """The collection a method works on: instances.get -> instances, zoneOperations.wait -> operations."""
        kind = method.split(".")[0]
        return "operations" if kind.endswith("Operations") else kind

    def _get_one(self, method, params, query, body):
        return self._existing(self._target(params, self._collection(method)))

    def _list(self, method, params, query, body):
        collection = self._collection(method)
        parent = self._target(params, collection)
        items = self._filtered([msg for path, msg in self._resources.items() if path.rsplit("/", 1)[0] == parent],
                               query)
        chosen, token = page(items, query.get("maxResults", ""), query.get("pageToken", ""))
        list_type, kind = {
            "instances": (compute_v1.InstanceList, "compute#instanceList"),
            "disks": (compute_v1.DiskList, "compute#diskList"),
            "snapshots": (compute_v1.SnapshotList, "compute#snapshotList"),
            "images": (compute_v1.ImageList, "compute#imageList"),
            "firewalls": (compute_v1.FirewallList, "compute#firewallList"),
            "resourcePolicies": (compute_v1.ResourcePolicyList, "compute#resourcePolicyList"),
            "operations": (compute_v1.OperationList, "compute#operationList"),
        }[collection]
        return list_type(kind=kind, id=parent, items=chosen, next_page_token=token, self_link=api_url(parent))

    @staticmethod
    def _filtered(items: list, query: dict[str, str]) -> list:
        terms = parse_filter(query.get("filter", ""))
        items = [m for m in items if filter_matches(terms, m.name, dict(getattr(m, "labels", None) or {}))]
        order = query.get("orderBy", "")
        if order not in ("", "name", "creationTimestamp desc"):
            raise invalid("orderBy", order, "Sorting is supported only by name or by creationTimestamp desc.")
        if order == "creationTimestamp desc":
            return sorted(items, key=lambda m: datetime.fromisoformat(m.creation_timestamp), reverse=True)
        return sorted(items, key=lambda m: m.name)

    def _delete_plain(self, method, params, query, body):
        path = self._target(params, self._collection(method))
        target = self._existing(path)
        return self._operation("delete", path, target.id, finish=lambda: self._resources.pop(path, None))

    def _insert(self, path: str, resource, finish: Callable[[], None] | None = None) -> compute_v1.Operation:
        """Store a new resource at once; a failed operation takes it away again."""
        self._resources[path] = resource
        return self._operation("insert", path, resource.id, finish=finish, undo=lambda: self._resources.pop(path, None))

    def _stamped(self, resource, kind: str, path: str):
        resource.kind = kind
        resource.id = self._id()
        resource.creation_timestamp = self._stamp()
        resource.self_link = api_url(path)
        return resource

    # -------------------------------------------------------------------------------------------- instances

    def _aggregated(self, method, params, query, body):
        """instances, disks or resourcePolicies in every zone (region) of the project, by scope, as
        aggregatedList answers: a scope with nothing on this page carries the NO_RESULTS_ON_PAGE warning."""
        collection = method.split(".", 1)[0]
        scope, scopes = ("regions", self.regions) if collection == "resourcePolicies" else ("zones", self.zones)
        everything = [msg for path, msg in self._resources.items()
                      if path.split("/")[2] == scope and path.split("/")[4] == collection]
        items = sorted(self._filtered(everything, query), key=lambda m: (m.self_link, m.name))
        chosen, token = page(items, query.get("maxResults", ""), query.get("pageToken", ""))
        scoped_type, list_type, field_name, kind = {
            "instances": (compute_v1.InstancesScopedList, compute_v1.InstanceAggregatedList, "instances",
                          "compute#instanceAggregatedList"),
            "disks": (compute_v1.DisksScopedList, compute_v1.DiskAggregatedList, "disks",
                      "compute#diskAggregatedList"),
            "resourcePolicies": (compute_v1.ResourcePoliciesScopedList, compute_v1.ResourcePolicyAggregatedList,
                                 "resource_policies", "compute#resourcePolicyAggregatedList"),
        }[collection]
        scoped = {}
        for where in scopes:
            here = [m for m in chosen if f"/{scope}/{where}/" in m.self_link]
            scoped[f"{scope}/{where}"] = scoped_type(**{field_name: here}) if here else scoped_type(
                warning=compute_v1.Warning(
                    code="NO_RESULTS_ON_PAGE",
                    message=f"There are no results for scope '{scope}/{where}' on this page.",
                    data=[compute_v1.Data(key="scope", value=f"{scope}/{where}")]))
        parent = f"projects/{self.project}/aggregated/{collection}"
        return list_type(kind=kind, id=parent, items=scoped, next_page_token=token, self_link=api_url(parent))

    def _machine_type(self, ref: str, zone: str) -> tuple[str, MachineType]:
        found = match_ref(ref, self.project, "zones/{zone}/machineTypes/{name}")
        if not found or found["project"] != self.project or found["zone"] != zone \
                or found["name"] not in self.machine_types[zone]:
            name = found["name"] if found else ref
            raise invalid("resource.machineType", ref, f"Machine type with name '{name}' does not exist in zone "
                                                       f"'{zone}'.")
        return found["name"], MACHINE_TYPES[found["name"]]

    def _instances_insert(self, method, params, query, body):
        zone = params["zone"]
        inst = _parse(compute_v1.Instance, body)
        check_name(inst.name)
        path = self._path("zones", zone, "instances", inst.name)
        if path in self._resources:
            raise already_exists(path)
        type_name, machine = self._machine_type(inst.machine_type, zone)
        check_labels(inst.labels)
        problem = metadata_problem((i.key, i.value) for i in inst.metadata.items)
        if problem:
            raise invalid("resource.metadata", "", problem)
        scheduling = scheduling_with_defaults(inst.scheduling, machine)
        accelerators = self._accelerators(inst, zone, machine)
        policies = [self._policy_for(ref, zone, type_name, i) for i, ref in enumerate(inst.resource_policies)]
        attached, new_disks = self._plan_disks(inst, zone)
        nics, static_nat = self._plan_nics(inst.network_interfaces, region_of(zone))
        keys = make_host_keys()

        self._stamped(inst, "compute#instance", path)
        inst.zone = api_url(f"projects/{self.project}/zones/{zone}")
        inst.machine_type = api_url(f"projects/{self.project}/zones/{zone}/machineTypes/{type_name}")
        inst.status = "PROVISIONING"
        inst.scheduling = scheduling
        inst.guest_accelerators = accelerators
        inst.resource_policies = policies
        inst.disks = attached
        inst.network_interfaces = nics
        inst.label_fingerprint = fingerprint(dict(inst.labels))
        inst.metadata.kind = "compute#metadata"
        inst.metadata.fingerprint = fingerprint([(i.key, i.value) for i in inst.metadata.items])
        inst.tags.fingerprint = fingerprint(list(inst.tags.items))
        inst.fingerprint = fingerprint(path, inst.id, inst.creation_timestamp)
        inst.cpu_platform = "Intel Cascade Lake"
        for disk in new_disks:
            self._resources[ref_path(disk.self_link, self.project)] = disk
        for att in attached:
            disk = self._resources[ref_path(att.source, self.project)]
            disk.users.append(inst.self_link)
            disk.last_attach_timestamp = inst.creation_timestamp
        self._guests[path] = _Guest(keys, static_nat)

        def finish() -> None:
            for disk in new_disks:
                disk.status = "READY"
            if path in self._guests:
                self._running(path)

        def undo() -> None:
            self._remove_instance(path, delete_disks=False)
            for disk in new_disks:
                self._resources.pop(ref_path(disk.self_link, self.project), None)

        self._resources[path] = inst
        return self._operation("insert", path, inst.id, finish=finish, undo=undo)

    def _accelerators(self, inst: compute_v1.Instance, zone: str, machine: MachineType) -> list:
        wanted = [compute_v1.AcceleratorConfig(accelerator_type=api_url(
            f"projects/{self.project}/zones/{zone}/acceleratorTypes/{machine.accelerator}"),
            accelerator_count=machine.gpus)] if machine.gpus else []
        given = [(a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count) for a in inst.guest_accelerators]
        if given and given != [(machine.accelerator, machine.gpus)]:
            raise invalid("resource.guestAccelerators", given, "The accelerators must match the machine type's.")
        return wanted

    def _policy_for(self, ref: str, zone: str, type_name: str, index: int) -> str:
        field_name = f"resource.resourcePolicies[{index}]"
        found = match_ref(ref, self.project, "regions/{region}/resourcePolicies/{name}")
        if not found:
            raise invalid(field_name, ref, "The URL is malformed.")
        if found["region"] != region_of(zone):
            raise invalid(field_name, ref, "Resource policy must be in the same region as the instance.")
        path = ref_path(ref, self.project)
        policy = self._existing(path)
        if policy.group_placement_policy.collocation == "COLLOCATED" and type_name.startswith("e2-"):
            raise invalid(field_name, ref, f"Compact placement is not supported for machine type {type_name}.")
        return api_url(path)

    def _disk_users(self, disk_url: str) -> list[tuple[str, str]]:
        """(instance self link, mode) of every instance the disk is attached to."""
        return [(inst.self_link, att.mode) for path, inst in self._resources.items() if path in self._guests
                for att in inst.disks if att.source == disk_url]

    def _plan_disks(self, inst: compute_v1.Instance, zone: str) -> tuple[list, list]:
        """The instance's attached disks as GCE stores them, and the new disks to make; ApiError where refused."""
        if not inst.disks:
            raise invalid("resource.disks", "", "No disks are specified.")
        if [d.boot for d in inst.disks].count(True) != 1 or not inst.disks[0].boot:
            raise invalid("resource.disks", "", "Exactly one boot disk must be specified, first.")
        attached, new = [], []
        for i, given in enumerate(inst.disks):
            field_name = f"resource.disks[{i}]"
            if given.source:
                disk = self._attachable(given, zone, field_name)
            else:
                params = given.initialize_params
                name = params.disk_name or (inst.name if given.boot else f"{inst.name}-{i}")
                path = self._path("zones", zone, "disks", name)
                if path in self._resources or any(d.name == name for d in new):
                    raise already_exists(path)
                disk = self._build_disk(zone, name, params.disk_size_gb if "disk_size_gb" in params else 0,
                                        params.disk_type, params.source_image, params.source_snapshot,
                                        dict(params.labels), f"{field_name}.initializeParams")
                new.append(disk)
            attached.append(self._attached(given, disk, i))
        return attached, new

    def _attachable(self, given: compute_v1.AttachedDisk, zone: str, field_name: str) -> compute_v1.Disk:
        """The existing disk an attachment names, if it may be attached in this mode; ApiError otherwise."""
        found = match_ref(given.source, self.project, "zones/{zone}/disks/{name}")
        if not found:
            raise invalid(f"{field_name}.source", given.source, "The URL is malformed.")
        path = ref_path(given.source, self.project)
        disk = self._existing(path)
        if found["zone"] != zone:
            raise invalid(f"{field_name}.source", given.source, "The disk must be in the instance's zone.")
        if disk.status != "READY":
            raise not_ready(path)
        users = self._disk_users(disk.self_link)
        if users and ((given.mode or "READ_WRITE") == "READ_WRITE" or any(m == "READ_WRITE" for _, m in users)):
            raise in_use("disk", path, ref_path(users[0][0], self.project))
        return disk

    @staticmethod
    def _attached(given: compute_v1.AttachedDisk, disk: compute_v1.Disk, index: int) -> compute_v1.AttachedDisk:
        return compute_v1.AttachedDisk(
            kind="compute#attachedDisk", type_="PERSISTENT", mode=given.mode or "READ_WRITE", source=disk.self_link,
            device_name=given.device_name or f"persistent-disk-{index}", index=index, boot=given.boot,
            auto_delete=given.auto_delete, interface=given.interface or "SCSI", disk_size_gb=disk.size_gb)

    def _instances_attach_disk(self, method, params, query, body):
        path = self._target(params, "instances")
        inst = self._existing(path)
        given = _parse(compute_v1.AttachedDisk, body)
        if given.boot or not given.source:
            raise invalid("resource.source", given.source, "Only an existing, non-boot disk can be attached.")
        disk = self._attachable(given, params["zone"], "resource")
        device = given.device_name or f"persistent-disk-{len(inst.disks)}"
        if any(att.device_name == device for att in inst.disks):
            raise invalid("resource.deviceName", device, "The device name is already in use on the instance.")
        inst.disks.append(self._attached(given, disk, len(inst.disks)))
        disk.users.append(inst.self_link)
        disk.last_attach_timestamp = self._stamp()

        def undo() -> None:
            inst.disks = [att for att in inst.disks if att.source != disk.self_link]
            disk.users = [u for u in disk.users if u != inst.self_link]

        return self._operation("attachDisk", path, inst.id, undo=undo)

    def _plan_nics(self, given: list, region: str) -> tuple[list, set[str]]:
        """The instance's network interfaces with their addresses, and the external addresses it asked for."""
        if not given:
            raise invalid("resource.networkInterfaces", "", "At least one network interface is required.")
        used_ips = self._addresses("network_i_p")
        used_nat = self._addresses("nat_i_p")
        static: set[str] = set()
        nics = []
        for i, nic in enumerate(given):
            field_name = f"resource.networkInterfaces[{i}]"
            network_ref = nic.network or "global/networks/default"
            if not match_ref(network_ref, self.project, "global/networks/{name}"):
                raise invalid(f"{field_name}.network", network_ref, "The URL is malformed.")
            network = self._existing(ref_path(network_ref, self.project))
            subnet = api_url(f"projects/{self.project}/regions/{region}/subnetworks/{network.name}")
            if nic.subnetwork:
                found = match_ref(nic.subnetwork, self.project, "regions/{region}/subnetworks/{name}")
                if not found or found["region"] != region:
                    raise invalid(f"{field_name}.subnetwork", nic.subnetwork, "The subnetwork must be in the "
                                                                              "instance's region.")
                if api_url(ref_path(nic.subnetwork, self.project)) != subnet:
                    raise not_found(ref_path(nic.subnetwork, self.project))
            if nic.network_i_p:
                if nic.network_i_p in used_ips or ipaddress.ip_address(nic.network_i_p) not in INTERNAL_RANGE:
                    raise invalid(f"{field_name}.networkIP", nic.network_i_p, "IP address is in use or out of the "
                                                                              "subnetwork's range.")
                address = nic.network_i_p
            else:
                address = next(str(ip) for ip in list(INTERNAL_RANGE.hosts())[1:] if str(ip) not in used_ips)
            used_ips.add(address)
            configs = []
            for config in nic.access_configs:
                config.kind = "compute#accessConfig"
                config.type_ = config.type_ or "ONE_TO_ONE_NAT"
                config.name = config.name or "External NAT"
                config.network_tier = config.network_tier or "PREMIUM"
                if config.nat_i_p:
                    static.add(config.nat_i_p)
                elif config.type_ == "ONE_TO_ONE_NAT":
                    config.nat_i_p = self._nat_address(used_nat)
                used_nat.add(config.nat_i_p)
                configs.append(config)
            nics.append(compute_v1.NetworkInterface(
                kind="compute#networkInterface", name=f"nic{i}", network=network.self_link, subnetwork=subnet,
                network_i_p=address, access_configs=configs, stack_type="IPV4_ONLY", fingerprint=fingerprint(
                    address, i)))
        return nics, static

    def _addresses(self, attribute: str) -> set[str]:
        nics = [nic for path in self._guests for nic in self._resources[path].network_interfaces]
        if attribute == "network_i_p":
            return {nic.network_i_p for nic in nics}
        return {c.nat_i_p for nic in nics for c in nic.access_configs if c.nat_i_p}

    def _nat_address(self, used: set[str]) -> str:
        """The next free ephemeral external address, round robin (a restarted instance gets another)."""
        hosts = list(NAT_RANGE.hosts())
        for step in range(len(hosts)):
            address = str(hosts[(self._next_nat + step) % len(hosts)])
            if address not in used:
                self._next_nat = (self._next_nat + step + 1) % len(hosts)
                return address
        raise ApiError(403, "quotaExceeded", "Quota 'IN_USE_ADDRESSES' exceeded. Limit: 254.0 in region.")

    def _running(self, path: str) -> None:
        """The instance boots: RUNNING, external addresses, a new boot on its console."""
        inst, guest = self._resources[path], self._guests[path]
        used = self._addresses("nat_i_p")
        for nic in inst.network_interfaces:
            for config in nic.access_configs:
                if config.type_ == "ONE_TO_ONE_NAT" and not config.nat_i_p:
                    config.nat_i_p = self._nat_address(used)
                    used.add(config.nat_i_p)
        inst.status = "RUNNING"
        inst.last_start_timestamp = self._stamp()
        early, late = boot_log(inst.name, guest.keys, len(guest.boots), datetime.now(UTC))
        guest.boots.append((early, late, time.monotonic() + self.boot_delay))

    def _stopped(self, path: str) -> None:
        """The instance stops: TERMINATED, its ephemeral external addresses released."""
        inst, guest = self._resources[path], self._guests[path]
        for nic in inst.network_interfaces:
            for config in nic.access_configs:
                if config.nat_i_p not in guest.static_nat:
                    config.nat_i_p = ""
        inst.status = "TERMINATED"
        inst.last_stop_timestamp = self._stamp()

    def _remove_instance(self, path: str, delete_disks: bool = True) -> None:
        """The instance goes: disks it deletes with it go too, the others are detached."""
        inst = self._resources.pop(path, None)
        self._guests.pop(path, None)
        for att in inst.disks if inst else ():
            disk_path = ref_path(att.source, self.project)
            disk = self._resources.get(disk_path)
            if disk is None:
                continue
            if att.auto_delete and delete_disks:
                del self._resources[disk_path]
            else:
                disk.users = [u for u in disk.users if u != inst.self_link]
                disk.last_detach_timestamp = self._stamp()

    def _instances_delete(self, method, params, query, body):
        path = self._target(params, "instances")
        inst = self._existing(path)
        before = inst.status
        inst.status = "STOPPING"
        return self._operation("delete", path, inst.id, finish=lambda: self._remove_instance(path),
                               undo=lambda: setattr(inst, "status", before))

    def _instances_stop(self, method, params, query, body):
        path = self._target(params, "instances")
        inst = self._existing(path)
        before = inst.status
        if before != "TERMINATED":
            inst.status = "STOPPING"

        def finish() -> None:
            if path in self._guests and inst.status != "TERMINATED":
                self._stopped(path)

        return self._operation("stop", path, inst.id, finish=finish, undo=lambda: setattr(inst, "status", before))

    def _instances_start(self, method, params, query, body):
        path = self._target(params, "instances")
        inst = self._existing(path)
        before = inst.status
        if before == "TERMINATED":
            inst.status = "STAGING"

        def finish() -> None:
            if path in self._guests and inst.status in ("TERMINATED", "STOPPING", "STAGING"):
                self._running(path)

        return self._operation("start", path, inst.id, finish=finish, undo=lambda: setattr(inst, "status", before))

    def _set_labels(self, method, params, query, body):
        """instances.setLabels and disks.setLabels: the labels replaced, if the fingerprint is the current one."""
        collection = self._collection(method)
        path = self._target(params, collection)
        target = self._existing(path)
        kind = compute_v1.InstancesSetLabelsRequest if collection == "instances" else compute_v1.ZoneSetLabelsRequest
        request = _parse(kind, body)
        check_labels(request.labels)
        if request.label_fingerprint != target.label_fingerprint:
            raise ApiError(412, "conditionNotMet", "Labels fingerprint either invalid or resource labels have changed")
        before = dict(target.labels)
        target.labels = dict(request.labels)
        target.label_fingerprint = fingerprint(dict(request.labels), target.id, time.monotonic_ns())

        def undo() -> None:
            target.labels = before
            target.label_fingerprint = fingerprint(before, target.id, time.monotonic_ns())

        return self._operation("setLabels", path, target.id, undo=undo)

    def _instances_serial(self, method, params, query, body):
        path = self._target(params, "instances")
        self._existing(path)
        port = int(query.get("port") or 1)
        if not 1 <= port <= 4:
            raise invalid("port", port, "Must be between 1 and 4.")
        contents = self._guests[path].serial(time.monotonic()) if port == 1 else ""
        start = min(int(query.get("start") or 0), len(contents))
        return compute_v1.SerialPortOutput(kind="compute#serialPortOutput", contents=contents[start:], start=start,
                                           next_=len(contents), self_link=api_url(path) + f"/serialPort?port={port}")

    def _instances_guest_attributes(self, method, params, query, body):
        path = self._target(params, "instances")
        inst = self._existing(path)
        query_path = query.get("queryPath", "")
        variable = query.get("variableKey", "")
        flag = next((i.value for i in inst.metadata.items if i.key == "enable-guest-attributes"), "")
        published = inst.status == "RUNNING" and flag.lower() in TRUE_WORDS and \
            self._guests[path].booted(time.monotonic())
        entries = {key.split()[0]: key.split()[1] for key in self._guests[path].keys} if published else {}
        answer = compute_v1.GuestAttributes(kind="compute#guestAttributes",
                                            self_link=api_url(path) + "/getGuestAttributes")
        if query_path in ("hostkeys/", "hostkeys") and entries and not variable:
            answer.query_path = query_path
            answer.query_value = compute_v1.GuestAttributesValue(items=[
                compute_v1.GuestAttributesEntry(namespace="hostkeys", key=k, value=v) for k, v in entries.items()])
            return answer
        if variable.startswith("hostkeys/") and variable.split("/", 1)[1] in entries:
            answer.variable_key = variable
            answer.variable_value = entries[variable.split("/", 1)[1]]
            return answer
        raise not_found(f"{path}/guestAttributes/{query_path or variable}")

    # -------------------------------------------------------------------------------------------- disks, snapshots

    def _build_disk(self, zone: str, name: str, size_gb: int, type_ref: str, image_ref: str, snapshot_ref: str,
                    labels: dict[str, str], field_name: str) -> compute_v1.Disk:
        """A new disk (CREATING) as GCE makes it for disks.insert or an instance's initializeParams."""
        check_name(name, f"{field_name}.name")
        check_labels(labels, f"{field_name}.labels")
        type_ref = type_ref or f"zones/{zone}/diskTypes/pd-standard"
        found = match_ref(type_ref, self.project, "zones/{zone}/diskTypes/{name}")
        if not found or found["zone"] != zone or found["name"] not in DISK_TYPES:
            raise invalid(f"{field_name}.diskType", type_ref, "Disk type does not exist in the disk's zone.")
        path = self._path("zones", zone, "disks", name)
        disk = self._stamped(compute_v1.Disk(name=name, labels=labels, status="CREATING"), "compute#disk", path)
        disk.zone = api_url(f"projects/{self.project}/zones/{zone}")
        disk.type_ = api_url(ref_path(type_ref, self.project))
        disk.label_fingerprint = fingerprint(labels)
        disk.physical_block_size_bytes = 4096
        source_size, what = DISK_TYPES[found["name"]], ""
        if image_ref:
            image = self._image(image_ref, f"{field_name}.sourceImage")
            disk.source_image, disk.source_image_id = image.self_link, str(image.id)
            source_size, what = image.disk_size_gb, "image"
        if snapshot_ref:
            if not match_ref(snapshot_ref, self.project, "global/snapshots/{name}"):
                raise invalid(f"{field_name}.sourceSnapshot", snapshot_ref, "The URL is malformed.")
            snapshot = self._existing(ref_path(snapshot_ref, self.project))
            if snapshot.status != "READY":
                raise not_ready(ref_path(snapshot.self_link, self.project))
            disk.source_snapshot, disk.source_snapshot_id = snapshot.self_link, str(snapshot.id)
            source_size, what = snapshot.disk_size_gb, "snapshot"
        if size_gb and what and size_gb < source_size:
            raise invalid(f"{field_name}.diskSizeGb", size_gb,
                          f"Requested disk size cannot be smaller than the {what} size ({source_size} GB).")
        disk.size_gb = size_gb or source_size
        return disk

    def _image(self, ref: str, field_name: str) -> compute_v1.Image:
        family = match_ref(ref, self.project, "global/images/family/{family}")
        if family:
            return self._newest(family["project"], family["family"])
        if not match_ref(ref, self.project, "global/images/{name}"):
            raise invalid(field_name, ref, "The URL is malformed.")
        return self._existing(ref_path(ref, self.project))

    def _newest(self, project: str, family: str) -> compute_v1.Image:
        images = [m for p, m in self._resources.items() if p.startswith(f"projects/{project}/global/images/")
                  and m.family == family and m.deprecated.state in ("", "ACTIVE")]
        if not images:
            raise not_found(f"projects/{project}/global/images/family/{family}")
        return max(images, key=lambda m: datetime.fromisoformat(m.creation_timestamp))

    def _images_from_family(self, method, params, query, body):
        return self._newest(params["project"], params["family"])

    def _disks_insert(self, method, params, query, body):
        zone = params["zone"]
        given = _parse(compute_v1.Disk, body)
        check_name(given.name)
        path = self._path("zones", zone, "disks", given.name)
        if path in self._resources:
            raise already_exists(path)
        disk = self._build_disk(zone, given.name, given.size_gb, given.type_, given.source_image,
                                given.source_snapshot, dict(given.labels), "resource")
        disk.description = given.description
        return self._insert(path, disk, finish=lambda: setattr(disk, "status", "READY"))

    def _disks_delete(self, method, params, query, body):
        path = self._target(params, "disks")
        disk = self._existing(path)
        users = self._disk_users(disk.self_link)
        if users:
            raise in_use("disk", path, ref_path(users[0][0], self.project))
        return self._operation("delete", path, disk.id, finish=lambda: self._resources.pop(path, None))

    def _snapshots_insert(self, method, params, query, body):
        given = _parse(compute_v1.Snapshot, body)
        check_name(given.name)
        check_labels(given.labels)
        path = self._path("global", "", "snapshots", given.name)
        if path in self._resources:
            raise already_exists(path)
        if not match_ref(given.source_disk, self.project, "zones/{zone}/disks/{name}"):
            raise invalid("resource.sourceDisk", given.source_disk, "The URL is malformed.")
        disk = self._existing(ref_path(given.source_disk, self.project))
        if disk.status != "READY":
            raise not_ready(ref_path(disk.self_link, self.project))
        snapshot = self._stamped(given, "compute#snapshot", path)
        snapshot.status = "CREATING"
        snapshot.source_disk, snapshot.source_disk_id = disk.self_link, str(disk.id)
        snapshot.disk_size_gb = disk.size_gb
        snapshot.storage_bytes = disk.size_gb * 2**27
        snapshot.storage_locations = snapshot.storage_locations or ["us"]
        snapshot.snapshot_type = snapshot.snapshot_type or "STANDARD"
        snapshot.label_fingerprint = fingerprint(dict(snapshot.labels))
        return self._insert(path, snapshot, finish=lambda: setattr(snapshot, "status", "READY"))

    # -------------------------------------------------------------------------------------------- firewalls, policies

    def _firewalls_insert(self, method, params, query, body):
        rule = _parse(compute_v1.Firewall, body)
        check_name(rule.name)
        path = self._path("global", "", "firewalls", rule.name)
        if path in self._resources:
            raise already_exists(path)
        network_ref = rule.network or "global/networks/default"
        if not match_ref(network_ref, self.project, "global/networks/{name}"):
            raise invalid("resource.network", network_ref, "The URL is malformed.")
        network = self._existing(ref_path(network_ref, self.project))
        for i, cidr in enumerate(rule.source_ranges):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise invalid(f"resource.sourceRanges[{i}]", cidr, "Must be a valid IPV4 or IPV6 range.") from None
        if bool(rule.allowed) == bool(rule.denied):
            raise invalid("resource", "", "Exactly one of allowed or denied must be specified.")
        for i, entry in enumerate([*rule.allowed, *rule.denied]):
            if not (entry.I_p_protocol in ("tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all")
                    or entry.I_p_protocol.isdigit()):
                raise invalid(f"resource.allowed[{i}].IPProtocol", entry.I_p_protocol, "Unknown protocol.")
            for port in entry.ports:
                if not re.fullmatch(r"\d{1,5}(-\d{1,5})?", port) or max(map(int, port.split("-"))) > 65535:
                    raise invalid(f"resource.allowed[{i}].ports", port, "Must be a port or a range of ports.")
        self._stamped(rule, "compute#firewall", path)
        rule.network = network.self_link
        rule.direction = rule.direction or "INGRESS"
        rule.priority = rule.priority if "priority" in rule else 1000
        rule.disabled = rule.disabled
        if rule.direction == "INGRESS" and not (rule.source_ranges or rule.source_tags or
                                                rule.source_service_accounts):
            rule.source_ranges = ["0.0.0.0/0"]
        rule.log_config = compute_v1.FirewallLogConfig(enable=rule.log_config.enable)
        return self._insert(path, rule)

    def _policies_insert(self, method, params, query, body):
        region = params["region"]
        policy = _parse(compute_v1.ResourcePolicy, body)
        check_name(policy.name)
        path = self._path("regions", region, "resourcePolicies", policy.name)
        if path in self._resources:
            raise already_exists(path)
        self._stamped(policy, "compute#resourcePolicy", path)
        policy.region = api_url(f"projects/{self.project}/regions/{region}")
        policy.status = "CREATING"
        return self._insert(path, policy, finish=lambda: setattr(policy, "status", "READY"))

    def _policies_delete(self, method, params, query, body):
        path = self._target(params, "resourcePolicies")
        policy = self._existing(path)
        for inst_path in self._guests:
            if policy.self_link in self._resources[inst_path].resource_policies:
                raise in_use("resource_policy", path, inst_path)
        return self._operation("delete", path, policy.id, finish=lambda: self._resources.pop(path, None))


# ---------------------------------------------------------------------------------------------------------- HTTP


def _handler(gce: Gce) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 60

        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            status, text = gce._serve(self.command, self.path, body)
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _reply

        def log_message(self, *args) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.gce", description="a stand-in Compute Engine v1 API")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    parser.add_argument("--project", default="kiln-test")
    parser.add_argument("--zone", action="append", dest="zones", help="a zone served (repeatable)")
    parser.add_argument("--op-delay", type=float, default=0.05, help="seconds until an operation is DONE")
    parser.add_argument("--image", action="append", default=[], metavar="NAME[=FAMILY]", help="an image to serve")
    args = parser.parse_args(argv)
    gce = Gce(args.project, args.zones or ("us-central1-a", "us-central1-b"), args.op_delay,
              host=args.host, port=args.port)
    for image in args.image:
        name, _, family = image.partition("=")
        gce.add_image(name, family or None)
    print(f"serving GCE for project {gce.project} at {gce.endpoint}", flush=True)
    try:
        gce._server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
