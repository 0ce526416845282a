"""One provider for every cloud: `CloudProvider` implements the seam (bootstrap.providers.Provider) once, over a
frozen record of each cloud's facts (`CloudFacts`, the table CLOUDS: what differs, and nothing else) and the same
verbs in each cloud's module (`Cloud`: make a cluster, remove it, snapshot it, list and sweep what kiln made there,
replace a node, arm autostop, read prices and places), each cloud's pure plan module deciding its request and its
dry run. What `kiln up`, `down`, `list` and `sweep` say is written here, once for every cloud.

A cloud's verbs are called with the options of its place that choose its account and endpoint (`connects`: an AWS
region and profile, a GCP project, an Azure subscription), as given on the command line or by the cluster's file
(None: the cloud's own default). Its SDK is imported when a verb is first called (boto3 alone takes a second).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from dataclasses import replace as changed
from datetime import UTC, datetime
from typing import Any, Protocol

from bootstrap import state
from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host
from bootstrap.providers import Added, Gone, Made, Notice, Replacement, catalog, failover, provision
from bootstrap.providers import offerings as offered
from bootstrap.providers.azure import plan as azure_plan
from bootstrap.providers.common import (
    SSH_WAIT_S,
    ClusterSummary,
    check_place,
    configured,
    listing,
    swept,
    validate_ssh_wait,
)
from bootstrap.providers.gcp import plan as gcp_plan


class Cloud(Protocol):
    """The verbs every cloud's module (bootstrap.providers.KIND.cloud) has, each called with `connects`."""

    def up(self, request: Any, *, ssh_wait_s: float, say: Callable[[str], None] | None = None,
           **connection: str | None) -> provision.Up: ...

    def down(self, name: str, **connection: str | None) -> list[str]: ...

    def down_with_snapshots(self, name: str, *, ttl_days: float, **connection: str | None) -> provision.Teardown: ...

    def list_clusters(self, **connection: str | None) -> list[ClusterSummary]: ...

    def list_snapshots(self, **connection: str | None) -> list: ...

    def sweep(self, *, dry_run: bool, **connection: str | None) -> list[ClusterSummary]: ...

    def sweep_snapshots(self, *, dry_run: bool, **connection: str | None) -> list: ...

    def replace(self, cluster: str, address: str, **connection: str | None) -> tuple[Host, list[str]]: ...

    def grow(self, cluster: str, count: int, **connection: str | None) -> list[tuple[str, Host, list[str]]]: ...

    def shrink(self, cluster: str, addresses: Sequence[str], **connection: str | None) -> list[str]: ...

    def arm_autostop(self, cluster: str, **connection: str | None) -> object: ...

    def places(self, every: bool, **connection: str | None) -> list[str | None]: ...

    def spot_prices(self, types: Sequence[str], **place: str | None) -> dict[str, float]: ...

    def on_demand_prices(self, types: Sequence[str], **place: str | None) -> dict[str, float]: ...

    def offerings(self, types: Sequence[str], **connection: str | None) -> offered.Record: ...

    def default_place(self, **connection: str | None) -> str | None: ...

    def place_names(self, *, near: str | None = None, **connection: str | None) -> Sequence[str]: ...

    def account(self, **connection: str | None) -> str: ...


@dataclass(frozen=True)
class CloudFacts:
    """What one cloud is, for the seam. Calling it places its provider: CLOUDS["aws"](region="us-west-2")."""

    kind: str
    package: str  # its modules: PACKAGE.cloud (the verbs, with its SDK) and PACKAGE.plan (pure)
    host_keys: str  # where the nodes' host keys come from (the provider shows them; never first contact)
    shutdown: str  # what autostop's power-off is on a node (node.py autostop)
    notice: Notice
    up_options: frozenset[str]  # kiln up's options it takes, besides COMMON_UP_OPTIONS
    where: tuple[str, ...]  # the options that place its clusters
    scope: str  # the option of `where` that bounds what list and sweep see
    connects: tuple[str, ...]  # the options of `where` every verb is called with
    place_word: str  # what one of its places is, to say a place it does not have: "an AWS region"
    prices: str  # where up --by-price reads its spot prices ("": kiln reads none there)
    on_demand_from: str  # where up --by-price reads its on-demand prices ("": kiln reads none there)
    priced_by: tuple[str, ...]  # the options of `where` its spot prices are read with
    machine: str  # what a node is called there: instance, VM
    volume: str  # what a data volume is called there: data volume, data disk
    keys_from: str  # where `up` read the host keys it pinned, as its lines say
    keys_shown: str  # the same, as the dry run says it
    found_by: str  # how `down` finds a cluster's resources ({name}: the cluster's)
    snapshot_word: str = "snapshot "  # before a snapshot's label ("": its id says it, as snap-...)
    env: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # an option not given, read from these
    volumes: bool = True  # its nodes can have data volumes (down --snapshot, up --volume)
    places_any_case: bool = False  # its places are named in any case (Azure's eastus, EastUS)

    def __call__(self, **where: str | None) -> CloudProvider:
        return CloudProvider(self, **where)


