"""Packer 1.6.6 compatibility for kiln's templates (pure functions, plus one copy step).

The templates in packer/ are written for current Packer. The few settings Debian's Packer
1.6.6 does not know carry a trailing `# packer>=1.7` mark, on an attribute line or on the
line that opens a block. `strip_modern` removes exactly those: a marked line, and when that
line opens brackets ({ [ (), every line up to the one that closes them. `compat_tree` writes
such a stripped copy of a template folder, which 1.6.6 can validate (and build from: every
marked setting belongs to a cloud source).

`pkrvars` renders a variable file, so callers never quote HCL by hand.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MARK = "# packer>=1.7"
OPENERS = "{[("
CLOSERS = "}])"


class CompatError(ValueError):
    """A marked setting that cannot be removed cleanly (names file and line)."""


@dataclass(frozen=True)
class Stripped:
    """One removed setting: where it started and its name (attribute or block type)."""

    line: int  # 1-based, in the original text
    name: str


def is_marked(line: str) -> bool:
    """True when the line ends with the `# packer>=1.7` mark."""
    return line.rstrip().endswith(MARK)


def _bracket_delta(line: str, state: dict) -> int:
    """Net brackets a line opens, outside strings and comments.

    `state` carries what spans lines: open block comments, strings inside interpolations
    (a stack of 'str' / 'interp' frames) and heredoc terminators.
    """
    delta = 0
    if state.get("heredoc"):
        if line.strip() == state["heredoc"]:
            state["heredoc"] = None
        return 0
    stack: list[str] = state.setdefault("stack", [])
    i = 0
    while i < len(line):
        char, pair = line[i], line[i : i + 2]
        if state.get("block_comment"):
            if pair == "*/":
                state["block_comment"] = False
                i += 1
        elif stack and stack[-1] == "str":
            if char == "\\":
                i += 1
            elif pair in ("${", "%{"):
                stack.append("interp")
                i += 1
            elif char == '"':
                stack.pop()
        elif char == "#" or pair == "//":
            break
        elif pair == "/*":
            state["block_comment"] = True
            i += 1
        elif char == '"':
            stack.append("str")
        elif pair == "<<" and not stack:
            words = line[i + 2 :].lstrip("-").split()
            marker = words[0] if words else ""
            if marker.isidentifier():
                state["heredoc"] = marker
                return delta
        elif char in OPENERS:
            if stack:
                stack.append(char)
            else:
                delta += 1
        elif char in CLOSERS:
            if not stack:
                delta -= 1
            elif stack[-1] in OPENERS or (stack[-1] == "interp" and char == "}"):
                stack.pop()
        i += 1
    return delta


def _setting_name(line: str) -> str:
    """`imds_support = ...` -> imds_support; `metadata_options { ...` -> metadata_options."""
    head = line.strip().split("=", 1)[0].split("{", 1)[0].split()
    return head[0].strip('"') if head else ""


def strip_modern_settings(text: str, source: str = "<text>") -> tuple[str, list[Stripped]]:
    """Remove the marked settings; return the new text and what was removed."""
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    removed: list[Stripped] = []
    state: dict = {}
    depth_to_close = 0  # > 0 while inside a marked setting
    removing = False  # inside a marked setting (brackets or a heredoc still open)
    start = 0
    for number, line in enumerate(lines, start=1):
        delta = _bracket_delta(line, state)
        if removing:
            depth_to_close += delta
            removing = depth_to_close > 0 or bool(state.get("heredoc"))
            continue
        if is_marked(line):
            if delta < 0:
                raise CompatError(f"{source}:{number}: a `{MARK}` mark on a closing line; mark the opening line")
            removed.append(Stripped(number, _setting_name(line)))
            depth_to_close, start = delta, number
            removing = depth_to_close > 0 or bool(state.get("heredoc"))
            continue
        kept.append(line)
    if removing:
        raise CompatError(f"{source}:{start}: the marked setting never closes")
    return "".join(kept), removed


def strip_modern(text: str) -> str:
    """The text without its `# packer>=1.7` settings (lines and whole blocks)."""
    return strip_modern_settings(text)[0]


def compat_tree(src_dir: Path | str, dst_dir: Path | str) -> list[str]:
    """Copy a template folder to dst_dir with the marked settings stripped from every .hcl file.

    Returns what was stripped, one `FILE:LINE NAME` per setting. dst_dir must not exist.
    """
    src, dst = Path(src_dir), Path(dst_dir)
    shutil.copytree(src, dst)
    report: list[str] = []
    for path in sorted(dst.rglob("*.hcl")):
        relative = path.relative_to(dst).as_posix()
        text, removed = strip_modern_settings(path.read_text(encoding="utf-8"), relative)
        if removed:
            path.write_text(text, encoding="utf-8")
            report.extend(f"{relative}:{item.line} {item.name}" for item in removed)
    return report


def hcl_value(value: object) -> str:
    """One value in HCL syntax: strings, numbers, bools, lists and string-keyed maps."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        # JSON string escapes are HCL's; "${" and "%{" would start a template.
        return json.dumps(value).replace("${", "$${").replace("%{", "%%{")
    if isinstance(value, Mapping):
        items = ", ".join(f"{hcl_value(str(key))} = {hcl_value(item)}" for key, item in value.items())
        return "{ " + items + " }" if items else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(hcl_value(item) for item in value) + "]"
    raise TypeError(f"no HCL form for {type(value).__name__}: {value!r}")


def pkrvars(values: Mapping[str, object]) -> str:
    """A .pkrvars.hcl text that sets each variable to its value, one per line."""
    return "".join(f"{name} = {hcl_value(value)}\n" for name, value in values.items())


# --- driving packer (argv builders for scripts/packer-validate and make image) ----------

# PROVIDER (make image PROVIDER=...) -> the build's source, as `packer -only` names it.
SOURCES = {
    "aws": "amazon-ebs.gpu",
    "gcp": "googlecompute.gpu",
    "azure": "azure-arm.gpu",
    "local": "qemu.local",
    "docker": "docker.container",
}
MODERN = (1, 7, 0)


def parse_packer_version(text: str) -> tuple[int, int, int]:
    """`Packer v1.6.6` (or `1.11.2`, first line of `packer version`) -> (1, 6, 6)."""
    words = text.strip().split()
    for word in words[:3]:
        parts = word.lstrip("v").split(".")
        if len(parts) == 3 and all(part.isdigit() for part in parts):
            return int(parts[0]), int(parts[1]), int(parts[2])
    raise ValueError(f"not a packer version: {text.strip()[:80]!r}")


def is_modern(version: tuple[int, int, int]) -> bool:
    """True for a packer that knows every setting in packer/ (plugins, `# packer>=1.7` lines)."""
    return version >= MODERN


def fmt_argvs(packer: str, template_dir: str, modern: bool, subdirs: list[str]) -> list[list[str]]:
    """`packer fmt -check` for the template folder; 1.6.6 has no -recursive, so one per folder."""
    if modern:
        return [[packer, "fmt", "-check", "-recursive", template_dir]]
    return [[packer, "fmt", "-check", folder] for folder in [template_dir, *subdirs]]


def validate_argv(packer: str, template_dir: str, provider: str, var_files: list[str]) -> list[str]:
    """`packer validate` of one provider's source with its var files (later files win)."""
    var_args = [f"-var-file={path}" for path in var_files]
    return [packer, "validate", f"-only={SOURCES[provider]}", *var_args, template_dir]
