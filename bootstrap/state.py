"""kiln's state on the operator's machine, and its one reader and writer.

`~/.kiln/clusters/NAME/` (KILN_HOME moves it) holds a cluster: cluster.json (how to reach it), nodes.json (what
the mesh found), aws.json, gcp.json or azure.json (what the provider made), capacity.json (where `up` found capacity,
after what), the cluster key and the pinned known_hosts.
`runs/<id>/` (KILN_RUNS moves it) holds a run: run.json (its plan), summary.json (what it did) and what was
collected from the nodes.
Records are frozen and hold parsed values (hosts as Host records), never strings to parse again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bootstrap.errors import KilnError, UsageError
from bootstrap.hosts import Host

LOGIN_FILE = "login.json"  # how the queue verbs reach a cluster's login node (bootstrap/attached.py)
CLUSTER_FILES = ("cluster.json", "nodes.json", "aws.json", "gcp.json", "azure.json", "capacity.json", "id_ed25519",
                 "id_ed25519.pub", "known_hosts", "known_hosts.first-contact", ".key.lock", LOGIN_FILE)


# ---------------------------------------------------------------- files


def kiln_home() -> Path:
    return Path(os.environ.get("KILN_HOME", Path.home() / ".kiln"))


def cluster_dir(cluster: str) -> Path:
    return kiln_home() / "clusters" / cluster


def runs_root() -> Path:
    """Where runs are kept: ~/.kiln/runs (whichever folder kiln was started from), unless KILN_RUNS says otherwise."""
    return Path(os.environ.get("KILN_RUNS", kiln_home() / "runs"))


def run_folder(run_id: str) -> Path:
    return runs_root() / run_id


@contextlib.contextmanager
def run_lock(run_id: str) -> Iterator[None]:
    """Held while one task ends a run's record (status settling a detached run, stop): never two at once."""
    folder = run_folder(validate_run_id(run_id))
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_json(path: Path, data: dict | list) -> None:
    """Write JSON atomically (a reader never sees half a file), making the folder private if it is new. Each writer
    has its temporary file of its own: kiln commands side by side on one cluster (runs sharing its nodes) each
    write its node names, and one's rename must not take the file another is still writing."""
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def write_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write the file whole (a reader sees it all, or the one before); with `mode`, it has that mode before it is in
    place (whatever the umask)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text)
        if mode is not None:
            tmp.chmod(mode)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: Path) -> dict | list | None:
    """The file's JSON; None if there is no file."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as error:
        raise KilnError(f"cannot read {path}: {error}") from None


def host_to_json(host: Host) -> dict:
    return {key: value for key, value in asdict(host).items() if value is not None}


def host_from_json(data: dict) -> Host:
    return Host(data["address"], data.get("port"), data.get("user"), data.get("slots"))


# ---------------------------------------------------------------- clusters


@dataclass(frozen=True)
class SshSettings:
    """How the operator reaches the nodes, besides the cluster's own pinned known_hosts."""

    config_file: str | None = None
    identity: str | None = None
    connect_timeout: int = 10


@dataclass(frozen=True)
class Instance:
    """A cloud instance of the cluster; `host_keys` says how its keys were pinned: console or first-contact."""

    id: str
    address: str
    host_keys: str


@dataclass(frozen=True)
class ClusterRecord:
    """How to reach a cluster by name (`--cluster NAME`); the provider and cloud part only for clusters kiln
    started (`kiln up`): provider "aws" or "local" (bootstrap.providers), None for hosts kiln was given."""

    name: str
    hosts: tuple[Host, ...]
    python: str
    ssh: SshSettings = SshSettings()
    region: str | None = None
    user: str | None = None
    instances: tuple[Instance, ...] = ()
    provider: str | None = None
    idle_minutes: float | None = None  # autostop: nodes power off after this long without a kiln run
    node_type: str | None = None  # the provider's machine type (p5.48xlarge): the collective check's floor
    # Where the cluster is, as the options that place it (("region", "us-west-2"),): written once, by the up that
    # made it, and read by every later verb (providers.placed), whatever the command line's defaults say.
    place: tuple[tuple[str, str], ...] = ()
    # A queue's controller machine on a cloud (slurmctld and kiln's programs): an instance of the cluster that is
    # none of its nodes (not in hosts), its host keys pinned beside theirs
    controller: Instance | None = None

    @property
    def where(self) -> dict[str, str]:
        return dict(self.place)


