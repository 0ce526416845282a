"""A task file: one run described once in YAML (resources, workdir, setup, the command and its mode, envs, the
checkpoint folder), launched again and again with `kiln launch task.yaml` or `kiln train --task task.yaml`.

`load` reads a file, checks it against SCHEMA (a JSON Schema: jsonschema's validator, the line of the field from
PyYAML's node marks) and gives the options of kiln's own flags; `merged` lays the flags given on the command line
over them. Pure but for reading the file. docs/tasks.md shows every field beside SkyPilot's and dstack's."""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from bootstrap.errors import UsageError
from bootstrap.launch import ENV_NAME, MODES, env_refusal

if TYPE_CHECKING:
    import jsonschema

_TEXT = {"type": "string", "minLength": 1}
_COUNT = {"type": "integer", "minimum": 1}
_NUMBER = {"type": "number", "minimum": 0}
_FLAG = {"type": "boolean"}
PROVIDER_PATTERN = "^(any|local|(aws|gcp|azure)(,(aws|gcp|azure))*)$"

# Under resources: what `kiln up` makes, as kiln launch's options of the same names.
RESOURCES = {
    "provider": {"type": "string", "pattern": PROVIDER_PATTERN,
                 "x-expect": "aws, gcp, azure, local, any, or clouds in order (aws,gcp)"},
    "count": _COUNT, "gpus": _TEXT, "instance_type": _TEXT, "spot": _FLAG, "max_price": _NUMBER,
    "region": _TEXT, "zone": _TEXT, "location": _TEXT, "project": _TEXT, "subscription": _TEXT, "profile": _TEXT,
    "ami": _TEXT, "image_id": _TEXT, "source_image": _TEXT, "volume": _COUNT, "ttl_hours": _NUMBER,
    "ssh_cidr": _TEXT, "user": _TEXT,
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,31}$", "x-expect": "1-32 of a-z, 0-9, '-'"},
        "resources": {"type": "object", "additionalProperties": False, "properties": RESOURCES},
        "image": _TEXT,
        "workdir": _TEXT,
        "python": _TEXT,
        "setup": _TEXT,
        "run": {"oneOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1}],
                "x-expect": "a command (a line, or a list of its words)"},
        "mode": {"enum": list(MODES)},
        "args": {"type": "string"},
        "envs": {"type": "object",
                 "propertyNames": {"pattern": f"^{ENV_NAME.pattern}$",
                                   "x-expect": "a variable name (letters, digits, _)"},
                 "additionalProperties": {"type": ["string", "number"],
                                          "x-expect": "a string or a number (quote true and false)"}},
        "checkpoint_dir": _TEXT,
        "timeout": _NUMBER,
        "managed": _FLAG,
        "max_recoveries": {"type": "integer", "minimum": 0},
    },
}
# A field's flag where the names differ (the rest: resources.X is --X, X is --X).
FLAG_OF = {"workdir": "code", "envs": "env"}


@dataclass(frozen=True)
class Task:
    """A task file as kiln's options: `options` by the flag's parameter name (code, provider, env, ...), the run's
    command as words (empty: kiln's reference trainer), the setup script."""

    path: Path
    options: Mapping[str, Any] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    setup: str | None = None


def load(path: str | Path) -> Task:
    """The task file at `path`, checked; a UsageError naming the file, the line and the field otherwise."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise UsageError(f"{path}: {error.strerror or error}") from None
    return parse(text, path)


def parse(text: str, path: Path) -> Task:
    try:
        loader = yaml.SafeLoader(text)  # one parse: the nodes (their lines) and the data made from them
        try:
            root = loader.get_single_node()
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UsageError(f"{path}{where}: not YAML ({getattr(error, 'problem', None) or error})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a task file is a mapping of fields ({', '.join(SCHEMA['properties'])})")
    import jsonschema  # here: a tenth of a second that every other kiln command would pay at its start

    lines = field_lines(root)
    errors = list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(data))
    if errors:
        first = min(errors, key=lambda error: (line_of(error, lines), jsonschema.exceptions.relevance(error)))
        raise UsageError(f"{path}:{line_of(first, lines)}: {describe(first)}")
    for name in data.get("envs", {}):
        if refusal := env_refusal(name):
            raise UsageError(f"{path}:{lines[('envs', name)]}: envs.{name}: {refusal}")
    return task_of(data, path)


def task_of(data: Mapping[str, Any], path: Path) -> Task:
    """The checked fields as kiln's options (pure)."""
    options: dict[str, Any] = dict(data.get("resources", {}))
    for key, value in data.items():
        if key in ("resources", "run", "setup"):
            continue
        options[FLAG_OF.get(key, key)] = value
    if "workdir" in data:  # from the task file's folder, wherever kiln is started
        options["code"] = str((path.parent / data["workdir"]).resolve())
    if "envs" in data:
        options["env"] = [f"{name}={value}" for name, value in data["envs"].items()]
    run = data.get("run")
    command = tuple(shlex.split(run) if isinstance(run, str) else run or ())
    return Task(path, options, command, data.get("setup"))


