"""usage: scripts/vm boot --disk D --kernel K --initrd I --state DIR [--snapshot] [--memory MiB] [--cpus N]
                  [--hostname H] [--authorize PUBKEY_FILE]... [--append CMDLINE] [--data-gib N] [--timeout S]
       scripts/vm ssh --state DIR [-- CMD...]
       scripts/vm stop --state DIR [--timeout S]
       scripts/vm status --state DIR

Boot a kiln image as a local VM, the way a cloud boots an instance: qemu (TCG, -cpu max, direct kernel boot),
a NoCloud seed carrying a per-boot ed25519 key for root and a fresh instance-id, SSH forwarded from a free
127.0.0.1 port. `boot` returns once SSH answers with the host key cloud-init printed on the serial console,
pinned in DIR/known_hosts; DIR/ssh_config (host kiln-vm) logs in with host keys checked. `ssh` runs CMD (joined
by ssh as usual) or a shell; `stop` powers off over SSH, then kills qemu (idempotent). DIR/vm.json records the VM.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bootstrap.providers.common import data_volume_file
from kiln import proc, sshwait
from kiln.errors import KilnError, UsageError, run_main
from kiln.hostkeys import console_host_keys, known_hosts_lines
from localcloud import vmspec as vmlib
from localcloud.vmspec import VmSpec

TOOLS = ("qemu-system-x86_64", "genisoimage", "ssh", "ssh-keygen")


def run(argv: list[str], timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    return proc.run(argv, timeout=timeout, check=check)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_console(spec_or_path: VmSpec | Path) -> str:
    path = spec_or_path.console if isinstance(spec_or_path, VmSpec) else spec_or_path
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def qemu_alive(pid: int, state: Path) -> bool:
    """pid is a running qemu of this state dir (not a recycled pid, not a zombie)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return str(state).encode() in cmdline and b"qemu-system" in cmdline and status.split(") ")[-1][:1] != "Z"


def kill_qemu(pid: int, state: Path, grace: float = 10) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        if not qemu_alive(pid, state):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and qemu_alive(pid, state):
            time.sleep(0.2)
    if qemu_alive(pid, state):
        raise UsageError(f"qemu (pid {pid}) survived SIGKILL")


def load_vm(state: Path) -> dict | None:
    try:
        return json.loads((state / "vm.json").read_text())
    except FileNotFoundError:
        return None


def make_seed(spec: VmSpec, public_keys: list[str], hostname: str, files: list[dict] | None = None) -> str:
    instance_id = f"kiln-{secrets.token_hex(8)}"
    seed_dir = spec.state / "seed"
    shutil.rmtree(seed_dir, ignore_errors=True)
    seed_dir.mkdir()
    (seed_dir / "meta-data").write_text(vmlib.seed_meta_data(instance_id, hostname))
    (seed_dir / "user-data").write_text(vmlib.seed_user_data(public_keys, files or ()))
    run(["genisoimage", "-quiet", "-output", str(spec.seed), "-volid", "cidata", "-joliet", "-rock",
         str(seed_dir / "user-data"), str(seed_dir / "meta-data")], timeout=60)
    return instance_id


def start_qemu(spec: VmSpec) -> tuple[VmSpec, int, list[str]]:
    """Start qemu detached; a port taken between choosing and binding it is retried with another."""
    for _ in range(5):
        spec.console.unlink(missing_ok=True)
        spec.pidfile.unlink(missing_ok=True)
        argv = vmlib.qemu_argv(spec)
        done = run(argv, timeout=60, check=False)
        if done.returncode == 0:
            return spec, int(spec.pidfile.read_text().strip()), argv
        if "host forwarding" not in done.stderr:
            raise KilnError(f"qemu did not start (exit {done.returncode}): {done.stderr.strip()}")
        spec = VmSpec(**{**spec.__dict__, "port": free_port()})
    raise KilnError("qemu could not bind a free 127.0.0.1 port for SSH after 5 tries")


def ssh_argv(state: Path, *command: str) -> list[str]:
    return ["ssh", "-F", str(state / "ssh_config"), vmlib.ALIAS, *command]


