"""A stock of things started ahead in sandboxes, so that work needing one never waits for it.

What is stocked is anything that holds a sandbox (``sb``): a sandbox with a process already
started in it and waiting for its input (the grader's launchers: a sandbox and an interpreter
with pytest imported). Each kind has a key; ``fill`` tops the stock of a key up to ``warm`` in
the background, ``take`` hands out a stocked one still alive (and refills), else makes one
now. A stocked one is used once: whoever takes it closes its sandbox. A failed start in the
background is dropped quietly: the next ``take`` makes its own and meets the error there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

from tempering.errors import SandboxError
from tempering.sandbox.base import Sandbox


class Holds(Protocol):
    @property
    def sb(self) -> Sandbox: ...


T = TypeVar("T", bound=Holds)


class Stock(Generic[T]):
    """Up to ``warm`` started ``T`` per key, made by the ``make`` each call names."""

    def __init__(self, warm: int) -> None:
        self.warm = warm
        self._stock: dict[str, list[T]] = {}
        self._starting: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def fill(self, key: str, make: Callable[[], Awaitable[T]]) -> None:
        """Start, in the background, as many as ``key``'s stock lacks of ``warm``."""
        stock = self._stock.setdefault(key, [])
        while not self._closed and len(stock) + self._starting.get(key, 0) < self.warm:
            self._starting[key] = self._starting.get(key, 0) + 1
            self.background(self._one(key, make))

    async def take(self, key: str, make: Callable[[], Awaitable[T]]) -> T:
        """A stocked one of ``key`` whose sandbox is still open, else one made now."""
        stock = self._stock.get(key, [])
        found = None
        while stock and found is None:
            candidate = stock.pop(0)
            if not candidate.sb.closed:
                found = candidate
        if self.warm:
            self.fill(key, make)
        return found or await make()

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task the stock cancels when it closes."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _one(self, key: str, make: Callable[[], Awaitable[T]]) -> None:
        try:
            made = await make()
        except (SandboxError, OSError):
            return  # the next take starts its own and reports the error
        finally:
            self._starting[key] -= 1
        if self._closed:  # closed while it started: nobody will take it
            await asyncio.shield(made.sb.close())
        else:
            self._stock[key].append(made)

    async def close(self) -> None:
        """Stop what is starting, and close every stocked sandbox."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for stock in self._stock.values():
            for made in stock:
                await made.sb.close()
        self._stock.clear()
