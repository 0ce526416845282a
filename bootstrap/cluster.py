"""One cluster session: hosts, ssh settings, facts, mesh, preflight and sync (I/O)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from bootstrap import commands, launch, mesh, preflight, progress, state, timeline, topology
from bootstrap.commands import SshOptions
from bootstrap.errors import KilnError, RemoteError
from bootstrap.hosts import Host
from bootstrap.mesh import Node
from bootstrap.ssh import Remote, default_control_dir
from kiln.gpu import allreduce, collective, dcgm, health, probe
from kiln.gpu import facts as gpufacts

REMOTE_ROOT = "kiln"
SYNC_QUIET_S = 2.0  # a sync over sooner (a small project) says nothing of its progress


@dataclass
class Cluster:
    """The hosts of one cluster and how to reach them."""

    name: str
    hosts: list[Host]
    remote: Remote
    python: str
    nodes: list[Node] = field(default_factory=list)

    @classmethod
    def connect(cls, name: str, hosts: Sequence[Host], options: SshOptions, *, python: str, fanout: int,
                timeout: float, accept_new: bool = False) -> Cluster:
        """Set up ssh for the cluster: its pinned known_hosts, trust on first use if asked."""
        folder = mesh.cluster_dir(name)
        pinned = state.known_hosts_path(name)
        # Connections are shared per cluster only: one made under another cluster's trust is never reused.
        tag = hashlib.sha256(name.encode()).hexdigest()[:8]
        options = replace(options, known_hosts=(str(pinned),),
                          control_path=options.control_path or os.path.join(default_control_dir(), f"{tag}-%C"))
        remote = Remote(options, fanout=fanout, timeout=timeout)
        if accept_new:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            first_contact = state.known_hosts_path(name, first_contact=True)
            users = remote.user_known_hosts(hosts[0]) if hosts else ()
            remote.options = replace(options, accept_new_into=str(first_contact), user_known_hosts=users)
        return cls(name, list(hosts), remote, python)

    def facts(self, hosts: Sequence[Host] | None = None, *, ports: Sequence[int] = (),
              names: dict[Host, list[str]] | None = None, probes: dict[Host, str] | None = None,
              only: Sequence[str] = ()) -> tuple[dict[Host, dict], dict[Host, str]]:
        """Facts from every host in one call each; (facts, unreachable reasons).
        `names` are other nodes' names a host should resolve; `probes` the node
        name it should log in to over the mesh; `only` the facts wanted, where a command needs no more (all)."""
        def gather(host: Host) -> dict:
            return self.remote.node(host, self.python, "facts", ",".join(map(str, ports)),
                                    ",".join((names or {}).get(host, [])), (probes or {}).get(host, ""),
                                    ",".join(only))

        hosts = hosts or self.hosts
        with timeline.step("facts", len(hosts)):
            return self.remote.map(hosts, gather)

    def require_facts(self, step: str, **kwargs) -> list[Node]:
        facts, failures = self.facts(**kwargs)
        if failures:
            raise RemoteError(step, {h.label: reason for h, reason in failures.items()})
        self.nodes = mesh.nodes_from_facts(facts)
        return self.nodes

    def apply_mesh(self, *, remember_python: bool = False) -> dict[str, list[str]]:
        """Authorize the cluster key on every node, pin every host key, make every
        hostname resolve to its routable address. Returns what changed, per host. The cluster file keeps the
        nodes' Python it had unless `remember_python` (kiln mesh --python): a run's --python is its own."""
        nodes = self.nodes or self.require_facts("mesh")
        private_key, public_key = mesh.ensure_cluster_key(self.name)
        payload = mesh.mesh_payload(self.name, nodes, private_key, public_key)
        state.write_known_hosts(self.name, payload["known_hosts"])
        by_host = {node.host: node for node in nodes}

        def install(host: Host) -> list[str]:
            if by_host[host].facts.get("uid") == 0:
                return self.remote.node(host, self.python, "mesh", "ssh", "hosts", input=payload)["changed"]
            changed = self.remote.node(host, self.python, "mesh", "ssh", input=payload)["changed"]
            names_only = {"cluster": self.name, "hosts": payload["hosts"]}  # root never sees the key
            return changed + self.remote.node(host, self.python, "mesh", "hosts", input=names_only,
                                              sudo=True)["changed"]

        with timeline.step("mesh", len(self.hosts)):
            changed = self.remote.map_or_raise("mesh", self.hosts, install)
        state.save_node_names(self.name, [state.NodeName(n.host.endpoint(), n.name, n.address, n.iface)
                                          for n in nodes])
        self.save(remember_python=remember_python)
        return {host.label: files for host, files in changed.items()}

    def save(self, *, remember_python: bool = True) -> None:
        """Record how to reach the cluster, so later tasks take `--cluster NAME` instead of -H (what a cloud
        provider recorded about it is kept; its nodes' Python too, unless `remember_python`)."""
        options = self.remote.options
        ssh = state.SshSettings(options.config_file, options.identity, options.connect_timeout)
        known = state.load_cluster(self.name)
        if known is None:
            record = state.ClusterRecord(self.name, tuple(self.hosts), self.python, ssh)
        else:
            record = replace(known, hosts=tuple(self.hosts), python=self.python if remember_python else known.python,
                             ssh=ssh)
        state.save_cluster(record)

    def saved_names(self) -> list[str] | None:
        """The node names `cluster.mesh` recorded for exactly these hosts, if any."""
        saved = state.load_node_names(self.name)
        if [entry.endpoint for entry in saved] != [h.endpoint() for h in self.hosts]:
            return None
        return [entry.name for entry in saved]

    def preflight(self, ports: Sequence[int] = (), probes: int = preflight.MESH_PROBES,
                  gpu_framework: str | None = None, frameworks: bool = True, deep: bool = False,
                  required: Sequence[str] = ("tensorflow",), fabric: bool = False) -> tuple[str, bool]:
        """Run every check in one round when the mesh's node names are known (two
        otherwise); `probes` nodes log in to the next one; with `gpu_framework`, the
        GPU health check too (with `deep`, DCGM's diagnostics as well); without `frameworks`, the nodes' own
        frameworks (`required`: the run's, TensorFlow by default) are not asked for (a run in a container image
        brings its own); with `fabric`, the nodes' EFA or InfiniBand where any has one. (table, all passed)"""
        def gather(names: list[str] | None) -> tuple[dict[Host, dict], dict[Host, str]]:
            edges = preflight.ring_probes(len(self.hosts), probes) if names else []
            targets = {self.hosts[a]: names[b] for a, b in edges}
            window = {host: [names[j] for j in preflight.neighbours(len(names), i)]
                      for i, host in enumerate(self.hosts)} if names else {}
            return self.facts(ports=ports, names=window, probes=targets)

        names = self.saved_names()
        facts, unreachable = gather(names)
        found = [facts[h]["hostname"] for h in self.hosts if h in facts]
        if not unreachable and found != names:  # no mesh yet, or hostnames changed since
            facts, unreachable = gather(found)
        with timeline.step("judge", len(self.hosts)):
            try:
                self.nodes = mesh.nodes_from_facts(facts)
            except KilnError as error:
                raise KilnError(f"preflight: {error}") from None
            findings = preflight.check_nodes(self.nodes, ports=ports,
                                             required=tuple(required) if frameworks else (),
                                             compare_versions=frameworks)
            findings += preflight.check_probes(self.nodes)
        checks = preflight.CHECKS if probes else tuple(check for check in preflight.CHECKS if check != "mesh")
        summary = []
        if fabric and (judged := preflight.check_fabric(self.nodes))[1]:
            findings += judged[0]
            checks, summary = (*checks, "fabric"), [judged[1]]
        if gpu_framework is not None:
            reports, lost = self.gpu_reports(framework=gpu_framework, deep=deep)
            unreachable.update({h: r for h, r in lost.items() if h not in unreachable})
            findings += [preflight.Finding(label, "gpu", problem)
                         for label, problems in health.judge_cluster(reports).items() for problem in problems]
            checks, summary = (*checks, "gpu"), [*summary, "", *(health.summary(report) for report in reports)]
        labels = [h.label for h in self.hosts]
        table = preflight.format_table(labels, findings, {h.label: r for h, r in unreachable.items()}, checks)
        return "\n".join([table, *summary]), not findings and not unreachable

    def gpu_reports(self, *, framework: str = "auto", timeout: float = 600,
                    deep: bool = False) -> tuple[list[health.NodeReport], dict[Host, str]]:
        """Every node's GPU facts, and where it has GPUs its probe's figures (kiln.gpu.probe with the nodes'
        Python and framework), an all-reduce over its GPUs where it has several (kiln.gpu.allreduce), and with
        `deep` DCGM's diagnostics; (reports in host order, unreachable reasons)."""
        argv = probe.remote_argv(self.python, framework)

        def gather(host: Host) -> health.NodeReport:
            found = gpufacts.host_facts(self.remote.check(host, gpufacts.gather_command(self.python),
                                                          timeout=120))
            if not found["gpus"]:
                return health.NodeReport(host.label, found)
            result = self.remote.run(host, argv, timeout=timeout)
            measured = probe.read_result(result.code, result.stdout, result.stderr)
            reduced = None
            if len(found["gpus"]) > 1:  # an all-reduce over the node's own GPUs: NVLink or PCIe as they are
                size = collective.max_bytes([gpu["memory_mib"].get("total") for gpu in found["gpus"]])
                done = self.remote.run(host, allreduce.remote_argv(self.python, len(found["gpus"]), size),
                                       timeout=timeout)
                reduced = probe.read_result(done.code, done.stdout, done.stderr)
            diagnosed = None
            if deep:
                done = self.remote.run(host, ["sh", "-c", dcgm.COMMAND], timeout=timeout)
                diagnosed = done.stdout + done.stderr
            return health.NodeReport(host.label, found, measured, reduced, diagnosed)

        reports, unreachable = self.remote.map(self.hosts, gather)
        return [reports[h] for h in self.hosts if h in reports], unreachable

    def allreduce_across(self, paths: launch.NodePaths, nic: str, *, max_bytes: int, min_bytes: int,
                         timeout: float = 300, env: dict[str, str] | None = None
                         ) -> tuple[dict, dict[tuple[int, int], dict]]:
        """An all-reduce across every node at once (one rank per GPU, one per node without), then one across
        each ring pair of nodes (kiln.gpu.collective.ring_pairs), the pairs of a round side by side, each rank
        with `env` (the fabric's): the probes' JSON, (all, {pair: result})."""
        names = [node.name for node in self.nodes]
        slots = topology.resolve_slots("horovod", [None] * len(names), mesh.gpu_counts(self.nodes))
        tag = os.urandom(4).hex()

        def measure(members: Sequence[int], label: str) -> dict:
            command = launch.allreduce_command(self.python, paths, [names[i] for i in members],
                                               [slots[i] for i in members], nic, tag=f"{tag}-{label}",
                                               max_bytes=max_bytes, min_bytes=min_bytes, timeout=timeout,
                                               env=env)
            done = self.remote.run(self.hosts[members[0]], ["sh", "-c", command], timeout=timeout + 30)
            return collective.read_horovod_output(done.stdout + "\n" + done.stderr)

        everyone = measure(range(len(names)), "all")
        pairs = collective.ring_pairs(len(names)) if len(names) > 2 else []  # two nodes: the pair is everyone
        results = {}
        for round_ in collective.pair_rounds(pairs):
            first = {self.hosts[a]: (a, b) for a, b in round_}
            found = self.remote.map_or_raise("all-reduce", list(first), lambda host, first=first: measure(
                first[host], "pair{}-{}".format(*first[host])))
            results.update({first[host]: result for host, result in found.items()})
        return everyone, results

    def reserve_ports(self, run_id: str, root: str, ports: Sequence[int],
                      hosts: Sequence[Host] | None = None) -> dict[str, dict[str, str]]:
        """Reserve `ports` for the run on `hosts` (default: every node; bootstrap/node.py reserve: all or none
        per node, another live run's reservation holds); the conflicts, by node: {node: {port: other run}}.
        Reserving again refreshes the run's own."""
        if not ports:
            return {}
        found = self.remote.map_or_raise("reserve ports", list(self.hosts if hosts is None else hosts),
                                         lambda host: self.remote.node(
            host, self.python, "reserve", run_id, root, *map(str, ports)))
        return {host.label: answer["conflicts"] for host, answer in found.items() if answer["conflicts"]}

    def release_ports(self, run_id: str, root: str, hosts: Sequence[Host] | None = None) -> None:
        """Drop the run's port reservations on `hosts` (default: every node) that still answer."""
        self.remote.map(list(self.hosts if hosts is None else hosts),
                        lambda host: self.remote.node(host, self.python, "release", run_id, root))

    def sync(self, source: str, destination: str) -> None:
        """Mirror a project folder to the same path on every node, leaving out what its .kilnignore (else its
        .gitignore files) and kiln's fixed list leave out. A sync that lasts shows each node's bytes (a bar each on
        a terminal, else a line every 30 s) and how long it took."""
        filters = commands.ignore_filters((Path(source) / ".kilnignore").is_file())
        started = time.monotonic()
        with progress.Report(f"syncing {source}", [host.label for host in self.hosts], quiet_s=SYNC_QUIET_S) as report:

            def push(host: Host) -> None:
                argv = commands.rsync_push_argv(source, host, destination, self.remote.options, filters=filters)
                self.remote.rsync(host, commands.with_progress(argv),
                                  progress=lambda done, total: report.update(host.label, done, total))

            self.remote.map_or_raise("sync", self.hosts, push)
        if report.shown:
            size = max((total for _, total in report.counts.values()), default=0)
            print(f"synced {source} ({progress.filesize.decimal(size)}) to {len(self.hosts)} node(s) in "
                  f"{time.monotonic() - started:.1f} s", flush=True)

    def sync_lib(self, destination: str) -> None:
        """Put kiln's own node-side part (the reference trainer, the shims, node.py for the interruption watcher)
        in `destination` on every node."""
        trainer = importlib.util.find_spec("trainer")  # found, not imported: importing it sets TensorFlow's env
        here = Path(__file__).parent
        folders = [*trainer.submodule_search_locations, str(here / "shim"), str(here / "node.py"), allreduce.__file__]

        def push(host: Host) -> None:
            self.remote.rsync(host, commands.rsync_push_folders_argv(folders, host, destination,
                                                                     self.remote.options))

        self.remote.map_or_raise("sync", self.hosts, push)

    def sync_run(self, lib: str, project: str | None = None, code: str = "") -> None:
        """kiln's node part (sync_lib) into `lib` and, given a `project` folder, the project (sync) into `code` on
        every node, the two side by side (each into its own folder, under its own lock)."""
        with ThreadPoolExecutor(2) as pool:
            pushes = [pool.submit(self.sync_lib, lib), *([pool.submit(self.sync, project, code)] if project else [])]
        errors = [error for push in pushes if (error := push.exception())]
        if errors and all(isinstance(error, RemoteError) for error in errors):
            raise RemoteError("sync", {host: reason for error in errors for host, reason in error.failures.items()})
        if errors:
            raise errors[0]

    def autostop(self, args: Sequence[str], hosts: Sequence[Host] | None = None) -> dict[Host, dict]:
        """Start (or, with idle 0, stop) every node's idle agent (bootstrap.autostop); its pid per host."""
        return self.remote.map_or_raise("autostop", hosts or self.hosts,
                                        lambda h: self.remote.node(h, self.python, "autostop", *args))

    def check_program(self, command: str | None) -> None:
        """Run the program check (launch.program_check) on every node; name each node where it failed."""
        if command is None:
            return
        results = self.remote.map_or_raise("program check", self.hosts, lambda h: self.remote.run(h, command))
        missing = {h.label: r.stdout.strip() or r.stderr.strip() for h, r in results.items() if r.code != 0}
        if missing:
            raise KilnError("the program cannot start: " + "; ".join(f"{host}: {why}" for host, why in
                                                                     sorted(missing.items()))
                            + "; nothing was started")

    def home(self, host: Host) -> str:
        for node in self.nodes:
            if node.host == host:
                return node.facts["home"]
        raise KilnError(f"no facts for {host.label}")

    def remote_root(self, host: Host) -> str:
        return f"{self.home(host)}/{REMOTE_ROOT}"
