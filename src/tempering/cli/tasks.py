"""``tempering grade`` and ``tempering tasks validate``: the command line of tasks and rewards."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tempering.cli.common import command_group, positive_float, positive_int
from tempering.errors import ConfigError

if TYPE_CHECKING:
    from tempering.reward import RewardResult


def _cmd_grade(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from tempering.reward import Grader
    from tempering.reward.report import render
    from tempering.tasks import FileTree, Limits, load_task

    task = load_task(args.task_dir)
    if not args.workspace.is_dir():
        raise ConfigError(f"--workspace {args.workspace}: not a directory")

    # The limits a grading reads an agent's sandbox with: what is taken fits the grading sandbox.
    files = FileTree.read(args.workspace, Limits().fitting(task.sandbox))
    if args.overlay:  # DIR holds only the files that differ from the task's workspace
        files = task.workspace.overlay(dict(files.files), dict(files.modes))

    async def run() -> RewardResult:
        async with Grader() as grader:
            return await grader.grade_files(task, files)

    result = asyncio.run(run())
    if not args.json:
        Console(stderr=True).print(render(result, f"{task.id}: {args.workspace}"))
    print(json.dumps(result.model_dump(mode="json"), indent=None if args.json else 2))
    return 0


def _cmd_tasks_validate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from tempering.reward.validate import validate_tasks
    from tempering.tasks.refs import select

    tasks = select([str(d) for d in args.dirs])
    if not tasks:
        raise ConfigError("give task directories to validate (or `humaneval[:N]`, "
                          "`repo-bugs[:N]`)")
    console = Console(stderr=True)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("validating", total=len(tasks))
        results = asyncio.run(validate_tasks(
            tasks, concurrency=args.concurrency, warm=min(args.concurrency, 8),
            on_done=lambda _: progress.advance(bar)))
    table = Table("task", "solution", "untouched", "verdict", title="task validation",
                  title_justify="left")
    for v in results:
        if args.all or not v.ok:
            table.add_row(v.task_id, f"{v.solution.reward:.3f}" if v.solution else "-",
                          f"{v.untouched.reward:.3f}" if v.untouched else "-",
                          "[green]valid" if v.ok else "[red]" + "; ".join(v.problems)[:200])
    bad = sum(not v.ok for v in results)
    if table.row_count:
        console.print(table)
    console.print(f"[bold green]{len(results)} task(s) valid" if not bad else
                  f"[bold red]{bad} of {len(results)} task(s) invalid")
    return 1 if bad else 0


def _cmd_tasks_import_swe(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tempering.tasks.swe import Imported, import_instances

    if not args.file.is_file():
        raise ConfigError(f"{args.file}: no such file of instances")
    console = Console(stderr=True)

    def said(result: Imported) -> None:
        if result.task_dir is not None:
            console.print(f"[green]imported[/] {result.instance_id} -> {result.task_dir}")
        else:
            console.print(f"[red]refused[/] line {result.line}: {result.error}",
                          highlight=False)

    results = import_instances(args.file, args.repos, args.out, timeout_s=args.timeout,
                               on_done=said)
    bad = sum(r.task_dir is None for r in results)
    console.print(f"[bold]{len(results) - bad} of {len(results)} instance(s) imported into "
                  f"{args.out}" + (f"; {bad} refused" if bad else "") +
                  ("" if bad == len(results) else
                   f"; check them with `tempering tasks validate {args.out}/*`"))
    return 1 if bad else 0


_GRADE_EPILOG = """\
examples:
  tempering grade examples/tasks/median --workspace my-attempt/
  tempering grade examples/tasks/slugify --overlay --workspace examples/tasks/slugify/solution

