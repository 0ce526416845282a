"""Where a cluster is made when its `up` names several candidates (clouds, places, instance types, spot then
on-demand): the up's options checked against every candidate's provider, each candidate's request prepared before
anything is made, the candidates ordered (by spot price where asked), and the first that comes up whole recorded
with what the up asked (capacity.json), so that a managed run's move can bring the cluster up again at its other
places (`up_again`). The `up` task and a move both come here; `say` prints a line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bootstrap import autostop, providers, state
from bootstrap.errors import KilnError, UsageError
from bootstrap.providers import common, failover
from bootstrap.providers import offerings as offered

PROVIDER_OPTIONS = ("instance_type", "spot", "max_price", "ami", "source_image", "image_id", "image_profile",
                    "image_tags", "ssh_cidr", "user", "ttl_hours", "ssh_wait", "volume", "region", "profile", "project",
                    "zone", "subscription", "location", "docker")
# The options that place a provider's clusters (each provider takes its own: Provider.where).
WHERE_OPTIONS = ("region", "profile", "project", "zone", "subscription", "location")
# The defaults of kiln up's provider options: one given at its default is not counted as given.
UP_DEFAULTS = {"image_profile": "gpu", "ttl_hours": 24.0, "ssh_wait": common.SSH_WAIT_S}


def given_options(values: dict) -> dict:
    """The provider options of a `kiln up` that were given (not left at their defaults)."""
    return {name: values[name] for name in PROVIDER_OPTIONS
            if values.get(name) not in (None, False) and values[name] != UP_DEFAULTS.get(name)}


@dataclass(frozen=True)
class Planned:
    """An up's candidates in the order they are tried, each with its provider and checked request."""

    clouds: list[str]
    types: dict[str, list[str]]  # per cloud: the instance types asked (--gpus: the catalog's)
    order: list[failover.Candidate]
    prepared: dict  # candidate -> (provider, request)
    idle_minutes: float | None
    max_attempts: int  # the most a round tries (--max-attempts)
    where_from: tuple[str, ...] = ()  # what the up read of where clouds offer the types, for a cloud it left open
    prices: dict = field(default_factory=dict)  # candidate -> its on-demand price, where those offerings gave one


def plan_up(name: str, values: dict) -> Planned:
    """Every candidate of an up (`values`: its options), each one's request checked before anything is made
    (UsageError for an option no candidate can take, or one that holds in a single place with several)."""
    clouds = failover.parse_clouds(values["provider"], tuple(providers.KINDS))
    if values["on_demand_fallback"] and not values["spot"]:
        raise UsageError("--on-demand-fallback: falls back from --spot machines; give --spot too")
    max_attempts = max_attempts_of(values)
    types = failover.types_of(clouds, values["gpus"], values["instance_type"])
    places = failover.places_of(clouds, values["zones"], values["regions"], values)
    places, records, unread, where_from = open_places(clouds, places, types, values)
    order = [candidate for candidate in failover.candidates([c for c in clouds if places[c]], places, types,
                                                            bool(values["spot"]), values["on_demand_fallback"])
             if candidate.cloud not in records or not offered.missing(records[candidate.cloud], candidate.place,
                                                                      candidate.instance_type)]
    if not order:
        raise UsageError(f"--gpus {values['gpus']}: no place of --provider {values['provider']} to try: "
                         + "; ".join(where_from))
    idle_minutes = autostop.validate_idle_minutes(values["idle_minutes"]) or None
    refuse_foreign(clouds, values)
    failover.refuse_across_places(order, {key: values[key] for key in ("volume", "ami", "image_id")})
    if len(order) > 1 and state.load_cluster(name) is not None:
        raise UsageError(f"cluster {name} exists here (kiln down {name} first): trying other places could make a "
                         "second one of that name")
    prepared = prepare_each(name, order, values, idle_minutes, clouds, unread, where_from)
    order = [candidate for candidate in order if candidate in prepared]
    if not order:
        raise UsageError(f"--gpus {values['gpus']}: no place of --provider {values['provider']} to try: "
                         + "; ".join(where_from))
    prices = {candidate: price for candidate in order if candidate.cloud in records and not candidate.spot
              and (price := offered.price_of(records[candidate.cloud], candidate.place, candidate.instance_type))
              is not None}
    return Planned(clouds, types, order, prepared, idle_minutes, max_attempts, tuple(where_from), prices)