def wait_for_ssh(spec: VmSpec, pid: int, timeout: float) -> list[str]:
    """Pin the host keys cloud-init prints on the console, wait for sshd's banner, then for a key login that
    checks them; the keys."""
    deadline = time.monotonic() + timeout

    def check_alive() -> bool:
        if not qemu_alive(pid, spec.state):
            raise KilnError(f"qemu exited during boot; last lines of {spec.console}:\n"
                            f"{proc.tail(read_console(spec), 25)}")
        return True

    def timed_out(waited: str, last: str = "") -> KilnError:
        return KilnError(f"timed out after {timeout:.0f} s waiting for {waited}{f' (ssh: {last})' if last else ''}; "
                         f"last lines of {spec.console}:\n{proc.tail(read_console(spec), 25)}")

    while check_alive() and not (keys := console_host_keys(read_console(spec))):
        if time.monotonic() > deadline:
            raise timed_out("cloud-init to print the SSH host keys")
        time.sleep(2)
    (spec.state / "known_hosts").write_text("".join(known_hosts_lines(["127.0.0.1"], keys, spec.port)))
    sshwait.wait_for_ssh([("127.0.0.1", spec.port)], max(0.0, deadline - time.monotonic()),
                         alive=lambda _: check_alive())
    while check_alive():
        done = run(ssh_argv(spec.state, "true"), timeout=60, check=False)
        if done.returncode == 0:
            return keys
        last = done.stderr.strip()
        if "Host key verification failed" in last or "IDENTIFICATION HAS CHANGED" in last:
            raise KilnError(f"the VM's SSH host key differs from the one its console printed: {last}")
        if time.monotonic() > deadline:
            raise timed_out("SSH to answer with the pinned host key", last)
        time.sleep(2)
    return keys


def boot(args: argparse.Namespace) -> int:
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        raise KilnError(f"missing tools: {', '.join(missing)} (apt-get install qemu-system-x86 genisoimage "
                      "openssh-client)")
    for name in ("disk", "kernel", "initrd"):
        if not getattr(args, name).is_file():
            raise UsageError(f"--{name} {getattr(args, name)}: no such file")
    hostname = vmlib.check_hostname(args.hostname)
    state = args.state.resolve()
    for path in (args.disk, args.kernel, args.initrd, state):
        if "," in str(path.resolve()):
            raise UsageError(f"{path}: qemu option values cannot hold a ',' in a path")
    previous = load_vm(state)
    if previous and qemu_alive(previous["pid"], state):
        raise UsageError(f"a VM is already running for {state} (pid {previous['pid']}); "
                         f"scripts/vm stop --state {state}")
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in ("vm.json", "known_hosts", "id_ed25519", "id_ed25519.pub"):
        (state / stale).unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"kiln-vm@{hostname}", "-f", str(state / "id_ed25519")],
        timeout=30)
    public_keys = [(state / "id_ed25519.pub").read_text()] + [Path(p).read_text() for p in args.authorize]
    data_disk, files = None, []
    if args.data_gib:
        data_disk = state / "data.img"
        with open(data_disk, "wb") as blank:  # sparse: a fresh, never formatted volume at every boot
            blank.truncate(args.data_gib * 2**30)
        files = [data_volume_file(args.data_gib, "root")]
    spec = VmSpec(disk=args.disk.resolve(), kernel=args.kernel.resolve(), initrd=args.initrd.resolve(), state=state,
                  port=free_port(), memory=args.memory, cpus=args.cpus, snapshot=args.snapshot, append=args.append,
                  data_disk=data_disk)
    instance_id = make_seed(spec, public_keys, hostname, files)
    started = time.monotonic()
    spec, pid, argv = start_qemu(spec)
    (state / "ssh_config").write_text(vmlib.ssh_config_text(state, spec.port))
    record = {"pid": pid, "port": spec.port, "hostname": hostname, "instance_id": instance_id,
              "key": str(state / "id_ed25519"), "ssh_config": str(state / "ssh_config"),
              "known_hosts": str(state / "known_hosts"), "console": str(spec.console), "disk": str(spec.disk),
              "kernel": str(spec.kernel), "initrd": str(spec.initrd), "snapshot": spec.snapshot,
              "memory": spec.memory, "cpus": spec.cpus, "argv": argv}
    (state / "vm.json").write_text(json.dumps(record, indent=2) + "\n")
    try:
        keys = wait_for_ssh(spec, pid, args.timeout)
    except BaseException:
        kill_qemu(pid, state, grace=2)
        (state / "vm.json").unlink(missing_ok=True)
        raise
    record.update(boot_seconds=round(time.monotonic() - started, 1), host_keys=keys)
    (state / "vm.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"vm: {hostname} up in {record['boot_seconds']} s (pid {pid}, ssh 127.0.0.1:{spec.port}); log in with:",
          file=sys.stderr)
    print(shlex.join(ssh_argv(state)))
    return 0


