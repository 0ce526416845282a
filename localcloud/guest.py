"""What the cloud stand-ins (testbed.gce, testbed.arm, localcloud.imds) share: a machine's real SSH host keys and the
block in which cloud-init prints them to the serial console at boot, and an HTTP server that skips the reverse
DNS lookup of its address at bind (seconds where no resolver answers, as inside a local cluster's node)."""

from __future__ import annotations

import base64
import hashlib
import socketserver
import subprocess
import tempfile
import threading
from datetime import datetime
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Self

KEY_NAMES = {"ssh-ed25519": "ED25519", "ecdsa-sha2-nistp256": "ECDSA"}


class QuietServer(ThreadingHTTPServer):
    """ThreadingHTTPServer without its reverse DNS lookup of the bound address at start."""

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Served:
    """A stand-in's server on a thread of its own, as a context manager: its endpoint, the thread started on
    enter, the server shut down and closed on exit."""

    scheme = "http"

    def serve(self, server: socketserver.BaseServer) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{self.scheme}://{host}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def make_host_keys() -> list[str]:
    """Real SSH host keys, as an Ubuntu VM makes them at first boot: `<type> <base64>` lines (ed25519, ecdsa)."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="kiln-hostkeys-") as tmp:
        for kind in ("ed25519", "ecdsa"):
            key = Path(tmp) / f"ssh_host_{kind}_key"
            subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "", "-f", str(key)],
                           check=True, timeout=30, stdin=subprocess.DEVNULL)
            lines.append(" ".join(key.with_suffix(".pub").read_text().split()[:2]))
    return lines


def key_fingerprint(line: str) -> str:
    """`SHA256:...` of a `<type> <base64>` key line, as ssh-keygen -l prints it."""
    digest = hashlib.sha256(base64.b64decode(line.split()[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def cloud_init_host_keys(host: str, keys: list[str], when: datetime) -> list[str]:
    """The lines cloud-init prints to the console at boot: the keys' fingerprints, then the keys themselves
    between the markers kiln reads (kiln.hostkeys.console_host_keys)."""
    stamp = when.strftime("%b %d %H:%M:%S")
    ordered = sorted(keys)  # cloud-init reads /etc/ssh/ssh_host_*_key.pub in name order: ecdsa, ed25519
    prints = [f"<14>{stamp} cloud-init: 256 {key_fingerprint(k)} root@{host} ({KEY_NAMES[k.split()[0]]})"
              for k in ordered]
    rule = f"<14>{stamp} cloud-init: " + "#" * 61
    return [rule, f"<14>{stamp} cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----", *prints,
            f"<14>{stamp} cloud-init: -----END SSH HOST KEY FINGERPRINTS-----", rule,
            "-----BEGIN SSH HOST KEY KEYS-----", *[f"{k} root@{host}" for k in ordered],
            "-----END SSH HOST KEY KEYS-----"]
