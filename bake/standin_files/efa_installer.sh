#!/bin/bash
# kiln stand-in for AWS's efa_installer.sh, NOT AWS's installer: the same options, the same layout beside it
# (env.sh, DEBS/<DISTRO>/<arch>/ with rdma-core/ and efa-driver/) and the same record of what it installed
# (/opt/amazon/efa_installed_packages); it installs the stand-in packages beside it, which hold no library.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")" || exit 1
# shellcheck source=/dev/null
. ./env.sh

usage() {
	cat <<USAGE
usage: $(basename "$0") [options]
 -y, --yes              Run installer without prompting for confirmation
 -n, --no-verify        Skip EFA device verification and test
 -k, --skip-kmod        Skip EFA kernel module installation
 -l, --skip-limit-conf  Skip EFA limit configuration
 -m, --minimal          Only install kernel module and rdma-core
 -g, --enable-gdr       Accepted for compatibility (GPUDirect support is always enabled)
 --mpi=openmpi4,openmpi5  The Open MPI versions to install (default both)
USAGE
}

YES=0 NO_VERIFY=0 SKIP_KMOD=0 SKIP_LIMITS=0 MINIMAL=0 MPI="openmpi4,openmpi5"
for arg in "$@"; do
	case "$arg" in
	-y | --yes) YES=1 ;;
	-n | --no-verify) NO_VERIFY=1 ;;
	-k | --skip-kmod) SKIP_KMOD=1 ;;
	-l | --skip-limit-conf) SKIP_LIMITS=1 ;;
	-m | --minimal) MINIMAL=1 ;;
	-g | --enable-gdr) ;;
	--mpi=*) MPI="${arg#--mpi=}" ;;
	-h | --help) usage; exit 0 ;;
	*) echo "Error: unknown option: $arg" >&2; usage >&2; exit 1 ;;
	esac
done
for mpi in ${MPI//,/ }; do
	case "$mpi" in openmpi4 | openmpi5) ;; *) echo "Error: unknown MPI: $mpi (openmpi4, openmpi5)" >&2; exit 1 ;; esac
done
if [ "$(id -u)" != 0 ]; then
	echo "Error: the EFA installer must be run as root" >&2
	exit 1
fi
# shellcheck source=/dev/null
. /etc/os-release
case "${ID}-${VERSION_ID}" in
debian-12) dist=DEBIAN12 ;;
ubuntu-22.04) dist=UBUNTU2204 ;;
ubuntu-24.04) dist=UBUNTU2404 ;;
*) echo "Unsupported operating system." >&2; exit 1 ;;
esac
base="DEBS/${dist}/$(uname -m)"
if [ ! -d "$base" ]; then
	echo "Error: package directory ${base} does not exist." >&2
	exit 1
fi
if [ "$YES" -ne 1 ]; then
	read -r -p "Install the EFA packages? [y/N] " answer || exit 1
	case "$answer" in y | Y) ;; *) exit 1 ;; esac
fi

packages=()
for deb in "$base"/*.deb "$base"/rdma-core/*.deb; do
	name="$(basename "$deb")"
	case "${name%%_*}" in
	efa-config) if [ "$SKIP_LIMITS" -eq 1 ]; then continue; fi ;;
	libfabric* | libnccl-ofi | efa-profile) if [ "$MINIMAL" -eq 1 ]; then continue; fi ;;
	openmpi40-aws) { [ "$MINIMAL" -eq 0 ] && [[ ",$MPI," == *,openmpi4,* ]]; } || continue ;;
	openmpi50-aws) { [ "$MINIMAL" -eq 0 ] && [[ ",$MPI," == *,openmpi5,* ]]; } || continue ;;
	esac
	packages+=("$PWD/$deb")
done
if [ "$SKIP_KMOD" -eq 0 ]; then
	packages+=("$PWD"/"$base"/efa-driver/*.deb)
fi
if ! apt-get install -y "${packages[@]}"; then
	echo "Error: Failed to install packages." >&2
	exit 1
fi
mkdir -p /opt/amazon
{
	echo "# EFA installer version: ${EFA_INSTALLER_VERSION}"
	echo "# Debug packages installed: no"
	echo "# Packages installed:"
	for package in "${packages[@]}"; do
		name="$(basename "$package")"
		echo "${name%.deb}"
	done
} >/opt/amazon/efa_installed_packages

if [ "$NO_VERIFY" -eq 0 ]; then
	if lspci -n 2>/dev/null | grep -q "1d0f:efa"; then
		/opt/amazon/efa/bin/fi_info -p efa -t FI_EP_RDM || { echo "Error: EFA device verification failed." >&2; exit 1; }
	else
		echo "EFA device not detected, skipping test."
	fi
fi
echo "==================================================="
echo "EFA installation complete."
