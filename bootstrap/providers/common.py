"""What every cloud provider's plan checks and decides alike, without touching a cloud: the cluster's name, the
operator's SSH range, TTLs, data volume sizes, SSH waits, the first-boot settings of the data volume, and which
set of snapshots a cluster's volumes come back from. Pure, and unit-tested with each provider's plan; and what every
provider's cloud side does alike: the undo list `up` rolls back with, the poll for the host keys a cloud shows,
and pinning them."""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from bootstrap.errors import UsageError

NAME = re.compile(r"[a-z0-9-]{1,32}")
MIN_PREFIX = {4: 8, 6: 32}
MAX_TTL_HOURS = 24 * 14
SSH_WAIT_S = 300
# The data volume: found on the node by its filesystem label (or, unformatted, by its exact size) by the image's
# kiln-data-volume unit, which reads its settings from this file, and mounted here.
DATA_MOUNT = "/data"
DATA_LABEL = "kiln-data"
DATA_SETTINGS = "/etc/kiln/data-volume.json"
MAX_VOLUME_GIB = 16384
SNAPSHOT_TTL_DAYS = 30.0
MAX_SNAPSHOT_TTL_DAYS = 3650.0


@dataclass(frozen=True, kw_only=True)
class CloudRequest:
    """What the operator asked for on any cloud: the cluster's name and size, the SSH range, the image profile,
    spot, the login, its TTL and idle stop. Each cloud's Request adds its place, its machine and its image, and its
    `validate_request` checks them all."""

    name: str
    count: int
    ssh_cidr: str
    image_profile: str = "gpu"
    spot: bool = False
    user: str = "ubuntu"
    ttl_hours: float = 24.0
    idle_minutes: float | None = None
    # A queue's cluster: the machines `up` makes now (0: none, Slurm's resume asks for each); None: all `count`.
    start: int | None = None


def validate_name(name) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise UsageError(f"cluster name {name!r}: use 1 to 32 lowercase letters, digits and '-'")
    return name


def matching(value, pattern: re.Pattern, flag: str, what: str, example: str, unset: str = "") -> str:
    """A value of --FLAG that must have a cloud's form (a zone, a machine type): one line where it is missing
    (`unset`: where else it may come from) or not of that form ("--zone 'x' is not a Compute Engine zone like
    us-central1-a")."""
    if not value:
        raise UsageError(f"give --{flag} (e.g. {example}){', or ' + unset if unset else ''}")
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UsageError(f"--{flag} {value!r} is not {what} like {example}")
    return value


def configured(value: str | None, names: Sequence[str]) -> str | None:
    """An option given, else the first of the environment variables `names` that is set (the cloud's own tools
    read them: CLOUDSDK_COMPUTE_ZONE, AZURE_LOCATION), else None."""
    return value or next((os.environ[name] for name in names if os.environ.get(name)), None)


def validate_cidr(text: str | None) -> str:
    """The operator's SSH source range; never the whole Internet, never guessed."""
    if not text:
        raise UsageError("give --ssh-cidr with the address you connect from (e.g. 203.0.113.7/32); "
                         "kiln never opens SSH to 0.0.0.0/0")
    try:
        network = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise UsageError(f"--ssh-cidr {text!r} is not an IPv4 or IPv6 address or CIDR") from None
    if network.prefixlen < MIN_PREFIX[network.version]:
        raise UsageError(f"--ssh-cidr {text!r} is too broad: at least /{MIN_PREFIX[network.version]} for "
                         f"IPv{network.version}; kiln never opens SSH to the whole Internet")
    return str(network)


def validate_start(start, count: int) -> int | None:
    """A queue's machines made at once (kiln queue up): none, or a whole number up to the cluster's `count`."""
    if start is None:
        return None
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= count:
        raise UsageError(f"a queue's first nodes {start!r}: a whole number from 0 to {count}")
    return start


def validate_count(count, machine: str = "instance") -> int:
    """--count: a whole number, at least 1 (`machine`: what a node is called, as the line says it)."""
    try:
        count = int(count)
    except (TypeError, ValueError):
        raise UsageError(f"--count {count!r} is not a whole number") from None
    if count < 1:
        raise UsageError(f"--count {count}: a cluster needs at least 1 {machine}")
    return count


def validate_user(user) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", user or ""):
        raise UsageError(f"--user {user!r} is not a valid login name")
    return user


def positive_number(text, flag: str, most: float, unreadable: str) -> float:
    """--FLAG's number: more than 0 and at most `most`; `unreadable`: what the line says after the text where it is
    no number."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UsageError(f"--{flag} {text!r}{unreadable}") from None
    if not 0 < value <= most:
        raise UsageError(f"--{flag} {value:g}: give more than 0 and at most {most:g}")
    return value


def validate_max_price(text) -> float:
    """--max-price as USD per hour: a finite number above 0 (nan and inf read as floats, and are no price)."""
    try:
        price = float(text)
    except (TypeError, ValueError):
        price = 0.0
    if not 0 < price < float("inf"):
        raise UsageError(f"--max-price {text!r} is not a positive price in USD per hour")
    return price


def validate_ttl(ttl_hours) -> float:
    """--ttl-hours: more than 0 and at most MAX_TTL_HOURS."""
    return positive_number(ttl_hours, "ttl-hours", MAX_TTL_HOURS, " is not a number")


def validate_volume(size_gib) -> int | None:
    """--volume SIZE_GB: one data volume of this many GiB per node (None: no data volume)."""
    if size_gib is None or size_gib is False:
        return None
    try:
        size = int(str(size_gib))
    except ValueError:
        raise UsageError(f"--volume {size_gib!r}: give the data volume's size in GiB, e.g. 100") from None
    if not 1 <= size <= MAX_VOLUME_GIB:
        raise UsageError(f"--volume {size}: give 1 to {MAX_VOLUME_GIB} GiB")
    return size


def validate_snapshot_ttl(days) -> float:
    """--snapshot-ttl-days: more than 0 and at most MAX_SNAPSHOT_TTL_DAYS."""
    return positive_number(days, "snapshot-ttl-days", MAX_SNAPSHOT_TTL_DAYS, ": give days, e.g. 30")


def parse_image_tags(text: str | None) -> tuple[tuple[str, str], ...]:
    """`kiln:fingerprint=ab12,kiln:tensorflow=2.18.1`: more tags the AMI must carry (what the bake writes)."""
    pairs = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.strip().partition("=")
        if not sep or not key or not value:
            raise UsageError(f"--image-tags {item.strip()!r}: write KEY=VALUE, e.g. kiln:fingerprint=ab12")
        pairs.append((key, value))
    return tuple(pairs)


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def validate_ssh_wait(seconds) -> float:
    """--ssh-wait SECONDS: 0 skips the wait."""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        raise UsageError(f"--ssh-wait {seconds!r}: give seconds, e.g. 300 (0: do not wait)") from None
    if not 0 <= value <= 3600:
        raise UsageError(f"--ssh-wait {seconds!r}: give 0 to 3600 seconds")
    return value


def no_answer_error(silent: Sequence[str], waited_s: float) -> str:
    """One line naming the instances whose SSH never answered."""
    return f"no SSH answer within {waited_s:g}s from {len(silent)} instance(s): {', '.join(silent)}"


def first_boot_settings(size_gib: int, user: str) -> str:
    """The instance's user data: cloud-init writes the settings the image's kiln-data-volume unit reads (it mounts
    the volume, formatting it only if it has no filesystem yet, whenever the disk appears)."""
    return "#cloud-config\n" + json.dumps({"write_files": [data_volume_file(size_gib, user)]}, sort_keys=True) + "\n"


def data_volume_file(size_gib: int, user: str) -> dict:
    """cloud-init's write_files entry for the data volume's settings (local VMs take it too: localcloud.vm)."""
    settings = {"label": DATA_LABEL, "mount": DATA_MOUNT, "owner": user, "size_bytes": size_gib * 2**30}
    return {"path": DATA_SETTINGS, "permissions": "0644", "owner": "root:root",
            "content": json.dumps(settings, sort_keys=True) + "\n"}


def latest_snapshot_set(snapshots: Iterable, done: str = "completed") -> dict:
    """The newest set of completed data snapshots, by node index; a set with any snapshot not completed is
    passed over (a `down --snapshot` that failed part-way). A snapshot is any record with an id, the node's index,
    its set's time (`taken_at`) and a state (`done` when it is complete: EC2's "completed", GCE's "READY")."""
    sets: dict[str, list] = {}
    for snapshot in snapshots:
        if snapshot.index is not None and snapshot.taken_at:
            sets.setdefault(snapshot.taken_at, []).append(snapshot)
    for taken_at in sorted(sets, reverse=True):
        members = sets[taken_at]
        if all(s.state == done for s in members):
            return {s.index: s for s in sorted(members, key=lambda s: s.id)}
    return {}


