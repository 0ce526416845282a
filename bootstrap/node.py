"""The node side of the launcher: sent as `python -S -c <this file> VERB ...`.

Standard library only, no kiln imports: it runs on nodes before any code is
synced, without `site` (faster start). Each verb prints one JSON object; the
verb `serve` answers requests on stdin, one JSON line each, so one process per
node serves a whole task.

Its start is paid once per node by every kiln command, so it imports little: the C socket module (socket.py
pulls in enum and selectors) and no json until a verb reads JSON (json pulls in re). Requests come marshalled
(the operator's, trusted: marshal is builtin); answers go out as JSON written here (`dumps`), which the operator
parses with its json.
"""

import marshal
import os
import sys
import time

try:
    import _socket as socket  # the functions and constants of socket.py, without its imports
except ImportError:  # an interpreter without CPython's C module
    import socket

HOSTS_FILE = "/etc/hosts"
DATA_VOLUME_SETTINGS = "/etc/kiln/data-volume.json"  # the image's kiln-data-volume reads it (kiln up --volume)
CONTAINER_PREFIX = "kiln-"  # a run's container on this node: kiln-RUN_ID (bootstrap/container.py)
LOCAL_NODE_MARK = "/etc/ssh/kiln-local-node"  # what localcloud.cluster puts in its nodes' private /etc/ssh
AZURE_METADATA = "http://169.254.169.254"  # an Azure VM's instance metadata service
AZURE_MANAGER = "https://management.azure.com"  # Resource Manager
AZURE_COMPUTE_API = "2026-04-01"  # virtualMachines' api-version, as the azure-mgmt-compute kiln pins sends it
POWER_OFF_RECHECK_S = 300  # a node still up this long after its power-off was taken tries again
SHUTDOWNS = ("system", "namespace", "azure")
RDMA_DEVICES = "/sys/class/infiniband"  # EFA and InfiniBand devices alike (rdma-core's view)
NCCL_TOPOLOGY_FILES = ("/opt/microsoft/ndv5-topo.xml", "/opt/microsoft/ndv4-topo.xml")  # Azure ND images' (azhpc)
PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_PCI_VENDOR = "0x10de"


def facts(ports, names, probe=None, only=None):
    """What the launcher needs to know about this node, gathered in one go (`only`: those facts alone, where a
    command needs no more). `probe` names another node to log in to over the mesh, to prove it works."""
    hostname = socket.gethostname()
    gather = {
        "hostname": lambda: hostname,
        "uid": os.getuid,
        "gid": os.getgid,
        "home": lambda: os.path.expanduser("~"),
        "gpus": gpu_devices,
        "memlock": memlock_limit,
        "data_volume": data_volume,
        "python": lambda: sys.version.split()[0],
        "executable": lambda: sys.executable,
        "ssh_connection": lambda: os.environ.get("SSH_CONNECTION", ""),
        "packages": lambda: packages(("tensorflow", "tf-keras", "horovod", "torch", "jax", "keras")),
        "addresses": addresses,
        "host_keys": host_keys,
        "resolve": lambda: resolve_all([hostname, *names]),
        "ports": lambda: {str(port): port_free(port) for port in ports},
        "probe": lambda: mesh_probe(probe) if probe else None,
        "rdma": rdma_devices,
        "nccl_topology": lambda: [path for path in NCCL_TOPOLOGY_FILES if os.path.isfile(path)],
        "gpu_pci": gpu_pci_devices,
    }
    unknown = [name for name in only or () if name not in gather]
    if unknown:
        raise ValueError(f"no fact named {', '.join(unknown)}")
    return {name: get() for name, get in gather.items() if not only or name in only}


def rdma_devices(root=RDMA_DEVICES):
    """The RDMA devices the kernel shows here (EFA, InfiniBand HCAs): each one's name, kernel driver, and its
    first port's link layer and state ("4: ACTIVE" when up), from sysfs."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = []
    for name in names:
        device = os.path.join(root, name)
        driver = os.path.join(device, "device", "driver")
        port = os.path.join(device, "ports", "1")
        found.append({"name": name,
                      "driver": os.path.basename(os.readlink(driver)) if os.path.islink(driver) else "",
                      "link_layer": read_text(os.path.join(port, "link_layer")).strip(),
                      "state": read_text(os.path.join(port, "state")).strip()})
    return found


def gpu_pci_devices(root=PCI_DEVICES):
    """The PCI device ids of the NVIDIA GPUs here ("2330" for an H100 SXM5), sorted, from sysfs: which machine
    this is, for the NCCL topology file that fits it (interconnect.topology_of)."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    found = []
    for name in names:
        device = os.path.join(root, name)
        if (read_text(os.path.join(device, "vendor")).strip() == NVIDIA_PCI_VENDOR
                and read_text(os.path.join(device, "class")).strip().startswith("0x03")):
            found.append(read_text(os.path.join(device, "device")).strip().removeprefix("0x"))
    return sorted(found)


def memlock_limit(limits="/proc/self/limits"):
    """The most memory a process here may lock (its hard limit), in bytes; -1 for unlimited. Read from the
    kernel's table of this process's limits: the resource module is a shared library to load, a third of a
    millisecond of every agent's start."""
    for line in read_text(limits).splitlines():
        if line.startswith("Max locked memory"):
            hard = line.split()[4]
            return -1 if hard == "unlimited" else int(hard)
    import resource

    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return -1 if hard == resource.RLIM_INFINITY else hard


