"""Stand-ins for the GPU fabric's downloads, beside the NVIDIA stand-in repositories (bake/standin.py):

  OUTDIR/repo/efa/        like https://efa-installer.amazonaws.com/: aws-efa-installer-VERSION.tar.gz, its detached
                          signature (.sig) and the signing key (aws-efa-installer.key), a throwaway one made here
  OUTDIR/repo/topology/   like azhpc-images' topology/ folder: ndv4-topo.xml, ndv5-topo.xml (stand-in content)

The tarball is laid out as AWS's is (aws-efa-installer/ with efa_installer.sh, env.sh and DEBS/<DISTRO>/<arch>/
holding the packages, rdma-core/ and efa-driver/ below it); its installer is a stand-in taking the real one's
options and writing the real record of what it installed (/opt/amazon/efa_installed_packages). The packages carry
the real names; none holds a library or a kernel module (the plugin's file lies where the real one does, but holds
no code), and the stand-in fi_info finds no EFA device, as the real one finds none on a machine without one. The
efa and infiniband roles reach these only through the variables role_vars() prints; their defaults stay AWS's and
Azure's.
"""
from __future__ import annotations

import hashlib
import subprocess
import tarfile
from pathlib import Path

from bake.debs import Package, build_deb, make_key

DATA = Path(__file__).resolve().parent / "standin_files"
EFA_DIR = "efa"
TOPOLOGY_DIR = "topology"
TOPOLOGY_FILES = ("ndv4-topo.xml", "ndv5-topo.xml")
DIST = "DEBIAN12"
# The stand-in packages' versions: the installer's own version says which release of the stack this is.
LIBFABRIC = "2.1.0amzn5.0"
RDMA_CORE = "58.0-1"


def efa_packages() -> dict[str, list[Package]]:
    """The installer's packages by the folder they lie in under DEBS/DEBIAN12/x86_64 ("" is the folder itself)."""
    fi_info = (DATA / "fi_info").read_text().replace("@VERSION@", LIBFABRIC)
    return {
        "": [
            Package("libfabric1-aws", LIBFABRIC, "libfabric with its EFA provider (AWS build)",
                    files={"opt/amazon/efa/lib/README.kiln-standin": ("kiln stand-in: no libfabric here\n", 0o644)}),
            Package("libfabric-aws-bin", LIBFABRIC, "libfabric's tools (fi_info, fi_pingpong)",
                    depends=f"libfabric1-aws (= {LIBFABRIC})",
                    files={"opt/amazon/efa/bin/fi_info": (fi_info, 0o755)}),
            Package("libnccl-ofi", "1.16.3-1", "aws-ofi-nccl, NCCL's net plugin for libfabric",
                    depends=f"libfabric1-aws (>= {LIBFABRIC})",
                    # named as the real plugin (installer 1.44.0 on), so the role finds it; not a library
                    files={"opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so": ("kiln stand-in: no plugin here\n", 0o644)}),
            Package("openmpi40-aws", "4.1.7-2", "Open MPI 4.1 (AWS build)",
                    files={"opt/amazon/openmpi/README.kiln-standin": ("kiln stand-in: no MPI here\n", 0o644)}),
            Package("openmpi50-aws", "5.0.8-11", "Open MPI 5 (AWS build)",
                    files={"opt/amazon/openmpi5/README.kiln-standin": ("kiln stand-in: no MPI here\n", 0o644)}),
            Package("efa-config", "1.18-1", "EFA's system settings (locked-memory limits)",
                    files={"etc/security/limits.d/efa.conf": ("*    soft    memlock    unlimited\n"
                                                              "*    hard    memlock    unlimited\n", 0o644)}),
            Package("efa-profile", "1.7-1", "EFA's shell profile (PATH, ld.so.conf)",
                    files={"etc/profile.d/zippy_efa.sh": ('PATH="/opt/amazon/efa/bin:$PATH"\n', 0o644),
                           "etc/ld.so.conf.d/efa.conf": ("/opt/amazon/efa/lib\n", 0o644)}),
        ],
        "rdma-core": [
            Package("libibverbs1", RDMA_CORE, "rdma-core's verbs library"),
            Package("ibverbs-providers", RDMA_CORE, "rdma-core's verbs providers (efa, mlx5)",
                    depends=f"libibverbs1 (= {RDMA_CORE})"),
            Package("ibverbs-utils", RDMA_CORE, "rdma-core's verbs tools (ibv_devinfo)",
                    depends=f"libibverbs1 (= {RDMA_CORE})"),
            Package("librdmacm1", RDMA_CORE, "rdma-core's connection manager library"),
            Package("rdma-core", RDMA_CORE, "rdma-core's system settings"),
        ],
        "efa-driver": [
            Package("efa", "2.17.1-1", "the EFA kernel module (DKMS source)",
                    files={"usr/src/efa-2.17.1/dkms.conf": ("# kiln stand-in: no module source here\n", 0o644)}),
        ],
    }


