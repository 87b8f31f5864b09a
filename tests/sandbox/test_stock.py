"""The stock of things started ahead in sandboxes (``sandbox/stock.py``), on real sandboxes:
what ``take`` hands out was started by ``fill``, one whose sandbox died is passed over, a
failed start in the background is dropped and met again by the next ``take``, and closing
the stock closes every sandbox it still holds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from polling import until
from tempering.errors import SandboxStartError
from tempering.sandbox import Sandbox, SandboxSpec, create_sandbox
from tempering.sandbox.stock import Stock


@dataclass
class Started:
    """A sandbox with something waiting in it, as the grader's launchers are."""

    sb: Sandbox


def _maker(made: list[Sandbox]) -> Callable[[], Awaitable[Started]]:
    """What a stock is handed to start one: a fresh sandbox, remembered in ``made``."""
    async def make() -> Started:
        sb = await create_sandbox(SandboxSpec())
        made.append(sb)
        return Started(sb)

    return make


async def test_take_hands_out_what_fill_started_and_tops_the_stock_up() -> None:
    made: list[Sandbox] = []
    make = _maker(made)
    stock: Stock[Started] = Stock(2)
    try:
        stock.fill("k", make)
        await until(lambda: len(made) == 2, timeout=60)
        first = await stock.take("k", make)
        assert first.sb is made[0]  # started ahead, not made now
        await until(lambda: len(made) == 3, timeout=60)  # the take started a replacement
        await made[1].close()  # it died while stocked: passed over
        second = await stock.take("k", make)
        assert second.sb is made[2]
        await first.sb.close()
        await second.sb.close()
    finally:
        await stock.close()
    await until(lambda: all(sb.closed for sb in made), timeout=30)


async def test_a_failed_start_is_dropped_and_the_next_take_meets_it() -> None:
    tries = 0

    async def failing() -> Started:
        nonlocal tries
        tries += 1
        raise SandboxStartError("no room")

    stock: Stock[Started] = Stock(1)
    try:
        stock.fill("k", failing)
        await until(lambda: tries == 1)
        with pytest.raises(SandboxStartError, match="no room"):
            await stock.take("k", failing)
    finally:
        await stock.close()


async def test_with_no_warm_stock_take_makes_one_now() -> None:
    made: list[Sandbox] = []
    make = _maker(made)
    stock: Stock[Started] = Stock(0)
    stock.fill("k", make)
    got = await stock.take("k", make)
    try:
        assert made == [got.sb]  # nothing was started ahead, nor after
    finally:
        await got.sb.close()
        await stock.close()
