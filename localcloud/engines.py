"""Docker engines for a local cluster (local-cluster up --docker): one dockerd per node, inside the node's
namespaces, and the cluster's registry, reached by the nodes on the bridge and by this machine on loopback (two
registry processes sharing one store: this machine's engine pushes over plain HTTP to loopback only). The plan
(paths, argv) is localcloud.netns's; this module starts, waits for and removes them (I/O)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bake import container
from kiln import proc
from kiln.errors import KilnError
from localcloud import netns as plan
from localcloud import registry

DOCKER_TOOLS = ("dockerd", "docker", "nsenter", registry.BINARY)


def check_tools() -> None:
    if missing := [tool for tool in DOCKER_TOOLS if not shutil.which(tool)]:
        raise KilnError(f"--docker needs {', '.join(missing)} (make setup installs docker.io and docker-registry)")


def start_engine(node: plan.Node, engine: plan.NodeEngine, sshd_pid: int, registry_address: str,
                 log: Path) -> subprocess.Popen:
    """Start the node's dockerd detached (its log: `log`)."""
    for folder in (engine.data_root, engine.exec_root):
        folder.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(plan.dockerd_argv(sshd_pid, engine, registry_address), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, start_new_session=True)


def wait_engine(node: plan.Node, engine: plan.NodeEngine, process: subprocess.Popen, log: Path,
                timeout: float = 60) -> None:
    """Wait until the node's engine answers; name the node and the engine's last words if it does not."""
    deadline = time.monotonic() + timeout
    while True:
        answer = proc.run(["docker", "-H", engine.docker_host, "version", "--format", "{{.Server.Version}}"],
                          timeout=10, check=False)
        if answer.returncode == 0:
            return
        if process.poll() is not None or time.monotonic() > deadline:
            said = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            raise KilnError(f"{node.name}: its Docker engine did not start: {said[-1] if said else 'no output'}")
        time.sleep(0.2)


def start_registries(cluster: plan.Cluster) -> dict[str, str]:
    """The cluster's registry: {"nodes": GATEWAY:5000, "operator": 127.0.0.1:PORT}, both serving one store, each
    process's pid kept beside it for `down`."""
    registry.check_installed()
    root = plan.ENGINE_DATA_ROOT / cluster.name / "registry"
    addresses = {"nodes": plan.registry_address(cluster), "operator": f"127.0.0.1:{registry.free_port('127.0.0.1')}"}
    for role, address in addresses.items():
        process, log = registry.start(root, address)
        (root / f"{role}.pid").write_text(f"{process.pid}\n")
        registry.wait_ready(f"http://{address}", process, log, timeout=30)
    (root / "addresses.json").write_text(json.dumps(addresses) + "\n")
    return addresses


def registry_addresses(name: str) -> dict[str, str]:
    path = plan.ENGINE_DATA_ROOT / name / "registry" / "addresses.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def stop_registries(name: str) -> None:
    """Stop the cluster's registry processes (by their pid files; a pid that no longer runs the registry of
    this cluster is left alone)."""
    root = plan.ENGINE_DATA_ROOT / name / "registry"
    for pidfile in root.glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pidfile.read_text())
            if str(root) in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                os.kill(pid, signal.SIGTERM)
                for _ in range(50):
                    if not Path(f"/proc/{pid}").exists():
                        break
                    time.sleep(0.1)
                else:
                    os.kill(pid, signal.SIGKILL)


def engine_leftovers(name: str, netns: list[str]) -> list[Path]:
    """What engines of cluster `name` left on disk: its data folder, each node's run folder and socket."""
    found = [plan.ENGINE_DATA_ROOT / name] if (plan.ENGINE_DATA_ROOT / name).exists() else []
    if plan.ENGINE_RUN_ROOT.is_dir():
        found += [path for path in plan.ENGINE_RUN_ROOT.iterdir()
                  if path.name.split(".", 1)[0] in netns or path.name.startswith(f"{name}-n")]
    return found


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_engine_files(name: str, netns: list[str]) -> None:
    """Remove the engines' folders (after their processes are gone: their mounts went with the nodes' mount
    namespaces). Each node's images are tens of thousands of files, whose removal waits on the disk more than on a
    core: the nodes' folders go side by side (three trees of 25,551 files, 1.4 GB each: 4.5 s against 7.8 s one
    after another, here)."""
    found = engine_leftovers(name, netns)
    parts = [child for path in found if path.is_dir() and not path.is_symlink() for child in path.iterdir()]
    if parts:
        with ThreadPoolExecutor(min(8, len(parts))) as pool:
            list(pool.map(remove_path, parts))
    for path in found:
        remove_path(path)
    left = engine_leftovers(name, netns)
    if left:
        raise KilnError(f"could not remove {', '.join(map(str, left[:3]))} of cluster {name}'s Docker engines")


def push_to_cluster(name: str, image: str, timeout: float = 1800, copy_from: str | None = None) -> str:
    """Push an image of this machine's engine to cluster `name`'s registry (up --docker); the reference its
    nodes pull it by (REGISTRY/REPOSITORY:TAG on the bridge). `copy_from`: a registry reference that already holds
    the image (where `make image PROVIDER=docker REGISTRY=...` pushed it): its compressed layers are copied as they
    are, where a push compresses every layer again (kiln's 3 GB cpu image: 9 s against 143 s with docker push on
    an earlier machine); where that reference names another image, or cannot be read, the image is pushed
    (container.push)."""
    addresses = registry_addresses(name)
    if not addresses:
        raise KilnError(f"cluster {name} has no registry (make it with: local-cluster up --docker)")
    path = image.rsplit("/", 1)[-1]  # the repository's last part and the tag: kiln:cpu-FINGERPRINT
    pushed = f"{addresses['operator']}/{path}"
    if not (copy_from and copied(copy_from, pushed, image, timeout)):
        container.push(image, pushed, timeout)
    return f"{addresses['nodes']}/{path}"


def config_digest(manifest: dict) -> str | None:
    """The digest of the image configuration an image manifest (Docker's schema 2 or OCI's) names: the image's
    id in the engine. None for a list of manifests or an older schema."""
    config = manifest.get("config")
    return config.get("digest") if isinstance(config, dict) else None


def copied(source: str, target: str, image: str, timeout: float) -> bool:
    """Copy the image at registry reference `source` to `target` blob by blob, unchanged (skopeo), when its
    manifest names `image` of this machine's engine; whether it did."""
    if not shutil.which("skopeo"):
        return False
    wanted = proc.run(["docker", "image", "inspect", "--format", "{{.Id}}", image], timeout=60).stdout.strip()
    raw = proc.run(["skopeo", "inspect", "--raw", *container.skopeo_tls(source, "tls-verify"), f"docker://{source}"],
                   timeout=120, check=False)
    try:
        if raw.returncode != 0 or config_digest(json.loads(raw.stdout)) != wanted:
            return False
    except (json.JSONDecodeError, AttributeError):
        return False
    proc.run(["skopeo", "copy", "--quiet", *container.skopeo_tls(source, "src-tls-verify"),
              *container.skopeo_tls(target, "dest-tls-verify"), f"docker://{source}", f"docker://{target}"],
             timeout=timeout)
    return True