@dataclass(frozen=True)
class CloudRequest:
    """A checked `kiln up` on a cloud: its plan module's request and how long to wait for SSH."""

    cluster: Any
    ssh_wait: float


class CloudProvider:
    """The provider of one cloud, placed: the seam's verbs, written once; the cloud's facts are its attributes."""

    def __init__(self, facts: CloudFacts, **where: str | None):
        self.facts = facts
        self.place = {key: value for key, value in where.items() if value is not None}

    def __getattr__(self, name: str):
        """The cloud's facts (kind, notice, scope...), and the options that place it (region, project...)."""
        if name in ("facts", "place"):  # not set yet (a copy being made): never looked for through themselves
            raise AttributeError(name)
        if name in {f.name for f in fields(CloudFacts)}:
            return getattr(self.facts, name)
        if name in self.facts.where:
            return self.place.get(name)
        raise AttributeError(name)

    @property
    def cloud(self) -> Cloud:
        return importlib.import_module(f"{self.facts.package}.cloud")  # type: ignore[return-value]

    @property
    def planner(self):
        return importlib.import_module(f"{self.facts.package}.plan")

    def given(self, keys: Sequence[str]) -> dict[str, str | None]:
        """These options of the place: given, else from the environment the cloud's own tools read."""
        return {key: configured(self.place.get(key), self.facts.env.get(key, ())) for key in keys}

    def connection(self) -> dict[str, str | None]:
        return {key: self.place.get(key) for key in self.facts.connects}

    def request(self, name: str, count: int, options: Mapping[str, Any], idle_minutes: float | None) -> CloudRequest:
        self.check_place()
        cluster = self.planner.from_options(name, count, options, idle_minutes, self.given(self.facts.where))
        ssh_wait = validate_ssh_wait(options.get("ssh_wait", SSH_WAIT_S))
        if idle_minutes and not ssh_wait:
            raise UsageError("--idle-minutes starts an agent on every node over SSH: it needs --ssh-wait above 0")
        return CloudRequest(cluster, ssh_wait)

    def plan(self, request: CloudRequest) -> list[str]:
        identity = state.cluster_dir(request.cluster.name) / "id_ed25519"
        lines = self.planner.dry_run(request.cluster, key=str(identity),
                                     place=self.given(self.facts.where), now=datetime.now(UTC))
        wait = (f"and for SSH to answer on each (at most {request.ssh_wait:g}s)" if request.ssh_wait
                else "(not for SSH: --ssh-wait 0)")
        return [*lines, f"then wait for the {self.facts.machine}s to run {wait}; pin the host keys "
                        f"{self.facts.keys_shown}"]

    def up(self, request: CloudRequest, say: Callable[[str], None] | None = None) -> Made:
        made = self.cloud.up(request.cluster, ssh_wait_s=request.ssh_wait, say=say, **self.connection())
        return Made(made.name, tuple(provision.made_lines(made, volume_word=self.facts.volume,
                                                          machines=f"{self.facts.machine}s",
                                                          keys_from=self.facts.keys_from)),
                    made.unpinned, made.expires)

    def down(self, name: str, *, snapshot_ttl_days: float | None = None) -> Gone:
        if snapshot_ttl_days is None:
            removed = self.cloud.down(name, **self.connection())
            if not removed:
                return Gone((f"cluster {name}: nothing {self.facts.found_by.format(name=name)} is left; nothing "
                             "to do",))
            return Gone((f"cluster {name}: removed {len(removed)} resource(s):", *(f"  {line}" for line in removed)))
        done = self.cloud.down_with_snapshots(name, ttl_days=snapshot_ttl_days, **self.connection())
        lines = [f"cluster {name}: node {made.index}'s {self.facts.volume} kept as {self.facts.snapshot_word}"
                 f"{made.label} ({made.size}, expires {made.expiry}); kiln up {name} --provider {self.facts.kind} "
                 "--volume N restores it" for made in done.snapshots]
        if not done.snapshots and not done.kept:
            lines.append(f"cluster {name}: no {self.facts.volume}s to snapshot")
        if done.removed:
            lines.append(f"cluster {name}: removed {len(done.removed)} resource(s)")
        return Gone(tuple(lines), tuple(f"{volume} (node {node}): {why}" for volume, node, why in done.kept))

    def list(self) -> list[str]:
        return listing(self.cloud.list_clusters(**self.connection()), self.cloud.list_snapshots(**self.connection()),
                       datetime.now(UTC), self.facts.machine)

    def sweep(self, *, dry_run: bool = False) -> list[str]:
        return swept(self.cloud.sweep(dry_run=dry_run, **self.connection()),
                     self.cloud.sweep_snapshots(dry_run=dry_run, **self.connection()), dry_run)

    def places(self, every: bool = False) -> list[str | None]:
        return self.cloud.places(every, **self.connection())

    def replace(self, cluster: str, host: Host) -> Replacement:
        new, keys = self.cloud.replace(cluster, host.address, **self.connection())
        return Replacement(host, new, tuple(keys))

    def grow(self, cluster: str, count: int) -> list[Added]:
        """`count` machines more for the cluster, made as its up made them (all, or none), in its file and pinned."""
        return [Added(host, host.address, tuple(keys))
                for _, host, keys in self.cloud.grow(cluster, count, **self.connection())]

    def shrink(self, cluster: str, hosts: Sequence[Host]) -> None:
        """The cluster's machines of `hosts` deleted, and taken out of its file and its pinned keys."""
        self.cloud.shrink(cluster, [host.address for host in hosts], **self.connection())

    def arm_autostop(self, cluster: str) -> None:
        self.cloud.arm_autostop(cluster, **self.connection())

    def make_controller(self, cluster: str) -> Host:
        """A queue's controller machine for the cluster: its identity, its machine, its host keys pinned from the
        provider, in the cluster's file; all of it or nothing."""
        make = getattr(self.cloud, "make_controller", None)
        if make is None:
            raise UsageError(f"kiln queue up --provider {self.facts.kind}: a queue's controller machine runs on aws "
                             "for now")
        host, _ = make(cluster, **self.connection())
        return host

    def check_place(self) -> None:
        """The place it is given (its --region, --zone or --location, or an entry of --regions or --zones) is one
        the cloud has, else one line naming the nearest real ones. Unchecked where the cloud cannot be asked (no
        credentials: a dry run), since the up could not go there either."""
        option = failover.PLACE[self.facts.kind]
        place = self.place.get(option)
        if not place:
            return
        known = place_names(self.facts.kind, tuple(sorted(self.connection().items())), place)
        if known is not None:
            check_place(place, known, option=option, listed=failover.PLACES_OPTION[self.facts.kind],
                        word=self.facts.place_word, any_case=self.facts.places_any_case)

    def default_place(self) -> str | None:
        """The place an up that names none goes to, as the cloud's own settings name it (None: none does)."""
        return self.cloud.default_place(**self.connection())

    def offerings(self, instance_types: Sequence[str] = (), *, refresh: bool = False) -> offered.Record:
        """Where the cloud offers the types of kiln's catalog (and `instance_types`) to the account: as it said
        within the last day (kept in KILN_HOME/offerings/KIND.json), else asked now and kept."""
        try:
            account = self.cloud.account(**self.connection())
        except ImportError as error:  # an SDK installed as kiln's extra, left out
            raise UsageError(f"{self.facts.kind}: its SDK is not installed ({error}): pip install "
                             f"'kiln[{self.facts.kind}]'") from None
        types = tuple(dict.fromkeys([*(m.instance_type for m in catalog.of_cloud(self.facts.kind)), *instance_types]))
        now = datetime.now(UTC)
        kept = offered.Record.from_json(state.load_offerings(self.facts.kind) or {})
        if kept and not refresh and kept.answers(account, types, now):
            return kept
        record = changed(self.cloud.offerings(types, **self.connection()), account=account)
        state.save_offerings(self.facts.kind, record.to_json())
        return record

    def spot_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        if not self.facts.prices:
            return {}
        return self.cloud.spot_prices(instance_types, **self.given(self.facts.priced_by))

    def on_demand_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        if not self.facts.on_demand_from:
            return {}
        return self.cloud.on_demand_prices(instance_types, **self.given(self.facts.priced_by))


