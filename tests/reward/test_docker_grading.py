"""Grading on the docker backend: a task whose environment is an image built from its own
recipe grades the same way, tamper checks included."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tempering.tasks import load_task

pytestmark = pytest.mark.docker
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.fixture
def docker_median(tmp_path: Path, docker_ready: None):  # type: ignore[no-untyped-def]
    root = tmp_path / "median"
    shutil.copytree(EXAMPLES / "median", root)
    (root / "environment").mkdir()
    (root / "environment" / "Dockerfile").write_text("FROM tempering/python:latest\n")
    toml = (root / "task.toml").read_text()
    (root / "task.toml").write_text(toml + '\n[sandbox]\nbackend = "docker"\n'
                                    'recipe = "environment"\nmemory_mb = 512\n')
    return load_task(root)


@pytest.mark.slow  # CI's slow half: the default run's 15 min budget
async def test_a_docker_task_grades_and_flags(docker_median, attempt) -> None:
    assert docker_median.sandbox.backend == "docker"
    assert docker_median.sandbox.recipe is not None
    assert docker_median.sandbox.recipe.endswith("/environment")
    solution = docker_median.solution["stats.py"]
    solved = await attempt(docker_median, {"stats.py": solution})
    assert solved.reward == 1.0 and solved.tests_passed == 5, (solved.flags, solved.log)
    cheat = await attempt(docker_median, {"conftest.py": "import pytest\n"})
    assert cheat.reward == 0.0 and "conftest" in cheat.flags
