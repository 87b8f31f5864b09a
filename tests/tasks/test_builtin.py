"""The built-in switchboard family: valid tasks (the solution scores 1, the untouched workspace
0, a wrong word 0), graded for real."""

from __future__ import annotations

import pytest

from tempering.reward import Grader
from tempering.tasks.builtin import CODEBOOK, answer_path, sign_of, switchboard, switchboard_task
from tempering.tasks.files import FileTree


async def test_every_switchboard_task_grades_its_solution_1_and_a_wrong_answer_0() -> None:
    tasks = switchboard(layouts=2)
    assert len(tasks) == 2 * len(CODEBOOK) and len({t.id for t in tasks}) == len(tasks)
    async with Grader() as grader:
        for task in tasks:
            assert task.solution is not None
            solved = await grader.grade_files(task, task.solution)
            untouched = await grader.grade_files(task, task.workspace)
            sign = task.id.split("/")[1].split("-")[0]
            wrong_word = next(w for s, w in CODEBOOK.items() if s != sign)
            wrong = await grader.grade_files(task, FileTree.of(
                {**task.workspace, answer_path(sign_of(task)): wrong_word}))
            assert (solved.reward, untouched.reward, wrong.reward) == (1.0, 0.0, 0.0), task.id


def test_layouts_shuffle_the_table_and_signs_are_checked() -> None:
    tables = {switchboard_task("echo", layout).workspace["codes.txt"] for layout in range(6)}
    assert len(tables) > 1
    with pytest.raises(ValueError, match="unknown call sign 'zulu'"):
        switchboard_task("zulu")
