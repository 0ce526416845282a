"""Where each cloud offers each instance type, as the cloud's own API answers it (pure): every cloud's answer parsed
into offerings (a type at a place kiln puts clusters: an AWS region with the zones of it that have the type, a GCP
zone, an Azure location with its zones, and why the account may not use it there), the dated record kiln keeps of
them (read live, kept a day: `kiln gpus --refresh` reads again), and what an `up` with no place named tries.

The calls, each cloud's own way of saying where a type is:
- AWS: EC2 DescribeRegions (the regions the account can use), then in each DescribeInstanceTypeOfferings with
  LocationType=availability-zone and a filter on the types: rows of {InstanceType, Location (a zone)}.
- GCP: machineTypes.aggregatedList with a filter on the type's name: items by scope `zones/ZONE`, each with the
  zone's machineTypes (absent, with a NO_RESULTS_ON_PAGE warning, where the zone has none).
- Azure: Resource SKUs (Microsoft.Compute/skus) for the subscription: a document per size with its `locations`,
  `locationInfo` (the zones of each) and `restrictions` (a Location restriction closes the size in a location to
  this subscription, with a reasonCode; a Zone restriction closes only the zones it names).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta

KEPT_FOR = timedelta(days=1)  # a record older than this is read again before an up uses it


@dataclass(frozen=True)
class Offering:
    """`instance_type` is offered at `place` (the place kiln puts a cluster), in `zones` of it; `restriction`:
    why this account may not use it there ("" where it may); `price`: its on-demand price there, USD an hour, where
    the cloud's price source gave one."""

    instance_type: str
    place: str
    zones: tuple[str, ...] = ()
    restriction: str = ""
    price: float | None = None


@dataclass(frozen=True)
class Record:
    """Where one cloud offers the types asked, as read for one account (a profile, project or subscription: ""
    for the credentials' own) at `read_at` (UTC, ISO 8601), and from what (`source`)."""

    cloud: str
    account: str
    read_at: str
    source: str
    types: tuple[str, ...]
    offerings: tuple[Offering, ...]
    unread: tuple[str, ...] = ()  # the places that did not answer, each with why (left out of `offerings`)
    priced_from: str = ""  # where the offerings' prices came from ("": none was read)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> Record | None:
        """The record, or None where `data` is not one (a file of another version, or damaged)."""
        try:
            return cls(data["cloud"], data["account"], data["read_at"], data["source"], tuple(data["types"]),
                       tuple(Offering(o["instance_type"], o["place"], tuple(o.get("zones", ())),
                                      o.get("restriction", ""), o.get("price")) for o in data["offerings"]),
                       tuple(data.get("unread", ())), data.get("priced_from", ""))
        except (KeyError, TypeError, AttributeError):
            return None

    def answers(self, account: str, types: Iterable[str], now: datetime) -> bool:
        """Whether this record says where `types` are for `account`, and is recent enough to go by."""
        try:
            age = now - datetime.fromisoformat(self.read_at)
        except (ValueError, TypeError):
            return False
        return self.account == account and set(types) <= set(self.types) and timedelta(0) <= age < KEPT_FOR


# ---------------------------------------------------------------------------------------- each cloud's answer


def aws_offerings(region: str, rows: Iterable[Mapping]) -> list[Offering]:
    """EC2's DescribeInstanceTypeOfferings of `region` (LocationType=availability-zone): a region offering per
    type, with the zones that have it."""
    zones: dict[str, set[str]] = {}
    for row in rows:
        zones.setdefault(row["InstanceType"], set()).add(row["Location"])
    return [Offering(kind, region, tuple(sorted(where))) for kind, where in sorted(zones.items())]


def gcp_offerings(items: Mapping[str, Mapping]) -> list[Offering]:
    """GCE's machineTypes.aggregatedList items (scope `zones/ZONE` -> {"machineTypes": [{"name": ...}]}): a zone
    offering per type the zone has."""
    found = []
    for scope, scoped in items.items():
        if not scope.startswith("zones/"):
            continue
        zone = scope.split("/", 1)[1]
        found += [Offering(machine["name"], zone, (zone,)) for machine in scoped.get("machineTypes") or ()]
    return sorted(found, key=lambda offering: (offering.instance_type, offering.place))