def prepare_each(name: str, order: list[failover.Candidate], values: dict, idle_minutes: float | None,
                 clouds: list[str], unread: set[str], said: list[str]) -> dict:
    """Each candidate's provider and checked request (prepare). A cloud of several whose offerings could not be
    read (`unread`) and whose own default place its request cannot do without (GCP's zone, Azure's location) is
    left out, and `said` says so; any other refusal is the up's."""
    prepared, left_out = {}, set()
    for candidate in order:
        try:
            prepared[candidate] = prepare(name, values["count"], candidate, values, idle_minutes, len(clouds) > 1)
        except UsageError as error:
            if candidate.place or candidate.cloud not in unread or len(clouds) == 1:
                raise
            if candidate.cloud not in left_out:
                said.append(f"{candidate.cloud}: left out: {error}")
                left_out.add(candidate.cloud)
    return prepared


def known_offerings(clouds: list[str], *, refresh: bool) -> tuple[dict[str, offered.Record], dict[str, str]]:
    """What kiln knows of where each cloud offers the types of its catalog: with `refresh`, as each cloud answers
    now (why not, for a cloud that cannot be asked), else as kept from the last answer, however old."""
    kept, unread = {}, {}
    for cloud in clouds:
        if refresh:
            try:
                kept[cloud] = providers.named(cloud).offerings(refresh=True)
            except KilnError as error:
                unread[cloud] = str(error)
        elif record := offered.Record.from_json(state.load_offerings(cloud) or {}):
            kept[cloud] = record
    return kept, unread


def open_places(clouds: list[str], places: dict[str, list[str]], types: dict[str, list[str]],
                values: dict) -> tuple[dict[str, list[str]], dict[str, offered.Record], set[str], list[str]]:
    """Where an up asked by --gpus tries a cloud for which it names no place (no --region, --zone, --location or
    list, and none in the cloud's own settings): every place that offers the types to the account, as the cloud
    says (its offerings, kept a day). The places of each cloud, the offerings read, the clouds whose offerings
    could not be read (no credentials: its own default place is its one candidate, as with no --gpus; an up of
    several clouds leaves out one that has none), and what to say of them."""
    found, records, unread, lines = dict(places), {}, set(), []
    if not values["gpus"]:
        return found, records, unread, lines
    for cloud in clouds:
        if places.get(cloud) != [""] or not types.get(cloud):
            continue
        option = failover.PLACE[cloud]
        chosen = providers.named(cloud, {key: values[key] for key in providers.provider_class(cloud).where})
        try:
            if chosen.default_place():
                continue
            record = chosen.offerings(types[cloud])
        except ImportError as error:  # its SDK, a kiln extra, not installed
            lines.append(f"{cloud}: no --{option} given or configured, and its SDK is not installed ({error}: pip "
                         f"install 'kiln[{cloud}]'): its own default {option} is tried")
            unread.add(cloud)
            continue
        except KilnError as error:
            lines.append(f"{cloud}: no --{option} given or configured, and where {cloud} offers "
                         f"{', '.join(types[cloud])} could not be read ({error}): its own default {option} is tried")
            unread.add(cloud)
            continue
        found[cloud], records[cloud] = offered.places_of(record, types[cloud]), record
        regions, zones = offered.summary(record, types[cloud])
        order = ", the cheapest first" if any(o.price is not None for o in record.offerings) else ""
        lines.append(f"{cloud}: no --{option} named: every {option} that offers {', '.join(types[cloud])} to this "
                     f"account{order}, {len(found[cloud])} ({regions} region(s), {zones} zone(s); "
                     f"{offered.describe(record)})")
        lines += [f"  left out: {line}" for line in offered.closed(record, types[cloud])]
    return found, records, unread, lines


def max_attempts_of(values: dict) -> int:
    """--max-attempts of an up's options, checked (a capacity.json written before it has none: the default)."""
    return failover.check_max_attempts(values.get("max_attempts", failover.MAX_ATTEMPTS))


def by_price(planned: Planned, say: Callable[[str], None]) -> tuple[list[failover.Candidate], dict]:
    """The candidates cheapest first by the price each cloud gives (spot ones by their price now, then on-demand
    ones by theirs; those without one follow in the up's order), and the prices."""
    prices = read_prices(planned.order, planned.prepared, say)
    return failover.by_price(planned.order, prices), prices


def read_prices(order: list[failover.Candidate], prepared: dict,
                say: Callable[[str], None]) -> dict[failover.Candidate, float]:
    """The price of each candidate whose cloud gives one (up --by-price): spot now, or on demand by the hour, read
    once per place and kind; a place whose prices cannot be read is said, and its candidates keep their place
    after the priced ones."""
    prices: dict[failover.Candidate, float] = {}
    for (cloud, place, spot), kinds in failover.price_requests(order).items():
        group = [c for c in order if (c.cloud, c.place, c.spot) == (cloud, place, spot)]
        chosen = prepared[group[0]][0]
        where, kind = f"{cloud} {place or '(its default place)'}", "spot" if spot else "on-demand"
        if not (chosen.prices if spot else chosen.on_demand_from):
            say(f"up: {where}: kiln reads no {kind} prices of {cloud}; its candidates follow the priced ones")
            continue
        try:
            found = chosen.spot_prices(kinds) if spot else chosen.on_demand_prices(kinds)
        except KilnError as error:
            say(f"up: {where}: {error}; its candidates follow the priced ones")
            continue
        prices.update({c: found[c.instance_type] for c in group if c.instance_type in found})
    return prices