def gpu_devices():
    """How many NVIDIA GPUs the driver exposes here (/dev/nvidiaN)."""
    try:
        return sum(1 for name in os.listdir("/dev") if name.startswith("nvidia") and name[len("nvidia"):].isdigit())
    except OSError:
        return 0


def data_volume():
    """Where this node's data volume is mounted (kiln up --volume), or None."""
    try:
        with open(DATA_VOLUME_SETTINGS) as handle:
            import json

            return json.load(handle).get("mount")
    except (OSError, ValueError, AttributeError):
        return None


def normalize(name):
    return name.lower().replace("-", "_").replace(".", "_")


def site_dirs():
    """Where this Python's packages live, found without the `site` module: the
    virtual environment's site-packages, and the system's unless the venv hides it."""
    prefix = os.path.dirname(os.path.dirname(sys.executable))
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    folders = [os.path.join(prefix, "lib", version, "site-packages")]
    config = os.path.join(prefix, "pyvenv.cfg")
    isolated = os.path.exists(config) and "include-system-site-packages = false" in read_text(config)
    if not isolated:
        folders += [f"/usr/local/lib/{version}/dist-packages", "/usr/lib/python3/dist-packages",
                    os.path.join(sys.base_prefix, "lib", version, "site-packages")]
    return folders


def packages(wanted):
    """Installed versions from the dist-info folder names (cheaper than importlib.metadata)."""
    found = {name: None for name in wanted}
    keys = {normalize(name): name for name in wanted}
    for folder in site_dirs():
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            if entry.endswith(".dist-info") and "-" in entry:
                project, version = entry[: -len(".dist-info")].rsplit("-", 1)
                name = keys.get(normalize(project))
                if name and not found[name]:
                    found[name] = version
    return found


def addresses():
    """Global IPv4 (one per interface) and IPv6 addresses, with their interface."""
    import fcntl

    result = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, iface in socket.if_nameindex():
            request = iface.encode()[:15].ljust(256, b"\0")  # struct ifreq: the name, room for the answer
            try:
                address = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x8915, request)[20:24])  # SIOCGIFADDR
                mask = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x891B, request)[20:24])  # SIOCGIFNETMASK
            except OSError:
                continue
            if not address.startswith("127."):
                prefix = sum(bin(int(part)).count("1") for part in mask.split("."))
                result.append({"iface": iface, "address": address, "prefix": prefix})
    finally:
        sock.close()
    try:
        with open("/proc/net/if_inet6") as handle:
            for line in handle:
                raw, _, prefix, scope, _, iface = line.split()
                if scope == "00":
                    address = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(raw))
                    result.append({"iface": iface, "address": address, "prefix": int(prefix, 16)})
    except OSError:
        pass
    return result


def mesh_probe(target):
    """Log in to `target` the way horovodrun will: by name, cluster key, host key checked."""
    import subprocess

    try:
        done = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", target, "hostname"],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"target": target, "answer": None, "error": "no answer within 30s"}
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return {"target": target, "answer": done.stdout.strip() if done.returncode == 0 else None,
            "error": (lines[-1] if lines else f"exit {done.returncode}") if done.returncode else None}


def host_keys():
    keys = []
    for name in sorted(os.listdir("/etc/ssh")) if os.path.isdir("/etc/ssh") else []:
        if name.startswith("ssh_host_") and name.endswith("_key.pub"):
            with open(os.path.join("/etc/ssh", name)) as handle:
                fields = handle.read().split()
            if len(fields) >= 2:
                keys.append(f"{fields[0]} {fields[1]}")
    return keys


def resolve_all(names, budget=10.0):
    """Every name's addresses. Names in /etc/hosts are looked up in turn (the files answer at once); the others
    go to DNS, which may be slow or absent: those in parallel threads within `budget` seconds."""
    names = list(dict.fromkeys(names))
    listed = hosts_file_names()
    found = {name: resolve(name) for name in names if name in listed}
    rest = [name for name in names if name not in listed]
    if not rest:
        return found
    import threading

    def look(name):
        found[name] = resolve(name)

    threads = [threading.Thread(target=look, args=(name,), daemon=True) for name in rest]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + budget
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {name: found.get(name, []) for name in names}


def hosts_file_names():
    """Every name /etc/hosts gives an address to."""
    try:
        with open(HOSTS_FILE) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return set()
    return {name for line in lines for name in line.split("#", 1)[0].split()[1:]}


