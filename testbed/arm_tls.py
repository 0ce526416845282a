"""How the ARM stand-in is served: a throwaway CA and certificate (azure-core sends a bearer token over https only)
and the HTTP server and handler that put each request to testbed.arm.Arm."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import ssl
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from localcloud.guest import QuietServer

if TYPE_CHECKING:
    from testbed.arm import Arm


def make_tls(directory: Path, host: str = "127.0.0.1") -> tuple[str, str, str]:
    """A throwaway CA and a server certificate it signs for `host` (and localhost): (CA file, cert file, key file)."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    server_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kiln ARM stand-in CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
          .not_valid_after(now + timedelta(days=7))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    with contextlib.suppress(ValueError):
        names.insert(0, x509.IPAddress(ipaddress.ip_address(host)))
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=7))
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                           crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
              .sign(ca_key, hashes.SHA256()))
    files = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    files[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    files[2].write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    files[2].chmod(0o600)
    return str(files[0]), str(files[1]), str(files[2])


class TlsServer(QuietServer):
    """HTTPS: the TLS handshake in each connection's thread."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, context: ssl.SSLContext):
        self.context = context
        super().__init__(address, handler)

    def finish_request(self, request, client_address) -> None:
        request.settimeout(30)
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle wait between headers and body
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return  # a client that does not trust the CA, or went away
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                tls.close()


def handler_for(arm: Arm) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30
        wbufsize = 1 << 16  # headers and body leave in one write

        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            reply = arm._serve(self.command, self.path, self.headers, raw)
            body = reply.body
            data = (json.dumps(body).encode() if isinstance(body, dict) else body.encode() if isinstance(body, str)
                    else body or b"")
            self.send_response(reply.status)
            if data:
                self.send_header("Content-Type", reply.content_type)
            for name, value in {"Cache-Control": "no-cache", "x-ms-request-id": str(uuid.uuid4()), **reply.headers
                                }.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = do_HEAD = _reply

        def log_message(self, *args) -> None:
            pass

    return Handler
