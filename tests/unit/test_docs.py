"""The docs hold true: every `kiln ... --dry-run` command their code blocks show runs as shown (through the `kiln`
program beside this Python, .venv/bin/kiln, as a user runs it), the README stays a five-minute read that keeps the
fresh machine's two commands, every page has a place in mkdocs.yml's nav, and every link into docs/ names a page
and a heading that are there. `make docs` checks the links between the pages themselves (strict)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
KILN = Path(sys.executable).with_name("kiln")

# Dry runs the docs show that a test machine cannot run, by a word of their command line, each with its reason.
# A command with one of these words is left out of the checked set; every entry must still match a command.
LEFT_OUT = {
    "sweep": "sweep --dry-run lists what has expired in the cloud account, so it signs in and asks the cloud even as "
             "a dry run; tests/integration/test_aws.py, test_gcp.py and test_azure.py run it against their stand-ins",
    "--by-price": "--by-price reads each cloud's prices even in a dry run (EC2's spot price history and the Price "
                  "List with credentials, Azure's Retail Prices API over the network); the tests give it the fault "
                  "hop's and the ARM stand-in's prices (test_aws.py, test_azure.py)",
}

# The user's project folder the dry runs run from: kiln's example programs, as the docs' commands name them, and
# the files the docs' examples call the user's own (a program, a list of items, a hostfile).
PROJECT_FILES = {
    "train.py": "print('your program')\n",
    "items.txt": "item-1\nitem-2\nitem-3\n",
    "hosts.txt": "h1 slots=2\nh2\nh3\n",
}


@dataclass(frozen=True)
class Shown:
    """A command as a page shows it: the page, its line, the line as written, and its words."""
    page: str
    line: int
    text: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def code_blocks(text: str) -> list[tuple[int, list[str]]]:
    """Each fenced code block of a Markdown text (indented ones in lists too): the line number of its first line
    and its lines."""
    blocks, fence, start, lines = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence is None:
            match = re.match(r"(`{3,}|~{3,})", stripped)
            if match:
                fence, start, lines = match.group(1), number + 1, []
        elif stripped == fence:
            blocks.append((start, lines))
            fence = None
        else:
            lines.append(line)
    return blocks


def shown_commands(path: Path) -> list[Shown]:
    """Every `kiln` command line of a page's code blocks (continued lines joined, comments dropped, `VAR=value`
    before it kept as its environment)."""
    page = str(path.relative_to(ROOT))
    found = []
    for start, lines in code_blocks(path.read_text()):
        index = 0
        while index < len(lines):
            number, text = start + index, lines[index].strip()
            while text.endswith("\\") and index + 1 < len(lines):
                index += 1
                text = text[:-1] + " " + lines[index].strip()
            index += 1
            if not re.match(r"(?:[A-Z_][A-Z0-9_]*=\S*\s+)*kiln\s", text):
                continue
            try:
                words = shlex.split(text, comments=True)
            except ValueError as error:
                raise ValueError(f"{page}:{number}: {text}: {error}") from None
            env = []
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                env.append(tuple(words.pop(0).split("=", 1)))
            if words and words[0] == "kiln":
                found.append(Shown(page, number, text, tuple(words), tuple(env)))
    return found


def dry_runs() -> list[Shown]:
    return [shown for path in [README, *pages()] for shown in shown_commands(path)
            if "--dry-run" in own_words(shown)]


def own_words(shown: Shown) -> tuple[str, ...]:
    """kiln's words of the command, without the user's command after `--`."""
    argv = shown.argv
    return argv[:argv.index("--")] if "--" in argv else argv


def left_out(shown: Shown) -> str | None:
    return next((word for word in LEFT_OUT if word in own_words(shown)), None)


CHECKED = [shown for shown in dry_runs() if left_out(shown) is None]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    for program in [*(ROOT / "examples").glob("*.py"), *(ROOT / "examples").glob("task-*.yaml")]:
        shutil.copy(program, folder / program.name)
    for name, text in PROJECT_FILES.items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize("shown", CHECKED, ids=str)
def test_a_dry_run_the_docs_show_runs_as_shown_and_changes_nothing(shown, project, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # A throwaway home: no one's cloud credentials, kiln's files in a folder of the test's own; and no SDK looks
    # for a machine identity at the clouds' metadata addresses.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "KILN_HOME": str(home / ".kiln"),
           "KILN_RUNS": str(home / "runs"), "AWS_EC2_METADATA_DISABLED": "true", "NO_GCE_CHECK": "True",
           **{key: os.environ[key] for key in ("PYTHONPYCACHEPREFIX", "LANG") if key in os.environ},
           **dict(shown.env)}
    result = subprocess.run([str(KILN), *shown.argv[1:]], cwd=project, env=env, capture_output=True, text=True,
                            timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{shown}: {shown.text}\n{output[-3000:]}"
    assert "Traceback" not in output, f"{shown}: {shown.text}\n{output[-3000:]}"
    assert result.stdout.strip(), f"{shown}: {shown.text} printed no plan"
    assert sorted(str(path.relative_to(home)) for path in home.rglob("*")) == [], f"{shown}: a dry run wrote files"


def test_the_docs_show_dry_runs_of_every_kind_of_task():
    tasks = {word for shown in CHECKED for word in own_words(shown) if word in ("train", "run", "up", "mesh", "check",
                                                                                  "sync")}
    assert tasks == {"train", "run", "up", "mesh", "check", "sync"}
    assert {"gcp", "azure", "local"} <= {shown.argv[shown.argv.index("--provider") + 1] for shown in CHECKED
                                          if "--provider" in shown.argv}


def test_each_dry_run_left_out_is_still_shown():
    assert {left_out(shown) for shown in dry_runs()} - {None} == set(LEFT_OUT)


def test_the_readme_is_read_in_five_minutes():
    assert len(README.read_text().splitlines()) <= 200


def test_the_readme_keeps_the_fresh_machines_two_commands():
    """CI runs the README's test command (.ci/run: make setup, then make test) on a fresh Debian machine as root."""
    text = README.read_text()
    section = text.split("## Quickstart (a fresh Debian 12 machine, as root)", 1)[1].split("\n## ", 1)[0]
    first_block = code_blocks(section)[0][1]
    commands = {line.split("#")[0].strip() for line in first_block} - {""}
    assert commands == {"make demo", "make test"}
    ci = (ROOT / ".ci/run").read_text()
    assert "\nmake setup\n" in ci and "\nmake test\n" in ci


