"""The help of every kiln task: long flags only (no `--,` or `--=INT` once invoke's short letters run out, and `-h`
stays help) but for the short flags kiln gives on purpose (KilnTask.SHORT: -v), a value shown for every option that
takes one (a repeatable one's in its help's first word), and numbers parsed as numbers."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from invoke.exceptions import ParseError
from invoke.parser import Parser

from bootstrap.tasks import KilnTask, namespace
from kiln.paths import PROJECT

NAMESPACE = namespace()
TASKS = sorted(NAMESPACE.task_names)
# Each option's help, as the first contexts made have it (invoke hands a task's help to the first only)
HELP = {context.name: {a.name: a.help or "" for a in context.args.values()} for context in NAMESPACE.to_contexts()}


def contexts():
    return {context.name: context for context in NAMESPACE.to_contexts()}


@pytest.mark.parametrize("name", TASKS)
def test_every_flag_is_a_long_name_with_its_value_shown(name):
    context = contexts()[name]
    for flags, _ in context.help_tuples():
        for flag in flags.split(", "):
            if flag in {f"-{short}" for short in KilnTask.SHORT.values()}:
                continue
            assert flag.startswith("--") and flag[2:3].isalpha(), f"{name}: broken flag {flag!r} in {flags!r}"
            assert not flag.startswith(("--=", "--,")), flags
    for argument in context.args.values():
        shown = context.help_for(f"--{argument.name.replace('_', '-')}")[0]
        said = HELP[name][argument.name]
        if argument.kind is list:  # repeatable (invoke shows no value for a list): its help starts with the value
            assert re.match(r"[A-Z][A-Z_=]*: ", said), f"{name}: --{argument.name}'s help begins {said[:30]!r}"
        elif argument.kind is not bool:
            assert "=" in shown, f"{name}: --{argument.name} takes a value but its help shows {shown!r}"


@pytest.mark.parametrize("name", TASKS)
def test_no_task_takes_h_from_help(name):
    assert "-h" not in contexts()[name].flags


def test_float_options_parse_as_numbers_and_refuse_words():
    context = contexts()["cluster.train"]
    parsed = Parser(contexts=[context]).parse_argv(["cluster.train", "--stall-factor", "2.5", "--max-restarts", "2"])
    args = parsed[0].args
    assert args["stall_factor"].value == 2.5 and args["max_restarts"].value == 2
    assert args["stall_minimum"].value == 0.0 and isinstance(args["stall_minimum"].value, float)
    assert isinstance(args["max_restarts"].value, int)
    for argv, message in ((["--stall-factor", "fast"], "--stall-factor wants a number, not 'fast'"),
                          (["--timeout", "abc"], "--timeout wants a whole number, not 'abc'"),
                          (["--max-restarts", "1.5"], "--max-restarts wants a whole number, not '1.5'"),
                          (["--timeout", "-5"], "--timeout wants a whole number of 0 or more, not '-5'"),
                          (["--stall-minimum", "nan"], "--stall-minimum wants a number of 0 or more, not 'nan'"),
                          (["--stall-minimum", "inf"], "--stall-minimum wants a number of 0 or more, not 'inf'")):
        with pytest.raises(ParseError, match=re.escape(message)):
            Parser(contexts=[contexts()["cluster.train"]]).parse_argv(["cluster.train", *argv])


def test_fab_prints_the_help_of_a_task_from_the_project():
    done = subprocess.run([sys.executable, "-m", "fabric", "--help", "cluster.train"], cwd=PROJECT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--stall-minimum=STRING" in done.stdout and "--, " not in done.stdout and "--=" not in done.stdout


def test_options_are_grouped_by_the_providers_that_take_them():
    from bootstrap.providers import option_groups

    takes = {"aws": frozenset({"ami", "region", "spot"}), "gcp": frozenset({"zone", "spot"}),
             "local": frozenset({"zone", "docker"})}
    groups = option_groups(["name", "count", "ami", "spot", "zone", "docker", "region", "gpus"], takes)
    assert groups == [("every provider", ["name", "count", "gpus"]), ("AWS and GCP", ["spot"]),
                      ("GCP and local", ["zone"]), ("AWS", ["ami", "region"]), ("local", ["docker"])]


def test_kiln_up_help_shows_each_clouds_options_under_its_name():
    from bootstrap.main import flag_name

    assert flag_name("--max-price=STRING") == "max_price" and flag_name("--[no-]spot") == "spot"
    done = subprocess.run([sys.executable, "-m", "bootstrap.main", "up", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    sections, current = {}, "every provider"
    for line in done.stdout.splitlines():
        if line.strip().endswith(" only:"):
            current = line.strip().removesuffix(" only:")
        elif line.startswith("  --"):
            sections.setdefault(current, []).append(line.split()[0].split("=")[0])
    assert "--ami" in sections["AWS"] and "--location" in sections["Azure"] and "--project" in sections["GCP"]
    assert "--docker" in sections["local"] and "--count" in sections["every provider"]
    assert "--spot" in sections["AWS, Azure and GCP"]
    assert sum(len(flags) for flags in sections.values()) == len(set().union(*sections.values()))  # each once
