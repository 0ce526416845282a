"""Stand-in Debian packages: each under a real package's name and version, holding only what kiln's roles and
tests look at, and saying in its description that it is a stand-in (bake/standin.py, bake/standin_fabric.py)."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

MAINTAINER = "kiln stand-in <standin@kiln.invalid>"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    what: str  # the real package this stands in for, in a few words
    depends: str = ""
    conflicts: str = ""
    provides: str = ""
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # path in package -> (content, mode)
    postinst: str = ""
    prerm: str = ""


def build_deb(package: Package, outdir: Path, scratch: Path) -> None:
    tree = scratch / f"{package.name}_{package.version}"
    (tree / "DEBIAN").mkdir(parents=True)
    for relpath, (content, mode) in package.files.items():
        target = tree / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(mode)
    doc = tree / "usr/share/doc" / package.name / "README.kiln-standin"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(f"kiln stand-in for {package.name} {package.version}: not the real software.\n")
    control = [f"Package: {package.name}", f"Version: {package.version}", "Architecture: amd64",
               f"Maintainer: {MAINTAINER}", "Section: kiln-standin", "Priority: optional"]
    for key, value in (("Depends", package.depends), ("Conflicts", package.conflicts),
                       ("Provides", package.provides)):
        if value:
            control.append(f"{key}: {value}")
    control += [f"Description: kiln stand-in: not the real {package.what}",
                " Empty stand-in under the real package name and version, for testing kiln's",
                " roles without the vendor's repositories. It installs no driver and no library."]
    (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
    for script, body in (("postinst", package.postinst), ("prerm", package.prerm)):
        if body:
            path = tree / "DEBIAN" / script
            path.write_text(f"#!/bin/sh\nset -e\n{body}\nexit 0\n")
            path.chmod(0o755)
    name = f"{package.name}_{package.version.replace(':', '%3a')}_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(outdir / name)],
                   check=True, stdout=subprocess.DEVNULL)


def make_key(gnupg: Path, uid: str) -> str:
    """Generate a throwaway signing key; return its fingerprint."""
    subprocess.run(["gpg", "--homedir", str(gnupg), "--batch", "--passphrase", "", "--quick-gen-key", uid,
                    "ed25519", "sign", "never"], check=True, capture_output=True)
    listing = subprocess.run(["gpg", "--homedir", str(gnupg), "--with-colons", "--list-keys", uid],
                             check=True, capture_output=True, text=True).stdout
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
