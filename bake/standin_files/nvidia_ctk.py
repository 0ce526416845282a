#!/usr/bin/python3
"""kiln stand-in for NVIDIA's nvidia-ctk: NOT the real NVIDIA Container Toolkit CLI.

It does the one thing kiln's container_runtime role asks of nvidia-ctk, the way the real one does it:
`nvidia-ctk runtime configure --runtime=docker [--config=PATH] [--set-as-default]` merges the nvidia runtime into
Docker's daemon.json, keeping every other key, and writes it back indented by four spaces. Everything else
(`cdi generate`, other runtimes) fails loudly: a stand-in must never pretend a GPU is there.
"""
import argparse
import json
import os
import sys

VERSION = "@VERSION@"
DOCKER_CONFIG = "/etc/docker/daemon.json"


def configure_docker(path: str, set_as_default: bool, dry_run: bool) -> int:
    config = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        if text.strip():
            config = json.loads(text)
    if not isinstance(config, dict):
        print(f"ERRO[0000] unable to load config: {path} does not hold a JSON object", file=sys.stderr)
        return 1
    config.setdefault("runtimes", {})["nvidia"] = {"args": [], "path": "nvidia-container-runtime"}
    if set_as_default:
        config["default-runtime"] = "nvidia"
    output = json.dumps(config, indent=4)
    if dry_run:
        print(output)
        return 0
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(output)
    print(f"INFO[0000] Wrote updated config to {path}", file=sys.stderr)
    print("INFO[0000] It is recommended that docker daemon be restarted.", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-ctk", description="kiln stand-in for nvidia-ctk")
    parser.add_argument("--version", "-v", action="store_true")
    commands = parser.add_subparsers(dest="command")
    runtime = commands.add_parser("runtime").add_subparsers(dest="action")
    configure = runtime.add_parser("configure")
    configure.add_argument("--runtime", default="docker")
    configure.add_argument("--config", default=None)
    configure.add_argument("--set-as-default", action="store_true")
    configure.add_argument("--dry-run", action="store_true")
    commands.add_parser("cdi").add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.version:
        print(f"NVIDIA Container Toolkit CLI version {VERSION} (kiln stand-in, not the real toolkit)")
        return 0
    if args.command == "runtime" and args.action == "configure":
        if args.runtime != "docker":
            print(f"ERRO[0000] kiln stand-in: runtime {args.runtime} is not supported", file=sys.stderr)
            return 1
        return configure_docker(args.config or DOCKER_CONFIG, args.set_as_default, args.dry_run)
    print("ERRO[0000] kiln stand-in: only `runtime configure --runtime=docker` is implemented "
          "(no GPU, no CDI)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