def resolve(name):
    try:
        # An ASCII name goes as bytes: a str would load the idna codec first.
        infos = socket.getaddrinfo(name.encode() if name.isascii() else name, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return []
    return sorted({info[4][0] for info in infos})


def port_free(port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
    except OSError:
        return False
    finally:
        sock.close()
    return True


RESERVATION_GRACE = 600.0  # s a reservation holds with no process of its run (starting, or between attempts)


def reserve(run_id, root, ports):
    """Reserve `ports` on this node for `run_id` (files ROOT/ports/PORT naming the run), all or none, under a
    lock: {"conflicts": {port: other run}}. Another run's reservation holds while that run has a process here,
    or for RESERVATION_GRACE s since it was made or refreshed; an older one whose run has no process left is
    taken over. Reserving again refreshes the run's own."""
    import fcntl

    folder = os.path.join(os.path.expanduser(root), "ports")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conflicts, live = {}, {}
        for port in ports:
            path = os.path.join(folder, str(port))
            holder = read_text(path).strip()
            if not holder or holder == run_id:
                continue
            if holder not in live:
                live[holder] = bool(run_processes(holder, helpers=True))
            try:
                recent = time.time() - os.stat(path).st_mtime < RESERVATION_GRACE
            except OSError:
                continue
            if live[holder] or recent:
                conflicts[str(port)] = holder
        if not conflicts:
            for port in ports:
                with open(os.path.join(folder, str(port)), "w") as handle:
                    handle.write(run_id + "\n")
        return {"conflicts": conflicts}


def release(run_id, root):
    """Drop this run's port reservations on this node; the ports released."""
    folder = os.path.join(os.path.expanduser(root), "ports")
    released = []
    try:
        names = os.listdir(folder)
    except OSError:
        return {"released": released}
    for name in names:
        path = os.path.join(folder, name)
        if name.isdigit() and read_text(path).strip() == run_id:
            os.remove(path)
            released.append(int(name))
    return {"released": sorted(released)}


def write_if_changed(path, text, mode=0o600):
    """Write `text` to `path` unless it already holds it; True if it changed."""
    try:
        with open(path) as handle:
            if handle.read() == text and (os.stat(path).st_mode & 0o777) == mode:
                return False
    except FileNotFoundError:
        pass
    import _thread

    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.kiln-tmp-{os.getpid()}-{_thread.get_ident()}"  # writers side by side never share one
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def replace_block(text, marker, block):
    """Put `block` between BEGIN/END lines of `marker` at the top of `text`."""
    begin, end = f"# BEGIN {marker}\n", f"# END {marker}\n"
    lines = text.splitlines(keepends=True)
    if begin in lines and end in lines:
        del lines[lines.index(begin) : lines.index(end) + 1]
    return begin + block + end + "".join(lines)


def hosts_text(text, marker, entries):
    """/etc/hosts with kiln's block on top and any other line that maps one of
    the cluster's names to a different address commented out, so every name
    resolves to its routable address only."""
    names = {name: address for address, name in entries}
    kept = []
    for line in text.splitlines(keepends=True):
        fields = line.split("#", 1)[0].split()
        clash = fields and any(names.get(name, fields[0]) != fields[0] for name in fields[1:])
        kept.append(f"# {marker}: {line}" if clash else line)
    block = "".join(f"{address} {name}\n" for address, name in entries)
    return replace_block("".join(kept), marker, block)


def mesh(payload, parts):
    """Install the cluster key, pinned known_hosts and ssh config ("ssh", as the
    login user) and the cluster's names in /etc/hosts ("hosts", as root)."""
    changed = []
    if "ssh" in parts:
        changed += mesh_ssh(payload)
    if "hosts" in parts and mesh_hosts(payload["cluster"], [tuple(entry) for entry in payload["hosts"]]):
        changed.append(HOSTS_FILE)
    return {"changed": changed}


def mesh_hosts(cluster, entries, path=HOSTS_FILE):
    """The cluster's names in /etc/hosts; True if it changed. Edited in place (it may be a bind mount) under a
    lock on the file itself, so clusters meshed side by side over the same node each keep their block, and a
    name lookup meanwhile never reads it empty."""
    import fcntl

    with open(path, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        current = handle.read()
        wanted = hosts_text(current, f"kiln {cluster}", entries)
        if wanted == current:
            return False
        handle.seek(0)
        handle.write(wanted)
        handle.truncate()
        return True


def mesh_ssh(payload):
    """The cluster's key, known_hosts and ssh config under ~/.ssh/kiln/CLUSTER, included from ~/.ssh/config, and
    its key authorized. ~/.ssh/config and authorized_keys are shared by every cluster on the node: they are read
    and rewritten under a lock, so meshes of clusters side by side (runs on overlapping hosts) lose nothing."""
    import fcntl

    cluster = payload["cluster"]
    ssh_dir = os.path.expanduser("~/.ssh")
    os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
    base = os.path.join(ssh_dir, "kiln", cluster)
    for folder in (os.path.dirname(base), base):
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
    with open(os.path.join(os.path.dirname(base), ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return install_ssh(payload, ssh_dir, base)


def install_ssh(payload, ssh_dir, base):
    cluster = payload["cluster"]
    changed = []
    files = {
        "id_ed25519": payload["private_key"],
        "id_ed25519.pub": payload["public_key"] + "\n",
        "known_hosts": payload["known_hosts"],
        "config": payload["ssh_config"],
    }
    for name, text in files.items():
        if write_if_changed(os.path.join(base, name), text):
            changed.append(f"~/.ssh/kiln/{cluster}/{name}")
    config = os.path.join(ssh_dir, "config")
    current = read_text(config)
    if write_if_changed(config, replace_block(current, f"kiln {cluster}", f"Include {base}/config\n")):
        changed.append("~/.ssh/config")
    authorized = os.path.join(ssh_dir, "authorized_keys")
    current = read_text(authorized)
    addresses = ",".join(address for address, _ in payload["hosts"])
    line = (f'from="{addresses}",no-agent-forwarding,no-port-forwarding,no-X11-forwarding '
            f'{payload["public_key"]}\n')
    body = payload["public_key"].split()[1]
    others = [old for old in current.splitlines(keepends=True) if body not in old.split()]
    if line not in current.splitlines(keepends=True):
        if others and not others[-1].endswith("\n"):
            others[-1] += "\n"
        write_if_changed(authorized, "".join(others) + line)
        changed.append("~/.ssh/authorized_keys")
    return changed


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def namespaces(pid="self"):
    """A process's UTS and mount namespaces: what tells apart the nodes of a local cluster, which share one PID
    space (on a real machine every process has the same)."""
    return [os.readlink(f"/proc/{pid}/ns/{kind}") for kind in ("uts", "mnt")]


def run_processes(run_id, helpers=False, inside=0):
    """Processes of this run on this node, found by the KILN_RUN_ID they carry (run_id None: of any run), here
    or inside the run's container on this node (`inside`: its pid, None for none, 0: look it up); kiln's own
    helpers that carry it (the interruption watcher) only if asked."""
    needle = f"\0KILN_RUN_ID={run_id}\0".encode() if run_id else b"\0KILN_RUN_ID="
    places = [namespaces()]
    if inside == 0:
        inside = container_pid(run_id) if run_id else None
        try:
            places.append(namespaces(inside))
        except OSError:
            pass
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle not in b"\0" + handle.read() + b"\0" or namespaces(entry) not in places:
                    continue
            cmdline = read_bytes(f"/proc/{entry}/cmdline")
            if is_stopping(cmdline) or (not helpers and is_helper(cmdline)):
                continue
            found.append(int(entry))
        except OSError:
            continue
    return found


HELPERS = ("/lib/shim/interruption.py",)  # kiln's, in its node folder (~/kiln/lib)


def runs_here():
    """The runs whose processes (kiln's helpers too) are on this node: the KILN_RUN_ID they carry."""
    mine, found = namespaces(), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                variables = handle.read().split(b"\0")
            run = next((v[len(b"KILN_RUN_ID="):] for v in variables if v.startswith(b"KILN_RUN_ID=")), None)
            if run and namespaces(entry) == mine:
                found.add(run.decode(errors="replace"))
        except OSError:
            continue
    return {"runs": sorted(found)}


def is_helper(cmdline):
    """Whether a command line (NUL-separated) runs one of kiln's helper scripts."""
    return any(word.decode(errors="replace").endswith(HELPERS) for word in cmdline.split(b"\0")[:3])


def is_stopping(cmdline):
    """Whether a command line is kiln's own stop of a run (the interruption watcher becomes one on a notice): not
    one of the run's processes, and a second stop that ended it would cut its work and its report short."""
    words = cmdline.split(b"\0")
    return any(word.endswith(b"/lib/node.py") for word in words[:3]) and b"stop" in words[1:5]


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def docker(*args, timeout=30):
    """A docker command's (exit code, output); (None, why) where docker is missing or does not answer."""
    import subprocess

    try:
        done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, str(error)
    return done.returncode, (done.stdout or done.stderr).strip()


def container_pid(run_id):
    """The host pid of the run's container's first process on this node, or None (no such container, or no
    docker here)."""
    code, out = docker("inspect", "--format", "{{.State.Pid}}", CONTAINER_PREFIX + run_id, timeout=15)
    try:
        return int(out) if code == 0 and int(out) > 0 else None
    except ValueError:
        return None


def run_containers():
    """Whether a kiln run's container runs here (a horovod worker node's ranks live only in there)."""
    code, out = docker("ps", "--quiet", "--filter", "label=kiln.run", timeout=30)
    return code == 0 and bool(out.strip())


def remove_container(run_id):
    """Remove the run's container on this node, if there is one: what is left of it goes with the run."""
    code, out = docker("rm", "-f", CONTAINER_PREFIX + run_id, timeout=60)
    # No such container, or no engine running on this node (then no container either).
    if code not in (0, None) and "No such container" not in out and "Cannot connect to the Docker daemon" not in out:
        return out
    return None


def stop(run_id, grace):
    """TERM every process of the run (in its container too), KILL what is left after `grace` seconds, then
    remove the run's container."""
    import signal

    inside = container_pid(run_id)
    pids = run_processes(run_id, helpers=True, inside=inside)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and run_processes(run_id, helpers=True, inside=inside):
            time.sleep(0.1)
        pids = run_processes(run_id, helpers=True, inside=inside)
        if not pids:
            break
    left = run_processes(run_id, helpers=True, inside=inside)
    failed = remove_container(run_id)
    revoke_container_access(run_id)
    return {"left": left, **({"container": failed} if failed else {})}


def container_access(payload):
    """A container run's own way to the cluster's other nodes (kiln train --image), never the cluster's key: the
    run's key, the pinned known_hosts and an ssh config in ~/.ssh/kiln-runs/RUN (the container's ~/.ssh,
    read-only), and that key authorized here only to run a command in the run's container (its forced command);
    stop takes both away."""

    run_id = payload["run_id"]
    folder = os.path.expanduser(f"~/.ssh/kiln-runs/{run_id}")
    for path in (os.path.expanduser("~/.ssh/kiln"), os.path.dirname(folder), folder):
        os.makedirs(path, mode=0o700, exist_ok=True)
    for name, text in (("id_ed25519", payload["private_key"]), ("known_hosts", payload["known_hosts"]),
                       ("config", payload["ssh_config"])):
        path = os.path.join(folder, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
            handle.write(text)
    authorize_run(run_id, payload["authorized"])
    return {"access": folder}


def authorize_run(run_id, line=None):
    """authorized_keys with the run's line (tagged kiln-run-RUN) replaced by `line`, or taken out (None), under the
    lock every writer of the file here holds (mesh_ssh)."""
    import fcntl

    authorized = os.path.expanduser("~/.ssh/authorized_keys")
    with open(os.path.expanduser("~/.ssh/kiln/.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = read_text(authorized).splitlines()
        kept = [old for old in current if not old.endswith(f" kiln-run-{run_id}")] + ([line] if line else [])
        if kept != current:
            write_if_changed(authorized, "\n".join(kept) + ("\n" if kept else ""))


def revoke_container_access(run_id):
    """Take a container run's key away on this node (its authorized line, its folder): nothing of it outlives the
    run's containers."""
    import shutil

    if not os.path.isdir(os.path.expanduser("~/.ssh/kiln")):
        return  # never meshed here: nothing of a run's either
    authorize_run(run_id)
    shutil.rmtree(os.path.expanduser(f"~/.ssh/kiln-runs/{run_id}"), ignore_errors=True)


# Where a machine's identity and credentials are asked for: EC2's IMDS, GCE's metadata server and Azure's IMDS at
# 169.254.169.254 (EC2's also at fd00:ec2::254), Azure's WireServer at 168.63.129.16. A run's container is kept from
# them: its processes live under one cgroup (kiln.slice, docker run --cgroup-parent), whose packets to these
# addresses the node rejects (iptables' cgroup match: the net_cls class under cgroup v1, the path under v2).
METADATA_ADDRESSES = ("169.254.169.254", "168.63.129.16", "fd00:ec2::254")
GUARD_SLICE = "kiln.slice"
GUARD_CLASSID = 0x4B4C0001  # the slice's net_cls class (cgroup v1): "KL" 1
GUARD_TAG = "kiln-containers"  # the rules' comment (under v2, with the slice's inode: a rule names one cgroup)


def cgroup_v1_mount(mountinfo, controller):
    """Where `controller`'s cgroup v1 hierarchy is mounted, from /proc/self/mountinfo's text; None where it is not."""
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" in fields:
            fs = fields[fields.index("-") + 1:]
            if len(fs) >= 3 and fs[0] == "cgroup" and controller in fs[2].split(","):
                return fields[4]
    return None


def guard_rules(tag, match):
    """(tool, rule) for each metadata address: packets from the containers' cgroup (`match`) to it rejected."""
    return [("ip6tables" if ":" in address else "iptables",
             ["OUTPUT", "-d", address, "-m", "cgroup", *match, "-m", "comment", "--comment", tag, "-j", "REJECT"])
            for address in METADATA_ADDRESSES]


def stale_rules(listing, tag):
    """The rules of `iptables -S OUTPUT` that guarded a kiln.slice since removed (another inode than `tag`'s),
    as the arguments that delete each."""
    import shlex

    stale = []
    for line in listing.splitlines():
        words = shlex.split(line)
        if "--comment" in words and words[0] == "-A":
            comment = words[words.index("--comment") + 1]
            if comment.startswith(GUARD_TAG + "-") and comment != tag:
                stale.append(["-D", *words[1:]])
    return stale


def guard_metadata(mountinfo="/proc/self/mountinfo", cgroup2="/sys/fs/cgroup"):
    """As root, before a run's container starts: kiln.slice made (its net_cls class set under cgroup v1) and its
    packets to the metadata services rejected, idempotently. {"guarded": "v1"|"v2"}, or {"refused": why,
    "open": whether the metadata service answers here} where this node cannot."""
    import shutil
    import subprocess

    net_cls = cgroup_v1_mount(read_text(mountinfo), "net_cls")
    if net_cls:
        folder, version = os.path.join(net_cls, GUARD_SLICE), "v1"
    elif os.path.exists(os.path.join(cgroup2, "cgroup.controllers")):
        folder, version = os.path.join(cgroup2, GUARD_SLICE), "v2"
    else:
        return {"refused": "neither net_cls (cgroup v1) nor cgroup v2 is mounted", "open": metadata_open()}
    os.makedirs(folder, exist_ok=True)
    if version == "v1":
        with open(os.path.join(folder, "net_cls.classid"), "w") as handle:
            handle.write(str(GUARD_CLASSID))
        tag, match = GUARD_TAG, ["--cgroup", str(GUARD_CLASSID)]
    else:
        tag, match = f"{GUARD_TAG}-{os.stat(folder).st_ino}", ["--path", "/" + GUARD_SLICE]
    for tool, rule in guard_rules(tag, match):
        if not shutil.which(tool):
            if tool == "ip6tables":
                continue  # no IPv6 filtering here, and so no way to EC2's IPv6 endpoint either
            return {"refused": f"{tool} is not installed", "open": metadata_open()}
        if subprocess.run([tool, "-C", *rule], capture_output=True, timeout=30).returncode == 0:
            continue
        done = subprocess.run([tool, "-I", *rule], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            return {"refused": f"{tool}: {done.stderr.strip()}", "open": metadata_open()}
    for tool in ("iptables", "ip6tables"):
        if version == "v2" and shutil.which(tool):
            listing = subprocess.run([tool, "-S", "OUTPUT"], capture_output=True, text=True, timeout=30).stdout
            for rule in stale_rules(listing, tag):
                subprocess.run([tool, *rule], capture_output=True, timeout=30)
    return {"guarded": version}


def metadata_open(timeout=2.0):
    """Whether the cloud's metadata service takes a connection here."""
    connection = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    connection.settimeout(timeout)
    try:
        connection.connect((METADATA_ADDRESSES[0], 80))
    except OSError:
        return False
    finally:
        connection.close()
    return True


def progress(run_id, run_dir, signs=False, container=True, gpu=False):
    """The last logged step of every metrics file here, how much each process has printed (its log; a
    horovod rank's files), this node's processes of the run that are stopped (state T: hung or frozen), and the
    signs of their work when asked (`signs`): their CPU seconds, whether a GPU is busy, when the run's heartbeat
    file was touched. `container` False: the run has none (its processes are found without asking docker)."""
    try:
        entries = os.listdir(run_dir)
    except OSError:
        entries = []
    metrics = {}
    for name in (n for n in entries if n.startswith("metrics.") and n.endswith(".jsonl")):
        last = last_line(os.path.join(run_dir, name))
        try:
            import json

            row = json.loads(last)
            metrics[name[len("metrics."):-len(".jsonl")]] = {"step": int(row["step"])}
        except (ValueError, KeyError, TypeError):
            continue
    output = {name[:-len(".log")]: stat_of(os.path.join(run_dir, name), "st_size", 0)
              for name in entries if name.endswith(".log")}
    ranks = os.path.join(run_dir, "ranks")  # horovodrun --output-filename: ranks/rank.N/{stdout,stderr}
    for name in os.listdir(ranks) if os.path.isdir(ranks) else ():
        if name.startswith("rank.") and name[len("rank."):].isdigit():
            folder = os.path.join(ranks, name)
            output["rank-" + name[len("rank."):]] = sum(stat_of(os.path.join(folder, f), "st_size", 0)
                                                       for f in ("stdout", "stderr"))
    stopped, ticks = [], 0
    pids = run_processes(run_id, inside=0 if container else None)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            state, ticks = fields[0], ticks + int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError, ValueError):
            continue
        if state in ("T", "t"):
            stopped.append(pid)
    found = {"metrics": metrics, "output": output, "stopped": stopped}
    if signs:  # CPU time and the heartbeat are cheap; a GPU's (two nvidia-smi calls) only when asked (`gpu`)
        found["activity"] = {"cpu": ticks / os.sysconf("SC_CLK_TCK"), "gpu_busy": gpu and gpu_busy(pids),
                             "beat": stat_of(os.path.join(run_dir, HEARTBEAT), "st_mtime", 0.0)}
    return found


LOOK_POLL_S = 0.05  # how often a waiting look reads its tasks' states (a few files each)
HEARTBEAT = "heartbeat"  # in the run folder: KILN_HEARTBEAT, a file a program may touch to say it is alive


def stat_of(path, field, missing):
    """One field of the file's os.stat (st_size, st_mtime), or `missing` where it is gone or cannot be read."""
    try:
        return getattr(os.stat(path), field)
    except OSError:
        return missing


def gpu_busy(pids):
    """Whether a GPU that one of the run's processes (`pids`) computes on is busy now (nvidia-smi's compute apps
    and utilization: another run's or program's GPU is no sign of this run's work); False without GPUs or an
    answer."""
    import subprocess

    if not pids or not os.path.exists("/dev/nvidiactl"):
        return False
    answers = []
    for query in ("--query-compute-apps=pid,gpu_uuid", "--query-gpu=uuid,utilization.gpu"):
        try:
            answers.append(subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True,
                                          text=True, timeout=10, stdin=subprocess.DEVNULL).stdout)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return runs_gpu_busy(answers[0], answers[1], pids)


def runs_gpu_busy(apps, gpus, pids):
    """From nvidia-smi's CSV answers (compute apps: pid, GPU uuid; GPUs: uuid, utilization %): whether a GPU the
    processes `pids` compute on is busy (pure)."""
    wanted = {str(pid) for pid in pids}
    mine = {gpu.strip() for pid, _, gpu in (line.partition(",") for line in apps.splitlines()) if pid.strip() in wanted}
    for uuid, _, used in (line.partition(",") for line in gpus.splitlines()):
        if uuid.strip() in mine and used.strip().isdigit() and int(used) > 0:
            return True
    return False


def last_line(path):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 4096))
            lines = handle.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def status(run_dir, tasks):
    """For each task: running, exited with its code, or lost (gone without a code)."""
    result = {}
    for task in tasks:
        path = os.path.join(run_dir, task)
        try:
            with open(f"{path}.exit") as handle:
                result[task] = {"state": "exited", "code": int(handle.read().strip() or -1)}
                continue
        except FileNotFoundError:
            pass
        try:
            with open(f"{path}.pid") as handle:
                pid = int(handle.read().strip())
            os.kill(pid, 0)
            result[task] = {"state": "running", "pid": pid}
        except (FileNotFoundError, ValueError):
            result[task] = {"state": "starting"}
        except ProcessLookupError:  # gone: it may have written its exit code just now
            code = read_text(f"{path}.exit").strip()
            result[task] = {"state": "exited", "code": int(code)} if code else {"state": "lost"}
    return result


def look(run_dir, wait_s, tasks):
    """What the launcher's watch asks every node at each look: its tasks' states and the spot interruption
    notice its watcher wrote, if any. Where a task here is still starting or running, the answer waits up to
    `wait_s` for either to change (read every LOOK_POLL_S here, where reading is cheap), so the watch learns of a
    process's end when it happens, not at its next look; a node with none (its tasks ended, or it has none of its
    own) answers at once, keeping no look waiting on it."""
    def read():
        return {"tasks": status(run_dir, tasks), "notice": notice(run_dir)}

    first = read()
    going = any(task["state"] in ("starting", "running") for task in first["tasks"].values())
    deadline = time.monotonic() + (wait_s if going else 0)
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(LOOK_POLL_S, left))
        if (now := read()) != first:
            return now
    return first


def notice(run_dir):
    """The spot interruption notice the run's watcher wrote here (shim/interruption.py), or None."""
    text = read_text(os.path.join(run_dir, "notice.json"))
    try:
        import json

        return json.loads(text) if text else None
    except ValueError:
        return None


def started_at(pid):
    """A process's start time in clock ticks since boot (with its pid, what tells it from a later one)."""
    try:
        return int(read_text(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def autostop(idle_s, interval_s, shutdown, state_path):
    """Start this node's idle agent, detached, in place of the one before (idle_s 0: only stop that one). It
    powers the node off once no kiln run has had a process here for idle_s seconds (`shutdown`: "system" runs
    shutdown; "namespace", on a local cluster's node, kills every process in the node's network namespace; "azure"
    deallocates this Azure VM, as its own managed identity)."""

    if shutdown not in SHUTDOWNS:
        raise ValueError(f"shutdown {shutdown!r}: one of {', '.join(SHUTDOWNS)}")
    if shutdown == "namespace" and not os.path.exists(LOCAL_NODE_MARK):
        raise ValueError(f"shutdown namespace: no {LOCAL_NODE_MARK}; this is not a local cluster's node")
    os.makedirs(os.path.dirname(state_path), exist_ok=True)
    before = read_json(state_path)
    replaced = end_agent(before)
    if idle_s <= 0:
        write_state(state_path, {"cancelled": time.time(), "replaced": replaced})
        return {"pid": None, "replaced": replaced}
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.chdir("/")
                quiet = os.open(os.devnull, os.O_RDONLY)
                log = os.open(state_path[:-len(".json")] + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(quiet, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.closerange(3, 1 << 16)  # the serve agent's pipes and the ssh session's stay with it
                watch_idle(idle_s, interval_s, shutdown, state_path)
        except BaseException as error:  # the agent's last word, in its log
            print(f"autostop: {type(error).__name__}: {error}", flush=True)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = read_json(state_path)
        if now.get("pid") and now.get("pid") != before.get("pid"):
            return {"pid": now["pid"], "replaced": replaced}
        time.sleep(0.05)
    raise RuntimeError(f"the idle agent did not start (no pid in {state_path})")


def end_agent(recorded, wait=5.0):
    """Stop the agent a state file names, if it is still that process; its pid, or None."""
    import signal

    pid = recorded.get("pid")
    if not pid or pid == os.getpid() or started_at(pid) != recorded.get("since"):
        return None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + wait
    while started_at(pid) == recorded.get("since") and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def watch_idle(idle_s, interval_s, shutdown, state_path):
    """Look for kiln runs every interval_s; power off once none was seen for idle_s (a monotonic clock: a time
    step does not count). A power-off that fails is logged and tried again at the next look; one that was taken but
    left the node running (an Azure deallocation that failed later) is tried again POWER_OFF_RECHECK_S later."""

    me = {"pid": os.getpid(), "since": started_at(os.getpid()), "idle_s": idle_s, "shutdown": shutdown}
    last_busy, last_busy_at = time.monotonic(), time.time()
    failure = None
    while True:
        if run_processes(None) or run_containers():
            last_busy, last_busy_at = time.monotonic(), time.time()
        seen = {**me, "checked": time.time(), "last_busy": last_busy_at, **({"error": failure} if failure else {})}
        if time.monotonic() - last_busy >= idle_s:
            write_state(state_path, {**seen, "powering_off": time.time()})
            failure = power_off(shutdown)
            if failure is None and shutdown == "namespace":  # the node's processes are gone: so is it
                return
            if failure is None:
                write_state(state_path, {**seen, "powered_off": time.time()})
                time.sleep(POWER_OFF_RECHECK_S)
                print(f"autostop: still running {POWER_OFF_RECHECK_S} s after the power-off was taken; trying again",
                      flush=True)
                continue
            print(f"autostop: could not power off: {failure}", flush=True)
            seen["error"] = failure
        write_state(state_path, seen)
        time.sleep(interval_s)


def power_off(shutdown):
    """Power this node off; None, or why it could not be."""
    import signal
    import subprocess

    if shutdown == "system":
        argv = (["sudo", "-n"] if os.getuid() != 0 else []) + ["shutdown", "-h", "now"]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{' '.join(argv)}: {error}"
        said = done.stderr.strip() or "no output"
        return None if done.returncode == 0 else f"{' '.join(argv)}: exit {done.returncode}: {said}"
    if shutdown == "azure":  # the environment may point it elsewhere (the tests' stand-ins)
        return deallocate_self(os.environ.get("KILN_AZURE_METADATA") or AZURE_METADATA,
                               os.environ.get("KILN_AZURE_ENDPOINT") or AZURE_MANAGER,
                               os.environ.get("KILN_AZURE_CA_FILE") or None)
    mine = os.readlink("/proc/self/ns/net")
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == mine:
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue
    return None


def deallocate_self(metadata=AZURE_METADATA, manager=AZURE_MANAGER, cafile=None, timeout=30):
    """Ask Resource Manager to deallocate this Azure VM (a VM that only shuts down stays allocated and billed), as
    the VM's system-assigned identity, which kiln allowed to deallocate this VM alone; None once Resource Manager
    took the request, or why it did not."""
    import json
    import ssl
    import urllib.error
    import urllib.parse
    import urllib.request

    local = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy

    def ask(path):
        with local.open(urllib.request.Request(metadata + path, headers={"Metadata": "true"}), timeout=timeout) as got:
            return json.loads(got.read())

    step = "read this VM's resource id from the metadata service"
    try:
        vm = ask("/metadata/instance/compute?api-version=2021-02-01")["resourceId"]
        if not str(vm).startswith("/subscriptions/"):
            return f"could not {step}: the metadata service names {vm!r}, not a VM"
        step = "get a token for its managed identity"
        resource = urllib.parse.quote(manager.rstrip("/") + "/", safe="")
        token = ask(f"/metadata/identity/oauth2/token?api-version=2018-02-01&resource={resource}")["access_token"]
        step = f"deallocate {vm}"
        request = urllib.request.Request(f"{manager.rstrip('/')}{vm}/deallocate?api-version={AZURE_COMPUTE_API}",
                                         data=b"", method="POST", headers={"Authorization": f"Bearer {token}",
                                                                           "Content-Type": "application/json"})
        context = ssl.create_default_context(cafile=cafile)
        with urllib.request.build_opener(urllib.request.HTTPSHandler(context=context)).open(
                request, timeout=timeout) as answer:
            status = answer.status
    except urllib.error.HTTPError as error:
        return f"could not {step}: HTTP {error.code}" + said_by(error)
    except Exception as error:  # whatever it is, the agent logs it and tries again at its next look
        return f"could not {step}: {type(error).__name__}: {' '.join(str(error).split())}"
    return None if status in (200, 202) else f"could not {step}: HTTP {status}"


def said_by(error):
    """ARM's error code and message, or the metadata service's, from a failed call's body: " CODE: message"."""
    import json

    try:
        said = json.loads(error.read() or b"{}")
    except Exception:  # no body, a body cut short, or not JSON
        return ""
    said = said if isinstance(said, dict) else {}
    detail = said.get("error") if isinstance(said.get("error"), dict) else said  # ARM's, or the metadata's
    code = str(detail.get("code") or detail.get("error") or "")
    message = " ".join(str(detail.get("message") or detail.get("error_description") or "").split())
    text = f"{code}: {message}" if code and message else code or message
    return f" {text}" if text else ""


def read_json(path):
    try:
        import json

        return json.loads(read_text(path) or "{}")
    except ValueError:
        return {}


def write_state(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}"
    with open(temporary, "w") as handle:
        handle.write(dumps(data))
    os.replace(temporary, path)


def answer(verb, args, stdin):
    if verb == "facts":
        ports = [int(p) for p in args[0].split(",") if p] if args else []
        names = [n for n in args[1].split(",") if n] if len(args) > 1 else []
        only = [n for n in args[3].split(",") if n] if len(args) > 3 else []
        return facts(ports, names, args[2] if len(args) > 2 and args[2] else None, only)
    if verb == "mesh":
        payload = stdin()  # the agent's request carries it as is; a one-off call (sudo) reads JSON text
        if isinstance(payload, str):
            import json

            payload = json.loads(payload)
        return mesh(payload, args or ["ssh", "hosts"])
    if verb == "stop":
        return stop(args[0], float(args[1]) if len(args) > 1 else 5.0)
    if verb == "container_access":
        return container_access(stdin())
    if verb == "guard_metadata":
        return guard_metadata()
    if verb == "metadata_open":
        return {"open": metadata_open()}
    if verb == "reserve":
        return reserve(args[0], args[1], [int(p) for p in args[2:]])
    if verb == "release":
        return release(args[0], args[1])
    if verb == "status":
        return status(args[0], args[1:])
    if verb == "progress":
        return progress(args[0], args[1], signs="signs" in args[2:], container="bare" not in args[2:],
                        gpu="gpu" in args[2:])
    if verb == "look":
        return look(args[0], float(args[1]), args[2:])
    if verb == "runs":
        return runs_here()
    if verb == "autostop":
        return autostop(float(args[0]), float(args[1]), args[2], os.path.expanduser(args[3]))
    raise ValueError(f"unknown verb {verb!r}")


def serve(lifetime):
    """Requests until the end of the input (the operator is done), or `lifetime` seconds at most (a safety net:
    SIGALRM ends the process). Each request is a marshalled {"verb", "args", "input"} after its length (8 hex
    digits); each answer one JSON line, {"ok", "result"|"error"}."""
    try:
        import _signal as signal  # signal.py would import enum
    except ImportError:
        import signal
    signal.alarm(lifetime)
    stream = sys.stdin.buffer
    while True:
        header = stream.read(8)
        if len(header) < 8:
            return
        body = stream.read(int(header, 16))
        try:
            request = marshal.loads(body)
            given = request["input"]
            reply = {"ok": True, "result": answer(request["verb"], request["args"], lambda given=given: given)}
        except Exception as error:  # reported to the operator, who names the host
            reply = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(dumps(reply) + "\n")
        sys.stdout.flush()


def request_frame(request):
    """What the operator writes to a serving agent for one request (bootstrap.ssh.Agent)."""
    body = marshal.dumps(request, 2)  # version 2: plain values, read by every Python 3
    return b"%08x" % len(body) + body


_ESCAPES = str.maketrans({**{chr(code): f"\\u{code:04x}" for code in (*range(0x20), 0x7F)},
                          "\"": "\\\"", "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                          "\b": "\\b", "\f": "\\f"})


def dumps(value):
    """`value` (dicts, lists, tuples, strings, numbers, booleans, None) as JSON, as json.dumps writes it (ASCII
    only), without importing json."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    if isinstance(value, str):
        return json_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(dumps(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json_string(key if isinstance(key, str) else dumps(key))}: {dumps(item)}"
                               for key, item in value.items()) + "}"
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_string(text):
    text = text.translate(_ESCAPES)
    if not text.isascii():  # \uXXXX, a surrogate pair beyond the BMP; a lone surrogate as itself
        text = "".join(char if char < "\x80" else utf16_escape(ord(char)) for char in text)
    return f'"{text}"'


def utf16_escape(code):
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"


def main(argv):
    if argv[0] == "serve":
        serve(int(argv[1]) if len(argv) > 1 else 86400)
        sys.stdout.flush()
        os._exit(0)  # nothing left to tidy: skip the interpreter's teardown
    else:
        sys.stdout.write(dumps(answer(argv[0], argv[1:], sys.stdin.read)))


if __name__ == "__main__":
    main(sys.argv[1:])
