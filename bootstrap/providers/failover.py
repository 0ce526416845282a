"""Where a cluster may come up, in the order kiln tries, and what each cloud's errors mean for the next try: the
candidates of a `kiln up` (cloud, place, instance type, spot or on-demand), each cloud's capacity and quota error
codes as the clouds document them, and the loop that takes the first candidate that comes up whole. Pure but for
the loop's `attempt`, which makes one candidate's cluster (all of it, or nothing: each cloud's `up` undoes what it
made on any failure).

What an error means is bootstrap.providers.meanings' tables. A capacity error (the zone or region has no such
machines now), or a request refused for that place alone (a type the zone does not offer), moves on to the next
candidate; a quota error skips the rest of that region (of the cloud, for a quota of every region) and says which;
any other error stops at once (a bad request fails everywhere), as does an attempt that could not remove all it made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TypeVar

from bootstrap.errors import KilnError, UsageError
from bootstrap.providers import catalog, meanings

CLOUDS = ("aws", "gcp", "azure")


class CloudError(KilnError):
    """A cloud call failed; `code` is the cloud's own error code where it gave one, `left` whether undoing the
    attempt left anything behind (then kiln tries nothing else), `detail` what kiln measured where it refused
    before asking the cloud (a quota's numbers), said beside the verdict."""

    def __init__(self, message: str = "", *, code: str = "", left: bool = False, detail: str = ""):
        super().__init__(message)
        self.code, self.left, self.detail = code, left, detail


class Unavailable(UsageError):
    """A request its cloud refuses before anything is made, for this place alone (a size Azure does not offer
    there, or not to this subscription): bad input with one candidate, the next candidate's turn with several."""

    def __init__(self, message: str, *, code: str):
        super().__init__(message)
        self.code, self.left = code, False


class NoCapacity(KilnError):
    """Every candidate was tried and none came up; the message lists what each said. `refused_only`: every place
    refused the request itself, before anything was made (Unavailable); `tried`: the tries."""

    def __init__(self, message: str, *, refused_only: bool = False, tried: Sequence[Tried] = ()):
        super().__init__(message)
        self.refused_only, self.tried = refused_only, list(tried)


class Refused(NoCapacity, UsageError):
    """Every candidate's place refused the request itself before anything was made (no such type there, no image
    there): bad input, as with one candidate; the message says each refusal once."""


@dataclass(frozen=True)
class Candidate:
    """One way to make the cluster: on `cloud`, at `place` (AWS and Azure: a region; GCP: a zone; "" the provider's
    own default), of `instance_type`, as spot or on-demand machines."""

    cloud: str
    place: str
    instance_type: str
    spot: bool

    @property
    def region(self) -> str:
        """Where a quota holds: a GCP zone's region (us-central1 of us-central1-a), else the place."""
        return self.place.rsplit("-", 1)[0] if self.cloud == "gcp" and self.place.count("-") >= 2 else self.place

    def describe(self) -> str:
        return (f"{self.cloud} {self.place or '(its default place)'} {self.instance_type or '(its default type)'} "
                f"{'spot' if self.spot else 'on-demand'}")


@dataclass(frozen=True)
class Tried:
    candidate: Candidate
    verdict: str  # capacity, quota, unavailable
    code: str  # the cloud's error code
    refused: bool = False  # refused before anything was made (Unavailable)
    looked: bool = False  # kiln's own look refused it (a quota's numbers), before the cloud was asked to make it
    round: int = 1  # --retry-until-up's round it was tried in


def candidates(clouds: Sequence[str], places: Mapping[str, Sequence[str]], types: Mapping[str, Sequence[str]],
               spot: bool, on_demand_fallback: bool) -> list[Candidate]:
    """Every candidate in the order kiln tries them: the clouds in the user's order, in each its places in the
    user's order, in each its instance types in preference order; spot everywhere first, then (with the fallback)
    on-demand everywhere."""
    kinds = [spot] + ([False] if spot and on_demand_fallback else [])
    return [Candidate(cloud, place, kind, is_spot)
            for is_spot in kinds for cloud in clouds for place in (places.get(cloud) or [""])
            for kind in types[cloud]]


def classify(cloud: str, code: str, message: str = "") -> str:
    """capacity, unavailable, quota, or stop: what a failed attempt's error (its code, and its message where the
    code says several things) means for the next candidate (meanings' tables; transient and bad requests stop)."""
    verdict = meanings.meaning(cloud, code, message).verdict
    return verdict if verdict in ("capacity", "unavailable", "quota") else "stop"


def verdict_of(cloud: str, error: CloudError | Unavailable) -> str:
    """classify's verdict on a failed attempt; a request refused for its place alone before anything was made
    (Unavailable: a type the zone does not offer, a size not open to the subscription there) is `unavailable`,
    whatever its code, but for a quota's."""
    verdict = classify(cloud, error.code, str(error))
    return "unavailable" if isinstance(error, Unavailable) and verdict != "quota" else verdict


T = TypeVar("T")
EVERY_REGION = "*"  # a quota that holds in every region of a cloud (GCE's GPUS_ALL_REGIONS)
# How many candidates an up tries in one round before it gives up (or, with --retry-until-up, waits for the next):
# each failed try is a cloud's answer and the undoing of what it made, up to a minute or two, so a dozen is already
# a quarter of an hour. --max-attempts sets it.
MAX_ATTEMPTS = 12


def check_max_attempts(count: int) -> int:
    """--max-attempts (the command line made it a whole number) of at least 1, else UsageError."""
    if count < 1:
        raise UsageError(f"--max-attempts {count}: give how many candidates an up may try, a whole number of at "
                         "least 1")
    return count


def first_fit(order: Sequence[Candidate], attempt: Callable[[Candidate], T], say: Callable[[str], None],
              max_attempts: int = MAX_ATTEMPTS) -> tuple[T, Candidate, list[Tried]]:
    """Try each candidate in turn until one comes up, `max_attempts` of them at most: (what `attempt` returned,
    that candidate, what was tried before it). A candidate in a region where a quota was hit is skipped, and one its
    place refused before anything was made (Unavailable: a type not offered, no image there) or kiln's own look at a
    quota refused (its numbers in the error's detail) costs no more than a look: none of these is an attempt; an
    error that is neither capacity nor quota, or an attempt that left something behind, is raised as it is."""
    tried: list[Tried] = []
    refusals: list[str] = []  # what each place that refused said
    over_quota: set[tuple[str, str, bool]] = set()  # spot and on-demand machines have quotas of their own
    untried = 0

    def skipped(candidate: Candidate) -> bool:
        return bool({(candidate.cloud, candidate.region, candidate.spot),
                     (candidate.cloud, EVERY_REGION, candidate.spot)} & over_quota)

    for index, candidate in enumerate(order):
        if skipped(candidate):
            continue
        if sum(not (one.refused or one.looked) for one in tried) >= max_attempts:
            untried = sum(1 for later in order[index:] if not skipped(later))
            say(f"up: {max_attempts} tried, the most a round tries (--max-attempts); {untried} not tried")
            break
        if len(order) > 1:
            say(f"up: trying {candidate.describe()} ({index + 1} of {len(order)})")
        try:
            return attempt(candidate), candidate, tried
        except (CloudError, Unavailable) as error:
            verdict = verdict_of(candidate.cloud, error)
            if verdict == "stop" or error.left or len(order) == 1:
                raise
            tried.append(Tried(candidate, verdict, error.code, isinstance(error, Unavailable),
                               looked=bool(getattr(error, "detail", ""))))
            if isinstance(error, Unavailable):
                refusals.append(str(error))
            if verdict == "quota":
                meant = meanings.meaning(candidate.cloud, error.code, str(error))
                over_quota.add((candidate.cloud, EVERY_REGION if meant.everywhere else candidate.region,
                                candidate.spot))
                which = f"{error.code}: {meant.quota}" if meant.quota else error.code
                say(f"up: {candidate.cloud} {candidate.region or 'its default place'}: over a quota ({which}): "
                    + (f"skipping every region of {candidate.cloud}" if meant.everywhere else "skipping the region")
                    + (f" ({error.detail})" if getattr(error, "detail", "") else ""))
            elif verdict == "unavailable":
                say(f"up: {candidate.describe()}: {error}; nothing was made")
            else:
                say(f"up: {candidate.describe()}: no capacity ({error.code}); nothing of it is left")
    capped = f", {untried} not tried (--max-attempts {max_attempts})" if untried else ""
    if tried and all(t.refused for t in tried) and not untried:
        raise Refused("no candidate can be made: " + "; ".join(dict.fromkeys(refusals)), refused_only=True,
                      tried=tried)
    raise NoCapacity(f"no candidate came up: tried {len(tried)}{capped}: "
                     + "; ".join(f"{t.candidate.describe()}: {t.verdict} ({t.code})" for t in tried),
                     refused_only=bool(tried) and all(t.refused for t in tried), tried=tried)


# --retry-until-up's waits between rounds: the first, doubled each round up to the longest.
RETRY_FIRST_WAIT_S = 10.0
RETRY_LONGEST_WAIT_S = 300.0


def retryable(error: BaseException, cloud: str) -> bool:
    """A whole round that found no capacity (or, with one candidate, its capacity or quota error), nothing left; a
    round where every place refused the request itself (Unavailable: a size not offered) is not tried again."""
    if isinstance(error, NoCapacity):
        return not error.refused_only
    return isinstance(error, CloudError) and not error.left and \
        classify(cloud, error.code, str(error)) in ("capacity", "quota")


def until_up(order: Sequence[Candidate], attempt: Callable[[Candidate], T], say: Callable[[str], None],
             deadline_s: float, *, sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic,
             max_attempts: int = MAX_ATTEMPTS) -> tuple[T, Candidate, list[Tried]]:
    """first_fit (`max_attempts` tries a round), round after round while no candidate has capacity, waiting longer
    each time (RETRY_FIRST_WAIT_S doubled up to RETRY_LONGEST_WAIT_S), until `deadline_s` from now; then the last
    round's error. A candidate its place does not offer (an unavailable verdict, or refused before anything was
    made) is left out of the later rounds: waiting does not make a zone offer a type."""
    end = clock() + deadline_s
    wait, round_ = RETRY_FIRST_WAIT_S, 0
    earlier: list[Tried] = []  # the rounds before this one's tries, each with its round
    while True:
        round_ += 1
        try:
            made, chosen, tried = first_fit(order, attempt, say, max_attempts)
            return made, chosen, [*earlier, *(replace(one, round=round_) for one in tried)]
        except (NoCapacity, CloudError, Unavailable) as error:
            left = end - clock()
            if deadline_s <= 0 or not retryable(error, order[0].cloud) or left <= 0:
                raise
            tries = error.tried if isinstance(error, NoCapacity) else [  # one candidate's error comes as it is
                Tried(order[0], verdict_of(order[0].cloud, error), error.code, isinstance(error, Unavailable))]
            earlier += [replace(one, round=round_) for one in tries]
            offered_nowhere = {one.candidate for one in tries if one.verdict == "unavailable" or one.refused}
            order = [candidate for candidate in order if candidate not in offered_nowhere]
            if not order:
                raise
            pause = min(wait, left)
            say(f"up: round {round_}: no capacity ({getattr(error, 'code', '') or 'any candidate'}); trying again "
                f"in {pause:.0f}s (--retry-until-up: {left:.0f}s left)")
            sleep(pause)
            wait = min(wait * 2, RETRY_LONGEST_WAIT_S)


# The `where` option that places each provider's cluster (a GCP zone, an AWS region, an Azure location), and the list
# option that gives several of them to try.
PLACE = {"aws": "region", "gcp": "zone", "azure": "location", "local": "zone"}
PLACES_OPTION = {"aws": "regions", "gcp": "zones", "azure": "regions", "local": "zones"}
ANY = "any"


def parse_clouds(provider: str, known: Sequence[str]) -> list[str]:
    """--provider as the clouds to try, in order: one kind, several (aws,gcp), or `any` (every cloud)."""
    names = list(CLOUDS) if provider == ANY else [name.strip() for name in str(provider).split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        raise UsageError(f"--provider {provider}: choose one of {', '.join(sorted(known))}, several of "
                         f"{', '.join(CLOUDS)} (aws,gcp), or {ANY}")
    if len(names) != len(set(names)):
        raise UsageError(f"--provider {provider}: a cloud named twice")
    if len(names) > 1 and any(name not in CLOUDS for name in names):
        raise UsageError(f"--provider {provider}: only clouds ({', '.join(CLOUDS)}) can be tried one after another")
    return names


def split_list(text: str | None) -> list[str]:
    return [item.strip() for item in str(text or "").split(",") if item.strip()]


def places_of(clouds: Sequence[str], zones: str | None, regions: str | None,
              where: Mapping[str, str | None]) -> dict[str, list[str]]:
    """Each cloud's places to try, in the user's order: --zones (GCP) and --regions (AWS, Azure; an entry written
    CLOUD:PLACE, azure:eastus, is that cloud's alone), else the one its own option gives (--region, --zone,
    --location; "" for the provider's default)."""
    lists = {"zones": split_list(zones), "regions": split_list(regions)}
    for option, text in (("zones", zones), ("regions", regions)):
        if text is not None and not lists[option]:  # `--zones ,`: asked for a list, and gave none
            raise UsageError(f"--{option} {text!r}: no {option[:-1]} in the list; name at least one, or leave "
                             f"--{option} out")
    for option, given in lists.items():
        takers = [cloud for cloud in clouds if PLACES_OPTION.get(cloud) == option]
        if given and not takers:
            other = "--regions (AWS regions, Azure locations)" if option == "zones" else "--zones (GCP zones)"
            raise UsageError(f"--{option} {','.join(given)}: no cloud of --provider {','.join(clouds)} is placed by "
                             f"it (use {other})")
    for option, given in lists.items():
        takers = [cloud for cloud in clouds if PLACES_OPTION.get(cloud) == option]
        for entry in given:
            owner = entry.split(":", 1)[0] if ":" in entry else ""
            if owner and owner not in takers:
                raise UsageError(f"--{option} {entry}: {owner} is not a cloud of --provider {','.join(clouds)} "
                                 f"that --{option} places ({', '.join(takers)})")
            if not owner and len(takers) > 1:
                raise UsageError(f"--{option} {entry}: say whose it is ({' or '.join(f'{t}:{entry}' for t in takers)})"
                                 f": --{option} places {' and '.join(takers)}, which name their places differently")
    places = {}
    for cloud in clouds:
        if cloud not in PLACE:
            continue
        listed = list(dict.fromkeys(entry.split(":", 1)[-1] for entry in lists[PLACES_OPTION[cloud]]
                                    if ":" not in entry or entry.split(":", 1)[0] == cloud))  # CLOUD:PLACE: its own
        if listed and where.get(PLACE[cloud]):
            raise UsageError(f"--{PLACE[cloud]} {where[PLACE[cloud]]} and --{PLACES_OPTION[cloud]}: give one")
        places[cloud] = listed or [where.get(PLACE[cloud]) or ""]
    return places


def types_of(clouds: Sequence[str], gpus: str | None, instance_type: str | None) -> dict[str, list[str]]:
    """Each cloud's instance types to try: those of the catalog that carry --gpus, else --instance-type (one cloud
    only: the clouds name their types differently), else the provider's default ("" for the local provider)."""
    if len(clouds) > 1 and not gpus:
        raise UsageError(f"--provider {','.join(clouds)}: several clouds are asked for by GPUs (--gpus MODEL:COUNT), "
                         "not by an instance type: each cloud names its types differently")
    if gpus and instance_type:
        raise UsageError(f"--gpus {gpus} and --instance-type {instance_type}: give one (--gpus picks the type)")
    if gpus:
        unknown = [cloud for cloud in clouds if cloud not in catalog.CLOUDS]
        if unknown:
            raise UsageError(f"--gpus {gpus}: --provider {unknown[0]} has no GPUs to ask for (it takes "
                             f"{', '.join(catalog.CLOUDS)})")
        found = {}
        for cloud in clouds:
            try:
                found[cloud] = [machine.instance_type for machine in catalog.choose(gpus, cloud)]
            except UsageError:
                if len(clouds) == 1:
                    raise
                found[cloud] = []
        if not any(found.values()):
            catalog.choose(gpus, clouds[0])  # says what the first cloud offers instead
        return found
    return {cloud: [instance_type or (catalog.default_type(cloud) if cloud in catalog.CLOUDS else "")]
            for cloud in clouds}


def capacity_record(order: Sequence[Candidate], chosen: Candidate, tried: Sequence[Tried],
                    asked: Mapping[str, object] | None = None) -> dict:
    """What capacity.json keeps of an `up`: the candidates in order, the one that came up, what each try before it
    met, and what the `up` was asked (so a managed run can bring the cluster up again elsewhere)."""
    return {"candidates": [asdict(candidate) for candidate in order], "came_up": asdict(chosen),
            "tried": [{**asdict(one.candidate), "verdict": one.verdict, "code": one.code, "round": one.round}
                      for one in tried],
            **({"asked": dict(asked)} if asked is not None else {})}


def attempt_log(name: str, record: Mapping) -> list[str]:
    """What `kiln list -v` says of how cluster `name` came up (its capacity.json): every try before it, round by
    round, and where it came up (pure)."""
    came_up = Candidate(**record["came_up"])
    tried = record.get("tried", [])
    lines = [f"{name}: came up at {came_up.describe()} after {len(tried)} failed tr{'y' if len(tried) == 1 else 'ies'}"
             f" of {len(record.get('candidates', []))} candidate(s)"]
    for one in tried:
        candidate = Candidate(**{key: one[key] for key in ("cloud", "place", "instance_type", "spot")})
        lines.append(f"  round {one.get('round', 1)}: {candidate.describe()}: {one['verdict']} ({one['code']})")
    return lines


def candidates_of(record: Mapping) -> tuple[list[Candidate], Candidate]:
    """capacity.json's candidates and the one that came up, read back."""
    return [Candidate(**one) for one in record["candidates"]], Candidate(**record["came_up"])


def moved_order(order: Sequence[Candidate], came_up: Candidate) -> list[Candidate]:
    """Where a cluster whose place ran out of capacity is brought up again: its `up`'s candidates at other places,
    in their order; none at the place that just refused (taking a cluster down to ask that place again would lose
    its machines for nothing). Empty: the cluster has no other place, and is not taken down."""
    here = (came_up.cloud, came_up.place)
    return [c for c in order if (c.cloud, c.place) != here]


def refuse_across_places(order: Sequence[Candidate], given: Mapping[str, object]) -> None:
    """Options that hold in one place only (a data volume's snapshots, an AMI, an Azure image id) with several
    places to try: refused, so a cluster never comes up elsewhere without them."""
    places = {(candidate.cloud, candidate.place) for candidate in order}
    held = [name for name, value in given.items() if value]
    if len(places) > 1 and held:
        raise UsageError(f"{', '.join('--' + name.replace('_', '-') for name in held)}: holds in one place (its "
                         "snapshots, its image), and this up may try "
                         f"{len(places)}: give one place, or leave the option out")


def describe_order(order: Sequence[Candidate], prices: Mapping[Candidate, float] | None = None,
                   max_attempts: int = MAX_ATTEMPTS) -> list[str]:
    """What `up --dry-run` says of the candidates, in the order they are tried (with each one's price where
    --by-price read one: a spot price now, an on-demand one by the hour), and how many a round tries at most where
    that is fewer."""
    prices = prices or {}
    capped = f"; a round tries {max_attempts} at most: --max-attempts" if len(order) > max_attempts else ""
    return [f"candidates, in the order kiln tries them ({len(order)}{capped}):",
            *(f"  {index}. {candidate.describe()}" + (f" (${prices[candidate]:g}/h{' now' if candidate.spot else ''})"
                                                      if candidate in prices else "")
              for index, candidate in enumerate(order, 1))]


def by_price(order: Sequence[Candidate], prices: Mapping[Candidate, float]) -> list[Candidate]:
    """--by-price: the spot candidates cheapest first, by the price each cloud gives now, then the on-demand ones
    (without --spot, or its fallback) cheapest first by their hourly price; in each, a candidate whose price kiln
    could not read goes after the priced ones, in the user's order among the unpriced."""
    def cheapest(chosen: list[Candidate]) -> list[Candidate]:
        priced = sorted((c for c in chosen if c in prices), key=lambda c: prices[c])  # stable: ties keep the order
        return [*priced, *(c for c in chosen if c not in prices)]
    return [*cheapest([c for c in order if c.spot]), *cheapest([c for c in order if not c.spot])]


def price_requests(order: Sequence[Candidate]) -> dict[tuple[str, str, bool], list[str]]:
    """The instance types whose price to read, by (cloud, place, spot or on demand), for the candidates of
    `order`."""
    asked: dict[tuple[str, str, bool], list[str]] = {}
    for candidate in order:
        kinds = asked.setdefault((candidate.cloud, candidate.place, candidate.spot), [])
        if candidate.instance_type not in kinds:
            kinds.append(candidate.instance_type)
    return asked
