"""The NVIDIA roles (nvidia_driver, cuda, container_runtime) and the GPU fabric's (efa, infiniband) for real:
ansible-playbook against a Debian 12 rootfs. The AWS image's set (NVIDIA's and efa) runs on one rootfs, infiniband
(Azure's RDMA sizes, with Debian's own rdma-core) on another.

NVIDIA's repositories are out of reach here, so scripts/nvidia-standin-repo builds signed local repositories of
stand-in packages under the real names and versions, served over HTTP on 127.0.0.1; the roles get their URLs and
throwaway key fingerprints as extra vars (their defaults stay NVIDIA's); beside them it builds a stand-in of AWS's
signed EFA installer tarball and of azhpc-images' topology files (bake/standin_fabric.py). The target is a
debootstrap minbase rootfs (cached in ~/.cache/kiln/rootfs/, keyed by its inputs) reached with the
community.general.chroot connection: each test's an overlay on that tree, unpacked once.
Debian packages the roles pull in (docker.io and its dependencies) are cached in ~/.cache/kiln/apt-archives/.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
PLAYBOOK_BIN = Path(sys.executable).with_name("ansible-playbook")
CACHE = Path(os.environ.get("KILN_CACHE", Path.home() / ".cache" / "kiln"))
MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
INCLUDE = ("python3", "python3-apt", "ca-certificates", "gpg", "systemd")  # what any real image has
MATRIX = dict(re.findall(r'^([a-z_]+):\s*"([^"]+)"', (ANSIBLE / "group_vars/all/versions.yml").read_text(), re.M))
DRIVER = f"{MATRIX['nvidia_driver_version']}-1"
TOOLKIT = f"{MATRIX['container_runtime_nvidia_toolkit_version']}-1"
CUDA_MAJOR, CUDA_MINOR, _ = MATRIX["cuda_version"].split(".")
NCCL = f"{MATRIX['cuda_nccl_version']}-1+cuda{MATRIX['cuda_nccl_cuda_version']}"
CUDNN = f"{MATRIX['cuda_cudnn_version']}-1"
EXPECTED = {  # package -> version, as the roles must leave them (Debian 12 names), all held
    "nvidia-driver-cuda": DRIVER,
    "nvidia-kernel-open-dkms": DRIVER,
    "nvidia-persistenced": DRIVER,
    "libcuda1": DRIVER,
    f"cuda-toolkit-{CUDA_MAJOR}-{CUDA_MINOR}": f"{MATRIX['cuda_version']}-1",
    f"libcudnn9-cuda-{CUDA_MAJOR}": CUDNN,
    f"libcudnn9-dev-cuda-{CUDA_MAJOR}": CUDNN,
    "libnccl2": NCCL,
    "libnccl-dev": NCCL,
    "nvidia-container-toolkit": TOOLKIT,
    "nvidia-container-toolkit-base": TOOLKIT,
    "libnvidia-container-tools": TOOLKIT,
    "libnvidia-container1": TOOLKIT,
    "datacenter-gpu-manager-4-core": f"1:{MATRIX['cuda_dcgm_version']}-1",
    f"datacenter-gpu-manager-4-cuda{CUDA_MAJOR}": f"1:{MATRIX['cuda_dcgm_version']}-1",
}
NOT_HELD = {"libcuda1"}  # a dependency, kept at the version by the pin and by nvidia-driver-cuda's "="
PLAYBOOK = """\
- name: NVIDIA roles against a rootfs
  hosts: all
  gather_facts: true
  roles:
    - role: nvidia_driver
    - role: cuda
    - role: container_runtime
      vars:
        container_runtime_nvidia: true
    - role: efa
"""
ONE_ROLE = """\
- name: One role against a rootfs
  hosts: all
  gather_facts: true
  roles:
    - role: {role}
