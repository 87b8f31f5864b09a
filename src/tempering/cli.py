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
import asyncio
import sys
import textwrap
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from tempering import __version__

if TYPE_CHECKING:
    from pydantic import ValidationError

    from tempering.sandbox import ExecResult, SandboxSpec

EXIT_USAGE = 2
EXIT_TIMEOUT = 124
EXIT_SANDBOX_FAILED = 125

# SandboxSpec field -> (option, type, metavar); the help text comes from the field's docstring.
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


class _Formatter(argparse.HelpFormatter):
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


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
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
def _spec_docs() -> dict[str, str]:
    """Each SandboxSpec field's docstring (pydantic keeps them as descriptions), on one line."""
    from tempering.sandbox.spec import SandboxSpec

    return {name: " ".join(f.description.replace("``", "").split())
            for name, f in SandboxSpec.model_fields.items() if f.description}


def _add_spec_options(parser: argparse.ArgumentParser, fields: Sequence[str],
                      overrides: dict[str, str] | None = None) -> None:
    from tempering.sandbox.spec import SandboxSpec

    for field in fields:
        option, kind, metavar = SPEC_OPTIONS[field]
        default = SandboxSpec.model_fields[field].default
        text = (overrides or {}).get(field) or _spec_docs().get(field, "")
        text = text.replace("%", "%%")
        parser.add_argument(option, dest=field, type=kind, metavar=metavar,
                            help=f"{text} (default: {default})")


def _spec(args: argparse.Namespace) -> SandboxSpec:
    """The SandboxSpec the options ask for (raises pydantic's ValidationError if invalid)."""
    from tempering.sandbox.spec import SandboxSpec

    values = {f: getattr(args, f) for f in [*SPEC_OPTIONS, "network"] if hasattr(args, f)}
    return SandboxSpec(**{k: v for k, v in values.items() if v is not None})


def _describe(exc: ValidationError) -> str:
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


# ---- subcommands ----

def _cmd_demo(args: argparse.Namespace) -> int:
    from tempering.demo import run_demo

    summary = asyncio.run(run_demo(args.episodes, args.concurrency, _spec(args)))
    return 0 if summary.ok else 1


def _cmd_sandbox_run(args: argparse.Namespace) -> int:
    from tempering.errors import SandboxError

    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not argv:
        raise UsageError("give the command to run after `--`, e.g. "
                          "`tempering sandbox run -- python3 -c 'print(1)'`")
    spec = _spec(args)

    async def run() -> ExecResult:
        from tempering.sandbox import open_sandbox

        async with open_sandbox(spec) as sandbox:
            return await sandbox.exec(argv)

    try:
        result = asyncio.run(run())
    except SandboxError as exc:
        print(f"tempering: error: {exc}", file=sys.stderr)
        return EXIT_SANDBOX_FAILED
    sys.stdout.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.write(result.stderr)
    if result.truncated:
        print(f"tempering: output exceeded {spec.output_limit_bytes} bytes per stream; "
              "the middle was dropped", file=sys.stderr)
    if result.oom_killed:
        print(f"tempering: killed for exceeding --memory-mb {spec.memory_mb}", file=sys.stderr)
    if result.timed_out:
        print(f"tempering: timed out after {spec.timeout_s:g} s (--timeout); killed",
              file=sys.stderr)
        return EXIT_TIMEOUT
    if result.exit_code is None:
        return EXIT_SANDBOX_FAILED
    return 128 - result.exit_code if result.exit_code < 0 else result.exit_code


