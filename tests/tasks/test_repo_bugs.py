"""The built-in repo-bugs family: every bug seeded once, graded FAIL_TO_PASS / PASS_TO_PASS by
the real pytest in a real grading sandbox: the fix scores 1, the untouched repository 0 with
exactly its fail-to-pass tests failing, an edit of the tests 0 and flagged."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tempering.reward import Grader, RewardResult
from tempering.reward.validate import validate_task
from tempering.tasks import Task
from tempering.tasks.files import FileTree
from tempering.tasks.repo_bugs import REPOS, repo_bug_from_id, repo_bugs
from tempering.tasks.task import GradingConfig, TaskConfig, TaskInfo


def fixed(task: Task) -> FileTree:
    assert task.solution is not None
    return task.workspace.overlay(dict(task.solution.files))


def failing(result: RewardResult) -> set[str]:
    return {t.id.split("[")[0] for t in result.tests if t.outcome != "passed"}


def test_every_bug_is_seeded_once_and_hides_the_tests_that_expose_it() -> None:
    tasks = repo_bugs()
    assert len(tasks) == sum(len(r.bugs) for r in REPOS) >= 10
    assert len({t.id for t in tasks}) == len(tasks)
    kinds = {b.kind for r in REPOS for b in r.bugs}
    assert kinds == {"off-by-one", "wrong default", "swapped arguments", "missed edge case",
                     "wrong exception"}
    for task in tasks:
        grading = task.config.grading
        assert grading.fail_to_pass and grading.pass_to_pass
        assert not set(grading.fail_to_pass) & set(grading.pass_to_pass)
        (bug_path,) = task.solution.files if task.solution else ()
        assert task.workspace[bug_path] != task.solution[bug_path]  # type: ignore[index]
        for test_id in grading.fail_to_pass:  # the agent never sees them
            path, name = test_id.split("::")
            assert f"def {name}(".encode() not in task.workspace[path], test_id
            assert f"def {name}(".encode() in task.tests[path.removeprefix("tests/")], test_id
        for test_id in grading.pass_to_pass:
            path, name = test_id.split("::")
            assert f"def {name}(".encode() in task.workspace[path], test_id


def test_counts_and_ids_are_checked() -> None:
    assert [t.id for t in repo_bugs(3)] == [t.id for t in repo_bugs()[:3]]
    for bad in (0, 99):
        with pytest.raises(ValueError, match=f"repo-bugs:{bad}: there are"):
            repo_bugs(bad)
    task = repo_bugs(1)[0]
    assert repo_bug_from_id(task.id).digest == task.digest
    with pytest.raises(ValueError, match="'repo-bugs/nope' is not a repo-bugs task"):
        repo_bug_from_id("repo-bugs/nope")


async def test_a_repo_bug_grades_its_fix_1_the_untouched_repo_0_and_a_test_edit_0() -> None:
    task = repo_bug_from_id("repo-bugs/ledger-refusal-exception")
    grading = task.config.grading
    async with Grader() as grader:
        solved = await grader.grade_files(task, fixed(task))
        untouched = await grader.grade_files(task, task.workspace)
        # Deleting the visible tests that would fail is an edit of the tests: dropped, flagged.
        gutted = FileTree.of({**fixed(task),
                              "tests/test_accounts.py": "def test_ok():\n    pass\n"})
        edited = await grader.grade_files(task, gutted)
    assert solved.reward == 1.0 and solved.flags == []
    assert solved.components["fail_to_pass"] == solved.components["pass_to_pass"] == 1.0
    assert untouched.reward == 0.0
    assert untouched.components["fail_to_pass"] == 0.0
    assert untouched.components["pass_to_pass"] == 1.0
    assert failing(untouched) == set(grading.fail_to_pass)
    assert edited.reward == 0.0 and "protected_edit" in edited.flags


@pytest.mark.slow
async def test_every_repo_bug_fails_exactly_its_fail_to_pass_tests() -> None:
    async with Grader(warm=2) as grader:
        for task in repo_bugs():
            solved = await grader.grade_files(task, fixed(task))
            untouched = await grader.grade_files(task, task.workspace)
            assert (solved.reward, untouched.reward) == (1.0, 0.0), task.id
            assert failing(solved) == set(), task.id
            assert failing(untouched) == set(task.config.grading.fail_to_pass), task.id


@pytest.mark.parametrize(("lists", "error"), [
    ({"fail_to_pass": ["test_a"]}, r"\['test_a'\] are not test ids"),
    ({"pass_to_pass": ["tests/t.py::a", "tests/t.py::a"]}, "lists .*more than once"),
    ({"fail_to_pass": ["other/t.py::a"]}, "are not test ids; .* tests/test_x.py::test_name"),
    ({"fail_to_pass": ["tests/t.py::a"], "pass_to_pass": ["tests/t.py::a"]},
     "in both grading.fail_to_pass and grading.pass_to_pass"),
    ({"fail_to_pass": ["tests/t.py::a"], "pass_to_pass": ["tests/t.py::a[1]", "tests/t.py::b"]},
     r"\['tests/t.py::a\[1\]'\] are in both"),
])
def test_test_lists_are_checked_when_loaded(lists: dict[str, list[str]], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        GradingConfig(**lists)  # type: ignore[arg-type]


def test_a_weight_on_an_empty_list_is_refused() -> None:
    with pytest.raises(ValueError, match="reward weight for pass_to_pass but grading"):
        TaskConfig(task=TaskInfo(id="t"), reward={"tests": 1.0, "pass_to_pass": 1.0})
    TaskConfig(task=TaskInfo(id="t"), reward={"pass_to_pass": 1.0},
               grading=GradingConfig(pass_to_pass=["tests/t.py::a"]))


@pytest.mark.slow
async def test_validate_names_lists_the_untouched_repo_contradicts() -> None:
    task = repo_bug_from_id("repo-bugs/intervals-contains-end")
    grading = task.config.grading
    wrong = GradingConfig(**(grading.model_dump() | {  # the lists swapped, one test each way
        "fail_to_pass": [grading.pass_to_pass[0]],
        "pass_to_pass": [*grading.pass_to_pass[1:], *grading.fail_to_pass]}))
    broken = replace(task, config=task.config.model_copy(update={"grading": wrong}))
    async with Grader() as grader:
        assert (await validate_task(task, grader)).ok
        problems = (await validate_task(broken, grader)).problems
    assert any(f"fail_to_pass tests already pass on the untouched workspace: "
               f"{grading.pass_to_pass[0]}" in p for p in problems), problems
    assert any(f"pass_to_pass tests do not pass on the untouched workspace (or did not run): "
               f"{grading.fail_to_pass[0]}" in p for p in problems), problems
