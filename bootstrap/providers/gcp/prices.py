"""What a Compute Engine machine type costs an hour in a region, from the Cloud Billing Catalog (pure).

GCP prices no machine type as a whole: the Catalog's Compute Engine service (`services/6F81-5844-456A`,
`services.skus.list`) has a SKU per series' vCPU and per series' GiB of memory in each region ("A2 Instance Core
running in Americas", "A2 Instance Ram running in Americas", "N1 Predefined Instance Core ...", "T2D AMD Instance
Core ..."), and one per GPU model ("Nvidia Tesla A100 GPU running in Americas", "Nvidia H100 80GB GPU ..."), each
with the regions it applies to (`serviceRegions`) and its price (`pricingInfo[0].pricingExpression.tieredRates`, a
`unitPrice` of units and nanos in `currencyCode`, per `usageUnit`: h for a vCPU or GPU, GiBy.h for memory). A
machine's price is its vCPUs, GiB and GPUs (as machineTypes.aggregatedList gives them) at those rates, as Google's
price pages add them up. Spot's vCPU and memory SKUs are the same with "Spot Preemptible " (formerly
"Preemptible ") before the description, its GPUs' say "GPU attached to Spot Preemptible VMs running in"; either
is Spot's whatever `usageType` says, and so is a usage type Preemptible. Newer GPUs' SKUs drop "Nvidia" ("H200
141GB GPU running in Americas").

Only those forms are rates, of usage type OnDemand or Preemptible: a commitment, a reservation, Calendar Mode, DWS
or a premium SKU (which the Catalog lists beside them, some under the same usage type) is never read as one; nor is
a price in another currency than USD (the Catalog answers in the currency asked, and a key's account may have
another), nor a rate two SKUs give differently. Two series and one GPU are named otherwise in the Catalog than in
the machine type: a3-megagpu's are A3Plus and "H100 80GB Plus" (or "Mega"), a3-ultragpu's A3Ultra. A machine type
whose rates are not all found has no price (never a part of one): a4-highgpu's B200 is sold by the "1 gpu slice",
with no vCPU or memory SKU, and has none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bootstrap.providers.gcp.plan import region_of

COMPUTE_SERVICE = "services/6F81-5844-456A"  # Compute Engine, in the Cloud Billing Catalog
CURRENCY = "USD"
# A machine type's series in the Catalog, where it is not the type's first word: `a3-megagpu-8g` is A3Plus
SERIES_OF = {"a3-megagpu": "a3plus", "a3-ultragpu": "a3ultra"}
GPU_WORD_SAME_AS = {"plus": "mega"}  # the Catalog's "H100 80GB Plus" (or "Mega") is nvidia-h100-mega-80gb
_SPOT = re.compile(r"^(?:Spot Preemptible |Preemptible )")
_MACHINE = re.compile(r"^(?P<series>[A-Za-z0-9]+)(?: AMD| Arm| Predefined)? Instance (?P<what>Core|Ram) running in "
                      r"[A-Za-z .-]+$")
# "Nvidia Tesla A100 GPU running in Americas", "H200 141GB GPU running in Americas" (newer ones without Nvidia);
# Spot's: "Nvidia L4 GPU attached to Spot Preemptible VMs running in Americas"
_GPU = re.compile(r"^(?:Nvidia )?(?P<model>[A-Za-z0-9 ]+?) GPU (?P<spot>attached to Spot Preemptible VMs )?"
                  r"running in [A-Za-z .-]+$")
USAGE_TYPES = ("OnDemand", "Preemptible")  # a commitment's (Commit1Yr, ...) is no rate, whatever it says
UNITS = {"core": "h", "ram": "GiBy.h", "gpu": "h"}


@dataclass(frozen=True)
class Shape:
    """What a machine type is made of, as machineTypes lists it: vCPUs, memory and its GPUs by accelerator type."""

    vcpus: int
    memory_gib: float
    accelerators: tuple[tuple[str, int], ...] = ()


def shapes(items: Mapping[str, Mapping]) -> dict[str, Shape]:
    """Each machine type's shape, from machineTypes.aggregatedList items (scope -> {"machineTypes": [...]}, the
    API's JSON): the same in every zone."""
    found = {}
    for scoped in items.values():
        for machine in scoped.get("machineTypes") or ():
            accelerators = tuple((a["guestAcceleratorType"], int(a["guestAcceleratorCount"]))
                                 for a in machine.get("accelerators") or ())
            found[machine["name"]] = Shape(int(machine["guestCpus"]), int(machine["memoryMb"]) / 1024, accelerators)
    return found


