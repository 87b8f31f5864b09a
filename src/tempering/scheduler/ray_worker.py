"""The Ray rollout worker (one per CPU node) and what every Ray actor's client shares.

``RolloutWorker`` is an async actor (one event loop, many jobs at once, like the in-process
executor): ``run`` builds a worker-side ``JobContext`` (the same class the scheduler hands out,
so ``ctx.pause_requested`` and ``ctx.resume`` mean the same thing on a cluster) and awaits the
job on the actor's loop. The driver addresses each run by a token it made up, which is how
``pause`` and ``cancel`` reach the right run; either can overtake the ``run`` call it is about
(Ray does not order calls to an async actor), so a token it does not know yet is remembered and
applied when the run arrives. ``ping`` shares the loop with the jobs on purpose: a job that
blocks the loop (a hung C call, a ``time.sleep``) stops the pings, and the driver's lease then
declares the whole worker lost and kills it, which is the only way to get its resources back.

The inference actor, a policy served to every worker, lives with the policies
(``policy/ray.py``) and uses the helpers here: ``WorkerInfo``, ``await_ref``, ``describe``,
``unwrap``, ``kill``, ``node_id``.

The actor classes are plain classes; the driver makes them actors with ``ray.remote(cls)``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import (
    NodeDiedError,
    ObjectLostError,
    RayActorError,
    RayTaskError,
    WorkerCrashedError,
)

from tempering.scheduler.job import JobContext, JobFn, run_worker_stop

log = logging.getLogger(__name__)

LOST = (RayActorError, WorkerCrashedError, NodeDiedError, ObjectLostError)
"""What awaiting an actor call raises when the actor, its process, its node or its owner died."""

EARLY_TOKENS = 4096
"""Most not-yet-seen tokens remembered for early pauses and cancels (a late one for a run that
already ended looks the same and would otherwise be kept forever)."""


@dataclass(frozen=True)
class WorkerInfo:
    """Where a rollout worker runs, as it reports itself."""

    name: str
    node_id: str
    pid: int
    hostname: str


async def await_ref(ref: Any) -> Any:
    """``await ref`` as a coroutine (for ``asyncio.wait_for`` and ``ensure_future``)."""
    return await ref


def describe(exc: BaseException) -> str:
    """A one-line account of an error (Ray's messages run to many lines)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def unwrap(exc: RayTaskError) -> BaseException:
    """The exception the remote code raised, as its own class (Ray wraps it in RayTaskError)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, Exception):
        return cause
    unwrapped: BaseException = exc.as_instanceof_cause()  # type: ignore[no-untyped-call]
    return unwrapped


def kill(handle: Any) -> None:
    """Kill an actor for good; one already dead is fine."""
    try:
        ray.kill(handle, no_restart=True)
    except Exception as exc:  # noqa: BLE001 - already dead, or Ray is shutting down
        log.debug("killing actor %s: %s", handle, exc)


def node_id() -> str:
    return str(ray.get_runtime_context().get_node_id())


class RolloutWorker:
    """Runs scheduler jobs on one node's event loop."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._runs: dict[str, tuple[JobContext, asyncio.Task[Any]]] = {}
        self._early_pause: OrderedDict[str, None] = OrderedDict()
        self._early_cancel: OrderedDict[str, None] = OrderedDict()

    async def info(self) -> WorkerInfo:
        return WorkerInfo(self.name, node_id(), os.getpid(), os.uname().nodename)

    async def ping(self) -> dict[str, float]:
        """Alive; and for each running job, seconds since its own last ``ctx.heartbeat()``."""
        now = time.monotonic()
        return {token: now - ctx.last_heartbeat for token, (ctx, _) in self._runs.items()}

    async def run(self, fn: JobFn, job_id: str, attempt: int, resume: Any, token: str,
                  pause: bool = False) -> Any:
        """``await fn(ctx)`` here; its value or its exception is the job's."""
        if _forget(self._early_cancel, token):
            raise asyncio.CancelledError(f"job {job_id} was cancelled before it started")
        ctx = JobContext(job_id, attempt, resume)
        if _forget(self._early_pause, token) or pause:
            ctx.request_pause()
        task = asyncio.current_task()
        assert task is not None  # an actor method always runs inside a task
        self._runs[token] = (ctx, task)
        try:
            return await fn(ctx)
        finally:
            del self._runs[token]

    async def stop(self) -> list[str]:
        """Close what jobs registered with ``at_worker_stop`` (their stores flush), before the
        executor asks this process to exit; returns the errors, if any, as text."""
        return await asyncio.to_thread(run_worker_stop)

    async def pause(self, token: str) -> bool:
        """Ask the run ``token`` to stop at its next safe point; False if it is not here yet."""
        run = self._runs.get(token)
        if run is None:
            _remember(self._early_pause, token)
            return False
        run[0].request_pause()
        return True

    async def cancel(self, token: str) -> bool:
        """Cancel the run ``token`` now (CancelledError at its current await)."""
        run = self._runs.get(token)
        if run is None:
            _remember(self._early_cancel, token)
            return False
        run[1].cancel()
        return True

    async def running(self) -> list[str]:
        """The job ids running here (for tests and for looking at a live cluster)."""
        return [ctx.job_id for ctx, _ in self._runs.values()]


def _forget(tokens: OrderedDict[str, None], token: str) -> bool:
    """Whether ``token`` was remembered (and forget it)."""
    if token in tokens:
        del tokens[token]
        return True
    return False


def _remember(tokens: OrderedDict[str, None], token: str) -> None:
    tokens[token] = None
    while len(tokens) > EARLY_TOKENS:
        tokens.popitem(last=False)