def refuse_foreign(clouds: list[str], values: dict) -> None:
    """With several clouds, an option none of them takes (--subscription with aws,gcp) is refused by flag; one
    that only some take goes to those (prepare). One provider refuses its foreign options itself."""
    if len(clouds) < 2:
        return
    chosen = [providers.provider_class(cloud) for cloud in clouds]
    taken = {key for kind in chosen for key in (*kind.where, *kind.up_options)}
    foreign = sorted(key for key in given_options(values) if key not in taken and key not in
                     providers.COMMON_UP_OPTIONS and key != "instance_type")
    if foreign:
        raise UsageError(f"{', '.join('--' + key.replace('_', '-') for key in foreign)}: an option of none of "
                         f"--provider {','.join(clouds)}")


def asked(values: dict) -> dict:
    """What an `up` was asked, as capacity.json keeps it (every option but the context and --dry-run)."""
    return {key: value for key, value in values.items() if key not in ("c", "dry_run")}


def up_again(name: str, capacity: dict, say) -> failover.Candidate:
    """Bring cluster `name` (taken down already) up again as its `kiln up` was asked (`capacity`: its capacity.json,
    read before the down), at its candidates of other places (failover.moved_order): where a managed run moves when
    its place has no capacity left. The candidate it came up at."""
    values = capacity.get("asked")
    if not values:
        raise KilnError(f"cluster {name}: what its kiln up asked is not on record (made by an older kiln): it cannot "
                        "be brought up elsewhere")
    candidates = failover.candidates_of(capacity)[0]
    order = failover.moved_order(*failover.candidates_of(capacity))
    clouds = list(dict.fromkeys(candidate.cloud for candidate in order))
    idle_minutes = autostop.validate_idle_minutes(values.get("idle_minutes")) or None
    prepared = {candidate: prepare(name, values["count"], candidate, values, idle_minutes, len(clouds) > 1)
                for candidate in order}
    made, candidate = bring_up(order, prepared, values, say, 0.0, candidates)
    say("\n".join(made.lines))
    return candidate


def bring_up(order: list[failover.Candidate], prepared: dict, values: dict, say, deadline_s: float,
             candidates: list[failover.Candidate] | None = None) -> tuple[providers.Made, failover.Candidate]:
    """The first candidate that comes up (failover.until_up), and where: capacity.json records it, with what the
    up was asked (`values`) and every candidate it named (`candidates`, default `order`: a move tries fewer, but
    the place it left stays one to move back to)."""
    made, candidate, tried = failover.until_up(order, lambda one: prepared[one][0].up(prepared[one][1], say=say), say,
                                               deadline_s, max_attempts=max_attempts_of(values))
    state.save_capacity(made.name, failover.capacity_record(candidates or order, candidate, tried, values))
    return made, candidate


def prepare(name: str, count: int, candidate: failover.Candidate, values: dict, idle_minutes: float | None,
            several_clouds: bool) -> tuple[providers.Provider, object]:
    """The provider placed where `candidate` is, and its checked request for that candidate (nothing is made)."""
    where = {key: values[key] for key in WHERE_OPTIONS}
    if candidate.cloud in failover.PLACE:
        where[failover.PLACE[candidate.cloud]] = candidate.place or None
    options = {**{key: values[key] for key in PROVIDER_OPTIONS}, "instance_type": candidate.instance_type or None,
               "spot": candidate.spot,
               # an on-demand fallback try carries no spot price; without --spot the provider refuses --max-price
               "max_price": None if values["spot"] and not candidate.spot else values["max_price"]}
    if several_clouds:  # each cloud gets the options it takes (refuse_foreign refused those none takes)
        kind = providers.provider_class(candidate.cloud)
        where = {key: value for key, value in where.items() if key in kind.where}
        options = {key: value for key, value in options.items()
                   if key in kind.where or key in kind.up_options or key not in (*WHERE_OPTIONS, *kind_options())}
    chosen = providers.named(candidate.cloud, where)
    providers.refuse_foreign_options(chosen, given_options(options))
    return chosen, chosen.request(name, count, options, idle_minutes)


def kind_options() -> set[str]:
    """Every option some provider takes for itself (up_options), besides the common ones."""
    return {key for kind in providers.KINDS for key in providers.provider_class(kind).up_options}