def azure_offerings(documents: Iterable[Mapping], types: Iterable[str]) -> list[Offering]:
    """ARM's Resource SKU documents: a location offering per VM size of `types` (any case), with its zones (less
    those a Zone restriction closes) and the reasonCode of a Location restriction (NotAvailableForSubscription)."""
    wanted = {kind.lower() for kind in types}
    found = []
    for sku in documents:
        if sku.get("resourceType") != "virtualMachines" or str(sku.get("name", "")).lower() not in wanted:
            continue
        zoned = {str(info.get("location", "")).lower(): set(info.get("zones") or ())
                 for info in sku.get("locationInfo") or ()}
        for location in sku.get("locations") or ():
            place = location.lower()
            closed, zones_closed = "", set()
            for restriction in sku.get("restrictions") or ():
                values = {str(v).lower() for v in restriction.get("values") or ()}
                if place not in values:
                    continue
                if restriction.get("type") == "Location":
                    closed = restriction.get("reasonCode") or "restricted"
                elif restriction.get("type") == "Zone":
                    info = restriction.get("restrictionInfo") or {}
                    zones_closed |= set(info.get("zones") or ())
            found.append(Offering(sku["name"], place, tuple(sorted(zoned.get(place, set()) - zones_closed)), closed))
    return sorted(found, key=lambda offering: (offering.instance_type.lower(), offering.place))


# ---------------------------------------------------------------------------------------- what an up tries


def offered(record: Record, place: str, instance_type: str) -> Offering | None:
    """The offering of `instance_type` at `place` in the record (any case), open or not; None where there is none."""
    return next((o for o in record.offerings if o.place.lower() == place.lower()
                 and o.instance_type.lower() == instance_type.lower()), None)


def priced(offerings: Iterable[Offering], prices: Mapping[tuple[str, str], float]) -> list[Offering]:
    """The offerings, each with its on-demand price where `prices` ((type, place) -> USD an hour, any case) has
    one."""
    known = {(kind.lower(), place.lower()): usd for (kind, place), usd in prices.items()}
    return [replace(o, price=known.get((o.instance_type.lower(), o.place.lower()), o.price)) for o in offerings]


def price_of(record: Record, place: str, instance_type: str) -> float | None:
    """The type's on-demand price at the place, by the record (None: not known)."""
    found = offered(record, place, instance_type)
    return found.price if found else None


def cheapest(record: Record, instance_type: str) -> tuple[float, str] | None:
    """The type's lowest on-demand price among the places open to the account, and where (None: no price)."""
    priced = [(o.price, o.place) for o in record.offerings if o.instance_type.lower() == instance_type.lower()
              and not o.restriction and o.price is not None]
    return min(priced) if priced else None


def places_of(record: Record, types: Sequence[str], first: str = "") -> list[str]:
    """The places open to the account that offer any of `types`, in the order an up with no place named tries
    them: `first` (the place the cloud's own settings name) where it offers one, then those offering the most
    preferred type first, then the cheapest by its on-demand price (those without a price after), then by how many
    zones have it (more zones, more machines to ask for), then by name."""
    rank = {kind.lower(): index for index, kind in enumerate(types)}
    best: dict[str, tuple[int, float, int, str]] = {}
    for offering in record.offerings:
        kind = offering.instance_type.lower()
        if kind not in rank or offering.restriction:
            continue
        price = offering.price if offering.price is not None else float("inf")
        key = (rank[kind], price, -len(offering.zones), offering.place)
        best[offering.place] = min(best.get(offering.place, key), key)
    ordered = sorted(best, key=lambda place: best[place])
    if first and first.lower() in ordered:
        ordered.remove(first.lower())
        ordered.insert(0, first.lower())
    return ordered


def closed(record: Record, types: Sequence[str]) -> list[str]:
    """Each place that has one of `types` but not for this account: `PLACE TYPE (REASON)`."""
    wanted = {kind.lower() for kind in types}
    return [f"{o.place} {o.instance_type} ({o.restriction})" for o in record.offerings
            if o.restriction and o.instance_type.lower() in wanted]


def missing(record: Record, place: str, instance_type: str) -> str:
    """Why `instance_type` is not to be tried at `place` by the record: "" where it is offered and open."""
    found = offered(record, place, instance_type)
    if found is None:
        return f"{record.cloud} does not offer {instance_type} in {place}"
    if found.restriction:
        return f"{instance_type} in {place} is not open to this account ({found.restriction})"
    return ""


def summary(record: Record, types: Sequence[str]) -> tuple[int, int]:
    """How many regions and zones of the cloud offer any of `types` to the account (a GCP zone's region is its
    name less the last part)."""
    open_ = [o for o in record.offerings if o.instance_type.lower() in {t.lower() for t in types} and not o.restriction]
    regions = {o.place.rsplit("-", 1)[0] if record.cloud == "gcp" else o.place for o in open_}
    zones = {zone for o in open_ for zone in (o.zones or (o.place,))}
    return len(regions), len(zones)


def describe(record: Record) -> str:
    """Where the record came from and when, as the dry run and `kiln gpus` say it (and where it could not read)."""
    return (f"{record.source}, read {record.read_at[:16].replace('T', ' ')} UTC"
            + (f"; prices: {record.priced_from}" if record.priced_from else "")
            + (f"; not read: {', '.join(record.unread)}" if record.unread else ""))
