"""Watch the instance metadata service for a spot interruption (preemption) notice, as EC2 and GCE post it.

- **ec2**: AWS posts `spot/instance-action` about two minutes before it stops or terminates a spot instance;
  before that the path answers 404. Every read carries a session token from `PUT /latest/api/token` (IMDSv2:
  kiln's instances require it, so a plain GET is refused with 401), and a refused token is fetched again once.
- **gce**: GCE's metadata server answers `computeMetadata/v1/instance/preempted` with FALSE, then TRUE once the
  Spot (or preemptible) VM is being preempted: about 30 s before it stops. Every read carries the
  `Metadata-Flavor: Google` header (refused with 403 without it), and the answer carries it back.
- **azure**: Azure's Scheduled Events (`metadata/scheduledevents`) list a `Preempt` event naming the VM at least
  30 s before a Spot VM is evicted. Every read carries the `Metadata: true` header (refused with 400 without
  it); the VM's own name comes from the instance metadata (`metadata/instance/compute/name`).

All sit at 169.254.169.254; `--source any` (the default) watches whichever answers there.

    python interruption.py [--source ec2|gce|azure|any] [--endpoint URL] [--interval S] [--once] [--run-dir DIR]
                           [--timeout S] [-- CMD...]

prints one JSON line when a notice comes (`{"action": "terminate", "time": "...", "seen": ..., "source": "ec2",
"grace_s": 90}`) and exits 0; `--once` looks once and prints `{"action": null}` where there is none. With
`--run-dir` (kiln starts it so with every run on every node) it writes the notice to DIR/notice.json for the
launcher, then becomes CMD with the source's grace (seconds) as its last argument (kiln's: stop this run's
processes here with SIGTERM, so they can checkpoint, and kill what is left after the grace); where no metadata
service answers (not a cloud instance) it exits at once; it gives up after `--timeout` seconds, or once the
node's tasks named by `--until-exited` have all written their exit codes. Standard library only: it runs on nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

ENDPOINT = "http://169.254.169.254"
TOKEN_TTL_SECONDS = 21600
NOTICE_PATH = "latest/meta-data/spot/instance-action"
GCE_ROOT = "computeMetadata/v1/"
GCE_PREEMPTED = GCE_ROOT + "instance/preempted"
# source -> (seconds the cloud gives from its notice to the machine's end, seconds of it a run's processes get to
# checkpoint before what is left is killed: the rest is for the watcher's look, the stop and the files' flush)
SOURCES = {"ec2": (120, 90), "gce": (30, 20), "azure": (30, 20)}
AZURE_EVENTS = "metadata/scheduledevents?api-version=2020-07-01"
AZURE_NAME = "metadata/instance/compute/name?api-version=2021-02-01&format=text"


class MetadataError(Exception):
    pass


class Unreachable(MetadataError):
    """Nothing answers at the endpoint (no metadata service: not a cloud instance, or not yet)."""


class Refused(MetadataError):
    """The service answered with an HTTP error (`code`)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class Service:
    """What the three clients share: one endpoint, never through a proxy, every call under a timeout."""

    source = ""

    def __init__(self, endpoint: str = ENDPOINT, timeout: float = 2.0):
        self.endpoint = endpoint.rstrip("/")
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
        self.timeout = timeout

    def fetch(self, path: str, headers: dict[str, str], method: str = "GET",
              check: Callable[[object], None] = lambda headers: None) -> str | None:
        """The text at a path (`check` reads the answer's headers first); None where it answers 404; Refused with
        any other HTTP error; Unreachable where nothing answers."""
        request = urllib.request.Request(f"{self.endpoint}/{path}", headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                check(response.headers)
                return response.read().decode()
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise Refused(f"{method} /{path.split('?')[0]}: HTTP {error.code}", error.code) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise Unreachable(f"{self.endpoint} is not answering: {reason}") from None


class Metadata(Service):
    """An IMDSv2 client (EC2): one session token, renewed when it expires or is refused."""

    source = "ec2"

    def __init__(self, endpoint: str = ENDPOINT, timeout: float = 2.0):
        super().__init__(endpoint, timeout)
        self._token: str | None = None
        self._expires = 0.0

    def token(self) -> str:
        if self._token is None or time.monotonic() > self._expires:
            token = self.fetch("latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)},
                               "PUT")
            if token is None:  # no IMDSv2 here (another cloud's metadata server)
                raise Refused("PUT /latest/api/token: HTTP 404", 404)
            self._token = token
            self._expires = time.monotonic() + TOKEN_TTL_SECONDS - 60
        return self._token

    def get(self, path: str) -> str | None:
        """The text at a metadata path; None where it answers 404 (not there, or not yet)."""
        try:
            return self.fetch(path, {"X-aws-ec2-metadata-token": self.token()})
        except Refused as refused:
            if refused.code != 401:
                raise
            self._token = None  # refused: asked again once, with a fresh token
            return self.fetch(path, {"X-aws-ec2-metadata-token": self.token()})

    def probe(self) -> None:
        """Raise Unreachable or MetadataError unless an IMDSv2 service answers here (it gives a token)."""
        self.token()

    def look(self) -> dict | None:
        """The notice posted (action and time), or None."""
        return parse_notice(self.get(NOTICE_PATH))


class GceMetadata(Service):
    """A client of GCE's metadata server: every request flavored, and the answer's flavor checked (another
    service at the address, such as EC2's, is not GCE's)."""

    source = "gce"

    def get(self, path: str) -> str | None:
        """The text at a metadata path; None where it answers 404."""
        def flavored(headers) -> None:
            if headers.get("Metadata-Flavor") != "Google":
                raise MetadataError(f"GET /{path}: the answer is not from GCE's metadata server")

        return self.fetch(path, {"Metadata-Flavor": "Google"}, check=flavored)

    def probe(self) -> None:
        """Raise Unreachable or MetadataError unless GCE's metadata server answers here."""
        if self.get(GCE_ROOT) is None:
            raise MetadataError(f"GET /{GCE_ROOT}: HTTP 404")

    def look(self) -> dict | None:
        """A preemption under way, as a notice (the machine stops about SOURCES["gce"][0] s from now), or None."""
        text = self.get(GCE_PREEMPTED)
        if text is None or text.strip() == "FALSE":
            return None
        if text.strip() != "TRUE":
            raise MetadataError(f"unexpected instance/preempted: {text[:200]!r}")
        at = time.gmtime(time.time() + SOURCES["gce"][0])
        return {"action": "preempt", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", at)}


class AzureMetadata(Service):
    """A client of Azure's instance metadata service: every request carries `Metadata: true`; the VM's name is
    read once (an event names the VMs it affects)."""

    source = "azure"

    def __init__(self, endpoint: str = ENDPOINT, timeout: float = 2.0):
        super().__init__(endpoint, timeout)
        self.name: str | None = None

    def get(self, path: str) -> str | None:
        return self.fetch(path, {"Metadata": "true"})

    def probe(self) -> None:
        """Raise Unreachable or MetadataError unless Azure's metadata service answers here with the VM's name."""
        name = self.get(AZURE_NAME)
        if not name:
            raise MetadataError(f"GET /{AZURE_NAME.split('?')[0]}: no name")
        self.name = name.strip()

    def look(self) -> dict | None:
        """A Preempt event naming this VM, as a notice (the eviction is due at its NotBefore), or None."""
        text = self.get(AZURE_EVENTS)
        try:
            events = json.loads(text or "{}").get("Events") or []
        except ValueError:
            raise MetadataError(f"unexpected scheduledevents: {(text or '')[:200]!r}") from None
        for event in events:
            if event.get("EventType") == "Preempt" and (self.name is None or self.name in event.get("Resources", [])):
                return {"action": "preempt", "time": azure_time(event.get("NotBefore", ""))}
        return None


def azure_time(text: str) -> str | None:
    """Scheduled Events' NotBefore (`Mon, 19 Sep 2016 18:29:47 GMT`) as `2016-09-19T18:29:47Z`; None if empty."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.strptime(text, "%a, %d %b %Y %H:%M:%S GMT"))
    except ValueError:
        return None


def services(source: str, endpoint: str) -> list:
    """The metadata clients to watch for `source` (any: every one, each kept only where it answers)."""
    kinds = (("ec2", Metadata), ("gce", GceMetadata), ("azure", AzureMetadata))
    return [kind(endpoint) for name, kind in kinds if source in (name, "any")]


def answering(watched: list) -> tuple[list, list[str]]:
    """Those of `watched` that answer at their endpoint, and why each other does not."""
    kept, why = [], []
    for service in watched:
        try:
            service.probe()
            kept.append(service)
        except MetadataError as error:
            why.append(f"{service.source}: {error}")
    return kept, why


def parse_notice(text: str | None) -> dict | None:
    """`{"action": "terminate"|"stop"|"hibernate", "time": "2026-11-25T10:02:00Z"}`, or None for no notice."""
    if text is None:
        return None
    notice = json.loads(text)
    if notice.get("action") not in ("terminate", "stop", "hibernate"):
        raise MetadataError(f"unexpected instance-action: {text[:200]!r}")
    return {"action": notice["action"], "time": notice.get("time")}


def look_all(watched: list) -> dict | None:
    """The first notice any of `watched` has posted, with its source and the grace it leaves; None if none."""
    for service in watched:
        try:
            notice = service.look()
        except MetadataError as error:
            print(f"interruption: {error}", file=sys.stderr)
            continue
        if notice:
            return {**notice, "seen": time.time(), "source": service.source, "grace_s": SOURCES[service.source][1]}
    return None


def wait_for_notice(metadata, interval: float, deadline: float | None = None,
                    over: Callable[[], bool] = lambda: False) -> dict | None:
    """Poll `metadata` (a client, or a list of them) until a notice comes (returned), or the deadline passes or
    `over()` says the run is over (None). A metadata service that stops answering is retried: an instance being
    stopped loses it last."""
    watched = metadata if isinstance(metadata, list) else [metadata]
    while not over():
        notice = look_all(watched)
        if notice:
            return notice
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(interval)
    return None


def all_exited(run_dir: str, tasks: list[str]) -> Callable[[], bool]:
    """Whether every one of the run's tasks on this node has written its exit code (the run is over here)."""
    return lambda: bool(tasks) and all(os.path.exists(os.path.join(run_dir, f"{task}.exit")) for task in tasks)


def report(run_dir: str, notice: dict) -> None:
    """Write the notice where the launcher looks (atomically: it may read at any time)."""
    path = os.path.join(run_dir, "notice.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(notice, handle)
    os.replace(path + ".tmp", path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="interruption", description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=(*SOURCES, "any"), default="any",
                        help="whose notice to watch for (default any: whichever metadata service answers)")
    parser.add_argument("--endpoint", default=ENDPOINT)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between looks (default 5)")
    parser.add_argument("--once", action="store_true", help="look once and say what is there")
    parser.add_argument("--run-dir", help="write the notice to RUN_DIR/notice.json")
    parser.add_argument("--timeout", type=float, help="stop watching after this many seconds")
    parser.add_argument("--until-exited", default="", metavar="TASK,...",
                        help="with --run-dir: stop watching once these tasks have written RUN_DIR/TASK.exit")
    parser.add_argument("then", nargs=argparse.REMAINDER, help="-- CMD...: run in the watcher's place on a notice")
    args = parser.parse_args(argv)
    then = args.then[1:] if args.then[:1] == ["--"] else args.then
    watched, why = answering(services(args.source, args.endpoint))
    if not watched:
        print(f"interruption: {'not watching: ' if args.run_dir else ''}{'; '.join(why)}", file=sys.stderr)
        return 0 if args.run_dir else 1
    if args.once:
        print(json.dumps(look_all(watched) or {"action": None}))
        return 0
    deadline = time.monotonic() + args.timeout if args.timeout else None
    tasks = [task for task in args.until_exited.split(",") if task]
    notice = wait_for_notice(watched, args.interval, deadline,
                             all_exited(args.run_dir, tasks) if args.run_dir else lambda: False)
    print(json.dumps(notice), flush=True)
    if notice and args.run_dir:
        report(args.run_dir, notice)
        if then:
            os.execvp(then[0], [*then, f"{notice['grace_s']:g}"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