def _cmd_doctor(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tempering.sandbox.doctor import doctor_checks

    rows = asyncio.run(doctor_checks())
    table = Table(title="Local sandbox backend on this host", title_justify="left")
    for name in ("check", "", "details"):
        table.add_column(name)
    for name, passed, detail in rows:
        mark = "[dim]–" if passed is None else "[green]✓" if passed else "[red]✗"
        table.add_row(name, mark, detail if passed is not False else f"[red]{detail}")
    console = Console()
    console.print(table)
    failed = sum(passed is False for _, passed, _ in rows)
    console.print("[bold green]✓ ready" if not failed else
                  f"[bold red]✗ {failed} check(s) failed; apply the fix shown and run again")
    return 1 if failed else 0


def _cmd_image_build(args: argparse.Namespace) -> int:
    import time

    from tempering.sandbox.image import build_default_image, build_recipe

    start = time.perf_counter()
    if args.recipe is not None:
        ref = asyncio.run(build_recipe(args.recipe, args.tag, force=args.force))
    else:
        ref = asyncio.run(build_default_image(force=args.force))
    print(ref)
    print(f"ready in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


def _cmd_reclaim(args: argparse.Namespace) -> int:
    from tempering.errors import SandboxUnavailableError
    from tempering.sandbox.docker import DockerSandbox
    from tempering.sandbox.local import LocalSandbox

    removed = LocalSandbox.reclaim()
    print(f"cleaned up {removed} sandbox(es) left by crashed tempering processes")
    try:
        containers = DockerSandbox.reclaim()
    except SandboxUnavailableError:
        return 0  # no engine here: nothing of the docker backend to clean
    print(f"removed {containers} container(s) left by crashed tempering processes")
    return 0


# ---- parser ----

_DEMO_EPILOG = """\
examples:
  tempering demo
  tempering demo --episodes 1000 --concurrency 64 --memory-mb 256 --cpus 0.5

Every 25th episode misbehaves on purpose (eats memory, loops forever, floods stdout); it counts
as expected when the sandbox reports oom, timeout or truncated. Exit status 0 iff every episode
had its expected outcome.
"""

_RUN_EPILOG = """\
examples:
  tempering sandbox run -- echo hi
  tempering sandbox run --memory-mb 256 --timeout 5 -- python3 -c 'print(2 + 2)'
  tempering sandbox run --network -- getent hosts example.com
  tempering sandbox run -- sh -c 'nproc; ulimit -a | head -3'

Prints the command's stdout and stderr once it ends. Exit status: the command's own; 124 on
timeout; 128+N when killed by signal N (137: killed, e.g. out of memory); 125 when the sandbox
itself failed.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tempering", description="Tempering: infrastructure for post-training "
                     "LLM agents with RL in real execution environments.")
    parser.add_argument("--version", action="version", version=f"tempering {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="run many short episodes through a sandbox pool and report latencies",
        description="Run episodes through a SandboxPool: allocate a sandbox, run a small Python "
                    "program, check its output, release; then print latency percentiles and "
                    "outcomes.", epilog=_DEMO_EPILOG)
    demo.add_argument("--episodes", type=positive_int, default=300, metavar="N",
                      help="episodes to run (default: 300)")
    demo.add_argument("--concurrency", type=positive_int, default=32, metavar="C",
                      help="episodes in flight at once, and the pool's max_instances "
                           "(default: 32)")
    _add_spec_options(demo, ["memory_mb", "cpus", "storage"])
    demo.set_defaults(func=_cmd_demo)

    sandbox_commands = command_group(commands, "sandbox", "work with single sandboxes")
    run = sandbox_commands.add_parser(
        "run", help="run one command in a fresh sandbox",
        description="Run one command in a fresh sandbox and remove the sandbox afterwards. The "
                    "command runs directly, not through a shell: use `sh -c '...'` for pipes.",
        epilog=_RUN_EPILOG)
    _add_spec_options(run, ["backend", "image", "memory_mb", "cpus", "pids", "disk_mb",
                            "storage"])
    run.add_argument("--network", action="store_true", default=None,
                     help=_spec_docs().get("network", "egress of its own, not this host's"))
    _add_spec_options(run, ["timeout_s"], overrides={
        "timeout_s": "Wall-clock limit of the command; past it, everything it started is killed "
                     "and the exit status is 124."})
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...",
                     help="the command and its arguments")
    run.set_defaults(func=_cmd_sandbox_run)

    doctor = commands.add_parser(
        "doctor", help="check that this host can run local sandboxes",
        description="Check this host for the local sandbox backend: bubblewrap, root, user "
                    "namespaces and cgroups, then start a sandbox and run python3 and pytest in "
                    "it. Prints each check with the fix for any that fails; exit status 1 if any "
                    "fails.")
    doctor.set_defaults(func=_cmd_doctor)

    reclaim = commands.add_parser(
        "reclaim", help="remove what crashed tempering processes left behind",
        description="Remove what crashed tempering processes left behind: the cgroups of "
                    "their sandboxes, and any process still in them, their volumes, and (where "
                    "a Docker engine answers) their containers. Prints how many sandboxes and "
                    "containers were removed. Safe while other tempering processes run: only "
                    "dead owners' leftovers are touched.")
    reclaim.set_defaults(func=_cmd_reclaim)
    image_commands = command_group(commands, "image", "build the docker backend's images")
    build = image_commands.add_parser(
        "build", help="build the default image (Python 3 with pytest) from this host's packages",
        description="Build the docker backend's default image, tempering/python:<digest> (also "
                    "tagged latest), from this host's installed Debian packages: the dependency "
                    "closure of python3, python3-pytest, a shell and the usual tools, with an "
                    "unprivileged user (uid 1000). Nothing is pulled. Cached: when the image "
                    "for the installed package versions exists, nothing is done. Prints the "
                    "image reference.")
    build.add_argument("--recipe", type=Path, metavar="DIR",
                       help="build a task's own image from DIR/Dockerfile, which starts FROM a "
                            "local image (tempering/python:latest, say); nothing is pulled")
    build.add_argument("--tag", metavar="NAME",
                       help="tag for --recipe (default: tempering/task:<digest of DIR>)")
    build.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    build.set_defaults(func=_cmd_image_build)

    from tempering.agent.commands import add_rollout_command
    from tempering.policy.commands import add_policy_commands
    from tempering.tasks.commands import add_task_commands
    from tempering.train.commands import add_train_command
    from tempering.trajectory.commands import add_traj_commands

    add_task_commands(commands)
    add_traj_commands(commands)
    add_policy_commands(commands)
    add_rollout_command(commands)
    add_train_command(commands)
    parser.set_defaults(func=lambda _: help_of(parser))
    return parser


def command_group(commands: Any, name: str, summary: str) -> Any:
    """A command with subcommands (``tempering NAME COMMAND``); alone, it prints its help."""
    group = commands.add_parser(name, help=summary, description=f"{summary[0].upper()}"
                                f"{summary[1:]}.")
    group.set_defaults(func=lambda _: help_of(group))
    return group.add_subparsers(dest=f"{name}_command", metavar="COMMAND")


def help_of(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


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
        print(f"tempering: error: {_describe(exc)}", file=sys.stderr)
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


if __name__ == "__main__":
    raise SystemExit(main())
