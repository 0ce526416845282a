"""A stand-in for the instance metadata services of EC2 (IMDSv2 required) and GCE, for the preemption tests.

Both clouds serve theirs at 169.254.169.254; this serves both there, and answers as each does for what kiln reads:

- **EC2**: `PUT /latest/api/token` with a TTL header of 1 to 21600 seconds gives a session token (400 without
  it); a GET without a valid, unexpired token is refused with 401; `/latest/meta-data/spot/instance-action` is 404
  until `interrupt()` posts a notice, then `{"action": ..., "time": ...}`; `/latest/meta-data/instance-id` names
  the instance; with an identity (the instance profile of the instance's launch: `--iam-file`, a JSON object with
  its role's name and temporary credentials, as the machines stand-in writes it), `/latest/meta-data/iam/
  security-credentials/` names the role and `.../ROLE` gives its credentials as EC2 documents them (Code, Type,
  AccessKeyId, SecretAccessKey, Token, Expiration, LastUpdated); 404 without one.
- **GCE**: every request under `/computeMetadata/v1/` must carry `Metadata-Flavor: Google` and no
  `X-Forwarded-For` (403 otherwise), and every answer carries `Metadata-Flavor: Google`;
  `instance/preempted` is FALSE until `preempt()`, then TRUE; `instance/id` and `instance/name` name it.
- **Azure**: every request under `/metadata/` must carry `Metadata: true` and no `X-Forwarded-For` (400
  otherwise) and an `api-version`; `instance/compute/name?format=text` names the VM; `scheduledevents` lists no
  event until `evict()`, then a `Preempt` event naming the VM, due 30 s later; `instance/compute` describes the
  VM (its `resourceId`: `azure_vm`); `identity/oauth2/token?resource=R` gives a token for the VM's managed identity
  (from `azure_token`, which the ARM stand-in's `identity_token` serves), or 400 "Identity not found" without one.

    with Imds("i-0abc") as imds:      # serves on 127.0.0.1, a free port: imds.endpoint
        imds.interrupt("terminate")   # or imds.preempt(), as GCE; imds.evict(), as Azure

As a program it serves a local cluster's node at the clouds' own address inside the node's network namespace
(localcloud.cluster starts it), and posts the notice written to --notice-file (`local-cluster interrupt NODE
[--cloud gce|azure]`): an EC2 instance-action document, `{"gce": "preempted"}` or `{"azure": "preempt"}`.

    python -m localcloud.imds --host 169.254.169.254 --port 80 --instance-id node2 --notice-file F
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs

from localcloud.guest import QuietServer, Served

NOTICE_LEAD_SECONDS = 120
GCE_PREEMPTED = {"gce": "preempted"}  # the notice file's text for a GCE preemption
GCE_ROOT = "/computeMetadata/v1/"
AZURE_EVICTED = {"azure": "preempt"}  # the notice file's text for an Azure Spot eviction
AZURE_ROOT = "/metadata/"
EC2_CREDENTIALS = "/latest/meta-data/iam/security-credentials/"  # an instance profile's role and its credentials
AZURE_NOTICE_SECONDS = 30


def notice_text(action: str = "terminate", lead_seconds: int = NOTICE_LEAD_SECONDS) -> str:
    """The instance-action document EC2 posts: the instance goes `lead_seconds` from now."""
    at = datetime.now(UTC) + timedelta(seconds=lead_seconds)
    return json.dumps({"action": action, "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")})


class Imds(Served):
    def __init__(self, instance_id: str = "i-0123456789abcdef0", host: str = "127.0.0.1", port: int = 0,
                 notice_file: Path | None = None, azure_vm: str | None = None,
                 azure_token: Callable[[], str | None] | None = None, iam_file: Path | None = None):
        self.instance_id = instance_id
        self.iam_file = iam_file
        self.azure_vm = azure_vm
        self.azure_token = azure_token
        self.notice_file = notice_file
        self.notice: dict | None = None
        self.preempted = False
        self.evicted_at: float | None = None  # when the Azure eviction was posted (time.time())
        self.tokens: dict[str, float] = {}
        self.requests: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        self.serve(QuietServer((host, port), self._handler()))

    def interrupt(self, action: str = "terminate", lead_seconds: int = NOTICE_LEAD_SECONDS) -> dict:
        """Post a spot interruption notice: the instance goes `lead_seconds` from now."""
        with self._lock:
            self.notice = json.loads(notice_text(action, lead_seconds))
            return dict(self.notice)

    def preempt(self) -> None:
        """Preempt the instance as GCE does: instance/preempted turns TRUE."""
        with self._lock:
            self.preempted = True

    def evict(self) -> None:
        """Evict the Spot VM as Azure does: a Preempt event naming it, due AZURE_NOTICE_SECONDS from now."""
        with self._lock:
            self.evicted_at = time.time()

    def _read_notice_file(self) -> None:
        if self.notice is not None or self.preempted or self.evicted_at or self.notice_file is None:
            return
        try:
            posted = json.loads(self.notice_file.read_text())
        except (OSError, ValueError):
            return
        if posted == GCE_PREEMPTED:
            self.preempted = True
        elif posted == AZURE_EVICTED:
            self.evicted_at = self.notice_file.stat().st_mtime
        else:
            self.notice = posted

    def _posted(self) -> dict | None:
        self._read_notice_file()
        return self.notice

    def _gce(self, method: str, path: str, headers) -> tuple[int, str]:
        """GCE's metadata server: flavored requests only, none forwarded; GET only."""
        if headers.get("Metadata-Flavor") != "Google" or "X-Forwarded-For" in headers:
            return 403, "Missing required header: Metadata-Flavor: Google"
        if method != "GET":
            return 405, "Method Not Allowed"
        name = path.split("?", 1)[0][len(GCE_ROOT):]
        self._read_notice_file()
        answers = {"": "instance/\nproject/\n", "instance/preempted": "TRUE" if self.preempted else "FALSE",
                   "instance/id": str(int.from_bytes(self.instance_id.encode()[-6:], "big")),
                   "instance/name": self.instance_id}
        return (200, answers[name]) if name in answers else (404, "Not Found")

    def expire_tokens(self) -> None:
        with self._lock:
            self.tokens.clear()

    def _azure(self, method: str, path: str, headers) -> tuple[int, str]:
        """Azure's instance metadata service: `Metadata: true` on every request, none forwarded, an api-version."""
        if headers.get("Metadata") != "true" or "X-Forwarded-For" in headers:
            return 400, json.dumps({"error": "Bad request. Required metadata header not specified"})
        route, _, query = path.partition("?")
        if method != "GET":
            return 405, "Method Not Allowed"
        if "api-version=" not in query:
            return 400, json.dumps({"error": "Bad request. api-version was not specified in the request"})
        self._read_notice_file()
        if route == "/metadata/instance/compute/name":
            return 200, self.instance_id
        if route == "/metadata/instance/compute":
            parts = (self.azure_vm or "").split("/")
            return 200, json.dumps({"name": self.instance_id, "resourceId": self.azure_vm or "",
                                    "subscriptionId": parts[2] if len(parts) > 2 else "",
                                    "resourceGroupName": parts[4] if len(parts) > 4 else "",
                                    "azEnvironment": "AzurePublicCloud", "osType": "Linux"})
        if route == "/metadata/identity/oauth2/token":
            return self._azure_token(query)
        if route == "/metadata/scheduledevents":
            events = []
            if self.evicted_at:
                due = time.gmtime(self.evicted_at + AZURE_NOTICE_SECONDS)
                events.append({"EventId": f"{int(self.evicted_at):x}-kiln", "EventStatus": "Scheduled",
                               "EventType": "Preempt", "ResourceType": "VirtualMachine",
                               "Resources": [self.instance_id], "EventSource": "Platform",
                               "NotBefore": time.strftime("%a, %d %b %Y %H:%M:%S GMT", due),
                               "Description": "Spot VM eviction", "DurationInSeconds": -1})
            return 200, json.dumps({"DocumentIncarnation": len(events), "Events": events})
        return 404, json.dumps({"error": "Not found"})

    def _azure_token(self, query: str) -> tuple[int, str]:
        resource = parse_qs(query).get("resource", [""])[0]
        if not resource:
            return 400, json.dumps({"error": "invalid_request", "error_description": "Required query variable "
                                                                                    "'resource' is missing"})
        token = self.azure_token() if self.azure_token else None
        if token is None:
            return 400, json.dumps({"error": "invalid_request", "error_description": "Identity not found"})
        now = int(time.time())
        return 200, json.dumps({"access_token": token, "client_id": "", "expires_in": "86399",
                                "expires_on": str(now + 86399), "ext_expires_in": "86399", "not_before": str(now),
                                "resource": resource, "token_type": "Bearer"})

    def _answer(self, method: str, path: str, headers) -> tuple[int, str]:
        with self._lock:
            if path.startswith(GCE_ROOT):
                return self._gce(method, path, headers)
            if path.startswith(AZURE_ROOT):
                return self._azure(method, path, headers)
            if method == "PUT":
                if path != "/latest/api/token":
                    return 405, "Method Not Allowed"
                ttl = headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return 400, "Bad Request"
                token = secrets.token_urlsafe(32)
                self.tokens[token] = time.monotonic() + int(ttl)
                return 200, token
            token = headers.get("X-aws-ec2-metadata-token")
            if token is None or self.tokens.get(token, 0) < time.monotonic():
                return 401, "Unauthorized"
            if path == "/latest/meta-data/instance-id":
                return 200, self.instance_id
            if path == "/latest/meta-data/spot/instance-action" and self._posted():
                return 200, json.dumps(self.notice)
            if path.startswith(EC2_CREDENTIALS):
                return self._ec2_credentials(path.removeprefix(EC2_CREDENTIALS))
            return 404, "Not Found"

    def _ec2_credentials(self, role: str) -> tuple[int, str]:
        """The instance profile's role (its name under the folder, its credentials under its name), as written to
        the identity file; 404 where the instance has none, or for another name."""
        try:
            held = json.loads(self.iam_file.read_text()) if self.iam_file else None
        except (OSError, ValueError):
            held = None
        if not held:
            return 404, "Not Found"
        if not role:
            return 200, held["role"]
        if role != held["role"]:
            return 404, "Not Found"
        return 200, json.dumps({"Code": "Success", "LastUpdated": held["issued"], "Type": "AWS-HMAC",
                                **{key: held[key] for key in ("AccessKeyId", "SecretAccessKey", "Token",
                                                              "Expiration")}})

    def _handler(self):
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self):
                status, body = imds._answer(self.command, self.path, self.headers)
                imds.requests.append((self.command, self.path, status))
                data = body.encode()
                self.send_response(status)
                if self.path.startswith(GCE_ROOT):
                    self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = _reply

            def log_message(self, *args):
                pass

        return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="imds", description="a stand-in metadata service of EC2 (IMDSv2) and GCE")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=80)
    parser.add_argument("--instance-id", default="i-0123456789abcdef0")
    parser.add_argument("--notice-file", type=Path, help="serve the notice written here (JSON), once it is")
    parser.add_argument("--ready-file", type=Path, help="made once the service listens")
    parser.add_argument("--iam-file", type=Path, help="the instance profile's role and credentials (JSON), once "
                                                      "written")
    args = parser.parse_args(argv)
    imds = Imds(args.instance_id, args.host, args.port, notice_file=args.notice_file, iam_file=args.iam_file)
    if args.ready_file:
        args.ready_file.touch()
    imds._server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
