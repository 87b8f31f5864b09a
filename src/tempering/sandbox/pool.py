"""``SandboxPool``: the seed's ``SandboxCluster``, made asynchronous and safe to share.

The pool owns allocation for many concurrent episodes:

- at most ``max_instances`` live sandboxes (handed out, warm, or starting);
- ``warm`` pre-started sandboxes per spec, refilled in the background, so that an allocation
  does not pay the start; a warm sandbox of another spec is closed to make room when full;
- when full, ``allocate`` raises ``ResourceExhaustedError`` at once (``timeout=0``, the default)
  or queues, first come first served, for up to ``timeout`` seconds (``None``: for as long as it
  takes), which is the back-pressure a scheduler wants;
- a sandbox is never handed out twice: ``release`` closes it, and the next episode gets a fresh
  one, so nothing of an earlier episode (file, process, environment) can leak into the next;
- leases: with ``lease_s``, a sandbox whose holder neither renews nor releases it in time (a
  crashed rollout, say) is reclaimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from tempering.errors import ResourceExhaustedError, SandboxError, SandboxNotFoundError
from tempering.sandbox.base import Sandbox
from tempering.sandbox.spec import SandboxSpec


@dataclass(frozen=True, slots=True)
class PoolStats:
    max_instances: int
    active: int
    """Sandboxes handed out now."""
    warm: int
    """Started sandboxes waiting to be handed out."""
    starting: int
    waiting: int
    """Callers queued in ``allocate``."""
    allocated: int
    """Allocations so far."""
    warm_hits: int
    """Allocations served by a warm sandbox."""
    released: int
    reclaimed: int
    """Sandboxes closed because their lease expired."""
    start_failures: int


@dataclass(slots=True)
class _Lease:
    sandbox: Sandbox
    expires: float | None


class SandboxPool:
    """Allocates sandboxes to tasks under a global cap, with a warm pool and leases."""

    def __init__(self, max_instances: int = 1000, warm: int = 0, *,
                 spec: SandboxSpec | None = None, lease_s: float | None = None) -> None:
        if max_instances < 1:
            raise ValueError(f"max_instances must be at least 1, got {max_instances}")
        if warm < 0 or warm > max_instances:
            raise ValueError(
                f"warm must be between 0 and max_instances ({max_instances}), got {warm}")
        if lease_s is not None and lease_s <= 0:
            raise ValueError(f"lease_s must be positive, got {lease_s}")
        self.max_instances = max_instances
        self.warm = warm
        self.spec = spec or SandboxSpec()
        self.lease_s = lease_s
        self._active: dict[str, _Lease] = {}
        self._warm: dict[str, deque[Sandbox]] = {}
        self._specs: dict[str, SandboxSpec] = {}
        self._starting = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._gone: OrderedDict[str, str] = OrderedDict()  # task id -> why it is no longer held
        self._refill_needed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._counts = dict(allocated=0, warm_hits=0, released=0, reclaimed=0, start_failures=0)

    # ---- lifecycle ----

    async def start(self) -> None:
        """Clean up after crashed earlier processes and start the background refill."""
        if self._tasks or self._closed:
            return
        from tempering.sandbox import backend_class

        reclaim = getattr(backend_class(self.spec.backend), "reclaim", None)
        if reclaim is not None:
            await asyncio.to_thread(reclaim)
        self._specs.setdefault(self.spec.key(), self.spec)
        self._tasks = [asyncio.create_task(self._refill_loop()),
                       asyncio.create_task(self._lease_loop())]
        self._refill_needed.set()

    async def close(self) -> None:
        """Close every sandbox of the pool, handed out or warm."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        sandboxes = [lease.sandbox for lease in self._active.values()]
        sandboxes += [sb for q in self._warm.values() for sb in q]
        self._active.clear()
        self._warm.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(ResourceExhaustedError("the pool was closed"))
        await asyncio.gather(*(sb.close() for sb in sandboxes), return_exceptions=True)

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- allocation ----

    @property
    def live(self) -> int:
        return len(self._active) + sum(len(q) for q in self._warm.values()) + self._starting

    async def allocate(self, task_id: str, spec: SandboxSpec | None = None, *,
                       timeout: float | None = 0.0, lease_s: float | None = None) -> Sandbox:
        """A fresh sandbox for ``task_id``.

        When the pool is full: ``timeout=0`` raises ``ResourceExhaustedError`` at once, a
        positive timeout waits that long for a release, ``None`` waits without limit.
        """
        if self._closed:
            raise ResourceExhaustedError("the pool is closed")
        if task_id in self._active:
            raise ValueError(f"task {task_id!r} already holds sandbox "
                             f"{self._active[task_id].sandbox.id}; release it first")
        await self.start()
        spec = spec or self.spec
        key = spec.key()
        if key not in self._specs:
            self._specs[key] = spec
            self._refill_needed.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            sandbox = self._take_warm(key)
            if sandbox is not None:
                self._counts["warm_hits"] += 1
                break
            if self.live >= self.max_instances:
                self._evict_warm()
            if self.live < self.max_instances:
                sandbox = await self._start_one(spec)
                break
            await self._wait_for_slot(task_id, deadline)
        lease = lease_s if lease_s is not None else self.lease_s
        self._active[task_id] = _Lease(sandbox, None if lease is None else time.monotonic() + lease)
        self._gone.pop(task_id, None)
        self._counts["allocated"] += 1
        self._refill_needed.set()
        return sandbox

    async def release(self, task_id: str) -> None:
        """Close ``task_id``'s sandbox and free its slot."""
        lease = self._active.pop(task_id, None)
        if lease is None:
            why = self._gone.get(task_id)
            raise SandboxNotFoundError(
                f"task {task_id!r} holds no sandbox in this pool" + (f" ({why})" if why else ""))
        self._counts["released"] += 1
        self._forget(task_id, "already released")
        try:
            await lease.sandbox.close()
        finally:
            self._slot_freed()

    def get(self, task_id: str) -> Sandbox:
        """The sandbox ``task_id`` holds."""
        try:
            return self._active[task_id].sandbox
        except KeyError:
            raise SandboxNotFoundError(f"task {task_id!r} holds no sandbox in this pool") from None

    def renew(self, task_id: str, lease_s: float | None = None) -> None:
        """Extend ``task_id``'s lease by ``lease_s`` (default: the pool's) from now."""
        lease = self._active.get(task_id)
        if lease is None:
            raise SandboxNotFoundError(f"task {task_id!r} holds no sandbox in this pool")
        seconds = lease_s if lease_s is not None else self.lease_s
        lease.expires = None if seconds is None else time.monotonic() + seconds

    def stats(self) -> PoolStats:
        return PoolStats(max_instances=self.max_instances, active=len(self._active),
                         warm=sum(len(q) for q in self._warm.values()), starting=self._starting,
                         waiting=sum(not w.done() for w in self._waiters), **self._counts)

    # ---- internals ----

    def _take_warm(self, key: str) -> Sandbox | None:
        queue = self._warm.get(key)
        while queue:
            sandbox = queue.popleft()
            if not sandbox.closed:
                return sandbox
            self._slot_freed()
        return None

    def _evict_warm(self) -> None:
        for queue in self._warm.values():
            if queue:
                sandbox = queue.pop()
                asyncio.get_running_loop().create_task(self._close_quietly(sandbox))
                return

    async def _close_quietly(self, sandbox: Sandbox) -> None:
        with contextlib.suppress(Exception):
            await sandbox.close()

    async def _start_one(self, spec: SandboxSpec) -> Sandbox:
        from tempering.sandbox import create_sandbox

        self._starting += 1
        try:
            return await create_sandbox(spec)
        except BaseException:
            self._counts["start_failures"] += 1
            self._slot_freed()
            raise
        finally:
            self._starting -= 1

    async def _wait_for_slot(self, task_id: str, deadline: float | None) -> None:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise ResourceExhaustedError(
                f"sandbox pool is full ({self.max_instances} of max_instances={self.max_instances} "
                f"in use); cannot allocate for task {task_id!r}: release a sandbox, raise "
                "max_instances, or pass timeout= to wait")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, remaining)
        except TimeoutError:
            raise ResourceExhaustedError(
                f"no sandbox became free within the {deadline and round(remaining or 0, 3)} s "
                f"timeout for task {task_id!r} (max_instances={self.max_instances})") from None
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def _slot_freed(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
        self._refill_needed.set()

    def _forget(self, task_id: str, why: str) -> None:
        self._gone[task_id] = why
        while len(self._gone) > 10_000:
            self._gone.popitem(last=False)

    async def _refill_loop(self) -> None:
        while True:
            await self._refill_needed.wait()
            self._refill_needed.clear()
            for key, spec in list(self._specs.items()):
                queue = self._warm.setdefault(key, deque())
                while (len(queue) < self.warm and self.live < self.max_instances
                       and not self._waiters):
                    try:
                        sandbox = await self._start_one(spec)
                    except (SandboxError, OSError):
                        await asyncio.sleep(1.0)  # do not spin on a broken backend
                        break
                    queue.append(sandbox)

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            expired = [t for t, lease in self._active.items()
                       if lease.expires is not None and lease.expires <= now]
            for task_id in expired:
                lease = self._active.pop(task_id)
                self._counts["reclaimed"] += 1
                self._forget(task_id, "reclaimed after its lease expired")
                await self._close_quietly(lease.sandbox)
                self._slot_freed()
