"""Fixtures that start real things: a local cluster of sshd nodes in network namespaces."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kiln.paths import cache_dir

ROOT = Path(__file__).resolve().parents[2]
FAB = Path(sys.executable).with_name("fab")
KILN = Path(sys.executable).with_name("kiln")
# Bake the container image in a fresh folder, with a fresh registry, whatever the cache keeps (as image-test does).
FRESH = bool(os.environ.get("KILN_IMAGE_TEST_FRESH"))
# The session's container image carries PyTorch and JAX beside TensorFlow (CPU builds, from the wheelhouse), so
# the container tests run every mode with --image; the matrix's default leaves them out (the frameworks role is
# the only difference).
CONTAINER_MATRIX = ROOT / "matrices" / "pytorch-jax.yml"


TESTS = Path(__file__).resolve().parents[1]
# Modules that share a session fixture (the container bake, made once per pytest-xdist worker; the image tests' VM,
# booted once under TCG) run in one worker.
SHARED_SESSION = {"tests/integration/test_containers.py": "container-bake",
                  "tests/integration/test_bake_docker.py": "container-bake",
                  "tests/image/test_bake_local.py": "baked-vm", "tests/image/test_local_vm.py": "baked-vm"}
# The longest modules first (their time in a whole run, most first), so the workers end together; then the rest in
# the order found. make test runs the local bake's tests (tests/image, about 1000 s with the image kept, 2500 s and
# more baking it) in the same pool, first: one worker boots and provisions the VM while the other runs clusters.
# test_queue early: most of its minutes are Slurm's timers, a worker waiting while the others use both cores
# A worker is handed its next module while its last two tests run (xdist's loadscope), so a long module must not be
# next when the container modules' worker asks (its last two tests take minutes): test_nvidia_roles, once after
# test_aws and test_trainer_resume, went to that worker and ran last, 35 s past the others.
LONGEST_FIRST = ("image/test_bake_local.py", "image/test_local_vm.py", "integration/test_bake_docker.py",
                 "integration/test_queue.py",
                 "integration/test_containers.py", "integration/test_managed.py", "integration/test_launcher.py",
                 "integration/test_nvidia_roles.py", "integration/test_user_programs.py",
                 "integration/test_trainer_resume.py", "integration/test_aws.py", "integration/test_image_rootfs.py",
                 "integration/test_gcp.py", "integration/test_watchdog.py", "integration/test_local_docker.py",
                 "integration/test_trainer_local.py", "integration/test_frameworks.py")


# With KILN_TEST_SHUFFLE=SEED (make suites gives its SHUFFLE_SEED), each module's tests run in an order drawn from
# the seed, and so do the modules LONGEST_FIRST does not place (all of them with no pool): a test that passes only
# after another fails there. The header gives the seed, which gives the same order again. A module whose tests must
# run as written says why with the in_written_order marker; a test that ends what the module's tests share (powers
# off their VM, replaces a node of their cluster) says so with after_the_rest: such tests run after the module's
# others, in the order written.
SHUFFLE = os.environ.get("KILN_TEST_SHUFFLE", "")


def pytest_report_header(config):
    if SHUFFLE:
        return f"kiln: tests shuffled with KILN_TEST_SHUFFLE={SHUFFLE} (run again with it for the same order)"
    return None


def tests_path(item) -> str:
    return item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else str(item.path)


def pytest_collection_modifyitems(items):
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    modules: dict[str, list] = {}
    for item in items:  # a module's tests stay together, whatever the order
        modules.setdefault(tests_path(item), []).append(item)
    order = sorted(modules, key=lambda path: rank.get(path, len(rank)))  # stable: the rest as found
    if SHUFFLE:
        pooled = bool(os.environ.get("PYTEST_XDIST_WORKER"))  # the pool hands out the LONGEST_FIRST modules first
        placed = [path for path in order if pooled and path in rank]
        rest = [path for path in order if path not in placed]
        random.Random(SHUFFLE).shuffle(rest)
        order = placed + rest
        for path in order:
            if not any(item.get_closest_marker("in_written_order") for item in modules[path]):
                modules[path] = shuffled(modules[path], f"{SHUFFLE}:{path}")
    items[:] = [item for path in order for item in modules[path]]


def shuffled(tests: list, seed: str) -> list:
    """A module's tests in an order drawn from the seed, those marked after_the_rest last, as written."""
    last = [item for item in tests if item.get_closest_marker("after_the_rest")]
    drawn = [item for item in tests if item not in last]
    random.Random(seed).shuffle(drawn)
    return drawn + last


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (make integration: -n), each module runs whole in one worker, its tests in order, beside
    the other modules: its fixtures (a cluster, a moto server) are made once, and no two workers make the same
    cluster. Modules sharing a session fixture (SHARED_SESSION) go to one worker together; modules are handed out
    in the collection's order (LONGEST_FIRST), not xdist's most-tests-first."""
    if config.getvalue("dist") not in ("load", "loadscope", "loadfile"):  # -n alone is load; another was asked for
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SHARED_SESSION.get(module, module)

    config.option.loadscopereorder = False
    return ByModule(config, log)


def needs_slurm(*tools: str) -> pytest.MarkDecorator:
    """Skips a module where Debian's Slurm and MUNGE (`tools`, by default the daemons and the client) are missing."""
    missing = [name for name in tools or ("slurmctld", "slurmd", "munged", "sbatch", "sinfo")
               if not shutil.which(name, path="/usr/sbin:/usr/bin")]
    return pytest.mark.skipif(bool(missing), reason=f"Slurm and MUNGE are not installed: {', '.join(missing)} "
                                                    "(scripts/setup installs them)")