def ssh(args: argparse.Namespace) -> int:
    state = args.state.resolve()
    if not (state / "ssh_config").is_file():
        raise KilnError(f"no VM in {state} (scripts/vm boot --state {state} ...)")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    os.execvp("ssh", ssh_argv(state, *command))


def stop(args: argparse.Namespace) -> int:
    state = args.state.resolve()
    record = load_vm(state)
    if record and qemu_alive(record["pid"], state):
        pid = record["pid"]
        try:
            run(ssh_argv(state, "systemctl", "poweroff"), timeout=30, check=False)
        except KilnError:
            pass  # the connection may hang while the guest goes down; the wait below is what counts
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and qemu_alive(pid, state):
            time.sleep(0.5)
        if qemu_alive(pid, state):
            kill_qemu(pid, state)
            print(f"vm: killed qemu (pid {pid}): no poweroff within {args.timeout:.0f} s", file=sys.stderr)
        else:
            print(f"vm: powered off (pid {pid})", file=sys.stderr)
    (state / "vm.json").unlink(missing_ok=True)
    (state / "qemu.pid").unlink(missing_ok=True)
    return 0


def status(args: argparse.Namespace) -> int:
    state = args.state.resolve()
    record = load_vm(state)
    running = bool(record and qemu_alive(record["pid"], state))
    print(json.dumps({"running": running, **(record or {})}, indent=2))
    return 0 if running else 3


@contextlib.contextmanager
def booted(image: Path, state: Path, hostname: str, *, timeout: float = 900,
           data_gib: int | None = None, cpus: int = 2) -> Iterator[Path]:
    """Boot a local image folder (its image.json names disk, kernel and initrd) on a throwaway overlay, as its own
    process with `cpus` virtual CPUs (and a blank data volume of data_gib GiB and its settings, as kiln up --volume);
    yield the VM's ssh_config (host kiln-vm, host key pinned); always stop it. The boot may take `timeout` less a
    minute (qemu under TCG on a busy machine: cloud-init alone can take minutes)."""
    record = json.loads((image / "image.json").read_text())
    vm = [sys.executable, "-m", "localcloud.vm"]
    try:
        proc.run([*vm, "boot", "--snapshot", "--state", str(state), "--hostname", hostname,
                  "--timeout", f"{max(60.0, timeout - 60):g}", "--cpus", str(cpus),
                  "--disk", str(image / record["disk"]), "--kernel", str(image / record["kernel"]),
                  "--initrd", str(image / record["initrd"]), *(["--data-gib", str(data_gib)] if data_gib else [])],
                 timeout=timeout, tail_lines=40)
        yield state / "ssh_config"
    finally:
        proc.run([*vm, "stop", "--state", str(state)], timeout=180, check=False)


def disk_format(disk: Path) -> str:
    """qcow2 or raw, as qemu-img reads the disk's header."""
    info = proc.run(["qemu-img", "info", "--output", "json", str(disk)], timeout=60)
    return json.loads(info.stdout)["format"]


