"""The Compute Engine stand-in's pure rules (testbed.gce): machine types, the API's errors, resource references,
names, labels and metadata as GCE checks them, list filters and pages."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from google.cloud import compute_v1

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