@dataclass(frozen=True)
class Snapshot:
    """A snapshot kiln took of one node's data volume, on every cloud: its id (EC2's snap-..., GCE's name, Azure's
    resource id), its cluster and node, the time of its set, its size (in the cloud's `unit`: GiB on EC2), its
    state, the cloud's tags (GCE's labels) and when it expires; Azure's name and location."""

    id: str
    cluster: str
    index: int | None
    taken_at: str
    gigabytes: int
    state: str
    tags: Mapping[str, str]
    expires: datetime | None = None
    unit: str = "GB"
    name: str = ""
    location: str = ""

    # what kiln list, sweep and down --snapshot say of it
    label = property(lambda self: self.name or self.id)
    size = property(lambda self: f"{self.gigabytes} {self.unit}")
    expiry = property(lambda self: format_time(self.expires) if self.expires else "never")

    def expired(self, now: datetime) -> bool:
        return self.expires is not None and self.expires <= now


def node_index(text: str) -> int | None:
    """A node's index as a tag or label holds it ("" or anything else: none)."""
    return int(text) if text.isdigit() else None


def snapshot_order(snapshot: Snapshot) -> tuple:
    """Cluster, then the time of its set, then node."""
    return (snapshot.cluster, snapshot.taken_at, -1 if snapshot.index is None else snapshot.index, snapshot.id)


def expired_snapshots(snapshots: Iterable[Snapshot], now: datetime) -> list[Snapshot]:
    return sorted((s for s in snapshots if s.expired(now)), key=snapshot_order)


def restore_note(name: str, count: int, restored: dict) -> str:
    """What `up --volume` says about the snapshots it restores from."""
    if not restored:
        return f"cluster {name}: no snapshot of its data volumes: each node gets an empty volume"
    taken_at = next(iter(restored.values())).taken_at
    fresh = [i for i in range(count) if i not in restored]
    left = sorted(i for i in restored if i >= count)
    note = (f"cluster {name}: data volumes restored from the snapshots of {taken_at} "
            f"({', '.join(f'node {i}: {s.id}' for i, s in sorted(restored.items()) if i < count)})")
    if fresh:
        note += f"; node(s) {', '.join(map(str, fresh))} had no snapshot and get an empty volume"
    if left:
        note += f"; the snapshot(s) of node(s) {', '.join(map(str, left))} are not used (fewer nodes now)"
    return note


@dataclass(frozen=True)
class ClusterSummary:
    name: str
    owner: str
    expires: datetime | None
    instances: tuple[str, ...]
    resources: int
    holds: str = ""  # what it is made of, as kiln list says it: "5 resource(s)", "resource group kiln-NAME"

    def expired(self, now: datetime) -> bool:
        return self.expires is not None and self.expires <= now


def summarize(resources: Iterable) -> list[ClusterSummary]:
    """Resources grouped by cluster name; a cluster expires with its earliest expiry. A resource is any record
    with `kind`, `label` (its id or name), `state`, `cluster`, `owner` and `expires`."""
    groups: dict[str, list] = {}
    for resource in resources:
        groups.setdefault(resource.cluster, []).append(resource)
    summaries = []
    for name, members in sorted(groups.items()):
        expiries = [r.expires for r in members if r.expires is not None]
        owners = sorted({r.owner for r in members} - {""})
        instances = tuple(sorted(f"{r.label} ({r.state})" for r in members if r.kind == "instance"))
        summaries.append(ClusterSummary(name, ",".join(owners), min(expiries, default=None), instances, len(members),
                                        f"{len(members)} resource(s)"))
    return summaries


def expired_clusters(resources: Iterable, now: datetime) -> list[ClusterSummary]:
    return [summary for summary in summarize(resources) if summary.expired(now)]