"""
PREEXISTING = {"log-driver": "json-file", "log-opts": {"max-size": "10m"}, "exec-opts": ["native.umask=normal"]}


def missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "needs root (debootstrap, chroot)"
    for tool in ("debootstrap", "chroot", "dpkg-deb", "apt-ftparchive", "gpg"):
        if not shutil.which(tool):
            return f"needs {tool}"
    if not PLAYBOOK_BIN.exists():
        return f"needs {PLAYBOOK_BIN} (make setup)"
    return None


def rootfs_tarball() -> Path:
    """A minbase Debian 12 rootfs tarball, cached by its inputs; built with debootstrap when missing."""
    key = hashlib.sha256(repr((SUITE, "minbase", MIRROR, INCLUDE, "no-debs")).encode()).hexdigest()[:12]
    tarball = CACHE / "rootfs" / f"{SUITE}-minbase-{key}.tar"
    if tarball.exists():
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    build = tarball.parent / f".build-{os.getpid()}"
    try:
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE, str(build),
                        MIRROR], check=True, capture_output=True, timeout=900)
        for deb in (build / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(build), "--numeric-owner", "-cf", str(partial), "."], check=True)
        partial.rename(tarball)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return tarball


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def standin():
    """The stand-in repositories, built (cached) and served on 127.0.0.1 for this module."""
    reason = missing_prerequisite()
    if reason:
        pytest.skip(reason)
    outdir = CACHE / "nvidia-standin"
    subprocess.run([str(ROOT / "scripts" / "nvidia-standin-repo"), "build", str(outdir)], check=True,
                   capture_output=True, timeout=300)
    summary = json.loads((outdir / "standin.json").read_text())
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", summary["root"],
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{base}/{summary['repos']['cuda']['path']}/Release", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        standin_vars = subprocess.run([str(ROOT / "scripts" / "nvidia-standin-repo"), "vars", str(outdir), base],
                                      check=True, capture_output=True, text=True, timeout=60)
        yield {
            **json.loads(standin_vars.stdout),
            # The chroot runs on this machine's kernel, whose headers Debian does not package; the VM bake
            # installs linux-headers-$(uname -r) for real.
            "nvidia_driver_kernel_headers_packages": [],
            "efa_kernel_build_packages": [],
        }
    finally:
        server.terminate()
        server.wait(timeout=10)


def minbase_tree(tmp_path_factory) -> Path:
    """The cached rootfs tarball unpacked once for this session's process, never written after: each test's rootfs
    is an overlay on it (rootfs). Eight tests unpacking it each took 29 s of CPU, the kernel's file creation most."""
    tree = tmp_path_factory.getbasetemp() / "minbase-tree"
    if not tree.is_dir():
        partial = tree.with_name(f".minbase-tree-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        subprocess.run(["tar", "-C", str(partial), "--numeric-owner", "-xpf", str(rootfs_tarball())], check=True,
                       timeout=600)
        partial.rename(tree)
    return tree


@contextlib.contextmanager
def rootfs(tmp_path_factory, name: str):
    """A fresh rootfs: an overlay whose lower layer is the minbase tree (what the test writes lands in its own upper
    folder), with the apt archive cache carried in and out; unmounted and removed, always."""
    top = tmp_path_factory.mktemp(name)
    path, upper, work = top / "rootfs", top / "upper", top / "work"
    for folder in (path, upper, work):
        folder.mkdir()
    archives = CACHE / "apt-archives"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={minbase_tree(tmp_path_factory)},upperdir={upper},workdir={work}", str(path)],
                   check=True, timeout=60)
    try:
        # A chroot is no booted system: keep maintainer scripts from starting daemons (dockerd) on this machine.
        policy = path / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        shutil.copy("/etc/resolv.conf", path / "etc/resolv.conf")
        (path / "etc/docker").mkdir(parents=True)
        (path / "etc/docker/daemon.json").write_text(json.dumps(PREEXISTING, indent=2) + "\n")
        if archives.is_dir():
            for deb in archives.glob("*.deb"):
                shutil.copy(deb, path / "var/cache/apt/archives" / deb.name)
        yield path
    finally:
        archives.mkdir(parents=True, exist_ok=True)
        for deb in (path / "var/cache/apt/archives").glob("*.deb"):
            if not (archives / deb.name).exists():
                shutil.copy(deb, archives / deb.name)
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=60).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=60)  # busy: detached
        shutil.rmtree(top, ignore_errors=True)


def run_playbook(target: Path, text: str, extra: dict, workdir: Path) -> subprocess.CompletedProcess:
    playbook = workdir / "play.yml"
    playbook.write_text(text)
    extra_file = workdir / "vars.json"
    extra_file.write_text(json.dumps(extra))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    argv = [str(PLAYBOOK_BIN), "-i", f"{target},", "-c", "community.general.chroot", str(playbook),
            "-e", f"@{ANSIBLE / 'group_vars/all/versions.yml'}", "-e", f"@{extra_file}"]
    return subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=1200)


