"""What the scheduler keeps per job and per group, and the handles callers hold.

A ``JobHandle`` is awaitable (it resolves to the ``JobResult``) and cancellable; a
``GroupHandle`` resolves to the results of the first ``keep`` jobs of its group to finish, in
the order they finished, once the group is complete (the rest having been cancelled).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tempering.scheduler.job import JobContext, JobResult, JobSpec, JobStatus
from tempering.scheduler.resources import Resources

if TYPE_CHECKING:
    from tempering.scheduler.scheduler import Scheduler


@dataclass(eq=False)
class Tracked:
    """One job's life in the scheduler."""

    spec: JobSpec
    id: str
    group: GroupState | None
    submitted_at: float
    status: JobStatus = JobStatus.QUEUED
    priority: int = 0
    attempts: int = 0
    reserved: Resources = field(default_factory=Resources)
    resume: Any = None
    resuming: bool = False
    """The next start resumes from ``resume`` (a paused job) rather than starting over."""
    resumed: bool = False
    """The current run is a resumption (no second deadline)."""
    ctx: JobContext | None = None
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    enqueued_at: float = 0.0
    started_at: float = 0.0
    queued_s: float = 0.0
    run_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    done: asyncio.Future[JobResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    def demand_now(self) -> Resources:
        """What starting it needs now: all of it, less what a paused job still holds."""
        return self.spec.demand - self.reserved if self.resuming else self.spec.demand

    def live_entry(self, priority: int) -> bool:
        """Whether a queue entry at ``priority`` is this job's current one: entries of jobs
        that started, ended or were re-queued at another priority are left in the heaps and
        skipped, which is cheaper than removing them."""
        return self.status is JobStatus.QUEUED and priority == self.priority


@dataclass(eq=False)
class GroupState:
    name: str
    keep: int
    members: list[Tracked] = field(default_factory=list)
    completed: int = 0
    ended: int = 0
    closed: bool = False
    boosted: bool = False


class JobHandle:
    """A submitted job: ``await handle`` for its result, ``handle.cancel()`` to stop it."""

    def __init__(self, scheduler: Scheduler, job: Tracked) -> None:
        self._scheduler, self._job = scheduler, job

    @property
    def id(self) -> str:
        return self._job.id

    @property
    def status(self) -> JobStatus:
        return self._job.status

    @property
    def paused(self) -> bool:
        """Waiting to resume from a pause (its status is queued)."""
        return self._job.resuming

    def cancel(self) -> bool:
        """Stop the job and free its resources now; False if it had already ended."""
        return self._scheduler.cancel(self._job)

    async def result(self) -> JobResult:
        return await asyncio.shield(self._job.done)

    def result_later(self, callback: Callable[[JobResult], None]) -> None:
        """Call ``callback`` with the result when the job ends (for progress displays)."""
        self._job.done.add_done_callback(lambda fut: callback(fut.result()))

    def __await__(self) -> Generator[Any, None, JobResult]:
        return self.result().__await__()


class GroupHandle:
    """A group of jobs of which the first ``keep`` to finish count."""

    def __init__(self, scheduler: Scheduler, state: GroupState, jobs: list[JobHandle]) -> None:
        self._scheduler, self._state, self.jobs = scheduler, state, jobs

    @property
    def name(self) -> str:
        return self._state.name

    async def results(self) -> list[JobResult]:
        """Every member's result, in the order they ended."""
        done = await asyncio.gather(*(job.result() for job in self.jobs))
        return sorted(done, key=lambda r: r.ended_at)

    async def kept(self) -> list[JobResult]:
        """The results that count: done ones, up to ``keep``, in the order they finished."""
        return [r for r in await self.results() if r.status is JobStatus.DONE][: self._state.keep]

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()

    def __await__(self) -> Generator[Any, None, list[JobResult]]:
        return self.kept().__await__()