def listing(summaries: Sequence[ClusterSummary], snapshots: Sequence, now: datetime, machine: str) -> list[str]:
    """`kiln list`'s lines on every cloud: each cluster (its `machine`s, what it holds) with its expiry and owner,
    then its machines; then the data snapshots (any record with `label`, `size`, `expiry` and `expired(now)`)."""
    lines = []
    for summary in summaries:
        expires = format_time(summary.expires) if summary.expires else "never"
        flag = " (expired)" if summary.expired(now) else ""
        lines.append(f"{summary.name}: {len(summary.instances)} {machine}(s), {summary.holds}, expires {expires}"
                     f"{flag}, owner {summary.owner or '?'}")
        lines += [f"  {one}" for one in summary.instances]
    if snapshots:
        lines.append("data snapshots:")
    lines += [f"  {one.cluster} node {one.index} {one.label}: {one.size}, {one.state}, taken {one.taken_at}, expires "
              f"{one.expiry}{' (expired)' if one.expired(now) else ''}" for one in snapshots]
    return lines


def swept(expired: Sequence[ClusterSummary], snapshots: Sequence, dry_run: bool) -> list[str]:
    """`kiln sweep`'s lines on every cloud: what was (or would be) removed, clusters then snapshots."""
    verb = "would remove" if dry_run else "removed"
    return [*(f"{verb} {summary.name}: {summary.holds}, expired "
              f"{format_time(summary.expires) if summary.expires else 'never'}" for summary in expired),
            *(f"{verb} snapshot {one.label} of {one.cluster} node {one.index}, taken {one.taken_at}, expired "
              f"{one.expiry}" for one in snapshots)]


class Rollback:
    """Undo actions, registered before each step so an interrupted call is undone too."""

    def __init__(self) -> None:
        self.undo: list[tuple[str, Callable[[], object]]] = []

    def push(self, what: str, action: Callable[[], object]) -> None:
        self.undo.append((what, action))

    def run(self, describe: Callable[[BaseException], str] = str, *, stoppable: bool = False) -> list[str]:
        """Undo in reverse order; the failures, as lines (each error told by `describe`). With `stoppable` (an undo
        under kiln.shield, whose second Ctrl-C stops it), a KeyboardInterrupt ends it there: the step it cut and
        those not yet run are named; elsewhere it goes up as it came."""
        failures = []
        steps = list(reversed(self.undo))
        for index, (what, action) in enumerate(steps):
            try:
                action()
            except KeyboardInterrupt:
                if not stoppable:
                    raise
                return failures + [f"{later}: not done (Ctrl-C)" for later, _ in steps[index:]]
            except Exception as error:  # keep undoing the rest; report every failure
                failures.append(f"{what}: {describe(error)}")
        return failures



def poll_host_keys(look: Callable[[str], list[str]], names: Sequence[str], timeout_s: float,
                   poll_s: float) -> dict[str, list[str]]:
    """The host keys `look(name)` finds for each machine (as the cloud shows them), looked at again every poll_s
    until every machine has them or timeout_s has passed (one look when it is 0); machines without keys are left
    out: kiln does not trust them on first contact."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, list[str]] = {}
    while True:
        for name in names:
            if name not in found:
                keys = look(name)
                if keys:
                    found[name] = keys
        if len(found) == len(names) or time.monotonic() + poll_s > deadline:
            return found
        time.sleep(poll_s)


def pin_host_keys(cluster: str, names: Sequence[str], hosts: Sequence, found: dict[str, list[str]],
                  shown: str) -> dict[str, str]:
    """Write the cluster's known_hosts (the file Cluster.connect pins for `--cluster NAME`) from the keys the
    machines `names` showed; per address, `shown` (where they came from) where pinned, "first-contact" where the
    keys must be accepted on first use."""
    from bootstrap import state
    from kiln.hostkeys import known_hosts_lines

    lines, states = [], {}
    for name, host in zip(names, hosts, strict=True):
        keys = found.get(name, [])
        lines += known_hosts_lines([host.address], keys)
        states[host.address] = shown if keys else "first-contact"
    state.write_known_hosts(cluster, "".join(lines))
    return states


def check_place(place: str, known: Sequence[str], *, option: str, listed: str, word: str,
                any_case: bool = False) -> None:
    """A place the cloud has (`known`: every one it has; `any_case`: its names are, as Azure's), else UsageError
    naming it and the nearest real ones, and the options that name places (pure)."""
    if place in known or any_case and place.lower() in {name.lower() for name in known}:
        return
    nearest = difflib.get_close_matches(place.lower(), list(known), n=3, cutoff=0.4) or list(known[:3])
    raise UsageError(f"{option} {place}: not {word} (the nearest: {', '.join(nearest)}), as --{option} or --{listed} "
                     "named it")
