"""Many episodes through the scheduler: one group per task, over-sampled, on any executor.

``run_rollouts`` submits, for every task, a group of ``samples + oversample`` episode jobs that
keeps the first ``samples`` to finish (the scheduler cancels the rest), each demanding a
sandbox slot and an inference slot, in the task's family so durations are learned per family.
With ``remote=True`` the jobs carry only references that pickle (the task's ``TaskRef``, the
policy's configuration, the run directory), so a Ray worker can resolve them itself; in
process they share the caller's task, policy, grader and store. Callers above the agent
package go through ``backends.py`` (``rollout_backend``), which knows which it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from tempering.agent.episode import EpisodeConfig
from tempering.agent.jobs import PolicyRef, episode_job
from tempering.errors import ConfigError
from tempering.scheduler import JobResult, JobSpec, JobStatus, Resources, Scheduler
from tempering.tasks.refs import TaskRef
from tempering.tasks.setup import PreparedRoot
from tempering.tasks.task import Task
from tempering.trajectory.schema import Recorder, Trajectory, new_id

EPISODE_DEMAND = Resources.of(sandbox=1, inference=1)


async def run_rollouts(tasks: Sequence[Task], policy: PolicyRef, *, scheduler: Scheduler,
                       samples: int = 1, oversample: int = 0,
                       config: EpisodeConfig | None = None, grader: Any = None,
                       recorder: Recorder | str | None = None, run_id: str = "",
                       remote: bool = False, demand: Resources = EPISODE_DEMAND,
                       priority: int = 0,
                       on_result: Callable[[JobResult], None] | None = None,
                       fork_groups: bool = True) -> list[Trajectory]:
    """Play ``samples`` kept episodes of every task; returns the kept trajectories. In process,
    with ``fork_groups``, a task's group prepares its sandbox once and each sample forks it
    (``tasks/setup.py``); on Ray each sample prepares its own."""
    if samples < 1 or oversample < 0:
        raise ConfigError(f"samples must be >= 1 and oversample >= 0, got {samples}, "
                          f"{oversample}")

    async def one_task(task: Task) -> list[Trajectory]:
        group_id = new_id()
        ref = TaskRef.of(task)
        if remote and ref.name is None:
            raise ConfigError(f"task {task.id!r} has no directory or built-in id a remote "
                              "worker could load it by")
        forked = fork_groups and not remote and samples + oversample > 1
        root = PreparedRoot(task) if forked else None
        specs = [JobSpec(partial(episode_job, task=ref, policy=policy, config=config,
                                 grader=None if remote else grader, recorder=recorder,
                                 run_id=run_id, group_id=group_id, sample_index=i,
                                 root=root),
                         demand=demand, priority=priority, family=task.family,
                         group=group_id, name=f"{task.id}#{i}")
                 for i in range(samples + oversample)]
        try:
            group = await scheduler.submit_group(specs, keep=samples, group=group_id)
            if on_result is not None:
                for handle in group.jobs:
                    handle.result_later(on_result)
            kept = await group
        finally:
            if root is not None:
                await root.close()
        return [r.value for r in kept if r.status is JobStatus.DONE]

    per_task = await asyncio.gather(*(one_task(task) for task in tasks))
    return [t for trajectories in per_task for t in trajectories]
