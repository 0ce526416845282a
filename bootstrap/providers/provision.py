"""The cloud-neutral skeleton of making a cluster, which every cloud's `up` runs: the cluster key, the cloud's own
steps (each registering its undo before it runs), the wait for SSH, the host keys pinned, the cluster file; on any
failure (Ctrl-C too) everything undone, and one error naming the step. A cloud gives only its verbs (`Verbs`): make
the nodes, read the host keys they show, keep its own record, settle what it started before the undo.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from dataclasses import replace as changed
from typing import Any, ClassVar, Self

from bootstrap import mesh, state
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.providers import Unfound
from bootstrap.providers.common import DATA_MOUNT, Rollback, no_answer_error, pin_host_keys
from bootstrap.providers.failover import CloudError
from kiln.hostkeys import known_hosts_lines, without_hosts
from kiln.shield import shielded
from kiln.sshwait import wait_for_ssh


@dataclass
class Progress:
    """The step under way, which a failure names ("could not create the instances"); in a replacement, the new
    node's id too, once it may exist (what a failure deletes). With `say`, each step is said as it begins (kiln
    up's progress: `cluster NAME: run the instances`)."""

    step: str = "generate the cluster key"
    made: str | None = None
    say: Callable[[str], None] | None = field(default=None, repr=False)
    name: str = ""

    def __setattr__(self, key: str, value: Any) -> None:
        super().__setattr__(key, value)
        if key == "step" and getattr(self, "say", None):
            self.say(f"cluster {self.name}: {value}")


@dataclass(frozen=True)
class Nodes:
    """What a cloud made: its ids (instance ids, VM names) and the hosts, in node order."""

    ids: tuple[str, ...]
    hosts: tuple[Host, ...]


@dataclass(frozen=True)
class Verbs:
    """One cloud's part of `up`.

    make(progress, rollback, public_key): make the cluster's resources and nodes, setting progress.step before each
        step and pushing each step's undo onto rollback before it runs.
    host_keys(ids, timeout_s): the host keys each node shows its cloud (console, serial log, guest attributes),
        looked for until timeout_s.
    save(nodes): write the cloud's own record of the cluster (what replace and down need).
    settle(): wait for what the cloud started, before anything is undone.
    """

    kind: str  # the provider, as the cluster file and `kiln down --provider` name it
    error: type[CloudError]
    make: Callable[[Progress, Rollback, str], Nodes]
    host_keys: Callable[[Sequence[str], float], dict[str, list[str]]]
    save: Callable[[Nodes], None]
    describe: Callable[[BaseException], str]
    code: Callable[[BaseException], str]
    keys_step: str = "read the host keys the nodes show"
    keys_source: str = "shown"  # where pinned keys came from, as the cluster file says
    settle: Callable[[], None] = field(default=lambda: None)
    # Where the cluster is, as the options that place it ({"region": "us-west-2"}): the cluster file keeps it for
    # every later verb (providers.placed), and a failed undo's message names it.
    place: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Cluster:
    """What `up` made: the nodes and how each one's host key is held (Instance.host_key: shown, first-contact)."""

    nodes: Nodes
    pinned: dict[str, str]
    identity: str

    def made(self, name: str, *, where: str, image: str, expires: str, ssh_wait: float,
             volumes: Sequence[str] = (), restore_note: str | None = None) -> Up:
        """What `up` tells of it (Up), with the cloud's own facts."""
        return Up(name, where, image, self.nodes.ids, tuple(h.endpoint() for h in self.nodes.hosts), self.identity,
                  expires, self.pinned, ssh_wait, tuple(volumes), restore_note)


def answering(name: str, nodes: Nodes, say: Callable[[str], None]) -> Callable[[str], None]:
    """What wait_for_ssh calls as each node's SSH answers: a line naming it, after how long, how many so far."""
    ids = {f"{h.address}:{h.port}": (i, h.address) for i, h in zip(nodes.ids, nodes.hosts, strict=True)}
    began, lock, answered = time.monotonic(), threading.Lock(), []

    def said(endpoint: str) -> None:
        with lock:
            answered.append(endpoint)
            node, address = ids[endpoint]
            say(f"cluster {name}: {node} ({address}) answers SSH after {time.monotonic() - began:.0f} s "
                f"({len(answered)} of {len(ids)})")
    return said


