"""Where jobs run: the executor boundary, and the in-process one on asyncio.

The scheduler decides *when* a job runs and with which resources; an executor decides *where*:
``AsyncioExecutor`` runs it as a task on this event loop (the default: thousands of episodes
share one loop), ``RayExecutor`` (``scheduler/ray.py``) on a Ray actor placed by custom
resources. Both take the same ``JobSpec`` and ``JobContext``, so moving a run to a cluster is a
change of executor, not of code.

An executor raises ``WorkerLostError`` when the worker died or went silent (the job may run
again); anything else the job raised is the job's. Cancelling the coroutine returned by ``run``
must stop the job at once wherever it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from tempering.scheduler.job import JobContext, JobSpec
from tempering.scheduler.resources import Resources

CapacityListener = Callable[[Resources], None]


@runtime_checkable
class Executor(Protocol):
    name: str

    async def start(self, on_capacity: CapacityListener) -> None:
        """Get ready; an executor that knows its capacity (Ray's nodes) reports it, and again
        whenever it changes (a node joined or left)."""
        ...

    async def run(self, job: JobSpec, ctx: JobContext) -> Any:
        """Run ``job`` to its end and return its value."""
        ...

    async def close(self) -> None: ...


class AsyncioExecutor:
    """Runs jobs as tasks on the caller's event loop."""

    name = "asyncio"

    async def start(self, on_capacity: CapacityListener) -> None:
        pass  # its capacity is what the scheduler was given

    async def run(self, job: JobSpec, ctx: JobContext) -> Any:
        return await job.fn(ctx)

    async def close(self) -> None:
        pass
