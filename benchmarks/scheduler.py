"""The scheduler: a heavy-tailed batch workload, scheduling overhead, back-pressure.

    python benchmarks/scheduler.py [--quick] [--only tail,overhead,submit] [--json FILE]

- tail: RL-style batches (G=8 groups x n=8 samples) of simulated episodes on S=32 sandbox
  slots. Each episode is a real asyncio job (``await asyncio.sleep(d)``); d is log-normal
  (sigma 0.5) around its family's median (four families, 10 to 40 ms, 20 ms overall) and 5% of
  episodes are 20x slower, all from a seeded RNG. Side by side on the same durations: the FIFO
  batch a synchronous trainer runs (a batch's 64 episodes through ``asyncio.Semaphore(S)``,
  wait for all, then the next batch), and the real ``Scheduler``. Figures: batch completion
  p50/p99 (the first 2 batches, where estimates are learned, left out on both sides), slot
  utilisation (the baseline's as busy slot-seconds / (S x wall time), the scheduler's from its
  metrics), slot time wasted by over-sampling and cut at deadlines, kept samples per second.
  Full: 100 batches, the scheduler run 3 times and the median quoted; quick: 25 batches, once.
- overhead: 10,000 jobs that return at once queued on 64 sandbox slots, wall time per job,
  against the same coroutines through ``asyncio.Semaphore(64)`` + ``gather``.
- submit: a producer ``await``ing ``submit`` 10,000 times into ``max_queued=1,000``, per job
  (submit and run), against the same with room for all (the cost of back-pressure) and against
  a bounded ``asyncio.Queue(1,000)`` feeding 64 workers; and the deepest queue seen.

The tempering side of ``tail`` (``Tuning``), each knob a real scheduler option, and why:

- ``submit_group(n + k specs, keep=n)`` with k=4. A group waits for a slow episode (or a top-up)
  only when more than k of its n + k are slow: with 5% slow that is 1.2% of groups at k=2
  (8.8% of batches), 0.15% at k=3 (1.2% of batches), 0.02% at k=4 (0.14% of batches). A p99
  within 1.3x of p50 needs that under 1% of batches, so k=4; it costs the wasted figure.
- ``SchedulerConfig(deadlines=True, deadline_quantile=0.9, deadline_factor=5.0,
  min_deadline_s=0.005)``: an episode may run 5x its family's learned p90 (the 1 s default
  floor would disable deadlines for millisecond episodes). 5, not the default 3: tuned while
  the learned quantiles counted completed episodes only (over-sampling cancels the slowest of
  every group, so the learned p90 came out at 55-75% of the true one and deadlines at 3 cut
  ordinary episodes); cut-short episodes are now censored observations, which removes that
  bias, and 5 is kept as the measured setting.
- 2 batches in flight: the next batch is queued while one drains, so its episodes take the
  slots the last groups of the previous batch leave (1 in flight: utilisation about 70%; 3:
  p50 half as long again). A batch's time runs from its first submission, so it includes
  waiting behind the batch before it.
- a batch's groups are submitted longest expected first (the scheduler's learned median per
  family, ``scheduler.estimator``): equal priorities run in submission order, so the long
  groups start early and the batch does not end on one.
- a group that ends short of n (more than k cut at their deadline) is topped up at once with
  fresh episodes at a higher ``JobSpec.priority``; the run prints how many were.

Kept samples are biased towards short episodes (the slow ones rarely count): that is what
long-tail control buys and what it costs; docs/scheduler.md says so beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from figures import Figure, benchmark_main, console, percentile, report

from tempering.scheduler import (
    GroupHandle,
    JobContext,
    JobSpec,
    JobStatus,
    Resources,
    Scheduler,
    SchedulerConfig,
)

# ---- the heavy-tailed batch workload ----

FAMILY_MEDIANS_S = {"suite-a": 0.010, "suite-b": 0.015, "suite-c": 0.027, "suite-d": 0.040}
"""Four task families around a 20 ms median (their geometric mean), each learned separately."""
SIGMA, SLOW_FRACTION, SLOW_FACTOR = 0.5, 0.05, 20.0
GROUPS, SAMPLES, SLOTS = 8, 8, 32
WARMUP = 2
"""Batches left out of the percentiles on both sides: the scheduler learns its estimates here."""
REFILL_PRIORITY = 100


@dataclass(frozen=True)
class Tuning:
    """The tempering side's knobs; every one a real scheduler option (see the docstring)."""

    extra: int = 4
    """k: episodes started per group beyond the n kept (``submit_group(n + k specs, keep=n)``)."""
    in_flight: int = 2
    longest_first: bool = True
    """Submit a batch's groups in decreasing order of their family's learned median."""
    config: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(
        deadlines=True, deadline_quantile=0.9, deadline_factor=5.0, min_deadline_s=0.005))