def up(name: str, verbs: Verbs, *, region: str, user: str, node_type: str, python: str,
       ssh_wait_s: float, say: Callable[[str], None] | None = None) -> Cluster:
    """Make cluster `name` with the cloud's verbs, wait until SSH answers on every node (unless ssh_wait_s is 0),
    pin the host keys the nodes show, and write the cluster file; on any failure undo it all and raise the cloud's
    error naming the step (with `left` where the undo left something behind). A UsageError the undo fully undid is
    raised as it is (bad input, found late: a name taken meanwhile). With `say`, each step and each node that
    answers SSH is said as it comes."""
    folder = state.cluster_dir(name)
    identity = str(folder / "id_ed25519")
    rollback, progress = Rollback(), Progress(say=say, name=name)
    try:
        had_key = (folder / "id_ed25519").exists()
        rollback.push("remove the local files", lambda: None if had_key else state.forget_cluster(name))
        _, public_key = mesh.ensure_cluster_key(name)
        (folder / "id_ed25519").chmod(0o600)
        nodes = verbs.make(progress, rollback, public_key)
        started = time.monotonic()

        if ssh_wait_s > 0:
            progress.step = "wait until SSH answers"
            silent = set(wait_for_ssh([(h.address, h.port) for h in nodes.hosts], ssh_wait_s,
                                      answered=answering(name, nodes, say) if say else None))
            if silent:
                raise verbs.error(no_answer_error([f"{i} ({h.address})" for i, h in zip(nodes.ids, nodes.hosts,
                                                                                         strict=True)
                                                   if f"{h.address}:{h.port}" in silent], ssh_wait_s))

        progress.step = verbs.keys_step
        found = verbs.host_keys(nodes.ids, max(0.0, ssh_wait_s - (time.monotonic() - started)))
        pinned = pin_host_keys(name, nodes.ids, nodes.hosts, found, verbs.keys_source)

        progress.step = "write the cluster file"
        verbs.save(nodes)
        state.save_cluster(state.ClusterRecord(
            name, nodes.hosts, python, state.SshSettings(identity=identity), region=region, user=user,
            instances=tuple(state.Instance(i, h.address, pinned[h.address]) for i, h in zip(nodes.ids, nodes.hosts,
                                                                                           strict=True)),
            provider=verbs.kind, node_type=node_type, place=tuple(sorted(verbs.place.items()))))
    except BaseException as error:
        where = " ".join((f"--provider {verbs.kind}", *flags(verbs.place)))
        failures = undo(name, verbs, rollback, where)
        if isinstance(error, UsageError) and not failures:
            raise
        said = "interrupted" if isinstance(error, KeyboardInterrupt) else verbs.describe(error)
        raise verbs.error(failed_line(name, where, progress.step, said, failures), code=verbs.code(error),
                          left=bool(failures)) from None
    return Cluster(nodes, pinned, identity)


def undo(name: str, verbs: Verbs, rollback: Rollback, where: str) -> list[str]:
    """Settle what the cloud started, then undo every step, in reverse; what could not be undone, as lines. A
    Ctrl-C while it runs is told that the undo goes on; a second one stops it, and what was not yet undone is
    named among the failures (so the error names the kiln down to run)."""
    with shielded(f"undoing what cluster.up {name} made", f"leaves it for kiln down {name} {where}"):
        try:
            verbs.settle()
        except KeyboardInterrupt:
            return [f"{what}: not done (Ctrl-C)" for what, _ in reversed(rollback.undo)]
        return rollback.run(verbs.describe, stoppable=True)


def flags(place: Mapping[str, str]) -> list[str]:
    """The command line's options of a place: {"region": "us-west-2"} -> ["--region us-west-2"]."""
    return [f"--{key} {value}" for key, value in sorted(place.items())]


