"""Grading tests run an agent's files through the real grader: a real agent sandbox, a real
grading sandbox, the real launcher and pytest."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from tempering.reward import Grader, RewardResult
from tempering.sandbox import open_sandbox
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


async def _attempt(task: Task, files: Mapping[str, str | bytes] | None = None,
                  shell: str | None = None, grader: Grader | None = None) -> RewardResult:
    """What an agent leaves: the task's workspace, then ``files`` written and ``shell`` run."""
    async with open_sandbox(task.sandbox) as sb:
        await task.prepare(sb)
        for path, data in (files or {}).items():
            await sb.write_file(path, data)
        if shell is not None:
            result = await sb.exec(shell)
            assert result.exit_code == 0, result.stderr
        async with Grader() if grader is None else _borrowed(grader) as g:
            return await g.grade(task, sb)


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
    return _attempt


class _borrowed:  # noqa: N801 - an async context manager that does not close the grader
    def __init__(self, grader: Grader) -> None:
        self.grader = grader

    async def __aenter__(self) -> Grader:
        return self.grader

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _repelled(task: Task, stats: str, runners: tuple[str, ...], name: str,
                    *, honest_pass: str | None = "tests/test_median.py::test_empty_raises"
                    ) -> None:
    """A red team's ``stats.py`` for the median task must not beat the grader under the
    runners it targets (the others are skipped): reward 0, or no more passing than the stub
    can pass honestly (``honest_pass``, None for none), and more passing only with a flag."""
    if task.config.grading.runner not in runners:
        pytest.skip(f"{name!r} targets pytest's machinery")
    result = await _attempt(task, {"stats.py": stats})
    passed = [t.id for t in result.tests if t.outcome == "passed"]
    assert result.reward == 0.0 or passed == [honest_pass], (
        result.reward, result.flags, result.details[:5], passed)
    assert result.tampered or len(passed) <= 1, (result.flags, passed)


@pytest.fixture
def repelled():  # type: ignore[no-untyped-def]
    """``await repelled(task, stats, runners, name)``: the attack does not beat the grader."""
    return _repelled
