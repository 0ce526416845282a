"""SSH host keys: read from a cloud-init console, written as known_hosts lines (the one writer of that format)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

BEGIN_KEYS = "-----BEGIN SSH HOST KEY KEYS-----"
END_KEYS = "-----END SSH HOST KEY KEYS-----"
KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
_KEY = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, KEY_TYPES)) + r") ([A-Za-z0-9+/]+={0,3})(?=\s|$)")


def public_key(text: str) -> str:
    """`type base64` of a public key line (its comment dropped)."""
    fields = text.split()
    if len(fields) < 2 or fields[0] not in KEY_TYPES:
        raise ValueError(f"not an SSH public key: {text.strip()[:60]!r}")
    return f"{fields[0]} {fields[1]}"


def console_host_keys(console: str) -> list[str]:
    """The host keys (`type base64`) cloud-init printed between its markers, from the last complete block (the
    current boot's: a reboot prints them again), or [] before it has printed them."""
    end = (console or "").rfind(END_KEYS)
    start = console.rfind(BEGIN_KEYS, 0, end) if end >= 0 else -1
    if start < 0:
        return []
    return [f"{m.group(1)} {m.group(2)}" for m in _KEY.finditer(console[start + len(BEGIN_KEYS):end])]


def host_pattern(name: str, port: int | None = None) -> str:
    """How known_hosts names a host: `name`, or `[name]:port` off port 22."""
    return f"[{name}]:{port}" if port and port != 22 else name


def known_hosts_lines(names: Iterable[str], keys: Sequence[str], port: int | None = None) -> list[str]:
    """One line per key pinning it under every name (duplicates dropped, order kept), each line ending in \\n."""
    patterns = ",".join(host_pattern(name, port) for name in dict.fromkeys(names))
    return [f"{patterns} {public_key(key)}\n" for key in keys]


def without_hosts(text: str, names: Iterable[str], port: int | None = None) -> str:
    """known_hosts text with every line naming one of `names` removed (a replaced machine's old keys); comments
    and other hosts' lines stay as they are."""
    gone = {host_pattern(name, port) for name in names}
    kept = []
    for line in text.splitlines(keepends=True):
        fields = line.split(maxsplit=1)
        if fields and not line.startswith("#") and gone & set(fields[0].split(",")):
            continue
        kept.append(line)
    return "".join(kept)
