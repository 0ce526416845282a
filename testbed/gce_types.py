"""What the Compute Engine stand-in's modules share: the guest inside an instance (host keys, serial port), the
records of an operation and of a fault set by a test, and the JSON form of the API's messages."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from google.cloud import compute_v1
from google.protobuf.json_format import ParseError

from localcloud.guest import cloud_init_host_keys
from testbed.gce_rules import ApiError


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
class Guest:
    """What runs inside an instance: its host keys, its console, when its last boot finished."""

    keys: list[str]
    static_nat: set[str] = field(default_factory=set)
    boots: list[tuple[str, str, float]] = field(default_factory=list)  # (kernel part, cloud-init part, ready at)

    def serial(self, now: float) -> str:
        return "".join(early + (late if now >= ready else "") for early, late, ready in self.boots)

    def booted(self, now: float) -> bool:
        return bool(self.boots) and now >= self.boots[-1][2]


@dataclass
class Op:
    msg: compute_v1.Operation
    due: float
    finish: Callable[[], None] | None = None
    undo: Callable[[], None] | None = None
    fault: Fault | None = None


@dataclass
class Fault:
    method: str
    reason: str
    code: int
    message: str | None
    countdown: int
    on: str


def parse_body(kind: type, body: str):
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
