"""What every command of the command line shares: its parser and help formatting, argument
types, the ``SandboxSpec`` options, and how a bad value is said (one line, exit status 2)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from pydantic import ValidationError

    from tempering.sandbox import SandboxSpec

EXIT_USAGE = 2
EXIT_TIMEOUT = 124
EXIT_SANDBOX_FAILED = 125

SPEC_OPTIONS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "memory_mb": ("--memory-mb", int, "MB"),
    "cpus": ("--cpus", float, "X"),
    "pids": ("--pids", int, "N"),
    "disk_mb": ("--disk-mb", int, "MB"),
    "timeout_s": ("--timeout", float, "S"),
    "storage": ("--storage", str, "{auto,memory,volume}"),
    "backend": ("--backend", str, "{local,docker}"),
    "image": ("--image", str, "REF"),
}


class Formatter(argparse.HelpFormatter):
    """Wraps prose paragraphs to the terminal, keeps indented lines (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in textwrap.dedent(text).strip().split("\n\n"):
            if any(line.startswith("  ") for line in para.splitlines()):
                paragraphs.append(textwrap.indent(para, indent))
            else:
                paragraphs.append(textwrap.fill(" ".join(para.split()), width,
                                                initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(paragraphs)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: say what was wrong and where help is.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class UsageError(Exception):
    """A command line that parses but cannot be run (exit status 2)."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number above 0")
    return value


@cache
def spec_docs() -> dict[str, str]:
    """Each SandboxSpec field's docstring (pydantic keeps them as descriptions), on one line."""
    from tempering.sandbox.spec import SandboxSpec

    return {name: " ".join(f.description.replace("``", "").split())
            for name, f in SandboxSpec.model_fields.items() if f.description}


def add_spec_options(parser: argparse.ArgumentParser, fields: Sequence[str],
                      overrides: dict[str, str] | None = None) -> None:
    from tempering.sandbox.spec import SandboxSpec

    for field in fields:
        option, kind, metavar = SPEC_OPTIONS[field]
        default = SandboxSpec.model_fields[field].default
        text = (overrides or {}).get(field) or spec_docs().get(field, "")
        text = text.replace("%", "%%")
        parser.add_argument(option, dest=field, type=kind, metavar=metavar,
                            help=f"{text} (default: {default})")


def spec_from(args: argparse.Namespace) -> SandboxSpec:
    """The SandboxSpec the options ask for (raises pydantic's ValidationError if invalid)."""
    from tempering.sandbox.spec import SandboxSpec

    values = {f: getattr(args, f) for f in [*SPEC_OPTIONS, "network"] if hasattr(args, f)}
    return SandboxSpec(**{k: v for k, v in values.items() if v is not None})


def describe(exc: ValidationError) -> str:
    """A pydantic ValidationError as one line in the command line's own terms."""
    parts = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"])
        option = SPEC_OPTIONS[field][0] if field in SPEC_OPTIONS else field
        message = err["msg"].removeprefix("Value error, ")
        message = f"{message[0].lower()}{message[1:]}"
        # A check across fields (no location) names its values itself.
        parts.append(f"{option} {err.get('input')}: {message}" if field else message)
    return "; ".join(parts)


def command_group(commands: Any, name: str, summary: str) -> Any:
    """A command with subcommands (``tempering NAME COMMAND``); alone, it prints its help."""
    group = commands.add_parser(name, help=summary, description=f"{summary[0].upper()}"
                                f"{summary[1:]}.")
    group.set_defaults(func=lambda _: help_of(group))
    return group.add_subparsers(dest=f"{name}_command", metavar="COMMAND")


def help_of(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE
