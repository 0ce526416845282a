"""Provisioning a running machine with the bake's playbooks, outside Packer: a local VM over its own ssh
config (tests, bench/local_bake.py), and reading the PLAY RECAP of the run."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import ansible_mitogen

from kiln import proc
from kiln.paths import PROJECT

ANSIBLE = PROJECT / "ansible"
VM_ADDRESS_OF_HOST = "10.0.2.2"  # this machine, as qemu's user-mode network shows it to a VM


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@contextlib.contextmanager
def served(folder: Path) -> Iterator[int]:
    """Serve a folder read-only on 127.0.0.1 from a thread (a VM reaches it at 10.0.2.2); yield the port."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def mitogen_strategy() -> dict[str, str]:
    """Ansible's settings for Mitogen's linear strategy: the same tasks, in the same order, with the same modules,
    run by one Python interpreter Mitogen starts on the host and keeps for the whole play, in place of a new
    interpreter (and the module's zip unpacked again) for every task. Under TCG a VM's Python starts in seconds,
    and the playbook's 50 tasks on a baked image took 215 s against 456 s by Ansible's own strategy."""
    return {"ANSIBLE_STRATEGY_PLUGINS": str(Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"),
            "ANSIBLE_STRATEGY": "mitogen_linear"}


def playbook(ssh_config: Path, play: Path, *extra: str, host: str = "kiln-vm",
             timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """ansible-playbook (this virtual environment's) against one host over its own ssh config, by Mitogen's
    strategy (mitogen_strategy), every connection through one shared ssh master: a handshake with a VM under TCG
    costs seconds."""
    ssh_args = f"-F {ssh_config} -o ControlMaster=auto -o ControlPersist=60s"
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "ANSIBLE_SSH_ARGS": ssh_args,
           **mitogen_strategy()}
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", f"{host},", *extra, str(play)]
    return proc.run(argv, timeout=timeout, check=False, env=env, cwd=PROJECT)


def recap(output: str, host: str = "kiln-vm") -> dict[str, int]:
    """The PLAY RECAP counters (ok, changed, failed, ...) of one host; {} when the output has none."""
    match = re.search(rf"{re.escape(host)}\s*:\s*(.*)", output.split("PLAY RECAP")[-1]) if "PLAY RECAP" in output \
        else None
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))} if match else {}


def wheelhouse(matrix: Path | None = None) -> Path:
    """The wheelhouse folder scripts/wheelhouse builds (or finds cached), with a matrix file's pins where given."""
    argv = [str(PROJECT / "scripts" / "wheelhouse"), "build", "--print", *(["--matrix", str(matrix)] if matrix else [])]
    built = proc.run(argv, timeout=1800, cwd=PROJECT)
    return Path(built.stdout.strip().splitlines()[-1])