def is_task_file(name: str | None) -> bool:
    """Whether kiln launch's NAME names a task file rather than a cluster (a cluster's name has no dot)."""
    return bool(name) and str(name).endswith((".yaml", ".yml"))


def name_from(path: str | Path) -> str:
    """A cluster's name for a task file that gives none: its file name's, as a cluster may be named (pure)."""
    stem = re.sub(r"[^a-z0-9-]+", "-", Path(path).stem.lower()).strip("-")[:32].strip("-")
    return stem or "task"


def merged(task: Task, passed: Mapping[str, Any], given: Iterable[str]) -> dict[str, Any]:
    """The options a task runs with: the task file's, under the flags given on the command line (`given`, by
    parameter name); the envs of both, a flag's winning where they name the same variable."""
    given = set(given)
    options = {**passed, **{key: value for key, value in task.options.items() if key in passed and key not in given}}
    if "env" in given and "env" in task.options:
        named = {item.split("=", 1)[0] for item in passed["env"]}
        options["env"] = [item for item in task.options["env"] if item.split("=", 1)[0] not in named] + \
            list(passed["env"])
    return options


def unused(task: Task, passed: Mapping[str, Any]) -> list[str]:
    """The task file's fields a command has no flag for (kiln train makes no machines: resources)."""
    return sorted(key for key in task.options if key not in passed)


def field_lines(node: yaml.Node | None, at: tuple = ()) -> dict[tuple, int]:
    """Every field's path (keys and list indexes) to its 1-based line: a key's own line for a mapping's entries."""
    lines: dict[tuple, int] = {}
    if node is None:
        return lines
    lines.setdefault(at, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            lines[(*at, key.value)] = key.start_mark.line + 1
            lines.update({path: line for path, line in field_lines(value, (*at, key.value)).items()
                          if path != (*at, key.value)})
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines.update(field_lines(item, (*at, index)))
    return lines


def unexpected(error: jsonschema.ValidationError) -> list[str]:
    """The fields an additionalProperties error is about, in the file's order."""
    known = error.schema.get("properties", {})
    return [key for key in error.instance if key not in known]


def field_path(error: jsonschema.ValidationError) -> tuple:
    """The path of the field an error is about: a key of its own where the key is what is wrong."""
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and unexpected(error):
        return (*path, unexpected(error)[0])
    if "propertyNames" in error.absolute_schema_path:
        return (*path, error.instance)
    return path


def line_of(error: jsonschema.ValidationError, lines: Mapping[tuple, int]) -> int:
    path = field_path(error)
    while path not in lines and path:
        path = path[:-1]
    return lines.get(path, 1)


def describe(error: jsonschema.ValidationError) -> str:
    """One line on what is wrong with a field, naming it as the file does (resources.gpus)."""
    name = ".".join(str(part) for part in field_path(error)) or "the task"
    if error.validator == "additionalProperties" and unexpected(error):
        key = unexpected(error)[0]
        known = list(error.schema.get("properties", {}))
        near = difflib.get_close_matches(key, known, n=1)
        return f"{name}: no such field ({f'did you mean {near[0]}?' if near else 'known: ' + ', '.join(known)})"
    expect = error.schema.get("x-expect")
    if expect:
        return f"{name}: {error.instance!r} is not {expect}"
    if error.validator == "type":
        kinds = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        return f"{name}: {error.instance!r} is not {' or '.join(TYPE_WORDS.get(k, k) for k in kinds)}"
    if error.validator == "enum":
        return f"{name}: {error.instance!r} is not one of {', '.join(map(str, error.validator_value))}"
    if error.validator == "minimum":
        return f"{name}: {error.instance!r} is below {error.validator_value}"
    if error.validator == "minLength":
        return f"{name}: empty"
    return f"{name}: {error.message}"


TYPE_WORDS = {"string": "a string", "integer": "a whole number", "number": "a number", "boolean": "true or false",
              "object": "a mapping of fields", "array": "a list"}