def failed_line(name: str, where: str, step: str, said: str, failures: Sequence[str]) -> str:
    """The one line a failed `up` ends with: the step, the cloud's words, and what the undo left (if anything, with
    the options that find it: --provider aws --region us-west-2)."""
    if failures:
        return (f"cluster.up {name}: could not {step}: {said}; rolling back left things behind (run kiln down {name} "
                f"{where}): " + "; ".join(failures))
    return f"cluster.up {name}: could not {step}: {said}; everything it had created was removed"


@dataclass(frozen=True)
class Swap:
    """One cloud's part of `replace`.

    make(replacing): make the new node as `up` made the cluster's; set replacing.made to its id as soon as it may
        exist (before the call that makes it, where the id is chosen beforehand); (its id, its host).
    host_keys(ids, timeout_s): as Verbs.host_keys.
    remove(id, address): delete a node (the new one after a failure, the old one after a success, one a queue no
        longer needs), waiting until it is gone; `address`: where it was reached ("" for one just made).
    attach(new_id, volume): attach the old node's data volume to the new one.
    """

    error: type[CloudError]
    describe: Callable[[BaseException], str]
    make: Callable[[Progress], tuple[str, Host]]
    host_keys: Callable[[Sequence[str], float], dict[str, list[str]]]
    remove: Callable[[str, str], None]
    attach: Callable[[str, str], None]
    first_step: str  # "run the instance", "create the VM"
    keys_step: str  # "read its host keys from the console"
    keys_where: str  # where a node shows its keys, for the error when it shows none
    keys_source: str = "shown"
    node_word: str = "instance"  # instance, VM
    volume_word: str = "data disk"  # data volume, data disk
    finds_old: str = "finds it by its labels"  # how `kiln down` finds an old node that could not be deleted
    volume_kept: str = "labelled with the cluster"  # where a volume that could not be attached stays
    error_code: Callable[[BaseException], str] = lambda error: ""  # the cloud's code for a failed call (Verbs')


def answered_keys(made: Sequence[tuple[str, Host]], host_keys: Callable[[Sequence[str], float], dict[str, list[str]]],
                  error: type[CloudError], progress: Progress, keys_step: str,
                  ssh_wait_s: float) -> dict[str, list[str]]:
    """Wait until SSH answers on every machine just made, (id, host) (no wait where ssh_wait_s is 0; `error`, the
    cloud's, naming them all where one stays silent), then read the host keys each shows within what is left of
    the wait: each one's, by id (a machine that shows none is missing: its caller refuses to trust it).
    `progress.step` says each step."""
    started = time.monotonic()
    progress.step = "wait until SSH answers"
    if ssh_wait_s > 0 and wait_for_ssh([(host.address, host.port) for _, host in made], ssh_wait_s):
        raise error(no_answer_error([f"{made_id} ({host.address})" for made_id, host in made], ssh_wait_s))
    progress.step = keys_step
    return host_keys([made_id for made_id, _ in made], max(0.0, ssh_wait_s - (time.monotonic() - started)))


def node_at(record: state.ClusterRecord, address: str) -> tuple[state.Instance, int]:
    """The node of the cluster at `address`, and its index; refused by address where there is none."""
    old = next((i for i in record.instances if i.address == address), None)
    if old is None:
        raise UsageError(f"cluster {record.name} has no instance at {address}")
    return old, record.instances.index(old)


