"""A real container registry on this machine (Debian's docker-registry: distribution 2.8), standing in for a
team's registry: `make image PROVIDER=docker REGISTRY=...` pushes to it and local cluster nodes pull from it.

usage: python -m localcloud.registry ROOT [--address 127.0.0.1:0]   # serves until interrupted
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from kiln.errors import KilnError, UsageError, run_main

BINARY = "docker-registry"


def config_text(root: Path, address: str) -> str:
    """The registry's settings: blobs under root, plain HTTP on address (loopback or a private bridge: Docker
    speaks plain HTTP to 127.0.0.0/8 by itself, to others where the engine lists it as insecure), no auth."""
    settings = {"version": 0.1, "log": {"level": "warn", "accesslog": {"disabled": True}},
                "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
                "http": {"addr": address}}
    return json.dumps(settings, indent=1) + "\n"  # JSON is YAML


def check_installed() -> None:
    if not shutil.which(BINARY):
        raise UsageError(f"{BINARY} is not installed (make setup installs Debian's docker-registry)")


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v2/", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            said = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            raise KilnError(f"the registry at {url} did not start: {said[-1] if said else f'exit {process.poll()}'}")
        time.sleep(0.1)


def start(root: Path, address: str) -> tuple[subprocess.Popen, Path]:
    """Start a registry on `address` with its data under root/data (several may share it: one on loopback for
    this machine's engine, one on a bridge for nodes), detached; the process and its log."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / f"config-{address.replace(':', '-')}.yml"
    config.write_text(config_text(root, address))
    log = config.with_suffix(".log")
    with log.open("ab") as out:
        process = subprocess.Popen([BINARY, "serve", str(config)], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                   start_new_session=True)
    return process, log


@contextlib.contextmanager
def serving(root: Path, host: str = "127.0.0.1", port: int = 0, timeout: float = 30) -> Iterator[str]:
    """Run a registry with its data under root until the block ends; yield its HOST:PORT."""
    check_installed()
    address = f"{host}:{port or free_port(host)}"
    process, log = start(root, address)
    try:
        wait_ready(f"http://{address}", process, log, timeout)
        yield address
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcloud.registry", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="folder for the registry's data, settings and log")
    parser.add_argument("--address", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: a free one)")
    args = parser.parse_args(argv)

    def serve() -> None:
        host, _, port = args.address.rpartition(":")
        with serving(args.root, host, int(port)) as address:
            print(f"registry: {address}", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)

    return run_main("registry", serve)


if __name__ == "__main__":
    sys.exit(main())