The workspace directory is graded like an agent's final workspace (a file of the task's
workspace missing from it counts as deleted; with --overlay, DIR holds only the files that
differ): its edits are screened, applied to a pristine copy in a fresh sandbox, and the hidden
tests run there. Prints a table (stderr) and the RewardResult as JSON (stdout); exit status 0 when a
grade was produced, whatever the reward.
"""


def add_task_commands(commands: Any) -> None:
    grade = commands.add_parser(
        "grade", help="grade a workspace directory against a task",
        description="Grade a workspace directory against a task directory, as the trainer "
                    "grades an episode: tamper screening, hidden tests in a fresh sandbox, "
                    "static analysis, rules and the task's verifiers.", epilog=_GRADE_EPILOG)
    grade.add_argument("task_dir", type=Path, metavar="TASK_DIR", help="the task directory")
    grade.add_argument("--workspace", type=Path, required=True, metavar="DIR",
                       help="the workspace to grade (the agent's files)")
    grade.add_argument("--overlay", action="store_true",
                       help="DIR holds only changed files, laid over the task's workspace")
    grade.add_argument("--json", action="store_true", help="print only the JSON, on one line")
    grade.set_defaults(func=_cmd_grade)

    task_commands = command_group(commands, "tasks", "work with task directories")
    validate = task_commands.add_parser(
        "validate", help="check that tasks are valid and can teach",
        description="Load each task (every bad field is named), then grade its reference "
                    "solution (must score 1, with no tamper flag) and its untouched workspace "
                    "(must score below 1); a task that lists fail-to-pass and pass-to-pass tests "
                    "must fail the first and pass the second untouched. `humaneval` stands for "
                    "the 164 built-in HumanEval tasks (`humaneval:N` the first N), "
                    "`repo-bugs[:N]` for the built-in repository tasks. Exit status 1 if any "
                    "task is invalid.",
        epilog="examples:\n  tempering tasks validate examples/tasks/*\n"
               "  tempering tasks validate humaneval --concurrency 8\n"
               "  tempering tasks validate repo-bugs\n")
    validate.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                          help="task directories, `humaneval[:N]` or `repo-bugs[:N]`")
    validate.add_argument("--concurrency", type=positive_int, default=4, metavar="C",
                          help="tasks validated at once (default: 4)")
    validate.add_argument("--all", action="store_true",
                          help="list every task, not only the invalid ones")
    validate.set_defaults(func=_cmd_tasks_validate)

    importers = command_group(task_commands, "import", "turn tasks of other formats into task "
                                                       "directories")
    swe = importers.add_parser(
        "swe", help="SWE-bench-style instances (JSON lines) as repository tasks",
        description="Turn SWE-bench-style instances (one JSON object per line: instance_id, "
                    "repo, base_commit, problem_statement, patch, test_patch, FAIL_TO_PASS, "
                    "PASS_TO_PASS; optional recipe or image) into task directories: the "
                    "repository at base_commit with a one-commit .git (no history to mine), "
                    "the tests directory after the test patch as the hidden tests, the gold "
                    "patch as the solution, graded resolved-or-not by FAIL_TO_PASS and "
                    "PASS_TO_PASS. An instance that cannot be carried is refused with the "
                    "reason and the others go on; exit status 1 if any was refused.",
        epilog="examples:\n  tempering tasks import swe instances.jsonl --repos repos/ "
               "--out tasks/swe\n  tempering tasks validate tasks/swe/*\n\n"
               "repositories are looked up under --repos as owner__name, owner/name or name; "
               "nothing is fetched. A task directory already under --out is replaced.")
    swe.add_argument("file", type=Path, metavar="FILE.jsonl", help="the instances")
    swe.add_argument("--repos", type=Path, required=True, metavar="DIR",
                     help="where the git repositories are")
    swe.add_argument("--out", type=Path, required=True, metavar="DIR",
                     help="where the task directories go (one per instance_id)")
    swe.add_argument("--timeout", type=positive_float, default=300.0, metavar="S",
                     help="grading.timeout_s of the tasks (default: 300)")
    swe.set_defaults(func=_cmd_tasks_import_swe)
