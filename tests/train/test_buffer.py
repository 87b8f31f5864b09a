"""The replay buffer: AReaL admission counted exactly, staleness never exceeded, filters applied,
checkpoints that lose nothing; and a real asyncio producer/consumer run with heavy-tailed rollout
times, synchronous (max_staleness=0) against asynchronous (max_staleness=2)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from tempering.errors import ConfigError
from tempering.reward.result import RewardResult
from tempering.train.buffer import Batch, ReplayBuffer, sample_version
from tempering.trajectory.filters import Pipeline
from tempering.trajectory.schema import Status, Step, Trajectory


def step(i: int, version: int, *, tokens: bool = True) -> Step:
    return Step(index=i, action="bash", arguments=f'{{"command": "echo {i}"}}',
                completion_token_ids=[1, 2, 3] if tokens else [], weights_version=version)


def traj(group: str, index: int, reward: float | None, *, versions: tuple[int, ...] = (0,),
         status: Status = Status.OK, tokens: bool = True) -> Trajectory:
    steps = [step(i, v, tokens=tokens) for i, v in enumerate(versions)]
    # distinct arguments per sample: the default pipeline's Dedup must not merge them
    steps.append(Step(index=len(steps), action="submit", arguments=f'{{"n": {index}}}',
                      completion_token_ids=[4] if tokens else [],
                      weights_version=versions[-1]))
    return Trajectory(task_id="t", group_id=group, sample_index=index, status=status,
                      steps=steps, reward=None if reward is None else RewardResult(
                          reward=reward, components={"tests": reward}, tests_passed=0,
                          tests_total=1, flags=[]))


def group(name: str, *, version: int = 0, size: int = 2) -> list[Trajectory]:
    """A group with signal: rewards 0, 1, 0, 1, ..."""
    return [traj(name, i, float(i % 2), versions=(version,)) for i in range(size)]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# ---- admission ----

@pytest.mark.parametrize("max_staleness", [0, 1, 4])
async def test_admission_bound_is_exact(max_staleness: int) -> None:
    b = 3
    buf = ReplayBuffer(batch_groups=b, max_staleness=max_staleness)
    started = 0
    while buf.try_admit():
        started += 1
    assert started == (max_staleness + 1) * b
    waiter = asyncio.create_task(buf.admit())
    await settle()
    assert not waiter.done()  # admit() waits at the bound

    buf.set_version(1)  # nothing consumed yet: exactly one more batch may start
    await settle()
    assert waiter.done()
    more = 1
    while buf.try_admit():
        more += 1
    assert more == b
    stats = buf.stats()
    assert stats.started_groups == stats.admission_limit == (max_staleness + 2) * b
    assert stats.in_flight_groups == stats.admitted_groups == (max_staleness + 2) * b


async def test_admission_counts_several_groups_at_once_and_cancellation() -> None:
    buf = ReplayBuffer(batch_groups=2, max_staleness=1)  # limit 4
    assert buf.try_admit(3)
    assert not buf.try_admit(2)  # all or nothing
    buf.cancel_admission(2)  # abandoned rollouts stop counting
    assert buf.try_admit(3)
    assert buf.stats().dropped["cancelled"] == 2
    with pytest.raises(ValueError, match="cancel_admission"):
        buf.cancel_admission(5)
    with pytest.raises(ConfigError, match="wait forever"):
        buf.try_admit(5)  # more than (1 + 1) x 2 could ever be in flight


async def test_cancelled_admit_waiter_lets_the_next_one_through() -> None:
    buf = ReplayBuffer(batch_groups=2, max_staleness=0)
    assert buf.try_admit()
    big = asyncio.create_task(buf.admit(2))
    small = asyncio.create_task(buf.admit(1))
    await settle()
    assert not big.done() and not small.done()  # small waits behind big: first come first
    big.cancel()
    await settle()
    assert small.done() and big.cancelled()
    assert buf.stats().in_flight_groups == 2


async def test_max_size_groups_caps_admission_below_the_staleness_bound() -> None:
    buf = ReplayBuffer(batch_groups=2, max_staleness=4, max_size_groups=3)
    assert [buf.try_admit() for _ in range(4)] == [True, True, True, False]
    buf.put(group("a"), version_started=0)
    assert not buf.try_admit()  # buffered groups count too
    await buf.get(1)
    assert buf.try_admit()  # consumed: room again
    with pytest.raises(ConfigError, match="max_size_groups=1 is below batch_groups=2"):
        ReplayBuffer(batch_groups=2, max_staleness=0, max_size_groups=1)


# ---- put: filters, versions, staleness ----

async def test_filters_drop_infra_and_flat_groups_and_give_admission_back() -> None:
    buf = ReplayBuffer(batch_groups=1, max_staleness=0)  # one group in flight at a time
    assert buf.try_admit() and not buf.try_admit()
    infra = [traj("infra", i, None, status=Status.INFRA_ERROR) for i in range(3)]
    assert buf.put(infra, version_started=0) == "filtered"

    assert buf.try_admit()  # the filtered group's admission came back
    flat = [traj("flat", i, 1.0) for i in range(3)]
    assert buf.put(flat, version_started=0) == "filtered"

    assert buf.try_admit()
    mixed = [*group("mixed"), traj("mixed", 9, None, status=Status.ENV_TIMEOUT)]
    assert buf.put(mixed, version_started=0) == "buffered"
    stats = buf.stats()
    assert stats.dropped == {"filtered": 2, "stale": 0, "cancelled": 0, "rolled_back": 0}
    assert stats.filtered_samples == {"env_timeout": 1, "infra_error": 3, "zero_variance": 3}
    assert (stats.buffered_groups, stats.buffered_samples) == (1, 2)
    batch = await buf.get()
    assert [t.sample_index for t in batch.groups[0]] == [0, 1]  # the infra member is gone


async def test_identical_samples_of_a_group_all_reach_the_learner() -> None:
    # GRPO's baseline must see every sample: the buffer's default filters do not deduplicate
    buf = ReplayBuffer(batch_groups=1, max_staleness=0)
    buf.try_admit()
    same = [traj("g", 0, 1.0), traj("g", 0, 1.0), traj("g", 1, 0.0)]
    assert buf.put(same, version_started=0) == "buffered"
    assert (await buf.get()).samples == 3


async def test_a_plain_filter_or_no_filtering() -> None:
    class KeepFirst:
        name = "keep_first"

        def apply(self, trajs: list[Trajectory]) -> list[Trajectory]:
            return trajs[:1]

    buf = ReplayBuffer(batch_groups=1, max_staleness=0, filters=KeepFirst())
    buf.try_admit()
    buf.put(group("g", size=3), version_started=0)
    assert (await buf.get()).samples == 1
    assert buf.stats().filtered_samples == {"dropped": 2}

    keep_all = ReplayBuffer(batch_groups=1, max_staleness=0, filters=Pipeline([]))
    keep_all.try_admit()
    flat = [traj("flat", i, 1.0, status=Status.INFRA_ERROR) for i in range(2)]
    assert keep_all.put(flat, version_started=0) == "buffered"


def test_sample_version_is_the_oldest_token() -> None:
    assert sample_version(traj("g", 0, 1.0, versions=(3, 1, 2)), version_started=3) == 1
    assert sample_version(traj("g", 0, 1.0, versions=(0,), tokens=False), version_started=5) == 5


async def test_stale_groups_are_refused_at_put_and_counted() -> None:
    buf = ReplayBuffer(batch_groups=1, max_staleness=1)
    assert buf.try_admit(2)
    buf.set_version(2)
    # started at version 0, so 2 versions old: refused
    assert buf.put(group("old", version=0), version_started=0) == "stale"
    # started at 2 by its own account, but a token came from version 0: the oldest decides
    mixed = [traj("mixed", i, float(i), versions=(0, 2)) for i in range(2)]
    assert buf.put(mixed, version_started=2) == "stale"
    stats = buf.stats()
    assert stats.stale_dropped == 2 and stats.buffered_groups == 0
    assert stats.started_groups == 0  # both admissions came back

    buf.try_admit()
    fresh = [traj("fresh", i, float(i), versions=(1, 2)) for i in range(2)]
    assert buf.put(fresh, version_started=1) == "buffered"
    batch = await buf.get()
    assert batch.versions == [[1, 1]] and batch.ages == [[1, 1]]
    assert (batch.staleness_max, batch.staleness_mean) == (1, 1.0)


async def test_groups_that_go_stale_while_buffered_never_reach_the_learner() -> None:
    buf = ReplayBuffer(batch_groups=2, max_staleness=1)
    assert buf.try_admit(3)
    buf.put(group("v0"), version_started=0)
    buf.set_version(1)
    getter = asyncio.create_task(buf.get())
    await settle()
    assert not getter.done()  # one group of two

    buf.set_version(2)  # "v0" is now 2 versions old: out before the learner can take it
    assert buf.stats().stale_dropped == 1 and len(buf) == 0
    buf.put(group("v1", version=1), version_started=1)
    await settle()
    assert not getter.done()  # "v0" no longer counts towards the batch
    buf.put(group("v2", version=2), version_started=2)
    batch = await asyncio.wait_for(getter, 1)
    assert [g[0].group_id for g in batch.groups] == ["v1", "v2"]
    assert batch.ages == [[1, 1], [0, 0]]
    assert buf.stats().staleness_histogram == {0: 2, 1: 2}


async def test_put_rejects_misuse() -> None:
    buf = ReplayBuffer(batch_groups=1, max_staleness=0)
    with pytest.raises(ValueError, match="without an admission"):
        buf.put(group("g"), version_started=0)
    buf.try_admit()
    with pytest.raises(ValueError, match="one group per call"):
        buf.put([*group("a"), *group("b")], version_started=0)
    with pytest.raises(ValueError, match="at least one trajectory"):
        buf.put([], version_started=0)
    buf.set_version(3)
    with pytest.raises(ValueError, match="versions only grow"):
        buf.set_version(2)
    with pytest.raises(ConfigError, match="max_staleness=-1"):
        ReplayBuffer(batch_groups=1, max_staleness=-1)


# ---- get ----

async def test_get_waits_and_is_woken_by_put() -> None:
    buf = ReplayBuffer(batch_groups=2, max_staleness=0)
    assert buf.try_admit(2)
    getter = asyncio.create_task(buf.get())
    buf.put(group("a"), version_started=0)
    await settle()
    assert not getter.done()  # one of two groups
    buf.put(group("b"), version_started=0)
    batch = await asyncio.wait_for(getter, 1)
    assert isinstance(batch, Batch) and batch.samples == 4 and batch.version == 0
    with pytest.raises(Exception, match="frozen"):
        batch.version = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match="get\\(3\\)"):
        await buf.get(3)


async def test_oldest_groups_first() -> None:
    buf = ReplayBuffer(batch_groups=1, max_staleness=5)
    assert buf.try_admit(5)
    for name, v in [("v2", 2), ("v0-first", 0), ("v1", 1), ("v0-second", 0), ("v3", 3)]:
        buf.put(group(name, version=v), version_started=v)
    buf.set_version(3)
    order = [(await buf.get()).groups[0][0].group_id for _ in range(5)]
    assert order == ["v0-first", "v0-second", "v1", "v2", "v3"]


# ---- checkpoints ----

async def test_state_dict_round_trip_keeps_groups_and_counters() -> None:
    buf = ReplayBuffer(batch_groups=2, max_staleness=2)
    assert buf.try_admit(6)
    buf.put(group("a"), version_started=0)
    buf.put([traj("flat", i, 0.0) for i in range(2)], version_started=0)
    buf.set_version(1)
    b = group("b", version=1, size=3)
    buf.put(b, version_started=1)
    buf.put(group("c", version=0), version_started=0)
    buf.cancel_admission()
    await buf.get(1)  # consumes "a" (version 0, first in)
    before = buf.stats()
    assert before.in_flight_groups == 1

    state = json.loads(json.dumps(buf.state_dict()))  # plain JSON, as a checkpoint holds it
    resumed = ReplayBuffer(batch_groups=2, max_staleness=2)
    resumed.load_state_dict(state)
    after = resumed.stats()
    # the rollout in flight died with the process: it no longer counts as started
    assert after.in_flight_groups == 0
    assert after.started_groups == before.started_groups - 1
    assert after.admitted_groups == before.admitted_groups - 1
    assert after.model_dump(exclude={"in_flight_groups", "started_groups",
                                     "admitted_groups"}) == \
        before.model_dump(exclude={"in_flight_groups", "started_groups", "admitted_groups"})

    batch = await resumed.get(2)
    assert [g[0].group_id for g in batch.groups] == ["c", "b"]
    assert batch.versions == [[0, 0], [1, 1, 1]] and batch.groups[1] == b
    with pytest.raises(ValueError, match="in use"):
        buf.load_state_dict(state)


# ---- a real asyncio run: rollout workers and a learner ----

async def simulate(max_staleness: int, *, steps: int = 30, workers: int = 12,
                   batch_groups: int = 4, train_s: float = 0.01,
                   ) -> tuple[ReplayBuffer, float, list[Batch]]:
    """Workers admit, "generate" two turns with the version current at each turn (the first
    one's at start) over a heavy-tailed time, and put; the learner gets, trains, bumps the
    version. Returns the buffer, the learner's wait fraction and the batches."""
    rng = random.Random(7)  # the same rollout times, in admission order, for every setting
    durations = iter([min(0.25, 0.004 * rng.paretovariate(1.5)) for _ in range(10_000)])
    buf = ReplayBuffer(batch_groups=batch_groups, max_staleness=max_staleness)
    counter = iter(range(10_000))
    batches: list[Batch] = []

    async def rollout_worker() -> None:
        while True:
            await buf.admit()
            try:
                name, duration, v0 = f"g{next(counter)}", next(durations), buf.version
                await asyncio.sleep(duration / 2)
                v1 = buf.version  # weights may have moved on between turns
                await asyncio.sleep(duration / 2)
            except asyncio.CancelledError:
                buf.cancel_admission()
                raise
            members = [traj(name, i, float(i % 2), versions=(v0, v1)) for i in range(2)]
            buf.put(members, version_started=v0)

    async def learner() -> float:
        loop = asyncio.get_running_loop()
        waited, start = 0.0, loop.time()
        for _ in range(steps):
            t0 = loop.time()
            batch = await buf.get()
            waited += loop.time() - t0
            batches.append(batch)
            assert batch.staleness_max <= max_staleness
            assert all(a <= max_staleness for ages in batch.ages for a in ages)
            await asyncio.sleep(train_s)
            buf.set_version(buf.version + 1)
        return waited / (loop.time() - start)

    tasks = [asyncio.create_task(rollout_worker()) for _ in range(workers)]
    try:
        wait_fraction = await asyncio.wait_for(learner(), 20)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    stats = buf.stats()
    # every admission ended exactly once: in the buffer, consumed, or dropped for a reason
    assert stats.admitted_groups == (stats.in_flight_groups + stats.buffered_groups
                                     + stats.consumed_groups + sum(stats.dropped.values()))
    assert stats.in_flight_groups == 0 and stats.consumed_groups == steps * batch_groups
    return buf, wait_fraction, batches


async def test_synchronous_run_never_trains_on_a_stale_sample() -> None:
    buf, _, batches = await simulate(0)
    stats = buf.stats()
    assert stats.staleness_histogram == {0: stats.consumed_samples}
    assert stats.staleness_max_consumed == 0
    assert stats.stale_dropped == 0  # admission alone kept it synchronous
    # one batch in flight at a time: the weights never moved under a running rollout, and
    # batch k was generated by version k
    for k, batch in enumerate(batches):
        assert batch.version == k
        assert {s.weights_version for t in batch.trajectories for s in t.steps} == {k}


async def test_async_run_stays_within_staleness_and_idles_the_learner_less() -> None:
    sync_buf, sync_wait, _ = await simulate(0)
    async_buf, async_wait, _ = await simulate(2)
    stats = async_buf.stats()
    assert stats.staleness_max_consumed is not None and stats.staleness_max_consumed <= 2
    assert max(stats.staleness_histogram) >= 1  # it did train off-policy, within the bound
    assert sync_buf.stats().staleness_max_consumed == 0
    # the heavy tail stalls every synchronous step; async overlaps it with training
    assert async_wait < 0.5 * sync_wait, (async_wait, sync_wait)
