"""Build local signed apt repositories of NVIDIA *stand-in* packages, for exercising kiln's NVIDIA roles here
(and, beside them, the GPU fabric's stand-in downloads: bake/standin_fabric.py).

usage: nvidia-standin-repo build OUTDIR [--force]

NVIDIA's repositories are out of reach on this machine, so the nvidia_driver, cuda and container_runtime roles
run against two tiny local repositories laid out like the real ones (flat repositories, `Suites: /`):

  OUTDIR/repo/cuda/debian12/x86_64/                   like developer.download.nvidia.com/compute/cuda/repos/...
  OUTDIR/repo/libnvidia-container/stable/deb/amd64/   like nvidia.github.io/libnvidia-container/stable/deb/...

Each holds packages under the real Debian 12 names at the versions of ansible/group_vars/all/versions.yml (plus
a few newer decoy versions, so apt pins and exact versions are really needed), indexed with apt-ftparchive and
signed (InRelease, Release.gpg) with a throwaway key made at build time, whose armored public key lies next to
it (kiln-standin-*.pub). Every package says "kiln stand-in" in its Description; none ships nvidia-smi, so GPU
checks skip instead of passing on a fake. The real defaults of the roles (NVIDIA's URLs and key fingerprints)
never reach these: a caller serves OUTDIR/repo itself (python3 -m http.server -b 127.0.0.1 -d OUTDIR/repo) and
passes the URLs and the fingerprints printed here (also in OUTDIR/standin.json).

The output is cached: an unchanged input fingerprint (this module, bake/standin_files/, the version matrix) reuses
OUTDIR. Needs dpkg-deb, apt-ftparchive (apt-utils) and gpg.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bake import debs, standin_fabric
from bake.debs import Package, build_deb, make_key
from bake.matrix import MATRIX, read_matrix
from kiln.errors import UsageError, run_main

DATA = Path(__file__).resolve().parent / "standin_files"
CUDA_REPO = "cuda/debian12/x86_64"
TOOLKIT_REPO = "libnvidia-container/stable/deb/amd64"


def cuda_packages(m: dict[str, str]) -> list[Package]:
    """The CUDA repository: driver (nvidia_driver role) and toolkit, cuDNN, NCCL (cuda role), Debian 12 names."""
    drv = f"{m['nvidia_driver_version']}-1"
    newer_drv = f"{m['nvidia_driver_branch']}.999.01-1"  # decoy: same branch, newer, must lose to the pin
    major, minor, _ = m["cuda_version"].split(".")
    cuda_home = f"/usr/local/cuda-{major}.{minor}"
    cudnn = f"{m['cuda_cudnn_version']}-1"
    cudnn_major = m["cuda_cudnn_version"].split(".")[0]
    nccl = f"{m['cuda_nccl_version']}-1+cuda{m['cuda_nccl_cuda_version']}"
    version_json = json.dumps({"cuda": {"name": "CUDA SDK (kiln stand-in)", "version": m["cuda_version"]}},
                              indent=3)
    persistenced = {
        "usr/bin/nvidia-persistenced": ((DATA / "refuse").read_text(), 0o755),
        "lib/systemd/system/nvidia-persistenced.service": ((DATA / "nvidia-persistenced.service").read_text(),
                                                           0o644),
    }
    packages = [
        Package("libcuda1", drv, "NVIDIA CUDA driver library"),
        Package("libcuda1", newer_drv, "NVIDIA CUDA driver library (decoy newer version)"),
        Package("nvidia-driver-cuda", drv, "NVIDIA driver CUDA integration components",
                depends=f"libcuda1 (= {drv})"),
        Package("nvidia-driver-cuda", newer_drv, "NVIDIA driver CUDA components (decoy newer version)",
                depends=f"libcuda1 (= {newer_drv})"),
        Package("nvidia-kernel-open-dkms", drv, "NVIDIA open kernel module DKMS source",
                conflicts="nvidia-kernel-dkms", provides=f"nvidia-kernel-dkms-any (= {drv})"),
        Package("nvidia-kernel-dkms", drv, "NVIDIA proprietary kernel module DKMS source",
                conflicts="nvidia-kernel-open-dkms", provides=f"nvidia-kernel-dkms-any (= {drv})"),
        Package("nvidia-persistenced", drv, "NVIDIA Persistence Daemon", files=persistenced),
        Package(f"cuda-toolkit-{major}-{minor}", f"{m['cuda_version']}-1", f"CUDA Toolkit {major}.{minor}",
                files={f"{cuda_home[1:]}/version.json": (version_json + "\n", 0o644),
                       f"{cuda_home[1:]}/bin/README.kiln-standin": ("kiln stand-in: no nvcc here\n", 0o644),
                       f"{cuda_home[1:]}/lib64/README.kiln-standin": ("kiln stand-in: no libraries\n", 0o644)},
                postinst=f"update-alternatives --install /usr/local/cuda cuda {cuda_home} {major}{minor}",
                prerm=f'[ "$1" = upgrade ] || update-alternatives --remove cuda {cuda_home}'),
        Package(f"libcudnn{cudnn_major}-cuda-{major}", cudnn, "cuDNN runtime libraries"),
        Package(f"libcudnn{cudnn_major}-cuda-{major}", f"{cudnn_major}.99.0.1-1", "cuDNN runtime (decoy newer)"),
        Package(f"libcudnn{cudnn_major}-dev-cuda-{major}", cudnn, "cuDNN development headers",
                depends=f"libcudnn{cudnn_major}-cuda-{major} (= {cudnn})"),
        Package("libnccl2", nccl, "NVIDIA Collective Communication Library (NCCL) runtime"),
        Package("libnccl2", nccl.replace("-1+", "-2+"), "NCCL runtime (decoy newer)"),
        Package("libnccl-dev", nccl, "NCCL development files", depends=f"libnccl2 (= {nccl})"),
    ]
    dcgm_unit = {"lib/systemd/system/nvidia-dcgm.service": ((DATA / "nvidia-dcgm.service").read_text(), 0o644),
                 "usr/bin/nv-hostengine": ((DATA / "refuse").read_text(), 0o755)}
    for dcgm, what in ((f"1:{m['cuda_dcgm_version']}-1", ""), ("1:4.99.0-1", " (decoy newer)")):
        packages += [  # no dcgmi: a stand-in never answers a diagnostic (no GPU is behind it)
            Package("datacenter-gpu-manager-4-core", dcgm, f"NVIDIA DCGM core{what}", files=dcgm_unit),
            Package(f"datacenter-gpu-manager-4-cuda{major}", dcgm, f"NVIDIA DCGM for CUDA {major}{what}",
                    depends=f"datacenter-gpu-manager-4-core (= {dcgm})"),
        ]
    return packages


def toolkit_packages(m: dict[str, str]) -> list[Package]:
    """The NVIDIA container toolkit repository (container_runtime role), with its real dependency chain."""
    ver = f"{m['container_runtime_nvidia_toolkit_version']}-1"
    newer = f"{m['container_runtime_nvidia_toolkit_version']}-99"  # decoy, must lose to the exact versions
    ctk = (DATA / "nvidia_ctk.py").read_text().replace("@VERSION@", m["container_runtime_nvidia_toolkit_version"])
    base_files = {"usr/bin/nvidia-ctk": (ctk, 0o755),
                  "usr/bin/nvidia-container-runtime": ((DATA / "refuse").read_text(), 0o755)}
    packages = []
    for version in (ver, newer):
        packages += [
            Package("libnvidia-container1", version, "NVIDIA container runtime library"),
            Package("libnvidia-container-tools", version, "NVIDIA container runtime library (command-line tools)",
                    depends=f"libnvidia-container1 (>= {version})"),
            Package("nvidia-container-toolkit-base", version, "NVIDIA Container Toolkit Base (nvidia-ctk)",
                    depends="python3", files=base_files),
            Package("nvidia-container-toolkit", version, "NVIDIA Container toolkit",
                    depends=f"nvidia-container-toolkit-base (= {version}), "
                            f"libnvidia-container-tools (>= {version}), libnvidia-container-tools (<< 2.0.0)"),
        ]
    return packages


def index_and_sign(repo: Path, gnupg: Path, fingerprint: str, label: str, keyname: str) -> None:
    ftp = ["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=kiln stand-in",
           "-o", f"APT::FTPArchive::Release::Label={label} (kiln stand-in, not NVIDIA)",
           "-o", "APT::FTPArchive::Release::Architectures=amd64"]
    packages = subprocess.run([*ftp, "packages", "."], cwd=repo, check=True, capture_output=True).stdout
    (repo / "Packages").write_bytes(packages)
    subprocess.run(["gzip", "-9nkf", "Packages"], cwd=repo, check=True)
    release = subprocess.run([*ftp, "release", "."], cwd=repo, check=True, capture_output=True).stdout
    (repo / "Release").write_bytes(release)
    gpg = ["gpg", "--homedir", str(gnupg), "--batch", "--yes", "--local-user", fingerprint]
    subprocess.run([*gpg, "--clearsign", "-o", "InRelease", "Release"], cwd=repo, check=True)
    subprocess.run([*gpg, "--armor", "--detach-sign", "-o", "Release.gpg", "Release"], cwd=repo, check=True)
    exported = subprocess.run(["gpg", "--homedir", str(gnupg), "--armor", "--export", fingerprint],
                              check=True, capture_output=True).stdout
    (repo / keyname).write_bytes(exported)


def input_fingerprint() -> str:
    digest = hashlib.sha256()
    for module in (Path(__file__), Path(standin_fabric.__file__), Path(debs.__file__)):  # what builds the output
        digest.update(module.read_bytes())
    for path in sorted(DATA.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(MATRIX.read_bytes())
    return digest.hexdigest()[:16]


def build(outdir: Path, force: bool) -> dict:
    stamp = outdir / "standin.json"
    fingerprint = input_fingerprint()
    if stamp.exists() and not force:
        summary = json.loads(stamp.read_text())
        if summary.get("input_fingerprint") == fingerprint:
            return summary
    matrix = read_matrix()
    outdir.mkdir(parents=True, exist_ok=True)
    for stale in ("repo", "gnupg"):
        shutil.rmtree(outdir / stale, ignore_errors=True)
    gnupg = outdir / "gnupg"
    gnupg.mkdir(mode=0o700)
    summary = {"input_fingerprint": fingerprint, "root": str(outdir / "repo"), "repos": {}}
    specs = (("cuda", CUDA_REPO, cuda_packages(matrix), "CUDA repository"),
             ("toolkit", TOOLKIT_REPO, toolkit_packages(matrix), "libnvidia-container repository"))
    with tempfile.TemporaryDirectory() as scratch:
        for key, relpath, packages, label in specs:
            repo = outdir / "repo" / relpath
            repo.mkdir(parents=True)
            for package in packages:
                build_deb(package, repo, Path(scratch))
            key_fpr = make_key(gnupg, f"kiln stand-in {label} (throwaway) <{key}@standin.kiln.invalid>")
            keyname = f"kiln-standin-{key}.pub"
            index_and_sign(repo, gnupg, key_fpr, label, keyname)
            summary["repos"][key] = {"path": relpath, "key": f"{relpath}/{keyname}", "fingerprint": key_fpr,
                                     "packages": sorted({f"{p.name}={p.version}" for p in packages})}
        summary["efa"] = standin_fabric.build_efa_installer(outdir / "repo", gnupg, Path(scratch),
                                                            matrix["efa_installer_version"])
        summary["topology"] = standin_fabric.build_topology(outdir / "repo")
    subprocess.run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"], check=False)
    stamp.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def role_vars(summary: dict, base_url: str) -> dict:
    """The variables that point the nvidia_driver, container_runtime, efa and infiniband roles at the stand-ins
    served at base_url (the folder summary["root"] served over HTTP)."""
    cuda, toolkit = summary["repos"]["cuda"], summary["repos"]["toolkit"]
    base = base_url.rstrip("/")
    return {
        "nvidia_driver_repo_url": f"{base}/{cuda['path']}/",
        "nvidia_driver_repo_key_url": f"{base}/{cuda['key']}",
        "nvidia_driver_repo_key_fingerprint": cuda["fingerprint"],
        "container_runtime_nvidia_repo_url": f"{base}/{toolkit['path']}/",
        "container_runtime_nvidia_repo_key_url": f"{base}/{toolkit['key']}",
        "container_runtime_nvidia_repo_key_fingerprint": toolkit["fingerprint"],
        **standin_fabric.role_vars(summary, base),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/nvidia-standin-repo", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="build (or reuse) the stand-in repositories in OUTDIR")
    build_cmd.add_argument("outdir", type=Path)
    build_cmd.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")
    vars_cmd = commands.add_parser("vars", help="print (JSON) the role variables for OUTDIR's repositories "
                                   "served at BASE_URL")
    vars_cmd.add_argument("outdir", type=Path)
    vars_cmd.add_argument("base_url")
    args = parser.parse_args(argv)
    return run_main("nvidia-standin-repo", lambda: run(args))


def run(args: argparse.Namespace) -> None:
    if args.command == "vars":
        stamp = args.outdir / "standin.json"
        if not stamp.exists():
            raise UsageError(f"no stand-in repositories in {args.outdir} (run build first)")
        print(json.dumps(role_vars(json.loads(stamp.read_text()), args.base_url), indent=2))
        return
    missing = [tool for tool in ("dpkg-deb", "apt-ftparchive", "gpg") if not shutil.which(tool)]
    if missing:
        raise UsageError(f"{', '.join(missing)} missing (apt-get install dpkg-dev apt-utils gnupg)")
    summary = build(args.outdir.resolve(), args.force)
    print(f"root: {summary['root']}  (serve it: python3 -m http.server -b 127.0.0.1 -d {summary['root']})")
    for key, repo in summary["repos"].items():
        print(f"{key}: {repo['path']}/  key {repo['key']}  fingerprint {repo['fingerprint']}")


if __name__ == "__main__":
    sys.exit(main())
