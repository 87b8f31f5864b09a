"""The scheduler: admission by every scarce resource, priorities, and long-tail control.

Jobs wait in one heap per demand shape (jobs demanding the same resources queue together), so
placing a job looks at one head per shape, not at every queued job: with ten thousand queued,
a placement still costs microseconds. The best head that fits the free resources runs; a
higher-priority job that does not fit never blocks a smaller one that does (backfilling).

Long-tail control, each switch in ``SchedulerConfig`` and each measured in
``benchmarks/scheduler.py``:

- deadlines from learned estimates: a job may run ``deadline_factor`` times its family's
  ``deadline_quantile`` duration; past it, it is cancelled (``timed_out``) or paused;
- over-sampling: ``submit_group(specs, keep=n)`` starts all of them and cancels the rest once
  ``n`` are done, so a group never waits for its slowest member;
- pausing: a paused job gives back all but what it keeps (its sandbox) and resumes later from
  its state, after what was waiting;
- group priority: once a group is ``group_boost_at`` done, its remaining jobs jump the queue.

Cancelling a job frees its resources at once, before its task has finished unwinding. With
``lease_s`` set, a running job that has not heartbeaten for that long is taken as lost: its
resources are reclaimed and it runs again (``max_attempts``), or ends ``lost``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Sequence
from typing import Any

from tempering.errors import ConfigError, QueueFullError, WorkerLostError
from tempering.scheduler.config import SchedulerConfig
from tempering.scheduler.estimates import DurationEstimator
from tempering.scheduler.executor import AsyncioExecutor, Executor
from tempering.scheduler.handles import GroupHandle, GroupState, JobHandle, Tracked
from tempering.scheduler.job import JobContext, JobResult, JobSpec, JobStatus, Paused
from tempering.scheduler.metrics import Metrics, SchedulerMetrics
from tempering.scheduler.resources import Resources


class Scheduler:
    """Places jobs on an executor within a capacity; see the module docstring."""

    def __init__(self, capacity: Resources | None = None, *, executor: Executor | None = None,
                 config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.executor: Executor = executor or AsyncioExecutor()
        self.estimator = DurationEstimator(prior_s=self.config.prior_s)
        self.capacity = capacity or Resources()
        self._limited = set(self.capacity)
        """Every resource ever offered: one that drops to zero still limits (no workers left
        means nothing runs, not everything runs)."""
        self.used = Resources()
        self.metrics_ = Metrics(time.monotonic())
        self._queues: dict[tuple[tuple[str, float], ...], list[tuple[int, int, Tracked]]] = {}
        self._queued = 0
        self._running: dict[str, Tracked] = {}
        self._paused: dict[str, Tracked] = {}
        self._seq = itertools.count()
        self._room = asyncio.Event()  # set while fewer than max_queued wait
        self._room.set()
        self._watch: asyncio.Task[None] | None = None
        self._closed = False

    # ---- lifecycle ----

    async def start(self) -> None:
        await self.executor.start(self.set_capacity)
        if self.config.lease_s is not None:
            self._watch = asyncio.create_task(self._watch_leases(self.config.lease_s))

    async def close(self) -> None:
        """Cancel what is queued or running, then close the executor."""
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
        for heap in self._queues.values():
            for _, _, job in heap:
                if not job.status.final:
                    self._finish(job, JobStatus.CANCELLED, error="scheduler closed")
        for job in [*self._running.values(), *self._paused.values()]:
            self._cancel_running(job, JobStatus.CANCELLED, "scheduler closed")
        await asyncio.sleep(0)
        await self.executor.close()

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def set_capacity(self, capacity: Resources) -> None:
        """New total capacity (an executor reports nodes joining or leaving)."""
        self.metrics_.account(self.used, self.capacity)
        self.capacity = capacity
        self._limited |= set(capacity)
        self._pump()

    # ---- submitting ----

    async def submit(self, spec: JobSpec) -> JobHandle:
        """Queue ``spec``; waits while ``max_queued`` jobs are already waiting."""
        await self._wait_for_room()
        return self.submit_nowait(spec)

    def submit_nowait(self, spec: JobSpec, group: GroupState | None = None) -> JobHandle:
        """Queue ``spec`` now; ``QueueFullError`` at ``max_queued``."""
        if self._closed:
            raise ConfigError("the scheduler is closed")
        if self._queued >= self.config.max_queued:
            raise QueueFullError(f"{self._queued} jobs are queued (max_queued="
                                 f"{self.config.max_queued}): await submit() to wait for room")
        self._check_demand(spec)
        job = Tracked(spec, f"job-{next(self._seq)}", group, time.monotonic())
        if group is not None:
            group.members.append(job)
        self._enqueue(job, spec.priority)
        self._pump()
        return JobHandle(self, job)

    async def submit_group(self, specs: Sequence[JobSpec], *, keep: int | None = None,
                           group: str | None = None) -> GroupHandle:
        """Start every spec of one group; once ``keep`` are done, cancel the rest."""
        keep = len(specs) if keep is None else keep
        if not 1 <= keep <= len(specs):
            raise ConfigError(f"keep={keep} must be between 1 and the group's {len(specs)} jobs")
        name = group or f"group-{next(self._seq)}"
        state = GroupState(name, keep)
        handles = []
        for spec in specs:
            await self._wait_for_room()
            handles.append(self.submit_nowait(spec, state))
        return GroupHandle(self, state, handles)

    def _check_demand(self, spec: JobSpec) -> None:
        too_big = {k: v for k, v in spec.demand.items() if k in self.capacity
                   and v > self.capacity[k] and self._executor_capacity_fixed}
        if too_big:
            raise ConfigError(f"job {spec.name or spec.fn!r} demands {too_big}, more than the "
                              f"whole capacity {self.capacity}")

    @property
    def _executor_capacity_fixed(self) -> bool:
        return isinstance(self.executor, AsyncioExecutor)

    # ---- placing ----

    def _enqueue(self, job: Tracked, priority: int) -> None:
        job.status, job.priority = JobStatus.QUEUED, priority
        job.enqueued_at = time.monotonic()
        demand = job.demand_now()
        heap = self._queues.setdefault(demand.key(), [])
        heapq.heappush(heap, (-priority, next(self._seq), job))
        self._queued += 1

    def _head(self, heap: list[tuple[int, int, Tracked]]) -> Tracked | None:
        while heap:
            job = heap[0][2]
            if job.live_entry(-heap[0][0]):
                return job
            heapq.heappop(heap)  # cancelled, re-prioritised or already placed
        return None

    def _pump(self) -> None:
        """Start the best queued jobs that fit, until none does."""
        t0 = time.perf_counter()
        placed = 0
        limited = frozenset(self._limited)
        free = dict(self.capacity - self.used)  # updated in place as jobs are placed
        while True:
            best: tuple[int, int] | None = None
            best_key = None
            for key, heap in self._queues.items():
                job = self._head(heap)
                if job is None or not job.demand_now().fits_in(free, limited):
                    continue
                rank = (heap[0][0], heap[0][1])
                if best is None or rank < best:
                    best, best_key = rank, key
            if best_key is None:
                break
            _, _, job = heapq.heappop(self._queues[best_key])
            self._queued -= 1
            for name, amount in job.demand_now().items():
                free[name] = free.get(name, 0.0) - amount
            self._start(job)
            placed += 1
        if placed:
            self.metrics_.placed(placed, time.perf_counter() - t0)
            self._wake_producers()

    def _start(self, job: Tracked) -> None:
        demand = job.demand_now()
        self.metrics_.account(self.used, self.capacity)
        self.used = self.used + demand
        job.reserved = job.reserved + demand
        job.status = JobStatus.RUNNING
        job.resumed = job.resuming
        if not job.resuming:
            job.attempts += 1
        now = time.monotonic()
        job.queued_s += now - job.enqueued_at
        job.started_at = now
        job.ctx = JobContext(job.id, job.attempts, job.resume if job.resuming else None)
        job.resuming = False
        self._paused.pop(job.id, None)
        self._running[job.id] = job
        job.task = asyncio.create_task(self._run(job))
        deadline = None if job.resumed else self._deadline(job)
        if deadline is not None:  # a resumed straggler has had its deadline: it runs on
            job.timer = asyncio.get_running_loop().call_later(deadline, self._on_deadline, job)

    def _deadline(self, job: Tracked) -> float | None:
        if job.spec.deadline_s is not None:
            return job.spec.deadline_s
        if not self.config.deadlines:
            return None
        q = self.estimator.quantile(job.spec.family, self.config.deadline_quantile)
        return max(self.config.deadline_factor * q, self.config.min_deadline_s)

    # ---- running ----

    async def _run(self, job: Tracked) -> None:
        ctx = job.ctx
        assert ctx is not None
        try:
            value = await self.executor.run(job.spec, ctx)
        except asyncio.CancelledError:
            return  # whoever cancelled has already finished the job
        except WorkerLostError as exc:
            self._lost(job, str(exc))
            return
        except Exception as exc:  # the job's own failure: recorded, never raised here
            self._release(job)
            self._finish(job, JobStatus.FAILED, error=f"{type(exc).__name__}: {exc}")
            self._pump()
            return
        if job.status.final:
            return  # cancelled while its value was on its way
        ran = time.monotonic() - job.started_at
        if isinstance(value, Paused):
            job.run_s += ran
            self._pause(job, value)
            return
        job.run_s += ran
        self.estimator.observe(job.spec.family, job.run_s)
        self._release(job)
        self._finish(job, JobStatus.DONE, value=value)
        self._pump()

    def _pause(self, job: Tracked, paused: Paused) -> None:
        if job.timer is not None:
            job.timer.cancel()
        self._running.pop(job.id, None)
        keep = Resources({k: min(v, job.reserved[k]) for k, v in paused.keep.items()})
        self.metrics_.account(self.used, self.capacity)
        self.used = self.used - (job.reserved - keep)
        job.reserved, job.resume, job.resuming = keep, paused.state, True
        self._paused[job.id] = job
        self.metrics_.paused += 1
        self._enqueue(job, job.priority - self.config.resume_penalty)
        self._pump()

    def _on_deadline(self, job: Tracked) -> None:
        if job.status is not JobStatus.RUNNING:
            return
        if self.config.stragglers == "pause" and job.ctx is not None:
            job.ctx.request_pause()
            job.timer = asyncio.get_running_loop().call_later(
                self.config.pause_grace_s, self._on_deadline_hard, job, job.attempts)
        else:
            self._cancel_running(job, JobStatus.TIMED_OUT, "ran past its deadline")

    def _on_deadline_hard(self, job: Tracked, attempt: int) -> None:
        if job.status is JobStatus.RUNNING and job.attempts == attempt:
            self._cancel_running(job, JobStatus.TIMED_OUT, "did not pause at its deadline")

    def _lost(self, job: Tracked, why: str) -> None:
        if job.status.final:
            return
        if job.task is not None and not job.task.done():
            job.task.cancel()
        self._release(job)
        job.run_s += time.monotonic() - job.started_at
        self.metrics_.lost += 1
        if job.attempts < job.spec.max_attempts:
            job.resume, job.resuming, job.errors = None, False, [*job.errors, why]
            self._enqueue(job, job.priority)
            self._pump()
        else:
            self._finish(job, JobStatus.LOST, error=why)

    async def _watch_leases(self, lease_s: float) -> None:
        while True:
            await asyncio.sleep(lease_s / 4)
            now = time.monotonic()
            for job in list(self._running.values()):
                ctx = job.ctx
                if ctx is not None and now - max(ctx.last_heartbeat, job.started_at) > lease_s:
                    self._lost(job, f"no heartbeat for {lease_s:g} s")

    # ---- ending ----

    def cancel(self, job: Tracked, why: str = "cancelled") -> bool:
        """Cancel a queued, paused or running job, freeing its resources now."""
        if job.status.final:
            return False
        if job.status is JobStatus.QUEUED:
            self._queued -= 1
            self._release(job)  # a paused job may hold some
            self._finish(job, JobStatus.CANCELLED, error=why)
        else:
            self._cancel_running(job, JobStatus.CANCELLED, why)
        self._pump()
        return True

    def _cancel_running(self, job: Tracked, status: JobStatus, why: str) -> None:
        if job.task is not None and not job.task.done():
            job.task.cancel()
        job.run_s += time.monotonic() - job.started_at
        if job.run_s > 0:  # it would have run at least this long: evidence for the estimate
            self.estimator.observe(job.spec.family, job.run_s, censored=True)
        self._release(job)
        self._finish(job, status, error=why)
        self._pump()

    def _release(self, job: Tracked) -> None:
        if job.timer is not None:
            job.timer.cancel()
            job.timer = None
        if job.reserved:
            self.metrics_.account(self.used, self.capacity)
            self.used = self.used - job.reserved
            job.reserved = Resources()
        self._running.pop(job.id, None)
        self._paused.pop(job.id, None)

    def _finish(self, job: Tracked, status: JobStatus, *, value: Any = None,
                error: str | None = None) -> None:
        job.status = status
        result = JobResult(job.id, status, value, error, job.attempts, job.queued_s, job.run_s,
                           job.group.name if job.group else None, job.spec.name,
                           time.monotonic())
        self.metrics_.finished(job.spec.family, result)
        if not job.done.done():
            job.done.set_result(result)
        job.task = job.ctx = None  # a finished job keeps no task, frame or context alive
        if job.group is not None:
            self._group_progress(job.group, job, status)
            job.group.ended += 1
            if job.group.ended == len(job.group.members):
                job.group.members.clear()  # break the group <-> job cycle: freed at once
        self._wake_producers()

    def _group_progress(self, group: GroupState, job: Tracked, status: JobStatus) -> None:
        if status is JobStatus.DONE:
            group.completed += 1
        if group.completed >= group.keep and not group.closed:
            group.closed = True
            for other in group.members:
                if not other.status.final:
                    self.metrics_.wasted_s += other.run_s + (
                        time.monotonic() - other.started_at
                        if other.status is JobStatus.RUNNING else 0.0)
                    self.cancel(other, "over-sampled: its group already has enough")
        elif (not group.boosted and group.completed / group.keep >= self.config.group_boost_at):
            group.boosted = True
            for other in group.members:
                if other.status is JobStatus.QUEUED:
                    self._queued -= 1
                    self._enqueue(other, other.priority + self.config.group_boost)

    def _wake_producers(self) -> None:
        if self._queued < self.config.max_queued:
            self._room.set()

    async def _wait_for_room(self) -> None:
        while self._queued >= self.config.max_queued:
            self._room.clear()
            await self._room.wait()

    # ---- visibility ----

    def metrics(self) -> SchedulerMetrics:
        """Queue depths, utilisation per resource, estimates and tail latencies, now."""
        return self.metrics_.snapshot(self)
