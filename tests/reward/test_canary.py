"""The canaries are named, placed and written like the hidden tests they hide among."""

from __future__ import annotations

import ast

import pytest

from tempering.reward import Grader, canary
from tempering.tasks import FileTree, Task
from tempering.tasks.humaneval import load_humaneval

MEDIAN = b"""import pytest

from stats import median


def test_odd():
    assert median([3, 1, 2]) == 2


def test_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_empty_raises():
    with pytest.raises(ValueError):
        median([])
"""


def test_canaries_sit_beside_a_hidden_file_and_borrow_its_names() -> None:
    seen = set()
    for _ in range(30):
        made = canary.make({"/w/tests/test_median.py": MEDIAN}, "/w", "tests", "")
        assert made.path.startswith("tests/test_median_") and made.path.endswith(".py")
        assert made.holds.split("_")[1] in ("odd", "even", "empty")
        assert made.breaks.startswith(("test_odd_", "test_even_"))  # mutable first asserts
        tree = ast.parse(made.text)
        names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert sorted(names) == sorted([made.holds, made.breaks])
        assert "from stats import median" in made.text  # it calls the solution as they do
        seen.add(made.path)
    assert len(seen) > 3  # the name is drawn, not fixed


def test_a_mutant_holds_no_test_class_of_any_name() -> None:
    # A TestCase named Helper is collected like any test class: kept in a mutant's file, it
    # ran a second time there, and an honest suite's canaries were reported as tampered.
    suite = MEDIAN + b"""

import unittest


class Helper(unittest.TestCase):
    def check(self, values, expected):
        self.assertEqual(median(values), expected)

    def test_helper(self):
        self.check([1, 2, 3], 2)


class Shapes:
    sides = 4
"""
    for _ in range(10):
        made = canary.make({"/w/tests/test_median.py": suite}, "/w", "tests", "")
        classes = [n.name for n in ast.parse(made.text).body if isinstance(n, ast.ClassDef)]
        assert classes == ["Shapes"], made.text


def test_the_failing_canary_is_a_mutant_that_fails_for_the_right_answer() -> None:
    made = canary.make({"/w/tests/test_median.py": MEDIAN}, "/w", "tests", "")
    scope: dict[str, object] = {}
    source = made.text.replace("import pytest\n", "").replace(
        "from stats import median", "from statistics import median")
    exec(compile(source, "canary", "exec"), scope)
    broke = False
    try:
        scope[made.breaks]()  # type: ignore[operator]
    except AssertionError:
        broke = True
    assert broke, made.text
    scope[made.holds]()  # type: ignore[operator]


def test_most_humaneval_problems_get_a_mutant_canary() -> None:
    mutants = 0
    for task in load_humaneval():
        made = canary.make({"/w/tests/test_humaneval.py": task.tests["test_humaneval.py"]},
                           "/w", "tests", "")
        ast.parse(made.text)
        mutants += "def check(" in made.text
    assert mutants >= 120  # the rest: check() does not open with a literal comparison


def test_without_hidden_python_files_the_canaries_still_come() -> None:
    made = canary.make({}, "/w", "tests", "import os\n")
    assert made.path.startswith("tests/test_") and made.holds != made.breaks
    assert "import os" in made.text


PARITY_TESTS = b"""from parity import is_even


def test_zero():
    assert is_even(0) == True


def test_one():
    assert is_even(1) == False
"""


@pytest.mark.parametrize("runner", ["pytest", "plain"])
async def test_a_wrong_answer_equal_to_the_mutant_is_a_model_failure(median: Task,
                                                                      runner: str) -> None:
    """A bool's mutant is its negation: a solution wrong on every input passes whichever
    mutant the canary is, while the test it is a mutant of fails. That is a model failure
    (reward 0, no flag), not a runner that passes failures."""
    grading = median.config.grading.model_copy(update={"runner": runner,
                                                       "expected_tests": 2})
    task = Task(median.config.model_copy(update={"grading": grading}), "parity",
                FileTree.of({"parity.py": "def is_even(n):\n    raise NotImplementedError\n"}),
                FileTree.of({"test_parity.py": PARITY_TESTS}), None)
    async with Grader() as grader:
        for _ in range(4):  # either mutant
            wrong = await grader.grade_files(task, task.workspace.overlay(
                {"parity.py": b"def is_even(n):\n    return n % 2 == 1\n"}))
            assert wrong.reward == 0.0 and wrong.flags == [], (wrong.flags, wrong.details)
            assert any(d.startswith("canary_inconclusive") for d in wrong.details)
            right = await grader.grade_files(task, task.workspace.overlay(
                {"parity.py": b"def is_even(n):\n    return n % 2 == 0\n"}))
            assert right.reward == 1.0 and right.flags == [], (right.flags, right.details)
