"""Episodes on the docker backend: the same loop, tools and branching on a real engine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tempering.agent import run_branches, run_episode
from tempering.policy.scripted import ScriptedPolicy
from tempering.reward import Grader
from tempering.tasks import load_task
from tempering.tasks.task import Task
from tempering.trajectory.schema import Status

pytestmark = pytest.mark.docker
MEDIAN = Path(__file__).parents[2] / "examples" / "tasks" / "median"
SOLUTION = (MEDIAN / "solution" / "stats.py").read_text()


@pytest.fixture
def docker_task(tmp_path: Path, docker_ready: None) -> Task:
    root = tmp_path / "median"
    shutil.copytree(MEDIAN, root)
    with (root / "task.toml").open("a") as f:
        f.write('\n[sandbox]\nbackend = "docker"\nmemory_mb = 512\n')
    return load_task(root)


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow): the default run keeps
# under 15 minutes
async def test_an_episode_and_its_branches_run_on_docker(docker_task: Task) -> None:
    assert docker_task.sandbox.backend == "docker"
    solve = [("bash", {"command": "cd /tmp && export WHERE=docker"}),
             ("bash", {"command": "pwd; echo $WHERE"}),
             ("write_file", {"path": "stats.py", "content": SOLUTION}), ("submit", {})]
    async with Grader() as grader:
        trajectory = await run_episode(docker_task, ScriptedPolicy(solve), grader=grader)
        assert trajectory.status == Status.OK, trajectory.error
        assert trajectory.reward is not None and trajectory.reward.reward == 1.0
        assert trajectory.steps[1].observation.split() == ["/tmp", "docker"]
        siblings = await run_branches(docker_task, ScriptedPolicy(solve), at=1, n=2,
                                      grader=grader)
    assert [t.status for t in siblings] == [Status.OK, Status.OK]
    assert all(t.steps[1].observation.split() == ["/tmp", "docker"] for t in siblings)
    assert all(t.reward is not None and t.reward.reward == 1.0 for t in siblings)
