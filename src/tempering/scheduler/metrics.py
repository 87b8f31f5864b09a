"""What the scheduler can tell while it runs: queues, utilisation, estimates, tail latencies.

Utilisation is exact, not sampled: every change of what is used (or of the capacity) adds
``amount x time`` to an integral, so ``utilisation[r]`` is the time-weighted fraction of resource
``r`` that was reserved since the scheduler started (or since ``reset``). Tail latencies come from
the last ``window`` finished jobs.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from tempering.scheduler.job import JobResult, JobStatus
from tempering.scheduler.resources import Resources

if TYPE_CHECKING:
    from tempering.scheduler.scheduler import Scheduler


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


class FamilyEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)

    samples: int
    p50_s: float
    p90_s: float
    p99_s: float


class SchedulerMetrics(BaseModel):
    """A snapshot; every duration in seconds."""

    model_config = ConfigDict(frozen=True)

    elapsed_s: float
    capacity: dict[str, float]
    used: dict[str, float]
    utilisation: dict[str, float]
    """Time-weighted fraction of each resource reserved since the start."""
    busy_s: dict[str, float] = {}
    """The integrals behind ``utilisation``: units reserved x seconds, per resource; two
    snapshots' differences give the utilisation between them, capacity changes included."""
    offered_s: dict[str, float] = {}
    """Units offered (the capacity) x seconds, per resource."""
    queued: int
    queued_by_family: dict[str, int]
    running: int
    paused: int
    """Paused jobs waiting to resume (counted in ``queued`` too)."""
    finished: dict[str, int]
    """Jobs by final status."""
    estimates: dict[str, FamilyEstimate]
    queue_wait_p50_s: float
    queue_wait_p99_s: float
    run_p50_s: float
    run_p99_s: float
    placement_overhead_us: float
    """Mean time the scheduler spent per job placed."""
    wasted_s: float
    """Run time of over-sampled jobs cancelled because their group was already complete."""
    lost: int
    """Times a worker was lost under a job (each retried or ended lost)."""
    pauses: int


class Metrics:
    """The scheduler's running accumulators."""

    def __init__(self, now: float, window: int = 2000) -> None:
        self.reset(now, window)

    def reset(self, now: float | None = None, window: int = 2000) -> None:
        self.started = time.monotonic() if now is None else now
        self.last = self.started
        self.busy: dict[str, float] = {}
        self.offered: dict[str, float] = {}
        self.placements = 0
        self.placement_s = 0.0
        self.status: Counter[str] = Counter()
        self.waits: deque[float] = deque(maxlen=window)
        self.runs: deque[float] = deque(maxlen=window)
        self.wasted_s = 0.0
        self.lost = 0
        self.paused = 0

    def account(self, used: Resources, capacity: Resources) -> None:
        """Add what was used and offered since the last change."""
        now = time.monotonic()
        dt = now - self.last
        self.last = now
        if dt > 0:
            for name, amount in capacity.items():
                self.offered[name] = self.offered.get(name, 0.0) + amount * dt
                self.busy[name] = self.busy.get(name, 0.0) + min(used[name], amount) * dt

    def placed(self, n: int, seconds: float) -> None:
        self.placements += n
        self.placement_s += seconds

    def finished(self, family: str, result: JobResult) -> None:
        self.status[str(result.status)] += 1
        self.waits.append(result.queued_s)
        if result.status is JobStatus.DONE:
            self.runs.append(result.run_s)

    def snapshot(self, scheduler: Scheduler) -> SchedulerMetrics:
        self.account(scheduler.used, scheduler.capacity)
        families: Counter[str] = Counter()
        for heap in scheduler._queues.values():  # noqa: SLF001 - the scheduler's own view
            for negative_priority, _, job in heap:
                if job.live_entry(-negative_priority):
                    families[job.spec.family] += 1
        estimates = {}
        for family in scheduler.estimator.families():
            e = scheduler.estimator.estimate(family)
            estimates[family] = FamilyEstimate(samples=e.samples, p50_s=e.p50, p90_s=e.p90,
                                               p99_s=e.p99)
        waits, runs = list(self.waits), list(self.runs)
        return SchedulerMetrics(
            elapsed_s=self.last - self.started, capacity=dict(scheduler.capacity),
            used=dict(scheduler.used),
            utilisation={k: self.busy.get(k, 0.0) / v for k, v in self.offered.items() if v > 0},
            busy_s=dict(self.busy), offered_s=dict(self.offered),
            queued=scheduler._queued, queued_by_family=dict(families),  # noqa: SLF001
            running=len(scheduler._running), paused=len(scheduler._paused),  # noqa: SLF001
            finished=dict(self.status), estimates=estimates,
            queue_wait_p50_s=_quantile(waits, 0.5), queue_wait_p99_s=_quantile(waits, 0.99),
            run_p50_s=_quantile(runs, 0.5), run_p99_s=_quantile(runs, 0.99),
            placement_overhead_us=self.placement_s / self.placements * 1e6
            if self.placements else 0.0,
            wasted_s=self.wasted_s, lost=self.lost, pauses=self.paused)