def nav_pages(entry) -> list[str]:
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, list):
        return [page for item in entry for page in nav_pages(item)]
    if isinstance(entry, dict):
        return [page for value in entry.values() for page in nav_pages(value)]
    return []


def test_every_docs_page_is_in_the_nav_once():
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert sorted(nav) == sorted(str(path.relative_to(DOCS)) for path in pages())


def headings(path: Path) -> set[str]:
    """The anchors of a page's headings, as MkDocs makes them (Python-Markdown's toc slugify of the text)."""
    anchors, fenced = set(), False
    for line in path.read_text().splitlines():
        if re.match(r"\s*(```|~~~)", line):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            anchors.add(slugify(re.sub(r"[`*]", "", match.group(1)), "-"))
    return anchors


def repository_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    return [ROOT / name for name in listed if name.endswith((".md", ".py", ".yml", ".cfg", ".toml")) or
            name in ("Makefile", ".ci/run") or name.startswith(("scripts/", "bootstrap/shim/"))]


def test_every_link_into_the_docs_names_a_page_and_heading_that_are_there():
    """The README, docstrings, comments and messages point into docs/ by path, a heading's anchor after `#`
    (docs/environment.md#one-process-per-gpu); the pages' own links to each other make docs checks."""
    missing = []
    for path in repository_files():
        if not path.is_file() or path.is_relative_to(DOCS):
            continue
        text = path.read_text(errors="replace")
        for match in re.finditer(r"(?<![\w./-])docs/([a-z0-9_/-]+\.md)(?:#([a-z0-9_-]+))?", text):
            page, anchor = DOCS / match.group(1), match.group(2)
            if not page.is_file() or (anchor and anchor not in headings(page)):
                missing.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert missing == []
