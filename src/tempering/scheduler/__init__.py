"""Scheduling heterogeneous work: sandbox slots, inference slots, learner steps.

    async with Scheduler(Resources.of(sandbox=64, inference=32)) as scheduler:
        handle = await scheduler.submit(JobSpec(fn, demand=Resources.of(sandbox=1)))
        result = await handle                       # JobResult: status, value, timings
        group = await scheduler.submit_group(specs, keep=8)   # over-sampling

``scheduler.py`` places jobs (admission, priorities, long-tail control), ``executor.py`` runs
them in this process on asyncio, ``ray.py`` on Ray actors across machines, with the same API.
"""

from __future__ import annotations

from tempering.scheduler.config import SchedulerConfig
from tempering.scheduler.estimates import DurationEstimator, Estimate
from tempering.scheduler.executor import AsyncioExecutor, Executor
from tempering.scheduler.handles import GroupHandle, JobHandle
from tempering.scheduler.job import JobContext, JobResult, JobSpec, JobStatus, Paused
from tempering.scheduler.metrics import SchedulerMetrics
from tempering.scheduler.resources import Resources
from tempering.scheduler.scheduler import Scheduler

__all__ = ["AsyncioExecutor", "DurationEstimator", "Estimate", "Executor", "GroupHandle",
           "JobContext", "JobHandle", "JobResult", "JobSpec", "JobStatus", "Paused", "Resources",
           "Scheduler", "SchedulerConfig", "SchedulerMetrics"]
