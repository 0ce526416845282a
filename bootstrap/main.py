"""The `kiln` command: Fabric's own program with kiln's tasks at the top level and the cluster executor set in
code, so `kiln -H h1,h2 train -- python train.py` works from any folder with every `fab` core flag.

Everything after the first `--` is the user's command, kept as the argv it was given (invoke would join it into
one string); the tasks read it from the config as `kiln_command`, and which of their options were given on the
command line as `kiln_given` (a task file gives the others).
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

from fabric import Config
from fabric.main import Fab
from invoke.exceptions import Exit, ParseError

from bootstrap.executor import ClusterExecutor
from bootstrap.tasks import namespace


class KilnConfig(Config):
    """Fabric's configuration, read from kiln's own files (/etc/kiln.yaml, ~/.kiln.yaml) and KILN_* variables."""

    prefix = "kiln"

    @staticmethod
    def global_defaults():
        defaults = Config.global_defaults()
        defaults["timeouts"]["connect"] = 10
        return defaults


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """(kiln's own argv, the user's command after the first `--`)."""
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1:]


HELP_FLAGS = ("--help", "-h")


def help_before_task(argv: list[str], tasks) -> list[str]:
    """`kiln up --help` as `kiln --help up`: invoke would take a --help after a task with a positional argument
    (`kiln up NAME`) as that argument's value. Core options before the task stay."""
    first = next((i for i, word in enumerate(argv) if i and word in tasks), None)
    if first is None or not any(word in HELP_FLAGS for word in argv[first + 1:]):
        return argv
    return [*argv[:first], "--help", argv[first]]


@contextmanager
def usage_errors():
    """A command line kiln cannot parse is bad input: one line, `kiln: ...`, exit 2 (invoke's own: exit 1)."""
    try:
        yield
    except ParseError as error:
        raise Exit(f"kiln: {error}", code=2) from None


def given_flags(contexts) -> dict[str, list[str]]:
    """Per task, the options given on the command line (by parameter name): a task file's fields give the rest."""
    return {context.name: sorted(argument.name.replace("-", "_") for argument in context.args.values()
                                 if argument.got_value) for context in contexts}


# Tasks whose help groups their options by the providers that take them (kiln up --help).
BY_PROVIDER = ("up", "launch")


def flag_name(flags: str) -> str:
    """The parameter name of a help line's flags: `--max-price=STRING` is max_price, `--[no-]spot` spot."""
    first = flags.split(", ")[-1].split("=")[0].removeprefix("--").removeprefix("[no-]")
    return first.replace("-", "_")


class Kiln(Fab):
    command: list[str] = []
    helping: str | None = None

    def print_task_help(self, name: str) -> None:
        self.helping = name
        try:
            super().print_task_help(name)
        finally:
            self.helping = None

    def print_columns(self, tuples) -> None:
        """A task's options; those of up and launch grouped by the providers that take them."""
        if self.helping not in BY_PROVIDER:
            return super().print_columns(tuples)
        from bootstrap import providers  # only for this help

        width = max(len(flags) for flags, _ in tuples)  # one column for every group
        lines = {flag_name(flags): (flags.ljust(width), said) for flags, said in tuples}
        for index, (title, names) in enumerate(providers.option_groups(list(lines))):
            if index:
                print(f"{self.leading_indent}{title} only:")
            super().print_columns([lines[name] for name in names])

    def run(self, argv=None, exit: bool = True) -> None:
        own, self.command = split_command(list(sys.argv if argv is None else argv))
        super().run(help_before_task(own, self.namespace.task_names), exit=exit)

    def parse_core(self, argv) -> None:
        with usage_errors():
            super().parse_core(argv)

    def parse_tasks(self) -> None:
        with usage_errors():
            super().parse_tasks()

    def update_config(self, merge: bool = True) -> None:
        super().update_config()
        self.config["kiln_command"] = list(self.command)
        self.config["kiln_given"] = given_flags(self.tasks or [])

    def no_tasks_given(self) -> None:
        if self.command:
            raise Exit("kiln: name a task for the command, e.g. `kiln -H h1,h2 train -- python train.py` "
                       "(see kiln --list)", code=2)
        super().no_tasks_given()


def kiln_version() -> str:
    try:
        return version("kiln")
    except PackageNotFoundError:
        return "unknown"


def make_program() -> Kiln:
    return Kiln(name="kiln", binary="kiln", version=kiln_version(), namespace=namespace(flat=True),
                executor_class=ClusterExecutor, config_class=KilnConfig)


def main() -> None:
    # Ctrl-C stops what kiln waits on (a run's watch, tensorboard's forward) even where kiln was started with
    # SIGINT ignored (a background job of a script inherits that, and Python then keeps it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    make_program().run()


if __name__ == "__main__":
    main()
