"""The scheduler's behaviour on the in-process executor: admission, priorities, back-pressure,
deadlines, over-sampling, cancellation, pausing and resuming, leases, metrics.

Jobs are real coroutines that hold their resources for real time; the assertions are about what
a user relies on (who ran when, what was freed when), with generous timing margins for a noisy
two-core machine.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tempering.errors import ConfigError, QueueFullError
from tempering.scheduler import (
    DurationEstimator,
    JobContext,
    JobSpec,
    JobStatus,
    Paused,
    Resources,
    Scheduler,
    SchedulerConfig,
)


class Probe:
    """Records which jobs ran, in what order, and how many at once."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.ended: list[str] = []
        self.now = 0
        self.peak = 0

    def job(self, name: str, seconds: float = 0.05) -> Any:
        async def fn(ctx: JobContext) -> str:
            self.order.append(name)
            self.now += 1
            self.peak = max(self.peak, self.now)
            try:
                await asyncio.sleep(seconds)
            finally:
                self.now -= 1
            self.ended.append(name)
            return name
        return fn


SANDBOX = Resources.of(sandbox=1)


async def test_admission_counts_every_scarce_resource() -> None:
    probe = Probe()
    cap = Resources.of(sandbox=4, inference=1)
    async with Scheduler(cap) as s:
        handles = [await s.submit(JobSpec(probe.job(f"j{i}"),
                                          demand=Resources.of(sandbox=1, inference=1)))
                   for i in range(4)]
        results = [await h for h in handles]
    assert probe.peak == 1  # the one inference slot bounds it, not the four sandboxes
    assert [r.status for r in results] == [JobStatus.DONE] * 4
    probe = Probe()
    async with Scheduler(Resources.of(sandbox=2, inference=8)) as s:
        for h in [await s.submit(JobSpec(probe.job(f"k{i}"), demand=Resources.of(
                sandbox=1, inference=1))) for i in range(6)]:
            await h
    assert probe.peak == 2  # and here the sandbox quota does


async def test_higher_priority_goes_first_and_small_jobs_backfill() -> None:
    probe = Probe()
    two = Resources.of(sandbox=2)
    async with Scheduler(two) as s:
        blocker = await s.submit(JobSpec(probe.job("blocker", 0.1), demand=two))
        low = await s.submit(JobSpec(probe.job("low"), priority=0))
        high = await s.submit(JobSpec(probe.job("high"), priority=5))
        big = await s.submit(JobSpec(probe.job("big"), demand=two, priority=9))
        await asyncio.gather(blocker, big, low, high)
    assert probe.order == ["blocker", "big", "high", "low"]
    probe = Probe()
    async with Scheduler(two) as s:
        half = await s.submit(JobSpec(probe.job("half", 0.2)))
        big = await s.submit(JobSpec(probe.job("big"), demand=two, priority=9))
        small = await s.submit(JobSpec(probe.job("small"), priority=0))
        await asyncio.gather(half, big, small)
    # "big" cannot fit while "half" holds a slot, and does not block "small", which fits
    assert probe.order == ["half", "small", "big"]


async def test_back_pressure_bounds_the_queue() -> None:
    probe = Probe()
    async with Scheduler(SANDBOX, config=SchedulerConfig(max_queued=2)) as s:
        running = await s.submit(JobSpec(probe.job("run", 0.3)))
        await s.submit(JobSpec(probe.job("q1")))
        await s.submit(JobSpec(probe.job("q2")))
        with pytest.raises(QueueFullError, match="max_queued=2"):
            s.submit_nowait(JobSpec(probe.job("q3")))
        t0 = time.monotonic()
        waited = await s.submit(JobSpec(probe.job("q3")))  # waits for room
        assert time.monotonic() - t0 >= 0.2 and running.status is JobStatus.DONE
        assert (await waited).status is JobStatus.DONE


async def test_a_demand_larger_than_the_cluster_is_refused() -> None:
    async with Scheduler(Resources.of(sandbox=2)) as s:
        with pytest.raises(ConfigError, match="sandbox"):
            await s.submit(JobSpec(Probe().job("x"), demand=Resources.of(sandbox=3)))


async def test_deadlines_from_learned_estimates_cut_the_tail() -> None:
    probe = Probe()
    config = SchedulerConfig(deadlines=True, deadline_factor=3.0, min_deadline_s=0.05)
    async with Scheduler(Resources.of(sandbox=4), config=config) as s:
        for h in [await s.submit(JobSpec(probe.job(f"fast{i}", 0.02), family="f"))
                  for i in range(8)]:
            assert (await h).status is JobStatus.DONE
        t0 = time.monotonic()
        slow = await (await s.submit(JobSpec(probe.job("slow", 10.0), family="f")))
        assert slow.status is JobStatus.TIMED_OUT and time.monotonic() - t0 < 2.0
        other = await (await s.submit(JobSpec(probe.job("other", 0.3), family="new",
                                              deadline_s=5.0)))
        estimate = s.metrics().estimates["f"]
    assert "slow" not in probe.ended and other.status is JobStatus.DONE
    assert estimate.samples == 9 and 0.015 < estimate.p50_s < 0.5  # the cut one counts too


async def test_over_sampling_keeps_the_first_n_and_cancels_the_rest() -> None:
    probe = Probe()
    async with Scheduler(Resources.of(sandbox=5)) as s:
        specs = [JobSpec(probe.job(f"fast{i}", 0.05)) for i in range(3)] + \
                [JobSpec(probe.job(f"slow{i}", 20.0)) for i in range(2)]
        t0 = time.monotonic()
        group = await s.submit_group(specs, keep=3)
        kept = await group
        elapsed = time.monotonic() - t0
        everyone = await group.results()
        metrics = s.metrics()
    assert sorted(r.value for r in kept) == ["fast0", "fast1", "fast2"] and elapsed < 5
    assert sorted(r.status for r in everyone).count(JobStatus.CANCELLED) == 2
    assert not any(name.startswith("slow") for name in probe.ended)
    assert metrics.wasted_s > 0 and metrics.used == {}


async def test_cancelling_frees_resources_at_once() -> None:
    started: dict[str, float] = {}

    async def stubborn(ctx: JobContext) -> None:
        try:
            await asyncio.sleep(30)
        finally:  # slow cleanup must not hold the slot
            await asyncio.shield(asyncio.sleep(1.0))

    async def quick(ctx: JobContext) -> None:
        started["quick"] = time.monotonic()

    async with Scheduler(SANDBOX) as s:
        long = await s.submit(JobSpec(stubborn))
        waiting = await s.submit(JobSpec(quick))
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        assert long.cancel()
        await waiting
        assert started["quick"] - t0 < 0.5
        assert (await long).status is JobStatus.CANCELLED and not long.cancel()


async def test_stragglers_pause_give_back_all_but_their_sandbox_and_resume() -> None:
    async def counter(ctx: JobContext) -> Any:
        count = ctx.resume or 0
        while count < 30:
            if ctx.pause_requested:
                return Paused(count, keep=Resources.of(sandbox=1))
            await asyncio.sleep(0.01)
            count += 1
        return count

    probe = Probe()
    config = SchedulerConfig(stragglers="pause", pause_grace_s=2.0)
    cap = Resources.of(sandbox=2, inference=1)
    demand = Resources.of(sandbox=1, inference=1)
    async with Scheduler(cap, config=config) as s:
        straggler = await s.submit(JobSpec(counter, demand=demand, deadline_s=0.1))
        waiting = await s.submit(JobSpec(probe.job("other", 0.3), demand=demand))
        await asyncio.sleep(0.2)
        # the straggler paused at its deadline and gave its inference slot to the waiting job,
        # keeping its sandbox
        assert straggler.paused and waiting.status is JobStatus.RUNNING
        assert s.used == Resources.of(sandbox=2, inference=1)
        assert (await waiting).status is JobStatus.DONE
        result = await straggler
    assert result.status is JobStatus.DONE and result.value == 30 and result.attempts == 1
    assert probe.order == ["other"] and s.metrics().pauses >= 1


async def test_nearly_complete_groups_jump_the_queue() -> None:
    probe = Probe()
    config = SchedulerConfig(group_boost=10, group_boost_at=0.5)
    async with Scheduler(SANDBOX, config=config) as s:
        group = await s.submit_group([JobSpec(probe.job(f"g{i}", 0.02)) for i in range(2)],
                                     keep=2)
        others = [await s.submit(JobSpec(probe.job(f"o{i}", 0.02))) for i in range(3)]
        await group
        await asyncio.gather(*others)
    assert probe.order[:2] == ["g0", "g1"]  # g1 was boosted past the earlier o-jobs


