"""What an image carries: the version matrix, working TensorFlow and Horovod, hygiene, services."""

from __future__ import annotations

import json

import pytest
from kiln_infra import BAKE_RECORD, VENV, read_json, run_checked, venv_python

pytestmark = pytest.mark.image

# How each matrix entry is read on the host, independently of the image's own manifest.
PIP = {"tensorflow_version": "tensorflow", "tensorflow_tf_keras_version": "tf-keras",
       "tensorflow_numpy_version": "numpy", "tensorflow_tensorboard_version": "tensorboard",
       "tensorflow_horovod_version": "horovod", "frameworks_torch_version": "torch", "frameworks_jax_version": "jax"}
# Entries an image carries only where the matrix names a version (PyTorch, JAX), and how they compare.
OPTIONAL = {"frameworks_torch_version", "frameworks_jax_version"}
GPU_ONLY = {"nvidia_driver_version", "nvidia_driver_branch", "cuda_version", "cuda_cudnn_version",
            "cuda_nccl_version", "container_runtime_nvidia_toolkit_version", "cuda_dcgm_version"}
MATRIX_KEYS = sorted(PIP) + ["mpi_openmpi_major", "nvidia_driver_version", "cuda_version", "cuda_cudnn_version",
                             "cuda_nccl_version", "container_runtime_nvidia_toolkit_version", "cuda_dcgm_version"]


def deb_upstream_version(host, package_pattern: str) -> str | None:
    result = host.run(f"dpkg-query --showformat='${{db:Status-Status}} ${{Version}}\\n' --show '{package_pattern}'")
    versions = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("installed ")]
    if not versions:
        return None
    version = versions[0].split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


@pytest.fixture(scope="module")
def pip_versions(host) -> dict[str, str | None]:
    """The version of each of PIP's distributions in the image's environment (None where it is not installed),
    read in one process: each Python start takes seconds on an emulated VM."""
    code = f"""import importlib.metadata as m, json
found = {{}}
for name in {sorted(set(PIP.values()))!r}:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        found[name] = None
print(json.dumps(found))"""
    return json.loads(run_checked(host, venv_python(code)).stdout.strip().splitlines()[-1])


def live_version(host, key: str, matrix: dict[str, str], pip_versions: dict[str, str | None]) -> str | None:
    if key in PIP:
        version = pip_versions.get(PIP[key])
        # PyTorch's wheels carry their build (2.13.0+cpu): the matrix names the release
        return version.split("+")[0] if version else None
    if key == "mpi_openmpi_major":
        version = deb_upstream_version(host, "openmpi-bin")
        return version.split(".")[0] if version else None
    package = {
        "nvidia_driver_version": "nvidia-driver-*",
        "cuda_version": "cuda-toolkit-{}".format("-".join(matrix["cuda_version"].split(".")[:2])),
        "cuda_cudnn_version": "libcudnn9-cuda-12",
        "cuda_nccl_version": "libnccl2",
        "container_runtime_nvidia_toolkit_version": "nvidia-container-toolkit",
        "cuda_dcgm_version": "datacenter-gpu-manager-4-core",
    }[key]
    return deb_upstream_version(host, package)


@pytest.mark.parametrize("key", MATRIX_KEYS)
def test_installed_version_matches_matrix_and_manifest(host, key, matrix, manifest, pip_versions):
    if key in GPU_ONLY and manifest.get("profile") != "gpu":
        pytest.skip(f"{key}: not part of the {manifest.get('profile')} profile")
    if key in OPTIONAL and not matrix[key]:
        pytest.skip(f"{key}: the matrix leaves it out of the image")
    installed = live_version(host, key, matrix, pip_versions)
    assert installed == matrix[key], f"{key}: the host has {installed or 'nothing'}, the matrix wants {matrix[key]}"
    recorded = manifest.get("installed", {}).get(key)
    if key == "mpi_openmpi_major" and recorded:
        recorded = recorded.split(".")[0]
    if key in OPTIONAL and recorded:
        recorded = recorded.split("+")[0]
    assert recorded == installed, f"{key}: the image's manifest says {recorded}, the host has {installed}"


def test_manifest_matrix_is_this_matrix(manifest, matrix):
    differ = {k: (v, matrix.get(k)) for k, v in manifest.get("matrix", {}).items() if matrix.get(k) != v}
    assert not differ, f"the image was baked from another matrix (manifest, this checkout): {differ}"