def can_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if not shutil.which("ip") or not shutil.which("sshd", path="/usr/sbin:/usr/bin"):
        return "needs iproute2 and openssh-server"
    return None


@dataclass
class LocalCluster:
    name: str
    state: Path
    nodes: list[dict]
    kiln_home: Path
    runs: Path

    @property
    def ssh_config(self) -> str:
        return str(self.state / "ssh_config")

    @property
    def names(self) -> list[str]:
        return [node["name"] for node in self.nodes]

    def env(self) -> dict[str, str]:
        return {**os.environ, "KILN_HOME": str(self.kiln_home), "KILN_RUNS": str(self.runs)}

    def fab(self, *args: str, hosts: str | None = None, timeout: float = 300, check: bool = False):
        """Run `fab -S <cluster ssh config> -H <hosts> ARGS` from the repository root."""
        argv = [str(FAB), "-S", self.ssh_config, *(["-H", hosts] if hosts is not None else []), *args]
        done = subprocess.run(argv, cwd=ROOT, env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{argv} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def kiln(self, *args: str, cwd: Path, hosts: str | None = "node1,node2,node3", timeout: float = 300,
             check: bool = False, env: dict[str, str] | None = None):
        """Run `kiln -S <cluster ssh config> -H <hosts> ARGS` from a user's project folder (`env`: added)."""
        argv = [str(KILN), "-S", self.ssh_config, *(["-H", hosts] if hosts is not None else []), *args]
        done = subprocess.run(argv, cwd=cwd, env={**self.env(), **(env or {})}, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{argv} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def ssh(self, node: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Log in as the operator does (the cluster's own ssh config, host keys checked)."""
        return subprocess.run(["ssh", "-F", self.ssh_config, node, command], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def node_dir(self, node: str) -> Path:
        return self.state / node

    @contextlib.contextmanager
    def rekeyed(self, node: str) -> Iterator[None]:
        """`node` with new host keys (its sshd reads them at each connection): a changed machine; its own keys
        are back afterwards, so the tests after it find the machine the cluster pinned."""
        keys = self.node_dir(node) / "etc-ssh"
        kept = {key.name: (key.read_bytes(), key.stat().st_mode) for key in keys.glob("ssh_host_*_key*")}
        try:
            for name in kept:
                (keys / name).unlink()
            for kind in ("ed25519", "ecdsa"):
                subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(keys / f"ssh_host_{kind}_key")],
                               check=True, timeout=30)
            yield
        finally:
            for key in keys.glob("ssh_host_*_key*"):
                key.unlink()
            for name, (content, mode) in kept.items():  # made with its mode: sshd refuses a private key others read
                descriptor = os.open(keys / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & 0o777)
                with os.fdopen(descriptor, "wb") as out:
                    out.write(content)


@pytest.fixture(scope="session")
def container_registry(tmp_path_factory, container_images):
    """A real registry (Debian's docker-registry) on loopback for the session: its address. Beside a kept container
    bake its data is kept too (container-test/registry), so the kept image is not pushed again (some GB,
    compressed) every session, only checked there; it starts empty whenever the kept image is not the one it was
    started beside, so it holds the blobs of one bake, not of every bake."""
    from localcloud.registry import serving

    if FRESH:
        root = tmp_path_factory.mktemp("registry")
    else:
        root = container_images / "registry"
        kept = "\n".join(sorted(p.parent.name for p in container_images.glob("docker-cpu-*/image.json")))
        beside = root / "kept-image"
        if not beside.is_file() or beside.read_text() != kept:
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            beside.write_text(kept)
        for old in root.glob("config-*"):  # an earlier session's settings and log, by its port
            old.unlink()
    with serving(root) as address:
        yield address


@pytest.fixture(scope="session")
def container_images(tmp_path_factory) -> Path:
    """The container bake's images folder, kept in the cache as image-test keeps the local image: a run whose bake
    inputs (the fingerprint: roles, the matrix, the base image, the wheelhouse) are those of the image there uses
    that image, as `make image PROVIDER=docker` reuses an unchanged one; any change bakes again, for real.
    KILN_IMAGE_TEST_FRESH=1 bakes in a fresh folder whatever is kept."""
    if FRESH:
        return tmp_path_factory.mktemp("images")
    kept = cache_dir() / "container-test"
    kept.mkdir(parents=True, exist_ok=True)
    return kept


@pytest.fixture(scope="session")
def container_bake(container_images, container_registry):
    """`make image PROVIDER=docker REGISTRY=...` once for the session (its tests and the container runs share it):
    (its folder, image.json). One image is kept in the engine (some GB): those of other inputs leave it, and a
    fresh folder's leaves it afterwards; the session registry's tag always does."""
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        pytest.fail("no Docker engine answers on this machine (make setup starts one: scripts/docker-engine)")
    made = subprocess.run([sys.executable, "-m", "bake.image", "docker", "--registry", container_registry,
                           "--matrix", str(CONTAINER_MATRIX)],
                          capture_output=True, text=True, timeout=3600, cwd=ROOT,
                          env={**os.environ, "KILN_IMAGES": str(container_images)})
    assert made.returncode == 0, f"the container bake failed:\n{made.stdout[-8000:]}\n{made.stderr[-3000:]}"
    folder = Path(made.stdout.strip().splitlines()[-1].rsplit(": ", 1)[-1])
    assert (folder / "image.json").is_file(), f"bake.image named no image: {made.stdout[-2000:]}"
    for other in container_images.glob("docker-cpu-*/image.json"):  # baked from other inputs
        if other.parent != folder:
            subprocess.run(["docker", "rmi", json.loads(other.read_text()).get("image", "")], capture_output=True,
                           timeout=300)
            shutil.rmtree(other.parent, ignore_errors=True)
    record = json.loads((folder / "image.json").read_text())
    reused = "up to date" in made.stdout
    SAID.append(f"container bake: {'reused the image baked from these very inputs,' if reused else 'baked'} "
                f"{folder.name}{' (KILN_IMAGE_TEST_FRESH=1 bakes anyway)' if reused else ''}")
    yield folder, record
    pushed = record.get("pushed", "").split("@")[0]
    kept = [] if FRESH else [record["image"]]
    for name in (record["image"], *([f"{pushed}:cpu-{record['fingerprint']}"] if pushed else [])):
        if name not in kept:
            subprocess.run(["docker", "rmi", name], capture_output=True, timeout=300)


SAID: list[str] = []
CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting (this machine's); absent elsewhere
BEFORE = pytest.StashKey[int]()


class CpuByModule:
    """The CPU each test used, with everything it started (a cluster's sshd and what runs under it, node engines,
    a VM's qemu): the pytest process in a cpuacct cgroup of its own, which every process it starts inherits,
    daemons included. Where a suite's minutes go on a machine whose cores are all busy is CPU, not a module's
    seconds (they stretch with what runs beside them). Not counted: what other daemons start for a test (the
    host's Docker engine's containers)."""

    def __init__(self, group: Path):
        self.group = group

    @classmethod
    def start(cls) -> CpuByModule | None:
        if os.geteuid() != 0 or not (CPUACCT / "cpuacct.usage").is_file():
            return None
        group = CPUACCT / f"kiln-tests-{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return None
        return cls(group)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()  # where a process it started lingers, the group stays (and says what it used)

    def usage(self) -> int:
        return int((self.group / "cpuacct.usage").read_text())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        item.stash[BEFORE] = self.usage()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        if call.when == "teardown" and BEFORE in item.stash:
            outcome.get_result().user_properties.append(("cpu_s", (self.usage() - item.stash[BEFORE]) / 1e9))


CPU: list[CpuByModule] = []


def pytest_configure(config):
    if started := CpuByModule.start():
        CPU.append(started)
        config.pluginmanager.register(started, "kiln-cpu-by-module")


def pytest_unconfigure(config):
    for started in CPU:
        started.stop()


def module_seconds(reports) -> list[tuple[str, int, float, float]]:
    """Each test module's tests, seconds (setup, call and teardown together) and CPU seconds (CpuByModule; 0 where
    not measured), the longest first."""
    tests: dict[str, set[str]] = {}
    seconds: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for report in reports:
        module = report.nodeid.split("::", 1)[0]
        tests.setdefault(module, set()).add(report.nodeid)
        seconds[module] = seconds.get(module, 0.0) + getattr(report, "duration", 0.0)
        cpu[module] = cpu.get(module, 0.0) + sum(value for key, value in getattr(report, "user_properties", ())
                                                 if key == "cpu_s")
    return sorted(((module, len(tests[module]), seconds[module], cpu[module]) for module in tests),
                  key=lambda row: -row[2])


def costliest_tests(reports, top: int = 30) -> list[tuple[float, float, str]]:
    """The `top` tests that used the most CPU (CpuByModule; a module's fixtures count in the test that first
    needed them): (CPU seconds, seconds, test id), the costliest first; none where CPU was not measured."""
    cpu: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for report in reports:
        cpu[report.nodeid] = cpu.get(report.nodeid, 0.0) + sum(
            value for key, value in getattr(report, "user_properties", ()) if key == "cpu_s")
        seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + getattr(report, "duration", 0.0)
    return sorted(((used, seconds[test], test) for test, used in cpu.items() if used), reverse=True)[:top]


def module_spans(reports) -> dict[str, tuple[str, float, float]]:
    """Each module's worker (pytest-xdist's gw0, gw1, ...; "-" without a pool) and when its first test began and
    its last ended (epoch seconds): where the pool's workers spent the run, and how long one waited for the other."""
    spans: dict[str, tuple[str, float, float]] = {}
    for report in reports:
        if not getattr(report, "start", 0):
            continue
        module = report.nodeid.split("::", 1)[0]
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "-")
        _, began, ended = spans.get(module, (worker, report.start, report.stop))
        spans[module] = (worker, min(began, report.start), max(ended, report.stop))
    return spans


def pytest_terminal_summary(terminalreporter):
    for line in SAID:
        terminalreporter.write_line(line)
    reports = [r for found in terminalreporter.stats.values() for r in found  # a passing setup's is under ""
               if hasattr(r, "nodeid") and getattr(r, "when", None)]
    if rows := module_seconds(reports):
        spans = module_spans(reports)
        zero = min((began for _, began, _ in spans.values()), default=0.0)
        terminalreporter.write_sep("=", "each module's tests and seconds (setup, call, teardown), the longest first, "
                                        "the CPU seconds of all it started, its worker and its span from the first "
                                        "test's start")
        for module, count, seconds, cpu in rows:
            worker, began, ended = spans.get(module, ("-", zero, zero))
            span = f"{began - zero:6.0f}-{ended - zero:<6.0f}"
            terminalreporter.write_line(f"{seconds:8.1f}s {count:3d} {cpu:7.0f}cpu {worker:>4} {span} {module}")
        if measured := sum(row[3] for row in rows):
            terminalreporter.write_line(f"CPU seconds of all the modules: {measured:.0f}")
    if costliest := costliest_tests(reports):
        terminalreporter.write_sep("=", "the tests that used the most CPU (seconds of CPU, seconds)")
        for used, seconds, test in costliest:
            terminalreporter.write_line(f"{used:7.0f}cpu {seconds:7.1f}s {test}")


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: the controller prints what it said
        session.config.workeroutput["said-integration"] = SAID


def pytest_testnodedown(node, error):
    SAID.extend(getattr(node, "workeroutput", {}).get("said-integration", []))


def local_cluster_command(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcloud.cluster", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    """A fresh 3-node local cluster for one test module, always torn down."""
    reason = can_make_namespaces()
    if reason:
        pytest.skip(reason)
    name = getattr(request.module, "CLUSTER_NAME", "kt")
    local_cluster_command("down", "--name", name)
    try:
        up = local_cluster_command("up", "3", "--name", name)
        if up.returncode != 0:
            raise AssertionError(f"local-cluster up failed:\n{up.stdout}\n{up.stderr}")
        state = Path("/run/kiln/local") / name
        nodes = json.loads((state / "nodes.json").read_text())
        if isinstance(nodes, dict):
            nodes = nodes["nodes"]
        home = tmp_path_factory.mktemp("kiln-home")
        yield LocalCluster(name, state, nodes, home, tmp_path_factory.mktemp("runs"))
    finally:
        local_cluster_command("down", "--name", name)


def run_processes(run_id: str) -> list[int]:
    """Processes on this machine (every local node shares its PID space) tagged with the run id."""
    needle = f"KILN_RUN_ID={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle + b"\0" in (entry / "environ").read_bytes() + b"\0":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def processes(tmp_path):
    """Trainer processes started by a test, always killed afterwards (see test_trainer_local.Processes)."""
    from test_trainer_local import Processes

    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.kill_all()