@dataclass(frozen=True)
class Group:
    family: str
    durations: tuple[float, ...]
    """n + k seeded durations: the baseline runs the first n, tempering all of them."""


def episode_duration(rng: random.Random, family: str) -> float:
    d = FAMILY_MEDIANS_S[family] * math.exp(rng.gauss(0.0, SIGMA))
    return d * SLOW_FACTOR if rng.random() < SLOW_FRACTION else d


def workload(batches: int, extra: int, seed: int = 0) -> list[list[Group]]:
    """Every batch has two groups of each family (a trainer sampling prompts per suite), so
    batches differ by their draws, not by how many slow families they happen to contain."""
    rng = random.Random(seed)
    families = sorted(FAMILY_MEDIANS_S)
    out = []
    for _ in range(batches):
        mix = families * (GROUPS // len(families))
        rng.shuffle(mix)
        out.append([Group(family, tuple(episode_duration(rng, family)
                                        for _ in range(SAMPLES + extra))) for family in mix])
    return out


async def episode(duration: float, ctx: JobContext) -> float:
    await asyncio.sleep(duration)
    return duration


@dataclass(frozen=True)
class TailRun:
    batch_s: list[float]
    """Completion time of every batch, from its first submission to its last kept result."""
    wall_s: float
    utilisation: float
    samples: int
    busy_s: float
    """Slot-seconds held by episodes."""
    wasted_s: float = 0.0
    """Run time of over-sampled episodes cancelled because their group was complete."""
    cut_s: float = 0.0
    """Run time of episodes cut at their deadline."""
    refilled: int = 0
    """Groups that ended short of n (more than k cut) and were topped up."""

    def p(self, q: float) -> float:
        return percentile(self.batch_s[WARMUP:], q)


async def fifo_batches(batches: list[list[Group]]) -> TailRun:
    """A synchronous trainer's rollout: a batch's episodes through S slots, then the next."""
    slots = asyncio.Semaphore(SLOTS)
    busy = 0.0

    async def one(duration: float) -> None:
        nonlocal busy
        async with slots:
            t0 = time.perf_counter()
            await episode(duration, JobContext("fifo", 1))
            busy += time.perf_counter() - t0

    times = []
    start = time.perf_counter()
    for batch in batches:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(d) for g in batch for d in g.durations[:SAMPLES]))
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    return TailRun(times, wall, busy / (SLOTS * wall), SAMPLES * GROUPS * len(batches), busy)


async def tempered_batches(batches: list[list[Group]], tuning: Tuning,
                           seed: int = 1) -> TailRun:
    """The same batches through the Scheduler, ``tuning.in_flight`` at a time."""
    rng = random.Random(seed)  # durations of top-up episodes
    times = [0.0] * len(batches)
    cut = 0.0
    refilled = 0

    def specs(group: Group, durations: tuple[float, ...], priority: int = 0) -> list[JobSpec]:
        return [JobSpec(partial(episode, d), family=group.family, priority=priority)
                for d in durations]

    async def finish(sched: Scheduler, group: Group, handle: GroupHandle) -> None:
        nonlocal cut, refilled
        kept = 0
        while True:
            results = await handle.results()
            cut += sum(r.run_s for r in results if r.status is JobStatus.TIMED_OUT)
            kept += sum(r.status is JobStatus.DONE for r in results)
            missing = SAMPLES - kept
            if missing <= 0:
                return
            refilled += 1  # more than k were cut: top the group up at once, ahead of the queue
            fresh = tuple(episode_duration(rng, group.family)
                          for _ in range(missing + tuning.extra))
            handle = await sched.submit_group(specs(group, fresh, REFILL_PRIORITY), keep=missing)

    async def run_batch(sched: Scheduler, index: int) -> None:
        t0 = time.perf_counter()
        groups = batches[index]
        if tuning.longest_first:  # the scheduler's own learned medians, longest first
            groups = sorted(groups, key=lambda g: -sched.estimator.quantile(g.family, 0.5))
        handles = [await sched.submit_group(specs(g, g.durations[:SAMPLES + tuning.extra]),
                                            keep=SAMPLES) for g in groups]
        await asyncio.gather(*(finish(sched, g, h) for g, h in zip(groups, handles, strict=True)))
        times[index] = time.perf_counter() - t0

    async with Scheduler(Resources.of(sandbox=SLOTS), config=tuning.config) as sched:
        in_flight = asyncio.Semaphore(tuning.in_flight)
        tasks = []
        start = time.perf_counter()
        for index in range(len(batches)):
            await in_flight.acquire()
            task = asyncio.create_task(run_batch(sched, index))
            task.add_done_callback(lambda _: in_flight.release())
            tasks.append(task)
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
        m = sched.metrics()
    return TailRun(times, wall, m.utilisation["sandbox"], SAMPLES * GROUPS * len(batches),
                   m.utilisation["sandbox"] * SLOTS * m.elapsed_s, m.wasted_s, cut, refilled)


async def tail(args: argparse.Namespace) -> list[Figure]:
    n_batches, runs = (25, 1) if args.quick else (100, 3)
    tuning = Tuning()
    batches = workload(n_batches, tuning.extra)
    ours = []
    for _ in range(runs):
        gc.collect()  # each run starts from the same heap, not from the last one's garbage
        ours.append(await tempered_batches(batches, tuning))
    gc.collect()
    fifo = await fifo_batches(batches)

    def med(f: Callable[[TailRun], float]) -> float:
        return statistics.median(f(run) for run in ours)

    ratios = [run.p(99) / run.p(50) for run in ours]
    ratio = statistics.median(ratios)
    console.print(
        f"  [dim]{n_batches} batches of {GROUPS} x {SAMPLES} on {SLOTS} slots, percentiles over "
        f"the last {n_batches - WARMUP}; tempering: k={tuning.extra}, {tuning.in_flight} "
        f"batches in flight, deadline {tuning.config.deadline_factor:g} x p"
        f"{tuning.config.deadline_quantile * 100:g}; median of {runs} run(s), p99/p50 of each "
        f"{', '.join(f'{r:.2f}' for r in ratios)}; groups topped up "
        f"{', '.join(str(run.refilled) for run in ours)}[/]")
    base = "FIFO batch"
    util = med(lambda r: r.utilisation)
    return report([
        Figure("tail", "batch completion p50", med(lambda r: r.p(50)) * 1e3, "ms",
               fifo.p(50) * 1e3, base),
        Figure("tail", "batch completion p99", med(lambda r: r.p(99)) * 1e3, "ms",
               fifo.p(99) * 1e3, base),
        Figure("tail", "  p99 / p50", ratio, "x", fifo.p(99) / fifo.p(50), base,
               target="<= 1.3", passed=ratio <= 1.3, relative=False),
        Figure("tail", "sandbox-slot utilisation", util * 100, "%", fifo.utilisation * 100, base,
               target=">= 90%", passed=util >= 0.9, relative=False),
        Figure("tail", "slot time wasted by over-sampling",
               med(lambda r: r.wasted_s / r.busy_s) * 100, "%", relative=False),
        Figure("tail", "slot time of episodes cut at deadlines",
               med(lambda r: r.cut_s / r.busy_s) * 100, "%", relative=False),
        Figure("tail", "kept samples per second", med(lambda r: r.samples / r.wall_s), "/s",
               fifo.samples / fifo.wall_s, base),
    ])


# ---- overhead at 10,000 queued ----

async def instant(ctx: JobContext) -> None:
    return None


async def through_scheduler(n: int, slots: int, max_queued: int,
                            wait: bool) -> tuple[float, float, int]:
    """Submit ``n`` instant jobs and await them all: (total seconds, placement us, deepest
    queue sampled). ``wait``: ``await submit`` (back-pressure), else ``submit_nowait``."""
    deepest = 0
    config = SchedulerConfig(max_queued=max_queued)
    async with Scheduler(Resources.of(sandbox=slots), config=config) as sched:
        handles = []
        t0 = time.perf_counter()
        for i in range(n):
            spec = JobSpec(instant, family="instant")
            handles.append(await sched.submit(spec) if wait else sched.submit_nowait(spec))
            if wait and i % 250 == 0:  # metrics() walks the queue: sampled, not every time
                deepest = max(deepest, sched.metrics().queued)
        for handle in handles:
            await handle
        elapsed = time.perf_counter() - t0
        return elapsed, sched.metrics().placement_overhead_us, deepest


async def through_semaphore(n: int, slots: int) -> float:
    """The hand-written alternative: every job a task, ``slots`` at a time."""
    sem = asyncio.Semaphore(slots)

    async def gated() -> None:
        async with sem:
            await instant(JobContext("base", 1))

    t0 = time.perf_counter()
    await asyncio.gather(*(gated() for _ in range(n)))
    return time.perf_counter() - t0


async def through_bounded_queue(n: int, slots: int, bound: int) -> float:
    """The hand-written bounded producer: ``asyncio.Queue(bound)`` drained by ``slots``
    workers; the producer waits in ``put`` while it is full."""
    queue: asyncio.Queue[Callable[[JobContext], Awaitable[None]] | None] = asyncio.Queue(bound)

    async def worker() -> None:
        while (fn := await queue.get()) is not None:
            await fn(JobContext("base", 1))

    t0 = time.perf_counter()
    workers = [asyncio.create_task(worker()) for _ in range(slots)]
    for _ in range(n):
        await queue.put(instant)
    for _ in workers:
        await queue.put(None)
    await asyncio.gather(*workers)
    return time.perf_counter() - t0


async def overhead(args: argparse.Namespace) -> list[Figure]:
    n, slots = 10_000, 64
    ours, base, placement = [], [], []
    for _ in range(3 if args.quick else 7):
        gc.collect()
        elapsed, placed_us, _ = await through_scheduler(n, slots, n, wait=False)
        ours.append(elapsed / n)
        placement.append(placed_us)
        base.append(await through_semaphore(n, slots) / n)
    per_job = statistics.median(ours) * 1e3
    return report([
        Figure("overhead", f"per job, {n:,} queued on {slots} slots, p50", per_job, "ms",
               statistics.median(base) * 1e3, f"Semaphore({slots}) + gather",
               target="< 1 ms", passed=per_job < 1.0),
        Figure("overhead", "  of which placing (placement_overhead_us)",
               statistics.median(placement), "us", relative=False),
    ])


# ---- back-pressure ----

async def submit(args: argparse.Namespace) -> list[Figure]:
    n, slots, bound = 10_000, 64, 1_000
    bounded, unbounded, base, deepest = [], [], [], 0
    for _ in range(3 if args.quick else 7):
        gc.collect()
        elapsed, _, depth = await through_scheduler(n, slots, bound, wait=True)
        bounded.append(elapsed / n)
        deepest = max(deepest, depth)
        unbounded.append((await through_scheduler(n, slots, n, wait=True))[0] / n)
        base.append(await through_bounded_queue(n, slots, bound) / n)
    per_submit = statistics.median(bounded) * 1e6
    free = statistics.median(unbounded) * 1e6
    return report([
        Figure("submit", f"submit + run per job, max_queued={bound:,}, p50", per_submit, "us",
               free, f"max_queued={n:,} (never waits)"),
        Figure("submit", "  the same", per_submit, "us", statistics.median(base) * 1e6,
               f"asyncio.Queue({bound:,}) + {slots} workers"),
        Figure("submit", "  deepest queue seen (sampled)", deepest, "jobs",
               target=f"<= {bound:,}", passed=deepest <= bound, relative=False),
    ])


SECTIONS: dict[str, Callable[[argparse.Namespace], Awaitable[list[Figure]]]] = {
    "tail": tail, "overhead": overhead, "submit": submit}


def main() -> None:
    benchmark_main(__doc__ or "", SECTIONS, "scheduler", quick_help="fewer batches and rounds")


if __name__ == "__main__":
    main()
