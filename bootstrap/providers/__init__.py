"""Where a cluster's machines come from: the one seam between kiln's tasks and a cloud.

Every provider implements the same verbs (`Provider` below): check a request and print its plan (`up --dry-run`),
make a cluster and roll it back on any failure (`up`), remove it (`down`, with snapshots of its data volumes where
it has them), `list` and `sweep` what kiln made there, put a fresh machine in a lost one's place (`replace`, for
`train --managed`) and get its nodes ready to power themselves off (`arm_autostop`). It also says where host keys
come from (never first contact), how a node learns it is being preempted and how long it has, and what autostop's
power-off means there. `kiln up --provider KIND` picks one, the cluster file remembers it, and the tasks call it
without knowing which it is.

local: the network-namespace cluster of localcloud.cluster on this machine (root), whose nodes can be lost and
replaced by fresh ones with new host keys. aws: EC2 through boto3 (bootstrap.providers.aws). gcp: Compute Engine
through google-cloud-compute (bootstrap.providers.gcp). azure: Resource Manager through the azure-mgmt clients
(bootstrap.providers.azure).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bootstrap import state
from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host
from bootstrap.shim import interruption

# kind -> the module whose `PROVIDERS[kind]` implements it (imported when asked for): every cloud's is
# bootstrap.providers.clouds' one CloudProvider, placed by the cloud's facts; the local cluster's is its own
KINDS = {"aws": "bootstrap.providers.clouds", "azure": "bootstrap.providers.clouds",
         "gcp": "bootstrap.providers.clouds", "local": "bootstrap.providers.local"}
# What `kiln up` takes for every provider; the rest of its options belong to one provider or another.
COMMON_UP_OPTIONS = ("name", "count", "idle_minutes", "dry_run", "provider")


@dataclass(frozen=True)
class Replacement:
    """A lost machine and the fresh one in its place, with the host keys the provider vouches for."""

    old: Host
    new: Host
    host_keys: tuple[str, ...]


@dataclass(frozen=True)
class Added:
    """A machine `grow` made for a cluster: how to reach it, its address on the cluster's network, and the host
    keys the provider vouches for."""

    host: Host
    address: str
    host_keys: tuple[str, ...]


@dataclass(frozen=True)
class Made:
    """A cluster `up` made: its name, what to tell the user, the hosts whose keys the provider did not show (kiln
    does not log in to them, so their autostop agents cannot start), and when it expires (where it does)."""

    name: str
    lines: tuple[str, ...]
    unpinned: tuple[str, ...] = ()
    expires: str = ""


@dataclass(frozen=True)
class Notice:
    """How a node learns it is being preempted: whose metadata its watcher reads (shim/interruption.py's
    --source: ec2, gce, or any that answers), what it reads there, and (from the watcher's table, the one place
    these are written) how long the cloud gives before the machine goes and how much of it a run's processes get
    to checkpoint (with `any`: the shortest)."""

    source: str
    what: str

    @property
    def lead_s(self) -> float:
        return min(lead for name, (lead, _) in interruption.SOURCES.items() if self.source in (name, "any"))

    @property
    def grace_s(self) -> float:
        return min(grace for name, (_, grace) in interruption.SOURCES.items() if self.source in (name, "any"))


@dataclass(frozen=True)
class Gone:
    """What `down` removed (lines to print); `kept` names what it could not remove or snapshot, and why."""

    lines: tuple[str, ...]
    kept: tuple[str, ...] = ()


class Unfound(KilnError):
    """`down` found nothing of a cluster where its cluster file says it is: the files stay (its key among them), and
    the message says where kiln looked."""

    def __init__(self, name: str, looked: str, folder: str):
        self.name, self.looked, self.folder = name, looked, folder
        super().__init__(f"cluster {name}: nothing of it is in {looked}, where its cluster file says it is; kiln "
                         f"keeps its key and files ({folder}) rather than forget a cluster that may still run "
                         f"somewhere. Once you know it is gone: kiln down {name} --forget")


class Provider(Protocol):
    kind: str
    # Where the nodes' host keys come from (the provider shows them; kiln never trusts a first contact).
    host_keys: str
    # What autostop's power-off is on a node (node.py autostop): "system" powers the machine off, and the cloud
    # then ends it; "namespace" kills a local node's processes, as a machine switched off.
    shutdown: str
    notice: Notice
    # kiln up's options this provider takes, besides COMMON_UP_OPTIONS (task parameter names).
    up_options: frozenset[str]
    # Whether its nodes can have data volumes (down --snapshot, up --volume).
    volumes: bool
    # The options that place its clusters (its constructor's parameters): aws region and profile, gcp project and
    # zone, local none.
    where: tuple[str, ...]
    # Where up --by-price reads the spot price of its machines now ("": kiln reads none there).
    prices: str
    # Where up --by-price reads the on-demand price of its machines ("": kiln reads none there).
    on_demand_from: str
    # The option of `where` that bounds what `list` and `sweep` see (an AWS region; a GCP project and an Azure
    # subscription hold every region's clusters); None: one place holds them all (local).
    scope: str | None

    def request(self, name: str, count: int, options: Mapping[str, Any], idle_minutes: float | None) -> Any:
        """Check a `kiln up` (one UsageError line naming the bad input); nothing is made."""

    def plan(self, request: Any) -> list[str]:
        """What `up` would do (kiln up --dry-run); nothing is made."""

    def up(self, request: Any, say: Callable[[str], None] | None = None) -> Made:
        """Make the cluster and write its cluster file; any failure removes what was made. `say` is told each step
        and each node as it comes."""

    def down(self, name: str, *, snapshot_ttl_days: float | None = None) -> Gone:
        """Remove the cluster (with snapshot_ttl_days: snapshot its data volumes first); safe to repeat."""

    def list(self) -> list[str]:
        """The clusters (and data snapshots) kiln made here, a line each."""

    def sweep(self, *, dry_run: bool = False) -> list[str]:
        """Remove what is past its expiry; a line for each."""

    def places(self, every: bool = False) -> list[str | None]:
        """The values of `scope` that `list` and `sweep` look in besides the clusters' files: its own (given, or
        configured; None where only the cloud can tell), or with `every` all the account's (list --all-regions)."""

    def replace(self, cluster: str, host: Host) -> Replacement:
        """Put a fresh machine in a lost one's place, as the cluster's others were made; the old one goes."""

    def grow(self, cluster: str, count: int) -> list[Added]:
        """`count` machines more for the cluster (a queue's nodes resumed), made as its others were, each with the
        host keys its provider shows pinned, in its cluster file; all of them, or none (CloudError)."""

    def shrink(self, cluster: str, hosts: Sequence[Host]) -> None:
        """The cluster's machines of `hosts` removed (a queue's idle nodes suspended), and out of its file."""

    def arm_autostop(self, cluster: str) -> None:
        """Get the cluster ready for its nodes to power themselves off (e.g. a power-off that terminates)."""

    def spot_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        """The spot price now (USD an hour) of each type, where it is placed (up --by-price); those it has none of
        are left out."""

    def on_demand_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        """The on-demand price (USD an hour) of each type, where it is placed (up --by-price); those it has none
        of are left out."""


