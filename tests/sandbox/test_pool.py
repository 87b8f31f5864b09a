"""SandboxPool: the cap, queueing, warm sandboxes, leases and errors, on real sandboxes."""

from __future__ import annotations

import asyncio
import time

import pytest

from tempering.errors import ResourceExhaustedError, SandboxNotFoundError
from tempering.sandbox import SandboxPool


async def test_allocate_release_and_stats(make_spec) -> None:
    async with SandboxPool(max_instances=2, spec=make_spec()) as pool:
        sb = await pool.allocate("t1")
        assert (await sb.exec("echo hi")).stdout == "hi\n"
        assert pool.get("t1") is sb
        assert pool.stats().active == 1
        await pool.release("t1")
        assert sb.closed
        stats = pool.stats()
        assert (stats.active, stats.allocated, stats.released) == (0, 1, 1)


async def test_full_pool_raises_when_not_waiting(make_spec) -> None:
    async with SandboxPool(max_instances=1, spec=make_spec()) as pool:
        await pool.allocate("a")
        with pytest.raises(ResourceExhaustedError, match="max_instances=1"):
            await pool.allocate("b")


async def test_full_pool_queues_until_release(make_spec) -> None:
    async with SandboxPool(max_instances=1, spec=make_spec()) as pool:
        await pool.allocate("a")
        waiter = asyncio.create_task(pool.allocate("b", timeout=10))
        await asyncio.sleep(0.2)
        assert not waiter.done() and pool.stats().waiting == 1
        await pool.release("a")
        sb = await asyncio.wait_for(waiter, 10)
        assert (await sb.exec("echo b")).stdout == "b\n"


async def test_wait_times_out(make_spec) -> None:
    async with SandboxPool(max_instances=1, spec=make_spec()) as pool:
        await pool.allocate("a")
        start = time.perf_counter()
        with pytest.raises(ResourceExhaustedError, match="within"):
            await pool.allocate("b", timeout=0.3)
        assert 0.25 < time.perf_counter() - start < 3


async def _until_warm(pool: SandboxPool, count: int) -> None:
    for _ in range(100):
        if pool.stats().warm == count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the pool never had {count} warm sandboxes: {pool.stats()}")


async def test_warm_pool_serves_allocations(make_spec) -> None:
    async with SandboxPool(max_instances=4, warm=2, spec=make_spec()) as pool:
        await _until_warm(pool, 2)
        start = time.perf_counter()
        await pool.allocate("t")
        assert time.perf_counter() - start < 0.05
        assert pool.stats().warm_hits == 1


async def test_unknown_and_double_release(make_spec) -> None:
    async with SandboxPool(max_instances=2, spec=make_spec()) as pool:
        with pytest.raises(SandboxNotFoundError, match="nobody"):
            await pool.release("nobody")
        await pool.allocate("t")
        with pytest.raises(ValueError, match="already holds"):
            await pool.allocate("t")
        await pool.release("t")
        with pytest.raises(SandboxNotFoundError, match="already released"):
            await pool.release("t")


async def test_expired_lease_is_reclaimed(make_spec) -> None:
    async with SandboxPool(max_instances=1, spec=make_spec(), lease_s=0.5) as pool:
        sb = await pool.allocate("crashed-rollout")
        b = await pool.allocate("next", timeout=5)  # waits for the reclaim
        assert sb.closed and not b.closed
        assert pool.stats().reclaimed == 1
        with pytest.raises(SandboxNotFoundError, match="lease"):
            await pool.release("crashed-rollout")


async def test_renew_keeps_a_lease(make_spec) -> None:
    async with SandboxPool(max_instances=2, spec=make_spec(), lease_s=0.6) as pool:
        sb = await pool.allocate("t")
        for _ in range(4):
            await asyncio.sleep(0.3)
            pool.renew("t")
        assert not sb.closed


async def test_other_spec_evicts_warm(make_spec) -> None:
    async with SandboxPool(max_instances=1, warm=1, spec=make_spec()) as pool:
        await _until_warm(pool, 1)
        sb = await pool.allocate("t", make_spec(memory_mb=128))
        assert sb.spec.memory_mb == 128


async def test_many_concurrent_allocations_respect_the_cap(make_spec) -> None:
    peak = 0

    async def episode(pool: SandboxPool, i: int) -> str:
        nonlocal peak
        sb = await pool.allocate(f"e{i}", timeout=None)
        peak = max(peak, pool.stats().active)
        out = (await sb.exec(f"echo {i}")).stdout
        await pool.release(f"e{i}")
        return out

    async with SandboxPool(max_instances=4, spec=make_spec()) as pool:
        outs = await asyncio.gather(*(episode(pool, i) for i in range(40)))
    assert outs == [f"{i}\n" for i in range(40)] and peak <= 4


def test_bad_pool_arguments() -> None:
    with pytest.raises(ValueError, match="max_instances"):
        SandboxPool(max_instances=0)
    with pytest.raises(ValueError, match="warm"):
        SandboxPool(max_instances=2, warm=3)
