"""Grading tests run an agent's files through the real grader: a real agent sandbox, a real
grading sandbox, the real launcher and pytest."""

from __future__ import annotations

from pathlib import Path

import pytest

import attempts
from tempering.tasks import Task, load_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def isolated(task: Task, isolation: str) -> Task:
    """``task`` with ``grading.isolation`` set to ``isolation``."""
    grading = task.config.grading.model_copy(update={"isolation": isolation})
    return Task(task.config.model_copy(update={"grading": grading}), task.instruction,
                task.workspace, task.tests, task.solution)


@pytest.fixture(scope="session")
def median() -> Task:
    """The median example with the tested code in the tests' process (``shared``): the
    adversarial suite is the guard's and the probe's, which tasks whose tests reach into the
    tested code rely on. ``test_boundary.py`` runs the same attacks with process isolation."""
    return isolated(load_task(EXAMPLES / "median"), "shared")


@pytest.fixture(params=["pytest", "plain"])
def task(request: pytest.FixtureRequest, median: Task) -> Task:
    """The median task under pytest, and under the plain runner (the grading zygote)."""
    if request.param == "pytest":
        return median
    grading = median.config.grading.model_copy(update={"runner": "plain"})
    return Task(median.config.model_copy(update={"grading": grading}), median.instruction,
                median.workspace, median.tests, median.solution)


@pytest.fixture
def attempt():  # type: ignore[no-untyped-def]
    """``await attempt(task, files, shell)``: grade what an agent left."""
    return attempts.attempt


async def _repelled(task: Task, stats: str, runners: tuple[str, ...], name: str,
                    *, honest_pass: str | None = "tests/test_median.py::test_empty_raises"
                    ) -> None:
    """A red team's ``stats.py`` for the median task must not beat the grader under the
    runners it targets (the others are skipped): reward 0, or no more passing than the stub
    can pass honestly (``honest_pass``, None for none), and more passing only with a flag."""
    if task.config.grading.runner not in runners:
        pytest.skip(f"{name!r} targets pytest's machinery")
    result = await attempts.attempt(task, {"stats.py": stats})
    passed = [t.id for t in result.tests if t.outcome == "passed"]
    assert result.reward == 0.0 or passed == [honest_pass], (
        result.reward, result.flags, result.details[:5], passed)
    assert result.tampered or len(passed) <= 1, (result.flags, passed)


@pytest.fixture
def repelled():  # type: ignore[no-untyped-def]
    """``await repelled(task, stats, runners, name)``: the attack does not beat the grader."""
    return _repelled
