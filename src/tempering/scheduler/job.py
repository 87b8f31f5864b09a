"""What is scheduled: a job's description, the context it runs with, and how it ended.

A job is an async function of a ``JobContext`` plus what the scheduler needs to place it: a
resource ``demand``, a ``priority``, a ``family`` (for duration estimates) and optionally a
``group`` (over-sampling and group priority work per group). The function runs wherever the
executor puts it (this process, a Ray actor), so for Ray it must be picklable (a module-level
function or a ``functools.partial`` of one).

Partial rollouts: a long job may look at ``ctx.pause_requested`` at safe points (between turns)
and return ``Paused(state, keep=...)``; the scheduler gives back everything but ``keep`` (a paused
episode keeps its sandbox, not its inference slot) and later runs the job again with
``ctx.resume`` set to ``state``, so the prefix is never redone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tempering.scheduler.resources import Resources


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"
    """The job raised, on every attempt it was given."""
    CANCELLED = "cancelled"
    """Cancelled by the caller, or an over-sampled job whose group was already complete."""
    TIMED_OUT = "timed_out"
    """Cancelled at its deadline (from the family's estimate, or its own)."""
    LOST = "lost"
    """Its worker stopped answering (lease expired, actor died) on every attempt."""

    @property
    def final(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.PAUSED)


JobFn = Callable[["JobContext"], Awaitable[Any]]


@dataclass(frozen=True)
class JobSpec:
    """A unit of work and what placing it needs."""

    fn: JobFn
    demand: Resources = field(default_factory=lambda: Resources.of(sandbox=1))
    priority: int = 0
    """Higher runs first; equal priorities run in submission order."""
    family: str = "default"
    """Jobs of one family share a duration estimate (a task suite, an environment)."""
    group: str | None = None
    deadline_s: float | None = None
    """Cancel (or pause) after this long running; None: from the family's estimate when the
    scheduler's deadlines are on, else none."""
    max_attempts: int = 2
    """Runs allowed when a worker is lost or the job raises an infrastructure error."""
    name: str = ""


@dataclass(frozen=True)
class Paused:
    """Returned by a job that stopped at a safe point because a pause was requested."""

    state: Any
    keep: Resources = field(default_factory=Resources)
    """What the paused job goes on holding (a live sandbox, say) until it resumes."""


class JobContext:
    """Handed to a running job: who it is, and the scheduler's requests to it."""

    def __init__(self, job_id: str, attempt: int, resume: Any = None) -> None:
        self.job_id, self.attempt, self.resume = job_id, attempt, resume
        self._pause = asyncio.Event()
        self.last_heartbeat = time.monotonic()
        self.pause_listeners: list[Callable[[], None]] = []
        """Called when a pause is requested (an executor forwards it to a remote worker)."""

    @property
    def pause_requested(self) -> bool:
        """True once the scheduler asked this job to stop at its next safe point."""
        return self._pause.is_set()

    def request_pause(self) -> None:
        if not self._pause.is_set():
            self._pause.set()
            for listener in self.pause_listeners:
                listener()

    async def wait_pause(self) -> None:
        await self._pause.wait()

    def heartbeat(self) -> None:
        """Say the job is alive; with leases on, silence past the lease reclaims it."""
        self.last_heartbeat = time.monotonic()


@dataclass(frozen=True)
class JobResult:
    job_id: str
    status: JobStatus
    value: Any = None
    error: str | None = None
    attempts: int = 0
    queued_s: float = 0.0
    """Time spent waiting for resources (all attempts)."""
    run_s: float = 0.0
    """Time spent running (all attempts and resumptions)."""
    group: str | None = None
    name: str = ""
    ended_at: float = 0.0
    """``time.monotonic()`` when it ended."""


_at_worker_stop: list[Callable[[], None]] = []


def at_worker_stop(fn: Callable[[], None]) -> None:
    """Have ``fn`` run when an executor stops the worker process this job runs in, before the
    process is asked to exit: a job's process-wide resources (a trajectory store it cached and
    buffers into) are closed then, not left to interpreter exit, which a stop may cut short. In
    the scheduler's own process nothing stops the worker; ``atexit`` is the same there."""
    _at_worker_stop.append(fn)


def run_worker_stop() -> list[str]:
    """Run (once) what ``at_worker_stop`` registered, newest first; the errors as text."""
    errors = []
    while _at_worker_stop:
        fn = _at_worker_stop.pop()
        try:
            fn()
        except Exception as exc:  # one failed close must not keep the others from running
            errors.append(f"{getattr(fn, '__qualname__', fn)}: {type(exc).__name__}: {exc}")
    return errors