@pytest.fixture(scope="module")
def frameworks(host) -> dict:
    """TensorFlow's and tf-keras's versions, and Horovod's build flags, read in one
    process: each import of TensorFlow takes a minute on an emulated VM, and horovodrun --check-build imports it
    once per question. An import that fails is recorded with its error, so only the tests that need it fail."""
    code = """import json
facts = {}
try:
    import tensorflow as tf, tf_keras
    facts["versions"] = [tf.__version__, tf_keras.__version__]
except Exception as error:
    facts["versions_error"] = repr(error)
try:
    import horovod.tensorflow as hvd
    facts["horovod"] = {"Gloo": bool(hvd.gloo_built()), "MPI": bool(hvd.mpi_built()), "NCCL": bool(hvd.nccl_built())}
except Exception as error:
    facts["horovod_error"] = repr(error)
print(json.dumps(facts))"""
    return json.loads(run_checked(host, venv_python(code)).stdout.strip().splitlines()[-1])


def test_tensorflow_and_tf_keras_import(frameworks, matrix):
    assert "versions" in frameworks, f"TensorFlow or tf-keras does not import: {frameworks.get('versions_error')}"
    assert frameworks["versions"] == [matrix["tensorflow_version"], matrix["tensorflow_tf_keras_version"]]


@pytest.fixture(scope="module")
def horovod_build(frameworks) -> dict[str, bool]:
    assert "horovod" in frameworks, f"horovod.tensorflow does not import: {frameworks.get('horovod_error')}"
    return frameworks["horovod"]


@pytest.mark.parametrize("feature", ["Gloo", "MPI"])
def test_horovod_is_built_with(horovod_build, feature):
    assert horovod_build[feature], f"Horovod lacks {feature}: {horovod_build}"


def test_horovodrun_starts(host, matrix):
    version = run_checked(host, f"{VENV}/bin/horovodrun --version").stdout.strip().splitlines()[-1]
    assert version == matrix["tensorflow_horovod_version"], f"horovodrun --version says {version}"


def test_horovod_has_nccl_on_gpu_images(horovod_build, manifest):
    if manifest.get("profile") != "gpu":
        pytest.skip("NCCL operations are built on the gpu profile only")
    if manifest.get("horovod_nccl") is False:
        pytest.skip("the manifest records a Horovod built without CUDA (kiln_image_cuda_builds=false: stand-in CUDA)")
    assert horovod_build["NCCL"], f"Horovod lacks NCCL: {horovod_build}"


@pytest.mark.parametrize("unit", ["kiln-ssh-hostkeys.service", "kiln-data-volume.service", "chrony.service",
                                  "ssh.service", "docker.service"])
def test_service_is_enabled(host, unit, machine_image):
    result = host.run(f"systemctl is-enabled {unit}")
    assert result.stdout.strip() == "enabled", f"{unit} is {result.stdout.strip() or result.stderr.strip()}"


@pytest.mark.boot
def test_docker_keeps_gpus_in_running_containers(host, manifest, machine_image, captured):
    """Docker's cgroup driver is cgroupfs (with systemd's, a daemon-reload takes the GPUs from running containers:
    nvidia-container-toolkit#48), merged into daemon.json; on gpu images the nvidia runtime is registered there
    too. A running engine says so itself (a disk that never booted has none: the engine docker would reach from
    it is another machine's)."""
    settings = json.loads(host.file("/etc/docker/daemon.json").content_string or "{}")
    assert "native.cgroupdriver=cgroupfs" in settings.get("exec-opts", []), f"daemon.json: {settings}"
    if manifest.get("profile") == "gpu":
        assert settings.get("runtimes", {}).get("nvidia", {}).get("path") == "nvidia-container-runtime", settings
    if captured:
        return
    running = host.run("docker info --format '{{.CgroupDriver}}'")
    if running.rc == 0:
        assert running.stdout.strip() == "cgroupfs", f"the engine runs with {running.stdout.strip()}"


@pytest.mark.machine
def test_a_node_can_keep_run_containers_from_the_metadata_service(host, machine_image):
    """kiln keeps a run's container from the cloud's metadata service with iptables' cgroup match (node.py
    guard_metadata); docker.io brings iptables, and the kernel's match must load."""
    assert host.exists("iptables") or host.file("/usr/sbin/iptables").exists, "iptables is missing"
    if host.user().name == "root" or host.run("sudo -n true").rc == 0:
        listed = host.run("sudo -n iptables -m cgroup --help 2>&1 || iptables -m cgroup --help 2>&1")
        assert "--cgroup" in listed.stdout, f"iptables has no cgroup match: {listed.stdout[-300:]}"