def cluster_json(record: ClusterRecord) -> dict:
    """A cluster file's contents (pure)."""
    data = asdict(record)
    data["hosts"] = [host_to_json(h) for h in record.hosts]
    data["place"] = dict(record.place)
    return data


def save_cluster(record: ClusterRecord) -> None:
    write_json(cluster_dir(record.name) / "cluster.json", cluster_json(record))


def load_cluster(name: str) -> ClusterRecord | None:
    path = cluster_dir(name) / "cluster.json"
    data = read_json(path)
    if data is None:
        return None
    try:
        return ClusterRecord(
            name=data["name"], hosts=tuple(host_from_json(h) for h in data["hosts"]), python=data["python"],
            ssh=SshSettings(**data.get("ssh", {})), region=data.get("region"), user=data.get("user"),
            instances=tuple(Instance(**i) for i in data.get("instances", [])),
            provider=data.get("provider", "aws" if data.get("instances") else None),
            idle_minutes=data.get("idle_minutes"), node_type=data.get("node_type"),
            place=tuple(sorted(data["place"].items())) if "place" in data else legacy_place(data),
            controller=Instance(**data["controller"]) if data.get("controller") else None)
    except (KeyError, TypeError, AttributeError) as error:
        raise KilnError(f"{path} is not a kiln cluster file ({error}); remove it and set the cluster up again") \
            from None


def legacy_place(data: dict) -> tuple[tuple[str, str], ...]:
    """The place of a cluster file written before files kept one: an AWS cluster's region (GCP's project and
    Azure's subscription are in their gcp.json and azure.json, where their providers look)."""
    if data.get("provider", "aws" if data.get("instances") else None) == "aws" and data.get("region"):
        return (("region", data["region"]),)
    return ()


def known_hosts_path(cluster: str, *, first_contact: bool = False) -> Path:
    """The cluster's pinned known_hosts (what its provider showed, then the mesh), or the keys accepted on first
    contact where the user allowed it."""
    return cluster_dir(cluster) / ("known_hosts.first-contact" if first_contact else "known_hosts")


def read_known_hosts(cluster: str, *, first_contact: bool = False) -> str:
    path = known_hosts_path(cluster, first_contact=first_contact)
    return path.read_text() if path.exists() else ""


def write_known_hosts(cluster: str, text: str, *, first_contact: bool = False) -> Path:
    """The one writer of a cluster's known_hosts files (ssh itself appends first contacts, where allowed)."""
    path = known_hosts_path(cluster, first_contact=first_contact)
    write_atomic(path, text)  # ssh of a command beside this one reads it meanwhile
    return path


def list_clusters(*, lenient: bool = False) -> list[ClusterRecord]:
    """Every cluster with a cluster file here, by name (`lenient`: those whose file cannot be read left out)."""
    root = kiln_home() / "clusters"
    records = []
    for path in sorted(root.iterdir()) if root.is_dir() else ():
        try:
            records.append(load_cluster(path.name))
        except KilnError:
            if not lenient:
                raise
    return [record for record in records if record is not None]


@dataclass(frozen=True)
class NodeName:
    """What the mesh recorded about a host: its hostname, cluster address and interface."""

    endpoint: str
    name: str
    address: str
    iface: str


def save_node_names(cluster: str, nodes: list[NodeName]) -> None:
    write_json(cluster_dir(cluster) / "nodes.json", [asdict(n) for n in nodes])


def load_node_names(cluster: str) -> list[NodeName]:
    try:
        return [NodeName(**entry) for entry in read_json(cluster_dir(cluster) / "nodes.json") or []]
    except (KilnError, TypeError):
        return []  # a stale or foreign file: the mesh finds the names again


def save_cloud_state(cluster: str, data: dict, kind: str = "aws") -> None:
    """What a cloud provider made for the cluster (`kind`.json: aws.json, gcp.json), written by that provider."""
    write_json(cluster_dir(cluster) / f"{kind}.json", data)


def load_cloud_state(cluster: str, kind: str = "aws") -> dict | None:
    return read_json(cluster_dir(cluster) / f"{kind}.json")