def replace(record: state.ClusterRecord, address: str, volumes: Sequence[str], swap: Swap, *,
            ssh_wait_s: float) -> tuple[Host, list[str]]:
    """Put a new node in place of the one at `address` of the cluster (its `record`), and delete the old one; its
    data volume (volumes[i], node i's, where there is one) moves to the new one; the cluster file is updated. (the
    new host, the host keys it shows)

    The new node must run, answer SSH and show its host keys (kiln never trusts a replacement on first contact);
    otherwise it is deleted and the cluster is left as it was."""
    name = record.name
    old, index = node_at(record, address)
    replacing = Progress(swap.first_step)
    try:
        new_id, host = swap.make(replacing)
        keys = answered_keys([(new_id, host)], swap.host_keys, swap.error, replacing, swap.keys_step,
                             ssh_wait_s).get(new_id)
        if not keys:
            raise swap.error(f"{new_id} shows no host keys ({swap.keys_where}): kiln does not trust a replacement on "
                             "first contact")
    except BaseException as error:
        undo = Rollback()
        made = replacing.made
        if made:
            undo.push(f"delete {made}", lambda: swap.remove(made, ""))
        left = undo.run(swap.describe)
        said = "interrupted" if isinstance(error, KeyboardInterrupt) else swap.describe(error)
        raise swap.error(f"cluster {name}: could not replace {address} ({old.id}): could not {replacing.step}: {said}"
                         + (f"; left behind: {'; '.join(left)}" if left else "; nothing new is left running"),
                         code=swap.error_code(error), left=bool(left)) from None
    instances = tuple(state.Instance(new_id, host.address, swap.keys_source) if i is old else i
                      for i in record.instances)
    hosts = tuple(host if h.address == address else h for h in record.hosts)
    state.save_cluster(changed(record, hosts=hosts, instances=instances))
    volume = volumes[index] if index < len(volumes) else None
    replaced = f"cluster {name}: {address} was replaced by {new_id} ({host.address}), but"
    try:
        swap.remove(old.id, address)
    except Exception as error:
        stays = f"; its {swap.volume_word} {volume} stays attached to it" if volume else ""
        raise swap.error(f"{replaced} the old {swap.node_word} {old.id} could not be deleted: "
                         f"{swap.describe(error)}{stays} (kiln down {name} {swap.finds_old})") from None
    if volume:
        try:
            swap.attach(new_id, volume)
        except Exception as error:
            raise swap.error(f"{replaced} its {swap.volume_word} {volume} could not be attached to it: "
                             f"{swap.describe(error)} (the {swap.volume_word.split()[-1]} is kept, "
                             f"{swap.volume_kept})") from None
    return host, keys


def no_volumes(name: str, volumes: Sequence[str]) -> None:
    """A cluster whose nodes have data volumes keeps its number of nodes: each volume is its node's by place (a
    replacement takes it over), which a node added or removed would shift."""
    if any(volumes):
        raise UsageError(f"cluster {name} has data volumes, one per node by its place: nodes are added to or removed "
                         "from a cluster without them only")


def grow(record: state.ClusterRecord, count: int, swap_at: Callable[[int], Swap], *, volumes: Sequence[str] = (),
         ssh_wait_s: float) -> list[tuple[str, Host, list[str]]]:
    """Add `count` nodes to the cluster (its `record`), each made as `up` made the cluster's (`swap_at(index)`:
    the cloud's part for node `index`), one after another. Each must run, answer SSH and show its host keys (kiln
    never trusts a new node on first contact); on any failure (Ctrl-C too) every one made is deleted and the
    cluster is left as it was, else the cluster file lists them after its nodes and their keys are pinned beside
    the others'. Each node's (id, host, host keys), in order: what a queue's resume joins."""
    name, first = record.name, len(record.instances)
    no_volumes(name, volumes)
    made: list[tuple[str, Host, Swap]] = []
    swap = swap_at(first)
    growing = Progress(swap.first_step)
    try:
        for index in range(first, first + count):
            swap = swap if index == first else swap_at(index)
            growing = Progress(swap.first_step)
            made.append((*swap.make(growing), swap))
        keys = answered_keys([(new_id, host) for new_id, host, _ in made], swap.host_keys, swap.error, growing,
                             "read the host keys they show", ssh_wait_s)
        blind = [new_id for new_id, _, _ in made if not keys.get(new_id)]
        if blind:
            raise swap.error(f"{', '.join(blind)} show(s) no host keys ({swap.keys_where}): kiln does not trust a "
                             "new node on first contact")
    except BaseException as error:
        undo = Rollback()
        ids = [new_id for new_id, _, _ in made]
        if growing.made and growing.made not in ids:  # the one being made when it failed
            made.append((growing.made, Host(""), swap))
        for new_id, _, its in made:
            undo.push(f"delete {new_id}", lambda its=its, new_id=new_id: its.remove(new_id, ""))
        left = undo.run(swap.describe)
        said = "interrupted" if isinstance(error, KeyboardInterrupt) else swap.describe(error)
        raise swap.error(f"cluster {name}: could not add {count} {swap.node_word}(s): could not {growing.step}: "
                         f"{said}" + (f"; left behind: {'; '.join(left)}" if left else "; nothing new is left running"),
                         code=swap.error_code(error), left=bool(left)) from None
    state.save_cluster(changed(record, hosts=(*record.hosts, *(host for _, host, _ in made)), instances=(
        *record.instances, *(state.Instance(new_id, host.address, swap.keys_source) for new_id, host, _ in made))))
    state.write_known_hosts(name, state.read_known_hosts(name) + "".join(
        line for new_id, host, _ in made for line in known_hosts_lines([host.address], keys[new_id], host.port)))
    return [(new_id, host, keys[new_id]) for new_id, host, _ in made]