def provider_class(kind: str):
    if kind not in KINDS:
        raise UsageError(f"--provider {kind}: choose one of {', '.join(sorted(KINDS))}")
    return importlib.import_module(KINDS[kind]).PROVIDERS[kind]


def named(kind: str, where: Mapping[str, Any] | None = None) -> Provider:
    """The provider of this kind, placed by `where` (e.g. an AWS region and profile, a GCP project and zone);
    options given that place another provider's clusters are refused by flag."""
    chosen = provider_class(kind)
    given = {key: value for key, value in (where or {}).items() if value is not None}
    foreign = sorted(key for key in given if key not in chosen.where)
    if foreign:
        takes = ", ".join("--" + key for key in chosen.where) or "nothing: its cluster is on this machine"
        raise UsageError(f"{', '.join('--' + key for key in foreign)}: not options of --provider {kind} (it is "
                         f"placed by {takes})")
    return chosen(**given)


def for_cluster(record: state.ClusterRecord | None, name: str | None) -> Provider:
    """The provider of a cluster kiln made, placed where its cluster file says it is."""
    if record is None or record.provider is None:
        raise UsageError(f"--managed and --down-after need a cluster that kiln started (kiln up NAME --provider "
                         f"{'|'.join(sorted(KINDS))}, then --cluster NAME); {name or 'these hosts'} "
                         f"{'is' if name else 'are'} not one")
    return placed(record, {})


def placed(record: state.ClusterRecord, given: Mapping[str, Any]) -> Provider:
    """The provider of a cluster kiln made (`record`, its cluster file), placed where the file says it is; the
    options `given` on the command line only add what the file does not hold (an AWS profile)."""
    if record.provider not in KINDS:
        raise UsageError(f"cluster {record.name}: kiln does not know the provider {record.provider!r} of its file")
    return named(record.provider, place_of(record.name, record.where, given))


def place_of(name: str, recorded: Mapping[str, str], given: Mapping[str, Any]) -> dict[str, Any]:
    """Where a cluster's verbs look (pure): the place its file records, whatever the command line's defaults
    (AWS_DEFAULT_REGION) say; the options given fill only what the record does not hold, and one that says
    otherwise than the record is refused by flag (the cluster is not there)."""
    given = {key: value for key, value in given.items() if value is not None}
    for key, value in sorted(given.items()):
        if key in recorded and str(value) != recorded[key]:
            raise UsageError(f"--{key} {value}: cluster {name} is in {key} {recorded[key]} (its cluster file says "
                             f"so); leave --{key} out")
    return {**given, **recorded}


