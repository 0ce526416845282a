"""Watch the instance metadata service for a spot interruption notice (IMDSv2, session tokens only).

AWS posts `spot/instance-action` about two minutes before it stops or terminates a spot instance; before that
the path answers 404. Every read carries a session token from `PUT /latest/api/token` (IMDSv2: kiln's instances
require it, so a plain GET is refused with 401), and a refused token is fetched again once.

    python interruption.py [--endpoint URL] [--interval S] [--once] [--run-dir DIR] [--timeout S] [-- CMD...]

prints one JSON line when a notice comes (`{"action": "terminate", "time": "...", "seen": ...}`) and exits 0;
`--once` looks once and prints `{"action": null}` where there is none. With `--run-dir` (kiln starts it so with
every run on every node) it writes the notice to DIR/notice.json for the launcher, then becomes CMD (kiln's:
stop this run's processes here with SIGTERM, so they can checkpoint); where no metadata service answers (not a
cloud instance) it exits at once; it gives up after `--timeout` seconds, or once the node's tasks named by
`--until-exited` have all written their exit codes. Standard library only: it runs on nodes.
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


class MetadataError(Exception):
    pass


class Unreachable(MetadataError):
    """Nothing answers at the endpoint (no metadata service: not a cloud instance, or not yet)."""


class Metadata:
    """An IMDSv2 client: one session token, renewed when it expires or is refused."""

    def __init__(self, endpoint: str = ENDPOINT, timeout: float = 2.0):
        self.endpoint = endpoint.rstrip("/")
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
        self.timeout = timeout
        self._token: str | None = None
        self._expires = 0.0

    def token(self) -> str:
        if self._token is None or time.monotonic() > self._expires:
            request = urllib.request.Request(f"{self.endpoint}/latest/api/token", method="PUT",
                                             headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)})
            try:
                self._token = self._open(request).decode()
            except urllib.error.HTTPError as error:
                raise MetadataError(f"PUT /latest/api/token: HTTP {error.code}") from None
            self._expires = time.monotonic() + TOKEN_TTL_SECONDS - 60
        return self._token

    def get(self, path: str) -> str | None:
        """The text at a metadata path; None where it answers 404 (not there, or not yet)."""
        for attempt in range(2):
            request = urllib.request.Request(f"{self.endpoint}/{path}",
                                             headers={"X-aws-ec2-metadata-token": self.token()})
            try:
                return self._open(request).decode()
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return None
                if error.code == 401 and attempt == 0:
                    self._token = None
                    continue
                raise MetadataError(f"GET /{path}: HTTP {error.code}") from None
        raise AssertionError("unreachable")

    def _open(self, request: urllib.request.Request) -> bytes:
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise Unreachable(f"{self.endpoint} is not answering: {reason}") from None


def parse_notice(text: str | None) -> dict | None:
    """`{"action": "terminate"|"stop"|"hibernate", "time": "2026-11-25T10:02:00Z"}`, or None for no notice."""
    if text is None:
        return None
    notice = json.loads(text)
    if notice.get("action") not in ("terminate", "stop", "hibernate"):
        raise MetadataError(f"unexpected instance-action: {text[:200]!r}")
    return {"action": notice["action"], "time": notice.get("time")}


def wait_for_notice(metadata: Metadata, interval: float, deadline: float | None = None,
                    over: Callable[[], bool] = lambda: False) -> dict | None:
    """Poll until a notice comes (returned), or the deadline passes or `over()` says the run is over (None). A
    metadata service that stops answering is retried: an instance being stopped loses it last."""
    while not over():
        try:
            notice = parse_notice(metadata.get(NOTICE_PATH))
        except MetadataError as error:
            print(f"interruption: {error}", file=sys.stderr)
            notice = None
        if notice:
            return {**notice, "seen": time.time()}
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
    metadata = Metadata(args.endpoint)
    if args.once:
        try:
            notice = parse_notice(metadata.get(NOTICE_PATH))
        except MetadataError as error:
            print(f"interruption: {error}", file=sys.stderr)
            return 1
        print(json.dumps(notice or {"action": None}))
        return 0
    if args.run_dir:
        try:
            metadata.token()
        except Unreachable as error:
            print(f"interruption: not watching: {error}", file=sys.stderr)
            return 0
    deadline = time.monotonic() + args.timeout if args.timeout else None
    tasks = [task for task in args.until_exited.split(",") if task]
    notice = wait_for_notice(metadata, args.interval, deadline,
                             all_exited(args.run_dir, tasks) if args.run_dir else lambda: False)
    print(json.dumps(notice), flush=True)
    if notice and args.run_dir:
        report(args.run_dir, notice)
        if then:
            os.execvp(then[0], then)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
