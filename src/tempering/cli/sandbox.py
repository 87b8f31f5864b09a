"""The commands that work with sandboxes themselves: ``demo``, ``sandbox run``, ``doctor``,
``reclaim``, ``image build``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tempering.cli.common import (
    EXIT_SANDBOX_FAILED,
    EXIT_TIMEOUT,
    UsageError,
    add_spec_options,
    command_group,
    positive_int,
    spec_docs,
    spec_from,
)

if TYPE_CHECKING:
    from tempering.sandbox import ExecResult


def add_sandbox_commands(commands: Any) -> None:
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
    add_spec_options(demo, ["memory_mb", "cpus", "storage"])
    demo.set_defaults(func=_cmd_demo)

    sandbox_commands = command_group(commands, "sandbox", "work with single sandboxes")
    run = sandbox_commands.add_parser(
        "run", help="run one command in a fresh sandbox",
        description="Run one command in a fresh sandbox and remove the sandbox afterwards. The "
                    "command runs directly, not through a shell: use `sh -c '...'` for pipes.",
        epilog=_RUN_EPILOG)
    add_spec_options(run, ["backend", "image", "memory_mb", "cpus", "pids", "disk_mb",
                            "storage"])
    run.add_argument("--network", action="store_true", default=None,
                     help=spec_docs().get("network", "egress of its own, not this host's"))
    add_spec_options(run, ["timeout_s"], overrides={
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


def _cmd_demo(args: argparse.Namespace) -> int:
    from tempering.demo import run_demo

    summary = asyncio.run(run_demo(args.episodes, args.concurrency, spec_from(args)))
    return 0 if summary.ok else 1


def _cmd_sandbox_run(args: argparse.Namespace) -> int:
    from tempering.errors import SandboxError

    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not argv:
        raise UsageError("give the command to run after `--`, e.g. "
                          "`tempering sandbox run -- python3 -c 'print(1)'`")
    spec = spec_from(args)

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

    from tempering.sandbox.docker.image import build_default_image, build_recipe

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
    from tempering.sandbox.docker.backend import DockerSandbox
    from tempering.sandbox.local.backend import LocalSandbox

    removed = LocalSandbox.reclaim()
    print(f"cleaned up {removed} sandbox(es) left by crashed tempering processes")
    try:
        containers = DockerSandbox.reclaim()
    except SandboxUnavailableError:
        return 0  # no engine here: nothing of the docker backend to clean
    print(f"removed {containers} container(s) left by crashed tempering processes")
    return 0


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
