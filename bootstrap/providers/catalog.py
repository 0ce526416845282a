"""The GPU machines each cloud offers, in one place: `kiln up --gpus MODEL:COUNT` finds in it the instance types that
carry COUNT of that GPU on the cloud `--provider` names, and each provider's help lists its entries. Pure.

Each entry is as its cloud's own page of GPU machine types states it (SOURCES); a GPU's name is the one its maker
sells it under, with the memory where one name covers two (A100 40 GB and A100-80GB, as SkyPilot and dstack name
them), and Azure's H100 NVL apart from the SXM H100.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bootstrap.errors import UsageError
from bootstrap.providers import offerings

SOURCES = {
    "aws": "https://aws.amazon.com/ec2/instance-types/#Accelerated_Computing",
    "gcp": "https://cloud.google.com/compute/docs/gpus",
    "azure": "https://learn.microsoft.com/azure/virtual-machines/sizes/overview#gpu-accelerated",
}


@dataclass(frozen=True)
class Machine:
    """An instance type and the GPUs it carries (`count` of `gpu`, `memory_gb` each); `notes`: its fabric."""

    cloud: str
    instance_type: str
    gpu: str
    count: int
    memory_gb: int
    notes: str = ""

    def describe(self) -> str:
        each = f"{self.memory_gb} GB" + (" each" if self.count > 1 else "")
        return ", ".join(filter(None, [f"{self.count} {self.gpu}, {each}", self.notes]))


def _machines(cloud: str, rows: list[tuple]) -> tuple[Machine, ...]:
    return tuple(Machine(cloud, *row) for row in rows)


# Where several types of a cloud carry the same GPUs, the one written first is preferred (the newer generation, the
# simpler network). The first entry of each cloud is its provider's default instance type.
MACHINES = (
    *_machines("aws", [
        ("g6.xlarge", "L4", 1, 24), ("g6.12xlarge", "L4", 4, 24), ("g6.48xlarge", "L4", 8, 24),
        ("g6e.xlarge", "L40S", 1, 48), ("g6e.12xlarge", "L40S", 4, 48), ("g6e.48xlarge", "L40S", 8, 48),
        ("g5.xlarge", "A10G", 1, 24), ("g5.12xlarge", "A10G", 4, 24), ("g5.48xlarge", "A10G", 8, 24),
        ("p4d.24xlarge", "A100", 8, 40, "NVLink, EFA"), ("p4de.24xlarge", "A100-80GB", 8, 80, "NVLink, EFA"),
        ("p5.48xlarge", "H100", 8, 80, "NVLink, EFA"),
        ("p5en.48xlarge", "H200", 8, 141, "NVLink, EFA"), ("p5e.48xlarge", "H200", 8, 141, "NVLink, EFA"),
        ("p6-b200.48xlarge", "B200", 8, 180, "NVLink, EFA"),
    ]),
    *_machines("gcp", [
        ("g2-standard-4", "L4", 1, 24), ("g2-standard-48", "L4", 4, 24), ("g2-standard-96", "L4", 8, 24),
        ("a2-highgpu-1g", "A100", 1, 40), ("a2-highgpu-8g", "A100", 8, 40, "NVLink"),
        ("a2-megagpu-16g", "A100", 16, 40, "NVLink"),
        ("a2-ultragpu-1g", "A100-80GB", 1, 80), ("a2-ultragpu-8g", "A100-80GB", 8, 80, "NVLink"),
        ("a3-highgpu-8g", "H100", 8, 80, "NVLink, GPUDirect-TCPX"),
        ("a3-megagpu-8g", "H100", 8, 80, "NVLink, GPUDirect-TCPXO"),
        ("a3-ultragpu-8g", "H200", 8, 141, "NVLink, GPUDirect RDMA"),
        ("a4-highgpu-8g", "B200", 8, 180, "NVLink, GPUDirect RDMA"),
    ]),
    *_machines("azure", [
        ("Standard_NC24ads_A100_v4", "A100-80GB", 1, 80), ("Standard_NC48ads_A100_v4", "A100-80GB", 2, 80),
        ("Standard_NC96ads_A100_v4", "A100-80GB", 4, 80),
        ("Standard_NC4as_T4_v3", "T4", 1, 16), ("Standard_NC64as_T4_v3", "T4", 4, 16),
        ("Standard_NV36ads_A10_v5", "A10", 1, 24),
        ("Standard_ND96asr_v4", "A100", 8, 40, "NVLink, InfiniBand"),
        ("Standard_ND96amsr_A100_v4", "A100-80GB", 8, 80, "NVLink, InfiniBand"),
        ("Standard_NC40ads_H100_v5", "H100-NVL", 1, 94), ("Standard_NC80adis_H100_v5", "H100-NVL", 2, 94),
        ("Standard_ND96isr_H100_v5", "H100", 8, 80, "NVLink, InfiniBand"),
        ("Standard_ND96isr_H200_v5", "H200", 8, 141, "NVLink, InfiniBand"),
    ]),
)
CLOUDS = tuple(SOURCES)


def of_cloud(cloud: str) -> tuple[Machine, ...]:
    return tuple(machine for machine in MACHINES if machine.cloud == cloud)


def default_type(cloud: str) -> str:
    """The cloud's default instance type: its first entry."""
    return of_cloud(cloud)[0].instance_type


def gpu_names() -> list[str]:
    return sorted({machine.gpu for machine in MACHINES})


def parse_gpus(text: str) -> tuple[str, int]:
    """`MODEL:COUNT` (COUNT 1 when left out) as (the catalog's name of MODEL, COUNT); any case; one line naming what
    is wrong otherwise."""
    model, _, count_text = str(text).strip().partition(":")
    names = {name.lower(): name for name in gpu_names()}
    if model.lower() not in names:
        raise UsageError(f"--gpus {text}: no cloud kiln knows offers {model or 'an unnamed GPU'}; the GPUs: "
                         f"{', '.join(gpu_names())}")
    if count_text and not (count_text.isascii() and count_text.isdigit() and int(count_text) > 0):
        raise UsageError(f"--gpus {text}: the count after ':' must be a whole number above 0, e.g. H100:8")
    return names[model.lower()], int(count_text or 1)


def carrying(gpu: str, count: int, cloud: str) -> list[Machine]:
    """The instance types of `cloud` with exactly `count` of `gpu`, in the catalog's order."""
    return [machine for machine in of_cloud(cloud) if machine.gpu == gpu and machine.count == count]


def choose(text: str, cloud: str) -> list[Machine]:
    """The instance types of `cloud` that `--gpus text` asks for, most preferred first; none is one line saying
    what that cloud offers of that GPU and which clouds carry the count asked."""
    gpu, count = parse_gpus(text)
    found = carrying(gpu, count, cloud)
    if found:
        return found
    counts = sorted({machine.count for machine in of_cloud(cloud) if machine.gpu == gpu})
    elsewhere = [other for other in CLOUDS if other != cloud and carrying(gpu, count, other)]
    offers = (f"kiln's catalog has {gpu} on {cloud} in machines of {', '.join(map(str, counts))}" if counts
              else f"kiln's catalog has no {gpu} on {cloud}")
    where = f"; {gpu}:{count} is on {', '.join(elsewhere)}" if elsewhere else ""
    raise UsageError(f"--gpus {text}: {offers}{where} (--instance-type names any other type)")


def table(cloud: str | None = None, offered: Mapping[str, offerings.Record] | None = None) -> list[str]:
    """The catalog as `kiln gpus` prints it: a line per instance type, by cloud; where `offered` has the cloud's
    offerings, how many regions and zones offer each type to the account, and where that was read."""
    lines = []
    for name in (cloud,) if cloud else CLOUDS:
        record = (offered or {}).get(name)
        lines.append(f"{name} ({SOURCES[name]}):" + (f" where offered: {offerings.describe(record)}" if record else ""))
        for machine in of_cloud(name):
            where = ""
            if record:
                regions, zones = offerings.summary(record, [machine.instance_type])
                low = offerings.cheapest(record, machine.instance_type)
                price = f"; from ${low[0]:g}/h on demand ({low[1]})" if low else ""
                where = f"  [{regions} region(s), {zones} zone(s){price}]" if regions else "  [offered nowhere to you]"
            lines.append(f"  {machine.gpu + ':' + str(machine.count):13} {machine.instance_type:27} "
                         f"{machine.describe()}{where}")
    return lines