@pytest.mark.machine
def test_docker_can_confine_its_containers_where_the_kernel_has_apparmor(host, machine_image):
    """On a kernel with AppArmor on, dockerd starts no container without apparmor_parser to load its
    docker-default profile (found baking the local image: docker.io only recommends apparmor)."""
    enabled = host.file("/sys/module/apparmor/parameters/enabled")
    if not enabled.exists or enabled.content_string.strip() != "Y":
        pytest.skip("AppArmor is off in this kernel")
    assert host.exists("apparmor_parser") or host.file("/usr/sbin/apparmor_parser").exists, (
        "apparmor_parser is missing: docker run fails with `AppArmor enabled on system but the docker-default "
        "profile could not be loaded`")


@pytest.mark.boot
def test_host_keys_are_made_at_first_boot(host, captured, machine_image):
    """A captured image has no host keys and a unit that makes them; a booted one has its own keys."""
    unit = host.file("/etc/systemd/system/kiln-ssh-hostkeys.service")
    assert unit.exists and "ssh-keygen -A" in unit.content_string, (
        "nothing makes SSH host keys at first boot: kiln-ssh-hostkeys.service is missing or changed")
    enabled = host.run("systemctl is-enabled kiln-ssh-hostkeys.service").stdout.strip()
    assert enabled == "enabled", f"kiln-ssh-hostkeys.service is {enabled or 'not enabled'}: no host keys at first boot"
    if not captured:
        assert host.file("/etc/ssh/ssh_host_ed25519_key").exists, "a booted image has no SSH host key"


def test_a_data_volume_is_mounted_whenever_its_disk_appears(host, machine_image):
    """kiln up --volume attaches each node's volume once the instance runs: udev must start the mounter then."""
    rule = host.file("/etc/udev/rules.d/90-kiln-data-volume.rules")
    assert rule.exists and 'ENV{SYSTEMD_WANTS}+="kiln-data-volume@%k.service"' in rule.content_string, (
        "no udev rule starts kiln-data-volume.service when a disk appears: a volume attached after boot stays "
        "unmounted")
    unit = host.file("/etc/systemd/system/kiln-data-volume@.service")
    assert unit.exists and "ExecStart=/usr/local/sbin/kiln-data-volume" in unit.content_string, (
        "kiln-data-volume@.service is missing: udev has no unit to start when the data volume appears")
    mounter = host.file("/usr/local/sbin/kiln-data-volume")
    assert mounter.exists and mounter.mode & 0o111, "/usr/local/sbin/kiln-data-volume is missing or not executable"
    for tool in ("lsblk", "blkid", "blockdev", "mkfs.ext4", "dumpe2fs", "e2fsck", "resize2fs"):
        assert host.exists(tool), f"{tool} is missing: the data volume cannot be found or formatted"


@pytest.mark.boot
def test_the_data_volume_is_mounted_where_its_settings_say(host):
    """On a node given a data volume (kiln up --volume; make image-test boots its VM with one), once boot is done
    the volume is mounted at the settings' path, with their label, owned by their user, and in fstab."""
    settings_file = host.file("/etc/kiln/data-volume.json")
    if not settings_file.exists:
        pytest.skip("this host was given no data volume (no /etc/kiln/data-volume.json)")
    settings = json.loads(settings_file.content_string)
    host.run("timeout 300 systemctl is-system-running --wait")  # boot is over: the boot and udev runs are done
    mount = host.mount_point(settings["mount"])
    assert mount.exists, (f"no filesystem is mounted at {settings['mount']}: "
                          + host.run("journalctl -b -u 'kiln-data-volume*' --no-pager | tail -20").stdout)
    assert mount.filesystem == "ext4", mount.filesystem
    label = host.run(f"blkid -p -s LABEL -o value {mount.device}").stdout.strip()
    assert label == settings["label"], f"{mount.device} carries the label {label!r}, not {settings['label']!r}"
    assert host.file(settings["mount"]).user == settings["owner"]
    assert f"LABEL={settings['label']} {settings['mount']} ext4" in host.file("/etc/fstab").content_string


