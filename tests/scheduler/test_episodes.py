"""Episodes scheduled for real: real sandboxes, the real grader, the asyncio executor.

A paused episode keeps its sandbox and prefix and resumes where it stopped; a cancelled one
frees its slot at once and still leaves a stored trajectory.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tempering.agent import EpisodeConfig
from tempering.agent.jobs import episode_job
from tempering.policy.scripted import ScriptedPolicy
from tempering.reward import Grader
from tempering.scheduler import JobSpec, JobStatus, Resources, Scheduler, SchedulerConfig
from tempering.tasks import load_task
from tempering.tasks.refs import TaskRef
from tempering.trajectory.schema import Status
from tempering.trajectory.store import TrajectoryStore

MEDIAN = Path(__file__).parents[2] / "examples" / "tasks" / "median"
SOLUTION = (MEDIAN / "solution" / "stats.py").read_text()
SOLVE = [("bash", {"command": "echo step 1"}), ("bash", {"command": "echo step 2"}),
         ("bash", {"command": "echo step 3"}), ("bash", {"command": "echo step 4"}),
         ("write_file", {"path": "stats.py", "content": SOLUTION}), ("submit", {})]
DEMAND = Resources.of(sandbox=1, inference=1)


async def test_a_group_of_episodes_keeps_the_first_n(tmp_path: Path) -> None:
    task = TaskRef.of(load_task(MEDIAN))
    fast, slow = ScriptedPolicy(SOLVE), ScriptedPolicy(SOLVE, delay_s=5.0)
    async with Grader() as grader, Scheduler(Resources.of(sandbox=4, inference=4)) as s:
        with TrajectoryStore(tmp_path / "run") as store:
            specs = [JobSpec(lambda ctx, i=i, p=p: episode_job(
                ctx, task, p, grader=grader, recorder=store, group_id="g", sample_index=i),
                demand=DEMAND, family="median") for i, p in enumerate([fast, fast, slow])]
            group = await s.submit_group(specs, keep=2)
            kept = await group
            everyone = await group.results()
    assert [r.value.reward.reward for r in kept] == [1.0, 1.0]
    assert sorted(r.status for r in everyone) == [JobStatus.CANCELLED, JobStatus.DONE,
                                                  JobStatus.DONE]
    stored = {t.sample_index: t for t in TrajectoryStore(tmp_path / "run").read()}
    assert stored[2].status == Status.INFRA_ERROR  # the cancelled one is still on record
    assert stored[2].error == "cancelled by the scheduler"


async def test_a_straggling_episode_pauses_keeps_its_sandbox_and_resumes(tmp_path: Path) -> None:
    task = TaskRef.of(load_task(MEDIAN))
    slow = ScriptedPolicy(SOLVE, delay_s=0.1)
    config = SchedulerConfig(stragglers="pause", pause_grace_s=5.0)
    async with Grader() as grader, Scheduler(Resources.of(sandbox=2, inference=1),
                                             config=config) as s:
        straggler = await s.submit(JobSpec(
            lambda ctx: episode_job(ctx, task, slow, grader=grader,
                                    config=EpisodeConfig(max_turns=10)),
            demand=DEMAND, deadline_s=0.25))
        other = await s.submit(JobSpec(
            lambda ctx: episode_job(ctx, task, ScriptedPolicy(SOLVE), grader=grader),
            demand=DEMAND))
        for _ in range(1000):
            if straggler.paused:
                break
            await asyncio.sleep(0.01)
        assert s.used["sandbox"] == 2 and other.status is JobStatus.RUNNING
        first, second = await straggler, await other
        pauses = s.metrics().pauses
    trajectory = first.value
    assert first.status is JobStatus.DONE and pauses >= 1
    assert trajectory.status == Status.OK and trajectory.reward.reward == 1.0
    assert [s.observation.strip() for s in trajectory.steps[:4]] == [
        "step 1", "step 2", "step 3", "step 4"]  # one episode, one sandbox, no step redone
    assert second.value.reward.reward == 1.0


async def test_cancelling_an_episode_frees_its_slot_and_records_it(tmp_path: Path) -> None:
    task = TaskRef.of(load_task(MEDIAN))
    async with Grader() as grader, Scheduler(Resources.of(sandbox=1, inference=1)) as s:
        with TrajectoryStore(tmp_path / "run") as store:
            stuck = await s.submit(JobSpec(lambda ctx: episode_job(
                ctx, task, ScriptedPolicy([("bash", {"command": "sleep 60"})]),
                grader=grader, recorder=store), demand=DEMAND))
            waiting = await s.submit(JobSpec(lambda ctx: episode_job(
                ctx, task, ScriptedPolicy(SOLVE), grader=grader, recorder=store),
                demand=DEMAND))
            await asyncio.sleep(0.5)
            stuck.cancel()
            done = await asyncio.wait_for(waiting.result(), 30)
    assert done.status is JobStatus.DONE and done.value.reward.reward == 1.0
    statuses = sorted(str(t.status) for t in TrajectoryStore(tmp_path / "run").read())
    assert statuses == ["infra_error", "ok"]
