"""Per-step utilisation from the scheduler's integrals, on a real scheduler whose capacity
changes the way it does under Ray (nothing offered until the workers join)."""

from __future__ import annotations

import asyncio

from tempering.scheduler import JobSpec, Resources, Scheduler
from tempering.train.metrics import Interval


async def test_interval_utilisation_is_exact_when_capacity_changes() -> None:
    started = asyncio.Event()

    async def hold(ctx: object) -> None:
        started.set()
        await asyncio.sleep(1.0)

    interval = Interval()
    async with Scheduler(Resources()) as s:  # no worker yet: nothing offered
        await asyncio.sleep(0.3)
        s.set_capacity(Resources.of(sandbox=1))  # a worker joined
        await asyncio.sleep(0.3)
        idle = interval.take(s.metrics(), 0.6)["sandbox_util"]
        job = await s.submit(JobSpec(hold))
        await started.wait()
        interval.take(s.metrics(), 0.0)  # the next interval starts with the slot taken
        await asyncio.sleep(0.3)
        busy = interval.take(s.metrics(), 0.3)["sandbox_util"]
        job.cancel()
    assert idle == 0.0
    # the whole interval had its one slot reserved: 1, not more (a share of the run-long
    # average taken over elapsed time read 1.5 here)
    assert 0.95 <= busy <= 1.0