def shrink(record: state.ClusterRecord, addresses: Sequence[str], remove: Callable[[str, str], None], *,
           volumes: Sequence[str] = ()) -> list[str]:
    """Delete the cluster's nodes at `addresses` one after another (`remove(id, address)`: the cloud's delete,
    waiting until it is gone), each taken out of the cluster file and its known_hosts once it is gone (a failure
    leaves the file true to what is left). The ids removed."""
    no_volumes(record.name, volumes)
    gone = [node_at(record, address)[0] for address in dict.fromkeys(addresses)]
    for instance in gone:
        remove(instance.id, instance.address)
        record = changed(record, hosts=tuple(h for h in record.hosts if h.address != instance.address),
                         instances=tuple(i for i in record.instances if i.address != instance.address))
        state.save_cluster(record)
        state.write_known_hosts(record.name, without_hosts(state.read_known_hosts(record.name), [instance.address]))
    return [instance.id for instance in gone]


def shrink_by(record: state.ClusterRecord, addresses: Sequence[str], swap: Swap, *,
              volumes: Sequence[str] = ()) -> list[str]:
    """`shrink` with the cloud's part (`swap`: its delete, and how a failure is said): a failed delete is one
    error of the cloud naming the nodes asked for (bad input, UsageError, as it is)."""
    try:
        return shrink(record, addresses, swap.remove, volumes=volumes)
    except UsageError:
        raise
    except Exception as error:
        raise swap.error(f"cluster {record.name}: could not remove {', '.join(addresses)}: {swap.describe(error)}",
                         code=swap.error_code(error)) from None


class CloudRecord:
    """What kiln keeps of a cluster it made on a cloud (`kind`.json): enough to replace a node as it was made, a
    frozen dataclass of each cloud's facts (its image, network, the request). The machines, their order and host
    keys are the cluster file's (state.ClusterRecord), written once there."""

    kind: ClassVar[str]
    volumes_field: ClassVar[str]  # the data volumes (disks), in node order: a tuple, as JSON keeps a list

    def save(self, cluster: str) -> None:
        state.save_cloud_state(cluster, asdict(self), self.kind)

    @classmethod
    def of_cluster(cls, name: str) -> tuple[state.ClusterRecord, Self]:
        """The cluster's file and this record of how kiln made it (what replace and arm_autostop read); one line
        where either is missing (a cluster made by an older kiln, or elsewhere)."""
        record, kept = state.load_cluster(name), cls.load(name)
        if record is None or kept is None:
            raise UsageError(f"cluster {name}: no record of how kiln made it on {cls.kind} ({cls.kind}.json; kiln "
                             "up of this version makes one)")
        return record, kept

    @classmethod
    def load(cls, cluster: str) -> Self | None:
        """The record, or None where there is none, or it is a file of another version that lacks a fact (an older
        file's extra facts are left)."""
        data = state.load_cloud_state(cluster, cls.kind)
        if not data:
            return None
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        try:
            return cls(**{**known, cls.volumes_field: tuple(data.get(cls.volumes_field) or ())})
        except TypeError:
            return None


