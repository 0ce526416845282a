"""horovodrun, with its build check answered once per Horovod install instead of on every launch.

On every launch horovodrun asks whether Horovod was built with Gloo (or MPI) by importing
horovod.tensorflow, and so all of TensorFlow, in a fresh process: seconds before the first rank
starts, paid again on every restart. The answer changes only when Horovod is reinstalled, so this keeps
it in ~/.cache/kiln/horovod-build.json, keyed by Horovod's version and its TensorFlow extension file, and
answers horovodrun from there. Everything else is horovodrun itself: `python horovodrun.py ARGS` is
`horovodrun ARGS`. Run by the nodes' Python from kiln's node part (~/kiln/lib/shim).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import horovod
from horovod.common import util
from horovod.runner import launch


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kiln" / "horovod-build.json"


def install_key() -> str:
    """Horovod's version and its TensorFlow extension's path, size and mtime: a reinstall changes it."""
    spec = importlib.util.find_spec("horovod.tensorflow")  # finds the package without importing TensorFlow
    folder = Path(spec.origin).parent if spec and spec.origin else None
    found = sorted(folder.glob("mpi_lib*.so")) if folder else []
    stats = [f"{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}" for path in found]
    return json.dumps([horovod.__version__, sys.executable, *stats])


def build_answers() -> dict[str, bool]:
    """{"gloo": ..., "mpi": ...} from the cache, else from Horovod's own check (then cached)."""
    path, key = cache_file(), install_key()
    try:
        cached = json.loads(path.read_text())
        if cached.get("key") == key:
            return {"gloo": bool(cached["gloo"]), "mpi": bool(cached["mpi"])}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    answers = {"gloo": bool(util.gloo_built()), "mpi": bool(util.mpi_built())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps({"key": key, **answers}) + "\n")
        os.replace(partial, path)
    except OSError:
        pass  # an unwritable cache only costs the check next time
    return answers


def main() -> int:
    answers = build_answers()
    launch.gloo_built = lambda verbose=False: answers["gloo"]
    launch.mpi_built = lambda verbose=False: answers["mpi"]
    sys.argv[0] = "horovodrun"
    launch.run_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