def recap(output: str) -> dict[str, int]:
    """The counters of the PLAY RECAP line of the one host."""
    section = output.rsplit("PLAY RECAP", 1)[-1]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", section)}


def chroot(target: Path, *argv: str) -> str:
    return subprocess.run(["chroot", str(target), *argv], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def converged(standin, tmp_path_factory):
    """Run the three roles twice on one fresh rootfs; yield the rootfs and both runs (with their times)."""
    workdir = tmp_path_factory.mktemp("play")
    with rootfs(tmp_path_factory, "gpu") as target:
        runs = []
        for _ in range(2):
            started = time.monotonic()
            done = run_playbook(target, PLAYBOOK, standin, workdir)
            runs.append((done, time.monotonic() - started))
            assert done.returncode == 0, f"ansible-playbook failed\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
        print(f"\nNVIDIA roles on a rootfs: first run {runs[0][1]:.1f} s, second run {runs[1][1]:.1f} s")
        yield target, runs, standin


EFA_RECORD = "opt/amazon/efa_installed_packages"


def test_the_efa_installer_ran_once_verified_and_left_no_download(converged):
    target, runs, _ = converged
    record = (target / EFA_RECORD).read_text().splitlines()
    assert record[0] == f"# EFA installer version: {MATRIX['efa_installer_version']}"
    installed = {line.split("_")[0] for line in record[3:]}
    assert {"libfabric1-aws", "libfabric-aws-bin", "libnccl-ofi", "openmpi50-aws", "efa-config", "efa",
            "libibverbs1", "ibverbs-providers"} <= installed, record
    assert "openmpi40-aws" not in installed, "--mpi=openmpi5 leaves Open MPI 4 out"
    listing = chroot(target, "dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n", "libnccl-ofi", "efa")
    assert all(line.split()[1] == "ii" for line in listing.splitlines()), listing
    listed = [line for line in (target / "etc/ld.so.conf.d/kiln-ofi-nccl.conf").read_text().splitlines()
              if line and not line.startswith("#")]
    assert listed == ["/opt/amazon/ofi-nccl/lib"], "the folder the plugin was found in"
    assert not (target / "var/tmp/kiln-efa-installer").exists(), "the installer's downloads stay in the image"
    assert not (target / "root/.gnupg").exists(), "checking the signature left a keyring in the image"
    ran = [re.search(r"TASK \[efa : Run the EFA installer\][^\n]*\n(\w+):", run.stdout).group(1) for run, _ in runs]
    assert ran == ["changed", "skipping"], "the installer runs once, and not again where its version is in place"


def test_the_stand_in_fi_info_finds_no_efa_device_here(converged):
    target, _, _ = converged
    done = subprocess.run(["chroot", str(target), "/opt/amazon/efa/bin/fi_info", "-p", "efa"], capture_output=True,
                          text=True)
    assert done.returncode != 0 and "No data available" in done.stderr


def test_an_installer_not_signed_by_the_pinned_key_installs_nothing(standin, tmp_path_factory):
    wrong = "0123456789ABCDEF0123456789ABCDEF01234567"
    workdir = tmp_path_factory.mktemp("efa-wrongkey")
    with rootfs(tmp_path_factory, "efa-wrongkey") as target:
        done = run_playbook(target, ONE_ROLE.format(role="efa"), {**standin, "efa_installer_key_fingerprint": wrong},
                            workdir)
        assert done.returncode != 0
        assert "EFA installer signature check failed" in done.stdout and wrong in done.stdout, done.stdout[-4000:]
        assert standin["efa_installer_key_fingerprint"] in done.stdout  # names the key that did sign it
        assert not (target / "opt/amazon").exists()
        assert not (target / "var/tmp/kiln-efa-installer").exists()


@pytest.fixture(scope="module")
def infiniband(standin, tmp_path_factory):
    """The infiniband role twice on a fresh rootfs (Debian's real rdma-core); yields the rootfs and both runs."""
    workdir = tmp_path_factory.mktemp("play-ib")
    with rootfs(tmp_path_factory, "ib") as target:
        runs = [run_playbook(target, ONE_ROLE.format(role="infiniband"), standin, workdir) for _ in range(2)]
        for done in runs:
            assert done.returncode == 0, f"ansible-playbook failed\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
        yield target, runs, standin


def test_infiniband_brings_rdma_core_limits_modules_and_the_topology_files(infiniband):
    target, runs, standin = infiniband
    listing = chroot(target, "dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n", "rdma-core",
                     "ibverbs-providers", "ibverbs-utils", "infiniband-diags", "perftest")
    assert [line.split()[1] for line in listing.splitlines()] == ["ii"] * 5, listing
    shown = subprocess.run(["chroot", str(target), "ibv_devinfo"], capture_output=True, text=True)
    # The real ibv_devinfo, which finds no HCA in a chroot (no sysfs: "Failed to get IB devices list").
    assert shown.returncode != 0 and "IB devices" in shown.stdout + shown.stderr, shown
    modules = (target / "etc/modules-load.d/kiln-infiniband.conf").read_text().split()
    assert {"ib_uverbs", "ib_umad", "rdma_ucm"} <= set(modules)
    assert "nvidia-peermem" not in modules, "it loads only on an out-of-tree OFED's ib_core: boots would fail"
    assert "DefaultLimitMEMLOCK=infinity" in (target / "etc/systemd/system.conf.d/kiln-rdma.conf").read_text()
    for entry in standin["infiniband_topology_files"]:
        placed = target / "opt/microsoft" / entry["name"]
        assert hashlib.sha256(placed.read_bytes()).hexdigest() == entry["sha256"]
    assert recap(runs[0].stdout)["changed"] > 0
    assert recap(runs[1].stdout)["changed"] == 0, runs[1].stdout[-6000:]


def test_a_topology_file_that_is_not_the_pinned_one_stops_the_play(standin, tmp_path_factory):
    files = [{**entry, "sha256": "0" * 64} for entry in standin["infiniband_topology_files"]]
    workdir = tmp_path_factory.mktemp("ib-wrongsum")
    with rootfs(tmp_path_factory, "ib-wrongsum") as target:
        done = run_playbook(target, ONE_ROLE.format(role="infiniband"),
                            {**standin, "infiniband_topology_files": files}, workdir)
        assert done.returncode != 0 and "checksum" in done.stdout.lower(), done.stdout[-4000:]
        assert not list((target / "opt/microsoft").glob("*.xml"))


def test_packages_are_installed_at_the_matrix_versions_and_held(converged):
    target, _, _ = converged
    listing = chroot(target, "dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\n", *EXPECTED)
    found = {line.split()[0]: line.split()[1:] for line in listing.splitlines()}
    for package, version in EXPECTED.items():
        assert package in found, f"{package} is not installed"
        got_version, want, _, status = found[package]
        assert got_version == version, f"{package} is {got_version}, the matrix says {version}"
        assert status == "installed", f"{package}: {found[package]}"
        if package not in NOT_HELD:
            assert want == "hold", f"{package} is not held ({want})"


def test_the_pin_beats_newer_driver_versions(converged):
    target, _, _ = converged
    pref = (target / "etc/apt/preferences.d/kiln-nvidia-driver.pref").read_text()
    assert f"Pin: version {MATRIX['nvidia_driver_version']}-*" in pref
    policy = chroot(target, "apt-cache", "policy", "libcuda1")
    candidate = re.search(r"Candidate: (\S+)", policy).group(1)
    assert candidate == DRIVER, f"the stand-in repo has a newer libcuda1 decoy, yet the candidate is\n{policy}"
    policy = chroot(target, "apt-cache", "policy", "nvidia-container-toolkit")  # named like the pin, other versions
    candidate = re.search(r"Candidate: (\S+)", policy).group(1)
    assert candidate == f"{MATRIX['container_runtime_nvidia_toolkit_version']}-99", policy  # the newest: unpinned


def test_keyrings_hold_the_pinned_fingerprints(converged):
    target, _, standin = converged
    for keyring, fingerprint in (("kiln-cuda.asc", standin["nvidia_driver_repo_key_fingerprint"]),
                                 ("kiln-nvidia-container-toolkit.asc",
                                  standin["container_runtime_nvidia_repo_key_fingerprint"])):
        shown = subprocess.run(["gpg", "--batch", "--with-colons", "--show-keys", str(target / "etc/apt/keyrings" /
                                keyring)], check=True, capture_output=True, text=True).stdout
        assert f"fpr:::::::::{fingerprint}:" in shown
        sources = (target / "etc/apt/sources.list.d" / keyring.replace(".asc", ".sources")).read_text()
        assert f"Signed-By: /etc/apt/keyrings/{keyring}" in sources


def test_daemon_json_gains_the_nvidia_runtime_and_keeps_its_keys(converged):
    target, _, _ = converged
    config = json.loads((target / "etc/docker/daemon.json").read_text())
    assert config["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}
    assert config["exec-opts"] == ["native.umask=normal", "native.cgroupdriver=cgroupfs"], (
        "Docker's cgroup driver is not cgroupfs (nvidia-container-toolkit#48), or an exec-opt was lost")
    for key, value in PREEXISTING.items():
        if key != "exec-opts":
            assert config[key] == value


def test_cuda_paths_services_and_no_fake_nvidia_smi(converged):
    target, _, _ = converged
    home = f"/usr/local/cuda-{CUDA_MAJOR}.{CUDA_MINOR}"
    assert f"{home}/bin" in (target / "etc/profile.d/cuda.sh").read_text()
    assert (target / "etc/ld.so.conf.d/kiln-cuda.conf").read_text().splitlines()[-1] == f"{home}/lib64"
    wants = target / "etc/systemd/system/multi-user.target.wants"
    assert (wants / "nvidia-persistenced.service").is_symlink()
    assert (wants / "nvidia-dcgm.service").is_symlink()
    assert (wants / "docker.service").is_symlink()
    assert not list(target.glob("usr/bin/nvidia-smi*")), "a stand-in must never ship nvidia-smi"
    assert not (target / "usr/bin/dcgmi").exists(), "a stand-in must never answer a diagnostic"


def test_second_run_changes_nothing(converged):
    _, runs, _ = converged
    first, second = recap(runs[0][0].stdout), recap(runs[1][0].stdout)
    assert first["changed"] > 0 and first["failed"] == 0
    assert second["changed"] == 0, f"second run changed {second['changed']} things\n{runs[1][0].stdout[-6000:]}"


@pytest.mark.parametrize(("role", "variable", "keyring"), [
    ("nvidia_driver", "nvidia_driver_repo_key_fingerprint", "kiln-cuda"),
    ("container_runtime", "container_runtime_nvidia_repo_key_fingerprint", "kiln-nvidia-container-toolkit"),
])
def test_wrong_pinned_fingerprint_stops_the_play(standin, tmp_path_factory, role, variable, keyring):
    wrong = "0123456789ABCDEF0123456789ABCDEF01234567"
    workdir = tmp_path_factory.mktemp("wrongkey")
    play = ONE_ROLE.format(role=role)
    with rootfs(tmp_path_factory, "wrongkey") as target:
        done = run_playbook(target, play, {**standin, variable: wrong, "container_runtime_nvidia": True}, workdir)
        assert done.returncode != 0
        assert "fingerprint mismatch" in done.stdout and wrong in done.stdout, done.stdout[-4000:]
        assert standin[variable] in done.stdout  # names the key it found
        assert not (target / f"etc/apt/keyrings/{keyring}.asc").exists()
        assert not (target / f"etc/apt/sources.list.d/{keyring}.sources").exists()


def test_proprietary_modules_replace_the_open_ones(standin, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("proprietary")
    play = ONE_ROLE.format(role="nvidia_driver")
    with rootfs(tmp_path_factory, "proprietary") as target:
        for modules in ("open", "proprietary"):
            done = run_playbook(target, play, {**standin, "nvidia_driver_kernel_modules": modules}, workdir)
            assert done.returncode == 0, done.stdout[-6000:]
        listing = chroot(target, "dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n",
                         "nvidia-kernel-*")
        installed = {line.split()[0]: line.split()[1:] for line in listing.splitlines() if line.split()[-1][1] == "i"}
        assert installed == {"nvidia-kernel-dkms": [DRIVER, "hi"]}, listing  # held, installed; open one gone
