#!/usr/bin/python3
"""Print what is installed, as JSON: kiln-versions COMPONENTS_JSON VENV_PYTHON.

COMPONENTS_JSON maps a name to {"pip": DIST}, {"deb": PACKAGE or [PACKAGE, ...]} (the first installed
of them: package names differ between distributions) or {"record": FILE, "prefix": TEXT} (what follows TEXT on
the first line of FILE that starts with it: an installer's record of itself, as AWS's EFA installer writes).
Versions are upstream versions (no epoch, no Debian revision); a missing one is null.
"""

import json
import subprocess
import sys


def upstream(version: str) -> str:
    version = version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def deb_versions(patterns: list[str]) -> dict[str, str]:
    if not patterns:
        return {}
    result = subprocess.run(
        ["dpkg-query", "--showformat=${Package} ${db:Status-Status} ${Version}\n", "--show", *patterns],
        capture_output=True, text=True, check=False,
    )
    found = {}
    for line in result.stdout.splitlines():
        package, status, *version = line.split()
        if status == "installed" and version:
            found[package] = upstream(version[0])
    return found


def pip_versions(python: str, names: list[str]) -> dict[str, str | None]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for n in sys.argv[1:]:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = None\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, check=False)
    return json.loads(result.stdout) if result.returncode == 0 else dict.fromkeys(names)


def record_version(path: str, prefix: str) -> str | None:
    try:
        with open(path) as handle:
            return next((line[len(prefix):].strip() for line in handle if line.startswith(prefix)), None)
    except OSError:
        return None


def main() -> None:
    components = json.loads(sys.argv[1])
    python = sys.argv[2]
    pips = pip_versions(python, [c["pip"] for c in components.values() if "pip" in c])
    candidates = {name: [spec["deb"]] if isinstance(spec["deb"], str) else spec["deb"]
                  for name, spec in components.items() if "deb" in spec}
    debs = deb_versions(sorted({package for packages in candidates.values() for package in packages}))
    installed = {name: pips.get(spec["pip"]) for name, spec in components.items() if "pip" in spec}
    for name, packages in candidates.items():
        installed[name] = next((debs[p] for p in packages if p in debs), None)
    for name, spec in components.items():
        if "record" in spec:
            installed[name] = record_version(spec["record"], spec["prefix"])
    print(json.dumps(installed, sort_keys=True))


if __name__ == "__main__":
    main()
