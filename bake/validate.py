"""usage: scripts/packer-validate [--only aws|gcp|azure|local] [--packer PATH] [--templates DIR]

Static checks of packer/, with no cloud credentials: `packer fmt -check`, then `packer
validate` of each source (all four unless --only) with its vars/<provider>.pkrvars.hcl and
dummy values for the rest (a throwaway SSH key, a fingerprint, the real version matrix from
ansible/group_vars/all/versions.yml, output folders that do not exist yet).

Packer >= 1.7 validates packer/ as it is (after `packer init packer/plugins`). Packer < 1.7
(Debian's 1.6.6) validates a copy without the settings marked `# packer>=1.7` and names
them. Exits non-zero with packer's own error when a check fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bake import packer as packer_compat
from bake.matrix import labels, read_matrix
from kiln import proc
from kiln.paths import PROJECT as ROOT

TEMPLATES = ROOT / "packer"


def run(argv: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run one packer command, output captured; CHECKPOINT_DISABLE keeps it offline."""
    return proc.run(argv, cwd=cwd, env={**os.environ, "CHECKPOINT_DISABLE": "1"}, timeout=300, check=False)


def fail(message: str, result: subprocess.CompletedProcess | None = None) -> int:
    print(f"packer-validate: {message}", file=sys.stderr)
    if result is not None:
        print((result.stdout + result.stderr).strip(), file=sys.stderr)
    return 1


def ansible_playbook() -> str | None:
    beside = Path(sys.executable).with_name("ansible-playbook")  # this virtual environment's
    return str(beside) if beside.exists() else shutil.which("ansible-playbook")


def dummy_values(work: Path, ansible_dir: Path) -> dict[str, object]:
    """Values that make every source validate offline; nothing here reaches a cloud."""
    key = work / "id_ed25519"
    proc.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "packer-validate", "-f", str(key)], timeout=30)
    return {
        "fingerprint": "0123456789abcdef",
        "versions": labels(read_matrix()),
        "ansible_playbook_command": ansible_playbook(),
        "ansible_directory": str(ansible_dir),
        "output_directory": str(work / "records"),
        "local_ssh_private_key_file": str(key),
        "local_output_directory": str(work / "qemu-output"),  # 1.6.6 refuses an existing one
        "gcp_project_id": "kiln-validate",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/packer-validate", description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(packer_compat.SOURCES), help="validate one provider's source")
    parser.add_argument("--packer", default=os.environ.get("PACKER", "packer"), help="packer binary (default: packer)")
    parser.add_argument("--templates", type=Path, default=TEMPLATES, help="template folder (default: packer/)")
    args = parser.parse_args(argv)

    packer = shutil.which(args.packer)
    if packer is None:
        return fail(f"{args.packer} not found; install packer (Debian: apt-get install packer)")
    if ansible_playbook() is None:
        return fail("ansible-playbook not found (packer validate runs it); run make setup")
    version_result = run([packer, "version"])
    try:
        version = packer_compat.parse_packer_version(version_result.stdout)
    except ValueError as error:
        return fail(str(error), version_result)
    modern = packer_compat.is_modern(version)
    providers = [args.only] if args.only else list(packer_compat.SOURCES)
    print(f"packer {'.'.join(map(str, version))}: {', '.join(providers)}")

    source_dir = args.templates.resolve()
    subdirs = sorted(str(path) for path in source_dir.iterdir() if path.is_dir())
    for fmt in packer_compat.fmt_argvs(packer, str(source_dir), modern, subdirs):
        result = run(fmt)
        if result.returncode != 0:
            return fail(f"not formatted: {' '.join(fmt[1:])} (packer fmt FOLDER rewrites it)", result)
    print("fmt: clean")

    with tempfile.TemporaryDirectory(prefix="kiln-packer-validate-") as tmp:
        work = Path(tmp)
        if modern:
            templates = source_dir
            result = run([packer, "init", str(source_dir / "plugins")])
            if result.returncode != 0:
                return fail("packer init plugins/ failed", result)
        else:
            templates = work / "packer"
            stripped = packer_compat.compat_tree(source_dir, templates)
            print(f"packer < 1.7: validating a copy without {len(stripped)} setting(s) it does not know:")
            for item in stripped:
                print(f"  stripped {item}")
        var_file = work / "validate.pkrvars.hcl"
        var_file.write_text(packer_compat.pkrvars(dummy_values(work, ROOT / "ansible")))
        for provider in providers:
            var_files = [str(templates / "vars" / f"{provider}.pkrvars.hcl"), str(var_file)]
            result = run(packer_compat.validate_argv(packer, str(templates), provider, var_files))
            if result.returncode != 0:
                return fail(f"{provider}: packer validate failed", result)
            print(f"validate {provider} ({packer_compat.SOURCES[provider]}): ok")
    if not modern:
        print("note: cloud builds need packer >= 1.7 (the stripped settings are their security settings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
