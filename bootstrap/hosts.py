"""Parse `-H` host lists and hostfiles into Host records (pure)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from bootstrap.errors import HostListError

_LABEL = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?$")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_SLOTS = re.compile(r"^slots=(\d+)$")


@dataclass(frozen=True)
class Host:
    """One node as the operator reaches it. `port`/`user` None: from ssh config. `slots` None: as many processes
    as the node has GPUs (one without), decided once its facts are in (topology.resolve_slots)."""

    address: str
    port: int | None = None
    user: str | None = None
    slots: int | None = None

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.address

    @property
    def label(self) -> str:
        """How the host is named in messages, tables and folder names."""
        address = f"[{self.address}]" if self.is_ipv6 else self.address
        return f"{address}:{self.port}" if self.port else address

    def endpoint(self) -> str:
        """The `[user@]host[:port]` form, as it would be written in a host list."""
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.label}"


def parse_host(item: str, *, where: str = "") -> Host:
    """Parse one `[user@]host[:port]` item; IPv6 addresses go in brackets."""
    text = item.strip()
    prefix = f"{where}: " if where else ""
    if not text:
        raise HostListError(f"{prefix}empty host item")
    if any(ch.isspace() for ch in text):
        raise HostListError(f"{prefix}{text!r}: whitespace inside a host item")
    user = None
    if "@" in text:
        user, _, text = text.rpartition("@")
        if not _USER.match(user):
            raise HostListError(f"{prefix}{item.strip()!r}: bad user name {user!r}")
    address, port = _split_address_port(text, item.strip(), prefix)
    return Host(address=address, port=port, user=user)


def _split_address_port(text: str, item: str, prefix: str) -> tuple[str, int | None]:
    port_text = None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise HostListError(f"{prefix}{item!r}: missing ']' after IPv6 address")
        address, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise HostListError(f"{prefix}{item!r}: unexpected {rest!r} after ']'")
            port_text = rest[1:]
        try:
            ipaddress.IPv6Address(address.split("%")[0])
        except ValueError:
            raise HostListError(f"{prefix}{item!r}: {address!r} is not an IPv6 address") from None
    elif text.count(":") > 1:
        raise HostListError(f"{prefix}{item!r}: write IPv6 addresses in brackets, e.g. [{text}]:22")
    else:
        address, _, port_text = text.partition(":")
        if port_text == "" and text.endswith(":"):
            raise HostListError(f"{prefix}{item!r}: empty port after ':'")
        if not _HOSTNAME.match(address):
            raise HostListError(f"{prefix}{item!r}: {address!r} is not a valid host name or address")
        port_text = port_text or None
    return address, _parse_port(port_text, item, prefix)


def _parse_port(port_text: str | None, item: str, prefix: str) -> int | None:
    if port_text is None:
        return None
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise HostListError(f"{prefix}{item!r}: port {port_text!r} is not a number from 1 to 65535")
    return int(port_text)


def parse_host_list(text: str) -> list[Host]:
    """Parse a comma-separated `-H` list: `user@h1:2222,h2,[fe80::1]:22`."""
    if not text or not text.strip():
        raise HostListError("the host list is empty")
    hosts = [parse_host(item, where=f"host list item {n}") for n, item in enumerate(text.split(","), 1)]
    return reject_duplicates(hosts)


def parse_hostfile(text: str, *, source: str = "hostfile") -> list[Host]:
    """Parse a hostfile: one `[user@]host[:port] [slots=N]` per line, `#` comments."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        first, *options = line.split()
        host = parse_host(first, where=where)
        for option in options:
            match = _SLOTS.match(option)
            if not match:
                raise HostListError(f"{where}: unknown option {option!r} (expected slots=N)")
            slots = int(match.group(1))
            if slots < 1:
                raise HostListError(f"{where}: slots must be at least 1, got {slots}")
            host = Host(host.address, host.port, host.user, slots)
        hosts.append(host)
    if not hosts:
        raise HostListError(f"{source}: no hosts in the file")
    return reject_duplicates(hosts)


def reject_duplicates(hosts: Iterable[Host]) -> list[Host]:
    """Refuse the same address and port twice: one node, one entry."""
    seen: dict[tuple[str, int | None], Host] = {}
    result = []
    for host in hosts:
        key = (host.address.lower().rstrip("."), host.port)
        if key in seen:
            raise HostListError(f"duplicate host {host.endpoint()!r} (also given as {seen[key].endpoint()!r})")
        seen[key] = host
        result.append(host)
    return result


def with_slots(hosts: Iterable[Host], slots: int) -> list[Host]:
    """Give every host `slots` slots (the `--slots` option over a `-H` list)."""
    if slots < 1:
        raise HostListError(f"slots must be at least 1, got {slots}")
    return [Host(h.address, h.port, h.user, slots) for h in hosts]


def format_hostfile(hosts: Iterable[Host]) -> str:
    """Write hosts back in hostfile form, one per line (slots where they were given)."""
    return "".join(f"{h.endpoint()}{f' slots={h.slots}' if h.slots else ''}\n" for h in hosts)