@contextlib.contextmanager
def opened(disk: Path, state: Path, timeout: float = 60) -> Iterator[Path]:
    """A local image's root disk (qcow2 or raw, one ext4 filesystem, as the bake makes it) opened here as a root
    filesystem, without booting it: the disk served raw by qemu-storage-daemon (a read-only FUSE export, where a
    qcow2 needs no copy), mounted read-only from a loop device with its journal left as it is, and an overlay over
    it whose changes go to `state` and are dropped. Yields the root; always unmounted and stopped; the disk is
    never written."""
    for tool in ("qemu-img", "qemu-storage-daemon", "mount", "umount"):
        if not shutil.which(tool):
            raise KilnError(f"opening {disk} needs {tool} (make setup installs qemu-system-x86 and qemu-utils)")
    raw, lower, upper, work, root = (state / name for name in ("raw", "lower", "upper", "work", "root"))
    for folder in (lower, upper, work, root):
        folder.mkdir(parents=True, exist_ok=True)
    raw.touch()
    log = state / "storage-daemon.log"
    with log.open("ab") as out:
        daemon = subprocess.Popen(vmlib.storage_daemon_argv(disk.resolve(), disk_format(disk), raw),
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    mounted: list[Path] = []
    try:
        deadline = time.monotonic() + timeout
        while not served(raw):  # the export's file takes the empty one's place
            if daemon.poll() is not None or time.monotonic() > deadline:
                said = log.read_text(errors="replace").strip().splitlines()
                raise KilnError(f"qemu-storage-daemon did not serve {disk}: {said[-1] if said else 'no output'}")
            time.sleep(0.1)
        proc.run(["mount", "-o", "ro,noload,loop", str(raw), str(lower)], timeout=timeout)
        mounted.append(lower)
        proc.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}",
                  str(root)], timeout=timeout)
        mounted.append(root)
        yield root
    finally:
        left = [target for target in reversed(mounted) if not unmounted(target, timeout)]
        daemon.terminate()
        try:
            daemon.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=timeout)
        if os.path.ismount(raw) and not unmounted(raw, timeout):
            left.append(raw)
        if left and sys.exc_info()[0] is None:  # the caller's folder is not to be removed through them
            raise KilnError(f"could not unmount {', '.join(map(str, left))} (opened from {disk}): "
                            f"see `findmnt {left[0]}`")


def served(raw: Path) -> bool:
    """Whether qemu-storage-daemon's export has taken the place of the empty file `raw`."""
    try:
        return raw.stat().st_size > 0
    except OSError:  # the export is going (its daemon ended): not served
        return False


def unmounted(target: Path, timeout: float) -> bool:
    """Unmount `target` (lazily where it is busy); whether it is no longer a mount point."""
    if proc.run(["umount", str(target)], timeout=timeout, check=False).returncode != 0:
        proc.run(["umount", "-l", str(target)], timeout=timeout, check=False)
    return not os.path.ismount(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/vm", description=__doc__.split("\n\n")[1])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("boot", help="boot a VM detached and wait until SSH answers with a pinned host key")
    p.add_argument("--disk", type=Path, required=True, help="qcow2 (or raw) root disk, /dev/vda in the guest")
    p.add_argument("--kernel", type=Path, required=True)
    p.add_argument("--initrd", type=Path, required=True)
    p.add_argument("--state", type=Path, required=True, help="directory for the VM's key, ssh config, log, pid")
    p.add_argument("--snapshot", action="store_true", help="discard all disk changes when qemu exits")
    p.add_argument("--memory", type=int, default=4096, help="MiB (default 4096)")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--hostname", default=vmlib.ALIAS)
    p.add_argument("--authorize", action="append", default=[], metavar="PUBKEY_FILE",
                   help="also authorize this public key for root (repeatable)")
    p.add_argument("--append", default=vmlib.DEFAULT_APPEND, help="kernel command line")
    p.add_argument("--data-gib", type=int, default=0, metavar="GIB",
                   help="attach a blank data volume of GIB GiB (/dev/vdc) with its settings, as kiln up --volume")
    p.add_argument("--timeout", type=float, default=float(os.environ.get("KILN_VM_BOOT_TIMEOUT", 300)),
                   help="seconds to wait for SSH (default 300, or $KILN_VM_BOOT_TIMEOUT)")
    p.set_defaults(func=boot)
    p = sub.add_parser("ssh", help="run a command (or a shell) on the VM with its ssh config")
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=ssh)
    p = sub.add_parser("stop", help="power the VM off (bounded wait), then kill qemu; idempotent")
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for poweroff before killing qemu")
    p.set_defaults(func=stop)
    p = sub.add_parser("status", help="print vm.json with running true/false (exit 0 running, 3 not)")
    p.add_argument("--state", type=Path, required=True)
    p.set_defaults(func=status)
    args = parser.parse_args(argv)
    return run_main("vm", lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