def cluster_public_key(name: str) -> str:
    """The public half of the cluster's key, which a replacement is made with; one line where it is gone."""
    path = state.cluster_dir(name) / "id_ed25519.pub"
    if not path.exists():
        raise UsageError(f"cluster {name}: its key is gone; kiln down {name} removes it")
    return path.read_text().strip()


def forget_local(name: str, kind: str, *, found: bool = True, looked: str = "") -> None:
    """After a `down`: remove the local files of a cluster, only where kiln's record says it made it on this cloud.
    Where that record is and nothing of the cluster was found where the down looked (`looked`: the place, as the
    record gave it), the files stay, its key among them: a cluster kiln cannot find is never forgotten (Unfound)."""
    if not state.has_cloud_state(name, kind):
        return
    if not found:
        raise Unfound(name, looked, str(state.cluster_dir(name)))
    state.forget_cluster(name)


@dataclass(frozen=True)
class Up:
    """What a cloud's `up` made, on every cloud: the cluster's name, where it runs and from which image (as the
    user reads them: a region; project/zone; a resource group and its location), its nodes (ids, hosts, data
    volumes, in node order), how each one's host key is held (address -> shown, console or first-contact), its key,
    its expiry, how long `up` waited for SSH, and what its data volumes were restored from."""

    name: str
    where: str
    image: str
    ids: tuple[str, ...]
    hosts: tuple[str, ...]
    identity: str
    expires: str
    host_keys: Mapping[str, str]
    ssh_wait: float
    volumes: tuple[str, ...] = ()
    restore_note: str | None = None

    @property
    def unpinned(self) -> tuple[str, ...]:
        """The addresses whose host keys the cloud did not show (kiln does not log in to them)."""
        return tuple(address for address, how in self.host_keys.items() if how == "first-contact")


@dataclass(frozen=True)
class Teardown:
    """What `down --snapshot` did, on every cloud: the resources removed, the snapshots taken (records with an id
    or name as `label`, `index`, `size` and `expiry`), the data volumes kept (id or name, node, why)."""

    removed: Sequence[str]
    snapshots: Sequence = ()
    kept: Sequence[tuple[str, str, str]] = ()


def made_lines(made: Up, *, volume_word: str, machines: str, keys_from: str) -> list[str]:
    """What `kiln up` says of a cluster it made, on every cloud: where it runs and from which image, each node (its
    id, its data volume), how each one's host keys were pinned (from `keys_from`), what to run next."""
    name = made.name
    lines = [] if made.ssh_wait else [f"not waiting for SSH to answer (--ssh-wait 0): the {machines} may still be "
                                      "booting"]
    image = made.image.rsplit("/", 1)[-1]  # a GCE or Azure image's name, without its path
    lines.append(f"cluster {name} is running in {made.where} from {image}, expires {made.expires}:")
    for host, node, volume in zip(made.hosts, made.ids, made.volumes or [None] * len(made.ids), strict=True):
        lines.append(f"  {host} ({node})" + (f", {volume_word} {volume} at {DATA_MOUNT}" if volume else ""))
    if made.restore_note:
        lines.append(made.restore_note)
    pinned = [address for address, how in made.host_keys.items() if how != "first-contact"]
    if pinned:
        lines.append(f"host keys of {', '.join(pinned)} pinned from {keys_from}")
    if made.unpinned:
        lines.append(first_contact_note(name, made.unpinned, keys_from))
    lines.append(f"key {made.identity}; next: kiln check --cluster {name}")
    return lines


def first_contact_note(name: str, addresses: Sequence[str], keys_from: str) -> str:
    """What to run when some host keys were not where the cloud shows them."""
    return (f"host keys of {', '.join(addresses)} were not in {keys_from}: recorded as first-contact; kiln mesh "
            f"--cluster {name} --accept-new-host-keys (or kiln train --cluster {name} --accept-new-host-keys) records "
            "them on first contact")
