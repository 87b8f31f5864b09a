"""The ``tempering`` command line: ``demo``, ``sandbox run``, ``grade``, ``tasks validate``,
``doctor``, ``reclaim``.

Each subcommand is a small function that imports what it needs when it runs, so ``--help`` and
a typo cost no backend import. Sandbox options are ``SandboxSpec`` fields: their help text is the
field's docstring and their values are validated by the model, so the command line cannot
accept what the Python API would reject. Bad input ends in one line naming the offending value
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tempering import __version__
from tempering.cli.common import EXIT_USAGE, Parser, UsageError, describe, help_of
from tempering.cli.rollout import add_rollout_command
from tempering.cli.sandbox import add_sandbox_commands
from tempering.cli.serve import add_policy_commands
from tempering.cli.tasks import add_task_commands
from tempering.cli.train import add_train_command
from tempering.cli.traj import add_traj_commands


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tempering", description="Tempering: infrastructure for post-training "
                     "LLM agents with RL in real execution environments.")
    parser.add_argument("--version", action="version", version=f"tempering {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    add_sandbox_commands(commands)

    add_task_commands(commands)
    add_traj_commands(commands)
    add_policy_commands(commands)
    add_rollout_command(commands)
    add_train_command(commands)
    parser.set_defaults(func=lambda _: help_of(parser))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, a usage error: already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    from pydantic import ValidationError

    from tempering.errors import ConfigError, TemperingError

    try:
        code: int = args.func(args)
        return code
    except ValidationError as exc:
        print(f"tempering: error: {describe(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, UsageError) as exc:
        print(f"tempering: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TemperingError as exc:
        print(f"tempering: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tempering: interrupted", file=sys.stderr)
        return 130