def gpu_words(name: str) -> frozenset[str]:
    """A GPU's name as a set of words, the way both namings agree: `nvidia-tesla-a100` and "Tesla A100" are {a100},
    `nvidia-h100-mega-80gb` and "H100 80GB Plus" are {h100, mega, 80gb}."""
    words = re.split(r"[-\s]+", name.lower())
    return frozenset(GPU_WORD_SAME_AS.get(word, word) for word in words if word and word not in ("nvidia", "tesla"))


def series_of(machine_type: str) -> str:
    """The Catalog's series of a machine type, lower case: `a2-highgpu-1g` a2, `a3-megagpu-8g` a3plus."""
    family = "-".join(machine_type.split("-")[:2])
    return SERIES_OF.get(family, machine_type.split("-")[0])


def unit_price(sku: Mapping, unit: str | None = None) -> float | None:
    """A SKU's price for one unit from its first tier (the one starting at 0), in USD; None where it has none, gives
    another currency, or (with `unit`) is priced by another unit."""
    try:
        expression = sku["pricingInfo"][0]["pricingExpression"]
        tiers = [t for t in expression.get("tieredRates") or () if float(t.get("startUsageAmount") or 0) == 0]
        price = tiers[0]["unitPrice"]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if price.get("currencyCode", CURRENCY) != CURRENCY or unit not in (None, expression.get("usageUnit")):
        return None
    return int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9


def rates(skus: Iterable[Mapping]) -> dict[tuple[str, str, bool, str], float]:
    """The Catalog's SKUs as hourly rates: (what: core, ram or gpu; the series, or the GPU's words joined; spot;
    region) -> USD for one vCPU, GiB or GPU. SKUs of any other form, usage type, unit or currency are left out, and
    so is a rate two SKUs give differently (which one is meant cannot be told: no price rather than a guess)."""
    found: dict[tuple[str, str, bool, str], float | None] = {}
    for sku in skus:
        text, usage = sku.get("description", ""), sku.get("category", {}).get("usageType")
        if usage not in USAGE_TYPES:
            continue
        spot = bool(_SPOT.match(text)) or usage == "Preemptible"
        text = _SPOT.sub("", text)
        machine, gpu = _MACHINE.match(text), _GPU.match(text)
        if machine:
            what, name = machine["what"].lower(), machine["series"].lower()
        elif gpu:
            what, name, spot = "gpu", " ".join(sorted(gpu_words(gpu["model"]))), spot or bool(gpu["spot"])
        else:
            continue
        price = unit_price(sku, UNITS[what])
        if price is None:
            continue
        for region in sku.get("serviceRegions") or ():
            key = (what, name, spot, region)
            found[key] = price if found.get(key, price) == price else None
    return {key: price for key, price in found.items() if price is not None}


def machine_price(machine_type: str, shape: Shape, region: str, rated: Mapping[tuple[str, str, bool, str], float],
                  spot: bool = False) -> float | None:
    """The machine type's price an hour in `region` (USD): its vCPUs, GiB and GPUs at the region's rates; None
    where one of them has no rate there."""
    series = series_of(machine_type)
    parts = [("core", series, shape.vcpus), ("ram", series, shape.memory_gib)]
    parts += [("gpu", " ".join(sorted(gpu_words(kind))), count) for kind, count in shape.accelerators]
    total = 0.0
    for what, name, amount in parts:
        rate = rated.get((what, name, spot, region))
        if rate is None:
            return None
        total += rate * amount
    return round(total, 6)


def zone_prices(offerings: Iterable, machines: Mapping[str, Shape],
                rated: Mapping[tuple[str, str, bool, str], float]) -> dict[tuple[str, str], float]:
    """(machine type, zone) -> its on-demand price an hour there, for the zone offerings (offerings.Offering) whose
    type has every rate in the zone's region."""
    found = {}
    for offering in offerings:
        shape = machines.get(offering.instance_type)
        price = machine_price(offering.instance_type, shape, region_of(offering.place), rated) if shape else None
        if price is not None:
            found[(offering.instance_type, offering.place)] = price
    return found