def save_capacity(cluster: str, data: dict) -> None:
    """Where `up` found capacity for the cluster and what it tried first (capacity.json), written by its failover."""
    write_json(cluster_dir(cluster) / "capacity.json", data)


def load_capacity(cluster: str) -> dict | None:
    data = read_json(cluster_dir(cluster) / "capacity.json")
    return data if isinstance(data, dict) else None


def offerings_path(kind: str) -> Path:
    """Where kiln keeps what a cloud last said of where it offers each GPU type (offerings/`kind`.json)."""
    return kiln_home() / "offerings" / f"{kind}.json"


def save_offerings(kind: str, data: dict) -> None:
    """Written by the cloud's provider when it has read them (bootstrap.providers.clouds)."""
    write_json(offerings_path(kind), data)


def load_offerings(kind: str) -> dict | None:
    """The cloud's kept offerings; None where there are none, or the file is damaged (then they are read again)."""
    try:
        data = read_json(offerings_path(kind))
    except KilnError:
        return None
    return data if isinstance(data, dict) else None


def has_cloud_state(cluster: str, kind: str = "aws") -> bool:
    return (cluster_dir(cluster) / f"{kind}.json").exists()


def forget_cluster(cluster: str) -> None:
    """Remove the files kiln keeps for a cluster (its key among them); the folder goes if nothing else is there."""
    folder = cluster_dir(cluster)
    for name in CLUSTER_FILES:
        (folder / name).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass


# ---------------------------------------------------------------- runs


@dataclass(frozen=True)
class TaskRecord:
    host: str        # the node's name
    host_index: int
    task: str


@dataclass(frozen=True)
class RunRecord:
    """A run's plan as started: enough for status, logs and stop to reach every process again."""

    run_id: str
    mode: str
    cluster: str
    python: str
    hosts: tuple[Host, ...]
    names: tuple[str, ...]
    root: str
    tasks: tuple[TaskRecord, ...]
    finishing: tuple[str, ...]
    rank_hosts: tuple[str, ...] = ()
    ssh: SshSettings = SshSettings()
    started: float = field(default_factory=time.time)
    watched: bool = True  # False: started with --detach (no watch writes its summary.json)


def new_run_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{secrets.token_hex(2)}"


def validate_run_id(run_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", run_id):
        raise UsageError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-' (at most 64)")
    return run_id


def save_run(record: RunRecord) -> None:
    data = asdict(record)
    data["hosts"] = [host_to_json(h) for h in record.hosts]
    write_json(run_folder(record.run_id) / "run.json", data)


def run_from_json(data: dict, path: Path) -> RunRecord:
    try:
        return RunRecord(
            run_id=data["run_id"], mode=data["mode"], cluster=data["cluster"], python=data["python"],
            hosts=tuple(host_from_json(h) for h in data["hosts"]), names=tuple(data["names"]), root=data["root"],
            tasks=tuple(TaskRecord(**t) for t in data["tasks"]), finishing=tuple(data["finishing"]),
            rank_hosts=tuple(data.get("rank_hosts", ())), ssh=SshSettings(**data.get("ssh", {})),
            started=data.get("started", 0.0), watched=data.get("watched", True))
    except (KeyError, TypeError) as error:
        raise KilnError(f"{path} is not a kiln run record ({error})") from None


def load_run(run_id: str | None) -> RunRecord:
    """A run's record; the newest run's when `run_id` is None."""
    if run_id is None:
        found = [(read_json(p), p) for p in runs_root().glob("*/run.json")]
        if not found:
            raise UsageError(f"no runs in {runs_root()}/; start one with kiln train")
        data, path = max(found, key=lambda pair: pair[0].get("started", 0))
        return run_from_json(data, path)
    path = run_folder(validate_run_id(run_id)) / "run.json"
    data = read_json(path)
    if data is None:
        raise UsageError(f"no run {run_id!r} in {runs_root()}/")
    return run_from_json(data, path)


def load_summary(run_id: str) -> dict | None:
    """A run's summary.json (written when the run ended, or was stopped); None while it runs."""
    return read_json(run_folder(validate_run_id(run_id)) / "summary.json")


def save_summary(run_id: str, data: dict) -> Path:
    path = run_folder(run_id) / "summary.json"
    write_json(path, data)
    return path