async def test_leases_reclaim_silent_jobs_and_retry_them() -> None:
    async def silent_then_alive(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            await asyncio.sleep(30)  # never heartbeats: its worker "stopped answering"
        for _ in range(5):
            ctx.heartbeat()
            await asyncio.sleep(0.05)
        return ctx.attempt

    async def always_silent(ctx: JobContext) -> None:
        await asyncio.sleep(30)

    async with Scheduler(SANDBOX, config=SchedulerConfig(lease_s=0.2)) as s:
        revived = await (await s.submit(JobSpec(silent_then_alive, max_attempts=2)))
        dead = await (await s.submit(JobSpec(always_silent, max_attempts=2)))
        metrics = s.metrics()
    assert revived.status is JobStatus.DONE and revived.value == 2 and revived.attempts == 2
    assert dead.status is JobStatus.LOST and "no heartbeat" in (dead.error or "")
    assert metrics.lost == 3 and metrics.used == {}


async def test_a_failing_job_is_recorded_and_frees_its_slot() -> None:
    async def boom(ctx: JobContext) -> None:
        raise ValueError("bad input 42")

    async with Scheduler(SANDBOX) as s:
        failed = await (await s.submit(JobSpec(boom)))
        ok = await (await s.submit(JobSpec(Probe().job("after"))))
    assert failed.status is JobStatus.FAILED and failed.error == "ValueError: bad input 42"
    assert ok.status is JobStatus.DONE


async def test_metrics_show_queues_utilisation_and_tails() -> None:
    probe = Probe()
    async with Scheduler(Resources.of(sandbox=2)) as s:
        handles = [await s.submit(JobSpec(probe.job(f"m{i}", 0.05), family="fam"))
                   for i in range(8)]
        snapshot = s.metrics()
        assert snapshot.queued == 6 and snapshot.queued_by_family == {"fam": 6}
        assert snapshot.running == 2
        await asyncio.gather(*handles)
        s.set_capacity(Resources.of(sandbox=4))
        final = s.metrics()
    assert final.finished == {"done": 8} and final.utilisation["sandbox"] > 0.8
    assert final.run_p50_s >= 0.04 and final.queue_wait_p99_s > 0.1
    assert final.placement_overhead_us < 1000


async def test_capacity_that_drops_to_zero_admits_nothing() -> None:
    probe = Probe()
    async with Scheduler(Resources.of(sandbox=1)) as s:
        s.set_capacity(Resources())  # the last worker left
        waiting = await s.submit(JobSpec(probe.job("w")))
        await asyncio.sleep(0.1)
        assert waiting.status is JobStatus.QUEUED and probe.order == []
        s.set_capacity(Resources.of(sandbox=1))  # a worker joined
        assert (await waiting).status is JobStatus.DONE


def test_estimates_count_what_was_cut_short_as_lasting_at_least_that_long() -> None:
    estimator = DurationEstimator(min_samples=1)
    for _ in range(10):
        estimator.observe("f", 1.0)
        estimator.observe("f", 2.0, censored=True)  # cut at 2 s: would have taken longer
    # the finished ones alone say p90 = 1 s; half the jobs ran past 2 s, so p90 is beyond it
    assert estimator.quantile("f", 0.3) == 1.0
    assert estimator.quantile("f", 0.9) == 2.0
    plain = DurationEstimator(min_samples=1)
    for value in range(1, 11):
        plain.observe("g", float(value))
    assert plain.quantile("g", 0.5) == 6.0 and plain.estimate("g").samples == 10


def test_worker_stop_hooks_run_once_newest_first_past_a_failure(monkeypatch) -> None:
    from tempering.scheduler import job

    monkeypatch.setattr(job, "_at_worker_stop", [])
    ran: list[str] = []

    def fails() -> None:
        ran.append("fails")
        raise OSError("disk full")

    job.at_worker_stop(lambda: ran.append("first"))
    job.at_worker_stop(fails)
    job.at_worker_stop(lambda: ran.append("last"))
    errors = job.run_worker_stop()
    assert ran == ["last", "fails", "first"]
    assert len(errors) == 1 and "OSError: disk full" in errors[0]
    assert job.run_worker_stop() == [] and ran == ["last", "fails", "first"]  # once
