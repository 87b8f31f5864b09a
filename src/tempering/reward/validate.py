"""Checking that tasks can teach: the reference solution scores 1, the untouched workspace less.

A task whose solution does not score 1 (a broken test, a missing dependency in the sandbox, a
tamper rule that the honest solution trips) would hand every episode a wrong reward, and one
whose untouched workspace already scores 1 rewards doing nothing. ``tempering tasks validate``
runs both gradings for every task, concurrently, through the real grader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tempering.errors import TemperingError
from tempering.reward import Grader, RewardResult
from tempering.reward.result import listed_cases, listed_passed
from tempering.tasks.setup import prepared
from tempering.tasks.task import Task


@dataclass(frozen=True)
class Validation:
    task_id: str
    solution: RewardResult | None
    untouched: RewardResult | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


async def validate_task(task: Task, grader: Grader) -> Validation:
    """Grade the reference solution and the untouched workspace; say what is wrong."""
    problems: list[str] = []
    solution = untouched = None
    try:
        task = await prepared(task)  # a setup step's tree is the pristine one
        untouched = await grader.grade_files(task, task.workspace)
        if task.solve is not None:
            solution, problem = await _solved_by_script(task, grader)
            problems += [problem] if problem else []
        elif task.solution is None:
            problems.append("no solution/: a task needs a reference solution to be validated")
        else:
            solution = await grader.grade_files(task, task.workspace.overlay(
                dict(task.solution.files), dict(task.solution.modes)))
    except TemperingError as exc:
        problems.append(str(exc))
    if solution is not None and (solution.reward != 1.0 or solution.tampered):
        failing = [f"{t.id} {t.outcome}" for t in solution.tests if t.outcome != "passed"]
        why = "; ".join(failing[:3] + solution.flags) or str(solution.components)
        problems.append(f"the reference solution scores {solution.reward:.3f}, not 1 ({why})")
    if untouched is not None and untouched.reward >= 1.0:
        problems.append("the untouched workspace already scores 1: the task rewards doing "
                        "nothing")
    if untouched is not None:
        problems += _listed_problems(task, untouched, solution)
    return Validation(task.id, solution, untouched, tuple(problems))


async def _solved_by_script(task: Task, grader: Grader) -> tuple[RewardResult, str]:
    """A harbor task's reference: ``solve.sh`` run in the agent's sandbox, which is then
    graded as an episode's would be."""
    from tempering.sandbox import open_sandbox
    from tempering.tasks.harbor import SOLUTION_DIR, SOLVE_TIMEOUT_S

    assert task.solve is not None
    async with open_sandbox(task.sandbox) as sb:
        await task.prepare(sb)
        await task.solve.write_into(sb, SOLUTION_DIR)
        done = await sb.exec(["bash", f"{SOLUTION_DIR}/solve.sh"], timeout=SOLVE_TIMEOUT_S)
        result = await grader.grade(task, sb)
    if done.exit_code != 0:
        return result, (f"solution/solve.sh exited with {done.exit_code}: "
                        f"{(done.stderr or done.stdout).strip()[-300:]}")
    return result, ""


def _listed_problems(task: Task, untouched: RewardResult,
                     solution: RewardResult | None) -> list[str]:
    """A SWE-bench-style task's lists: each names a hidden test (as the reference solution's
    grading collected them), every fail-to-pass test fails on the untouched workspace and
    every pass-to-pass test passes there."""
    grading, problems = task.config.grading, []
    collected = (solution or untouched).tests
    unknown = [i for i in [*grading.fail_to_pass, *grading.pass_to_pass]
               if not listed_cases(i, collected)]
    if unknown:
        problems.append(f"listed tests that no hidden test is: {', '.join(unknown[:3])} (ids "
                        "as the grader reports them, e.g. "
                        f"{collected[0].id if collected else 'tests/test_x.py::t'})")
    passing = [i for i in grading.fail_to_pass
               if i not in unknown and listed_passed(i, untouched.tests)]
    if passing:
        problems.append(f"fail_to_pass tests already pass on the untouched workspace: "
                        f"{', '.join(passing[:3])}")
    failing = [i for i in grading.pass_to_pass
               if i not in unknown and not listed_passed(i, untouched.tests)]
    if failing:
        problems.append(f"pass_to_pass tests do not pass on the untouched workspace (or did "
                        f"not run): {', '.join(failing[:3])}")
    return problems


async def validate_tasks(tasks: Sequence[Task], *, concurrency: int = 4, warm: int = 0,
                         on_done: Callable[[Validation], None] | None = None
                         ) -> list[Validation]:
    """Validate many tasks, ``concurrency`` at a time, in input order."""
    gate = asyncio.Semaphore(concurrency)
    async with Grader(warm=warm) as grader:
        async def one(task: Task) -> Validation:
            async with gate:
                result = await validate_task(task, grader)
            if on_done is not None:
                on_done(result)
            return result

        return list(await asyncio.gather(*(one(t) for t in tasks)))
