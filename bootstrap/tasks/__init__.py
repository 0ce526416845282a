"""kiln's Fabric tasks: they parse the command line, call the launcher, and print. `namespace()` is the
`cluster` collection that fabfile.py (and any program built on Fabric) exposes.

Modules: cluster (mesh, check, sync, train, run), runs (status, logs, stop, fetch, tensorboard),
lifecycle (up, down, list, sweep, launch, gpus: AWS, GCP, Azure, or a local cluster with --provider local), queue
(a Slurm queue whose nodes kiln makes and removes).
"""

from __future__ import annotations

import functools
import math

from fabric import task
from invoke import Collection, Task
from invoke.exceptions import Exit, ParseError
from invoke.parser import Argument

from bootstrap.errors import KilnError
from kiln.proc import raise_descriptor_limit


class NumberArgument(Argument):
    """A number option (int or float). invoke shows a value only for str and int kinds (a float looked like a
    switch), so it is kept as str for the help and parsed here: a word that is no number, or a negative one (no
    option of kiln's takes one), is refused naming the option, before anything starts (invoke's own int cast
    ended in a traceback)."""

    def __init__(self, number: type = float, **kwargs):
        self.number = number
        kwargs["kind"] = str
        super().__init__(**kwargs)

    def set_value(self, value, cast: bool = True) -> None:
        if cast and isinstance(value, str):
            value = parse_number(f"--{self.name.replace('_', '-')}", value, self.number)
        super().set_value(value, cast=False)


def parse_number(option: str, text: str, number: type = float) -> int | float:
    """`text` as a number of kind `number`, 0 or more (pure); ParseError naming `option` otherwise."""
    what = "a whole number" if number is int else "a number"
    try:
        value = number(text)
    except ValueError:
        raise ParseError(f"{option} wants {what}, not {text!r}") from None
    if value < 0 or not math.isfinite(value):  # negative, NaN or infinity
        raise ParseError(f"{option} wants {what} of 0 or more, not {text!r}")
    return value


class KilnTask(Task):
    """A task whose flags are only its long names (invoke's automatic short flags run out on tasks with many
    options, giving `--,` and `--=INT`, and would take `-h` from help), and whose float options take a value."""

    def __init__(self, *args, **kwargs):
        kwargs["auto_shortflags"] = False
        super().__init__(*args, **kwargs)

    SHORT = {"verbose": "v"}  # the one short flag a task may have, as ls -v and ssh -v spell it

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        arguments = super().get_arguments(ignore_unknown_help=ignore_unknown_help)
        for argument in arguments:
            if argument.name in self.SHORT:
                argument.names = (*argument.names, self.SHORT[argument.name])
        return [NumberArgument(number=a.kind, names=tuple(a.names), default=a.default, help=a.help,
                               positional=a.positional, optional=a.optional, attr_name=a.attr_name)
                if a.kind in (int, float) else a for a in arguments]


def cluster_task(**task_kwargs):
    """A task that runs once over all hosts (see bootstrap.executor) and turns
    kiln's errors into a message and exit code, without a traceback."""
    def decorate(function):
        @functools.wraps(function)
        def wrapper(c, *args, **kwargs):
            raise_descriptor_limit()  # hundreds of nodes' connections
            try:
                return function(c, *args, **kwargs)
            except KilnError as error:
                raise Exit(f"kiln: {error}", code=error.exit_code) from None

        made = task(klass=KilnTask, **task_kwargs)(wrapper)
        made.kiln_cluster = True
        return made
    return decorate


def namespace(*, flat: bool = False) -> Collection:
    """kiln's tasks: at the top level (`kiln train`, flat) or under `cluster` (`fab cluster.train`)."""
    from bootstrap.tasks import cluster, lifecycle, runs
    from bootstrap.tasks import queue as queues

    tasks = Collection() if flat else Collection("cluster")
    for module, names in ((cluster, ("mesh_", "check", "sync", "train", "run_", "autostop", "launch_")),
                          (runs, ("status", "logs", "stop", "fetch", "tensorboard")),
                          (lifecycle, ("up", "down", "list_", "sweep", "gpus")), (queues, ("queue_", "submit"))):
        for name in names:
            tasks.add_task(getattr(module, name))
    return tasks if flat else Collection(tasks)