def build_efa_installer(repo: Path, gnupg: Path, scratch: Path, version: str) -> dict:
    """The signed installer tarball in repo/efa; returns where it lies and its key's fingerprint."""
    top = scratch / "efa" / "aws-efa-installer"
    base = top / "DEBS" / DIST / "x86_64"
    for folder, packages in efa_packages().items():
        (base / folder).mkdir(parents=True, exist_ok=True)
        for package in packages:
            build_deb(package, base / folder, scratch / "efa-build")
    (base / "debug").mkdir()
    (top / "env.sh").write_text(f"EFA_INSTALLER_VERSION={version}\n")
    installer = top / "efa_installer.sh"
    installer.write_text((DATA / "efa_installer.sh").read_text())
    installer.chmod(0o755)
    (top / "README.kiln-standin").write_text("kiln stand-in for AWS's EFA installer: not AWS's software.\n")
    out = repo / EFA_DIR
    out.mkdir(parents=True)
    tarball = out / f"aws-efa-installer-{version}.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(top, arcname="aws-efa-installer", filter=lambda info: _owned_by_root(info))
    fingerprint = make_key(gnupg, "kiln stand-in EFA installer (throwaway) <efa@standin.kiln.invalid>")
    subprocess.run(["gpg", "--homedir", str(gnupg), "--batch", "--yes", "--local-user", fingerprint,
                    "--detach-sign", "-o", str(tarball) + ".sig", str(tarball)], check=True, capture_output=True)
    key = subprocess.run(["gpg", "--homedir", str(gnupg), "--armor", "--export", fingerprint],
                         check=True, capture_output=True).stdout
    (out / "aws-efa-installer.key").write_bytes(key)
    return {"path": EFA_DIR, "version": version, "fingerprint": fingerprint}


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def build_topology(repo: Path) -> dict:
    """Stand-in NCCL topology files (valid XML naming no device) and their SHA-256s."""
    out = repo / TOPOLOGY_DIR
    out.mkdir(parents=True)
    files = []
    for name in TOPOLOGY_FILES:
        content = f'<!-- kiln stand-in for azhpc-images\' {name}: no devices -->\n<system version="1">\n</system>\n'
        (out / name).write_text(content)
        files.append({"name": name, "sha256": hashlib.sha256(content.encode()).hexdigest()})
    return {"path": TOPOLOGY_DIR, "files": files}


def role_vars(summary: dict, base: str) -> dict:
    """The variables that point the efa and infiniband roles at the stand-ins served at base."""
    efa, topology = summary["efa"], summary["topology"]
    return {
        "efa_installer_url": f"{base}/{efa['path']}",
        "efa_installer_key_fingerprint": efa["fingerprint"],
        "infiniband_topology_url": f"{base}/{topology['path']}",
        "infiniband_topology_files": topology["files"],
    }