@functools.cache
def place_names(kind: str, connection: tuple[tuple[str, str | None], ...], near: str) -> tuple[str, ...] | None:
    """The places the cloud has (every one, or where the cloud can tell cheaply that `near` is one, just it), asked
    once per command and place; None where it cannot be asked."""
    try:
        return tuple(importlib.import_module(f"{CLOUDS[kind].package}.cloud").place_names(**dict(connection),
                                                                                         near=near))
    except (KilnError, ImportError):  # no credentials, or its SDK (an extra) is not installed
        return None


PROVIDERS = CLOUDS = {
    "aws": CloudFacts(
        "aws", "bootstrap.providers.aws", host_keys="each instance's console output (GetConsoleOutput)",
        # a spot instance learns it is being stopped two minutes ahead; autostop's power-off terminates it
        # (launched with InstanceInitiatedShutdownBehavior=terminate: a stopped instance's disks would still bill)
        shutdown="system", notice=Notice("ec2", "IMDSv2 latest/meta-data/spot/instance-action"),
        up_options=frozenset({"instance_type", "spot", "max_price", "ami", "image_profile", "image_tags", "ssh_cidr",
                              "user", "ttl_hours", "ssh_wait", "volume", "region", "profile"}),
        where=("region", "profile"), scope="region", connects=("region", "profile"),
        place_word="an AWS region",
        prices="EC2's spot price history (the newest price in each zone of the region, the lowest of them)",
        on_demand_from="AWS's Price List (GetProducts: Linux, shared tenancy, the region's on-demand price)",
        priced_by=("region", "profile"), machine="instance", volume="data volume", keys_from="the console output",
        keys_shown="their consoles show", found_by="tagged kiln:cluster={name}", snapshot_word=""),
    "gcp": CloudFacts(
        "gcp", "bootstrap.providers.gcp",
        host_keys="each instance's guest attributes (hostkeys/), else its serial port output",
        # a Spot VM learns it is being preempted about 30 s ahead; autostop's power-off stops the VM (its GPUs and
        # CPUs stop billing, its disks bill until kiln down: GCE has no terminate-on-shutdown for standard VMs)
        shutdown="system", notice=Notice("gce", "the metadata server's instance/preempted"),
        up_options=frozenset({"instance_type", "spot", "max_price", "source_image", "image_profile", "image_tags",
                              "ssh_cidr", "user", "ttl_hours", "ssh_wait", "volume", "project", "zone"}),
        # a project's list holds every zone's
        where=("project", "zone"), scope="project", connects=("project",),
        place_word="a GCP zone",
        prices="GCP's Cloud Billing Catalog (the Spot SKUs of the series' vCPU and memory and of the GPUs in the "
               "zone's region)",
        on_demand_from="GCP's Cloud Billing Catalog (the SKUs of the series' vCPU and memory and of the GPUs in "
                       "the zone's region)",
        priced_by=("project", "zone"),
        machine="instance", volume="data disk", keys_from="the instances' guest attributes and serial ports",
        keys_shown="they show", found_by="labelled kiln-cluster={name}",
        env=gcp_plan.ENV),
    "azure": CloudFacts(
        "azure", "bootstrap.providers.azure", host_keys="each VM's serial log (boot diagnostics)",
        # a Spot VM learns from Scheduled Events it is being evicted, at least 30 s ahead. Autostop deallocates: a
        # VM that only powered itself off would stay allocated and billed, so each VM's identity may deallocate
        # that VM alone, and its idle agent asks Resource Manager to (its disks bill until kiln down)
        shutdown="azure", notice=Notice("azure", "Scheduled Events' Preempt event"),
        up_options=frozenset({"instance_type", "spot", "max_price", "image_id", "image_profile", "image_tags",
                              "ssh_cidr", "user", "ttl_hours", "ssh_wait", "volume", "subscription", "location"}),
        where=("subscription", "location"), scope="subscription",  # a subscription's list holds every location's
        connects=("subscription",),
        place_word="an Azure location", places_any_case=True,
        prices="Azure's Retail Prices API (the Linux Spot meter of the size in the location)",
        on_demand_from="Azure's Retail Prices API (the Linux pay-as-you-go meter of the size in the location)",
        priced_by=("location",), machine="VM", volume="data disk", keys_from="the VMs' serial logs",
        keys_shown="their serial logs show", found_by="in resource group kiln-{name}",
        env=azure_plan.ENV),
}