# Hygiene: nothing of the bake may ship. A captured image must have none of it; a booted one may
# have its own, but none that the bake recorded (fingerprints, machine-id, instance-id).
LEFTOVERS = {
    "ssh host keys": "ls -1 /etc/ssh/ssh_host_* 2>/dev/null",
    "authorized_keys": "find /root /home -name 'authorized_keys*' -type f 2>/dev/null",
    "shell history": "find /root /home -maxdepth 2 \\( -name .bash_history -o -name .python_history \\) 2>/dev/null",
    "apt lists": "find /var/lib/apt/lists -mindepth 1 -maxdepth 1 ! -name lock ! -name partial 2>/dev/null",
    "cloud-init state": "ls -1d /var/lib/cloud/instances/* /var/lib/cloud/instance 2>/dev/null",
}


@pytest.fixture(scope="module")
def bake_record(host) -> dict:
    return read_json(host, BAKE_RECORD)


@pytest.fixture(scope="module")
def first_boot(host) -> int:
    """When the image first booted: systemd wrote /etc/machine-id then."""
    return int(host.run("stat -c %Y /etc/machine-id").stdout.strip() or 0)


def older_than(host, paths: list[str], when: int) -> list[str]:
    return [p for p in paths if int(host.run(f"stat -c %Y {p}").stdout.strip() or 0) < when]


@pytest.mark.boot
@pytest.mark.parametrize("what", sorted(LEFTOVERS))
def test_nothing_is_left_from_the_bake(host, what, captured, bake_record, first_boot):
    found = [line for line in host.run(LEFTOVERS[what]).stdout.splitlines() if line.strip()]
    if captured:
        assert not found, f"{what} left in the image: {found}"
        return
    if what in ("ssh host keys", "authorized_keys"):
        public = [p for p in found if what == "authorized_keys" or p.endswith(".pub")]
        prints = set()
        for path in public:
            prints |= {line.split()[1] for line in host.run(f"ssh-keygen -l -E sha256 -f {path}").stdout.splitlines()
                       if len(line.split()) > 1}
        baked = prints & set(bake_record.get("key_fingerprints", []))
        assert not baked, f"{what} from the bake survived: {sorted(baked)}"
    elif what == "cloud-init state":
        baked_id = bake_record.get("instance_id")
        assert not baked_id or not any(p.endswith("/" + baked_id) for p in found), (
            f"cloud-init state of the bake's instance {baked_id} survived: {found}")
    else:
        stale = older_than(host, found, first_boot)
        assert not stale, f"{what} older than the first boot (left from the bake): {stale}"


@pytest.mark.boot
def test_machine_id_is_not_the_bakes(host, captured, bake_record):
    machine_id = host.file("/etc/machine-id")
    if captured:
        assert not machine_id.exists or machine_id.size == 0, "the image ships a machine-id"
        return
    assert machine_id.content_string.strip() != bake_record.get("machine_id"), "the bake's machine-id survived"


def test_manifest_is_well_formed(manifest):
    assert manifest.get("profile") in ("cpu", "gpu"), f"manifest profile: {manifest.get('profile')!r}"
    assert manifest.get("target", "machine") in ("machine", "container"), f"manifest target: {manifest.get('target')!r}"
    assert manifest.get("venv") == VENV, f"manifest venv: {manifest.get('venv')!r}"
    chosen = manifest.get("matrix_override", {})
    assert isinstance(chosen, dict), f"manifest matrix_override: {chosen!r}"
    assert all(manifest["matrix"].get(name, version) == version for name, version in chosen.items()), \
        f"the entries the bake chose ({chosen}) are not the manifest's matrix ({manifest['matrix']})"


def test_the_python_environment_is_usable_by_any_user(host, container_image):
    """kiln runs a container as the login user (outputs are theirs, not root's): every file of the image's Python
    environment must be readable, and every folder searchable, by any uid."""
    unreadable = f"find {VENV} \\( -type d ! -perm -o=rx \\) -o \\( -type f ! -perm -o=r \\) | head -5"
    closed = host.run(unreadable).stdout.split()
    assert not closed, f"not readable by other users: {closed}"
    result = host.run(f"setpriv --reuid=65534 --regid=65534 --clear-groups {VENV}/bin/python -c 'import horovod'")
    assert result.rc == 0, f"nobody cannot import horovod in the image: {result.stderr[-500:]}"


@pytest.mark.parametrize("tool", ["ssh", "mpirun", "horovodrun"])
def test_what_kiln_runs_inside_the_container_is_there(host, tool, container_image):
    """horovodrun reaches the other nodes with ssh (kiln's shim), and runs ranks with Gloo or mpirun."""
    assert host.exists(tool) or host.file(f"{VENV}/bin/{tool}").exists, f"{tool} is missing from the image"