def search_places(recorded: Sequence[str | None], own: Sequence[str | None]) -> list[str | None]:
    """Where `list` and `sweep` look (pure): every place a cluster file here records, then the provider's own
    (given, configured, or all the account's), each once. A place only the cloud can tell (None: a GCP project from
    the credentials alone) is looked in only where there is no other."""
    order = list(dict.fromkeys(place for place in (*recorded, *own) if place))
    return order or [None]


def recorded_places(kind: str, records: Sequence[state.ClusterRecord]) -> list[str]:
    """The `scope` values of the clusters of this kind that kiln made from here (their cluster files)."""
    scope = provider_class(kind).scope
    return [record.where[scope] for record in records
            if scope and record.provider == kind and scope in record.where]


@dataclass(frozen=True)
class Looked:
    """What `list` or `sweep` found in each place it looked: the lines (under a heading per place where it looked
    in several), the places, and those it could not look in (place, why)."""

    lines: tuple[str, ...]
    places: tuple[str, ...]
    failed: tuple[tuple[str, str], ...] = ()


def look_everywhere(kind: str, given: Mapping[str, Any], every: bool, verb: str, **options: Any) -> Looked:
    """Call a provider's `list` or `sweep` (`verb`, with `options`) in every place that holds its clusters
    (search_places: the cluster files' places, then the given or configured one, or with `every` all the
    account's): a cluster made elsewhere than the default is never missed. One place that cannot be read does not
    hide the others."""
    own = named(kind, given)
    if not own.scope:
        return Looked(tuple(getattr(own, verb)(**options)), ())
    # a cluster file that cannot be read takes nothing away from the search (sweep is the expiry's safety net)
    places = search_places(recorded_places(kind, state.list_clusters(lenient=True)), own.places(every))
    if places == [None]:
        return Looked(tuple(getattr(own, verb)(**options)), ())
    lines: list[str] = []
    failed: list[tuple[str, str]] = []
    for place in places:
        where = f"{kind} {own.scope} {place}"
        try:
            found = getattr(named(kind, {**given, own.scope: place}), verb)(**options)
        except KilnError as error:
            failed.append((where, str(error)))
            continue
        if len(places) == 1:
            lines += found
        elif found:
            lines += [f"{where}:", *(f"  {line}" for line in found)]
    return Looked(tuple(lines), tuple(f"{own.scope} {place}" for place in places), tuple(failed))


def notice_source(record: state.ClusterRecord | None) -> str:
    """Whose preemption notices the nodes' watchers read: the cluster's provider's, or any that answers (hosts
    kiln did not make)."""
    if record is None or record.provider not in KINDS:
        return "any"
    return provider_class(record.provider).notice.source


def refuse_foreign_options(provider: Provider, given: Mapping[str, Any]) -> None:
    """One line naming the options given (not at their defaults) that this provider does not take."""
    foreign = sorted(name for name in given if name not in provider.up_options and name not in COMMON_UP_OPTIONS)
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        takes = ", ".join("--" + name.replace("_", "-") for name in sorted(provider.up_options)) or "no other option"
        raise UsageError(f"{flags}: not options of --provider {provider.kind} (it takes a name, --count, "
                         f"--idle-minutes and {takes})")


# How `kiln up --help` names each provider's options.
TITLES = {"aws": "AWS", "gcp": "GCP", "azure": "Azure", "local": "local"}


def option_groups(options: Sequence[str], takes: Mapping[str, frozenset[str]] | None = None) -> list[
        tuple[str, list[str]]]:
    """`options` (task parameter names) grouped by the providers that take them, for a task's help: those every
    provider takes first, then those of several providers, then each provider's own (pure, given `takes`: each
    provider's options, up_options and where; default: every provider's)."""
    if takes is None:
        takes = {kind: frozenset(provider_class(kind).up_options) | frozenset(provider_class(kind).where)
                 for kind in KINDS}
    kinds = list(takes)
    groups: dict[tuple[str, ...], list[str]] = {}
    for option in options:
        taken_by = tuple(kind for kind in kinds if option in takes[kind])
        groups.setdefault(taken_by if option not in COMMON_UP_OPTIONS else (), []).append(option)
    order = sorted(groups, key=lambda by: (bool(by), -len(by), [kinds.index(kind) for kind in by]))
    return [(title_of(by), groups[by]) for by in order]


def title_of(kinds: Sequence[str]) -> str:
    if not kinds:
        return "every provider"
    names = [TITLES.get(kind, kind) for kind in kinds]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
