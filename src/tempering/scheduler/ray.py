"""The Ray executor: scheduler jobs on rollout-worker actors, one per node that offers a resource.

Placement. Nodes say what they are for with Ray custom resources: CPU nodes that host
sandboxes start with ``--resources='{"rollout": 1}'``, GPU nodes with ``'{"inference": 1}'``.
The executor starts one async ``RolloutWorker`` actor on every alive node offering
``worker_resource``, pinned there (node affinity, not soft), and reports ``slots_per_worker``
per worker to the scheduler as its capacity. The scheduler keeps admitting against the total;
the executor places each admitted job on the worker with the most free room for its demand, so
sandbox slots are counted per node, not only in aggregate. Inference runs apart, in an
``InferenceActor`` on a GPU node (``policy/ray.py``: ``start_inference``), which jobs reach
through ``RayPolicy``.

Membership. A watcher lists the nodes every ``poll_s``: a new node with the resource gets a
worker and the capacity goes up once the worker answers; a node that left takes its worker
with it, capacity goes down, and the jobs that were running there fail with
``WorkerLostError`` at once (the scheduler runs them again while attempts remain).

Leases. Each worker is pinged every ``lease_s / 3`` on the same event loop its jobs use. One
that has not answered for ``lease_s`` (a job blocked its loop, the process froze, the network
split) is declared lost: its jobs raise ``WorkerLostError``, its resources are the scheduler's
again, the actor is killed and, if its node is alive, a fresh worker replaces it. A ping also
carries each job's own ``ctx.heartbeat()`` back to the driver's context.

Faults map to one error. Whatever the worker's death looks like from here (actor died, process
killed, node gone, owner gone, lease expired), the job raises ``WorkerLostError`` naming the
worker and its node. What the job itself raised arrives as the job's own exception class, not
Ray's wrapper, so the scheduler treats a job's bug the same on both executors.

Cancellation is real: cancelling ``run`` cancels the job's task inside the actor (a
``CancelledError`` at its current await, so its ``finally`` blocks close its sandbox), and the
room it held on the worker is free at once. Pauses are forwarded the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tempering.errors import ConfigError, WorkerLostError
from tempering.scheduler.executor import CapacityListener
from tempering.scheduler.job import JobContext, JobSpec, Paused
from tempering.scheduler.ray_worker import (
    LOST,
    RolloutWorker,
    WorkerInfo,
    await_ref,
    describe,
    kill,
    unwrap,
)
from tempering.scheduler.resources import Resources

__all__ = ["RayExecutor", "WorkerInfo"]

log = logging.getLogger(__name__)

WORKER_SHARE = 0.001
"""How much of ``worker_resource`` a worker actor takes: the resource marks the node, the
executor's ``slots_per_worker`` says how much work it takes."""

PAUSED_REMEMBERED = 10_000
"""Most paused jobs whose worker is remembered (a job never resumed must not grow it forever)."""


@dataclass(eq=False)
class _Worker:
    handle: Any
    info: WorkerInfo
    lost: asyncio.Future[str]
    """Resolved with the reason once the worker is declared lost; every run waits on it too."""
    used: Resources = field(default_factory=Resources)
    runs: dict[str, JobContext] = field(default_factory=dict)
    heartbeat: asyncio.Task[None] | None = None

    def __str__(self) -> str:
        return f"{self.info.name} (pid {self.info.pid} on node {self.info.node_id[:12]}, " \
               f"host {self.info.hostname})"


class RayExecutor:
    """Runs scheduler jobs on Ray actors placed by a custom resource; see the module docstring."""

    name = "ray"

    def __init__(self, *, address: str | None = None, worker_resource: str = "rollout",
                 slots_per_worker: Resources = Resources.of(sandbox=8, cpu=2),
                 poll_s: float = 2.0, lease_s: float = 30.0, start_timeout_s: float = 120.0,
                 max_concurrency: int = 1000, init_kwargs: Mapping[str, Any] | None = None,
                 exit_grace_s: float = 10.0) -> None:
        if not slots_per_worker or any(v <= 0 for v in slots_per_worker.values()):
            raise ConfigError(f"slots_per_worker={slots_per_worker!r}: give each worker a "
                              "positive amount of something, e.g. Resources.of(sandbox=8)")
        for label, value in (("poll_s", poll_s), ("lease_s", lease_s),
                             ("start_timeout_s", start_timeout_s)):
            if value <= 0:
                raise ConfigError(f"{label}={value}: must be a positive number of seconds")
        self.address, self.worker_resource = address, worker_resource
        self.slots, self.poll_s, self.lease_s = slots_per_worker, poll_s, lease_s
        self.start_timeout_s, self.max_concurrency = start_timeout_s, max_concurrency
        self.init_kwargs = dict(init_kwargs or {})
        self.exit_grace_s = exit_grace_s
        """On close, how long workers get to exit cleanly (flushing their stores)."""
        self._workers: dict[str, _Worker] = {}  # by node id: one worker per node
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._paused_on: OrderedDict[str, _Worker] = OrderedDict()
        self._on_capacity: CapacityListener | None = None
        self._reported: int | None = None
        self._changed = asyncio.Event()
        self._poke = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._owns_ray = self._closed = False
        self._names = itertools.count()

    @property
    def workers(self) -> list[WorkerInfo]:
        """The live rollout workers: name, node id, pid, host."""
        return [w.info for w in self._workers.values()]

    def capacity(self) -> Resources:
        """``slots_per_worker`` times the number of live workers."""
        return Resources({k: v * len(self._workers) for k, v in self.slots.items()})

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, on_capacity: CapacityListener) -> None:
        if self._watcher is not None or self._closed:
            raise RuntimeError("a RayExecutor starts once; make a new one")
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, **self.init_kwargs}
            if self.address is None and not os.environ.get("RAY_ADDRESS"):
                # A fresh single-node Ray: this machine is the one rollout node.
                kwargs.setdefault("resources", {self.worker_resource: 1})
            ray.init(address=self.address, **kwargs)  # blocks a few seconds, once
            self._owns_ray = True
        await self._reconcile()
        await asyncio.gather(*list(self._starting.values()), return_exceptions=True)
        self._on_capacity = on_capacity  # from here on: the first report is the whole start
        if not self._workers:
            log.warning("no alive Ray node offers the resource %r: no job runs until one "
                        "joins (ray start --address=HEAD:6379 --resources='{\"%s\": 1}')",
                        self.worker_resource, self.worker_resource)
        self._report(force=True)
        self._watcher = asyncio.create_task(self._watch(), name="ray-executor-watch")

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self._watcher, *self._starting.values(),
                             *(w.heartbeat for w in self._workers.values())) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for worker in list(self._workers.values()):
            if not worker.lost.done():
                worker.lost.set_result(f"rollout worker {worker} was stopped: the executor "
                                       "closed")
        # Have the workers close what their jobs left open (stores flush what they buffered)
        # and answer, then ask them to exit and kill whatever has not exited in time: the
        # flush does not depend on an exiting actor's atexit handlers beating that kill.
        stops = [w.handle.stop.remote() for w in self._workers.values()]
        if stops:
            done, _ = await asyncio.wait([asyncio.ensure_future(_errors(ref)) for ref in stops],
                                         timeout=self.exit_grace_s)
            for errors in (t.result() for t in done):
                for error in errors:
                    log.warning("stopping a rollout worker: %s", error)
        exits = [w.handle.__ray_terminate__.remote() for w in self._workers.values()]
        if exits:
            await asyncio.wait([asyncio.ensure_future(_quiet(ref)) for ref in exits],
                               timeout=self.exit_grace_s)
        for worker in list(self._workers.values()):
            kill(worker.handle)
        self._workers.clear()
        self._notify()
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    # -- running jobs ------------------------------------------------------------------------

    async def run(self, job: JobSpec, ctx: JobContext) -> Any:
        worker = await self._place(job, ctx)
        token = uuid.uuid4().hex
        worker.used += job.demand
        worker.runs[token] = ctx

        def forward_pause() -> None:
            if not worker.lost.done():
                worker.handle.pause.remote(token)

        ctx.pause_listeners.append(forward_pause)
        ref = worker.handle.run.remote(job.fn, ctx.job_id, ctx.attempt, ctx.resume, token,
                                       ctx.pause_requested)
        waiter = asyncio.ensure_future(await_ref(ref))
        where = f"job {ctx.job_id} (attempt {ctx.attempt})"
        try:
            done, _ = await asyncio.wait((waiter, worker.lost),
                                         return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                raise WorkerLostError(f"{where}: {worker.lost.result()}; the scheduler runs it "
                                      "again while it has attempts left")
            try:
                value = waiter.result()
            except RayTaskError as exc:
                raise unwrap(exc) from exc
            except LOST as exc:
                self._lose(worker, describe(exc))
                raise WorkerLostError(f"{where}: rollout worker {worker} was lost "
                                      f"({describe(exc)}); the scheduler runs it again while "
                                      "it has attempts left") from exc
            if isinstance(value, Paused) and value.keep:
                self._remember_paused(ctx.job_id, worker)
            return value
        except asyncio.CancelledError:
            if not waiter.done() and not worker.lost.done():
                worker.handle.cancel.remote(token)  # stops the job inside the actor now
            raise
        finally:
            waiter.cancel()
            ctx.pause_listeners.remove(forward_pause)
            worker.used -= job.demand
            del worker.runs[token]
            self._notify()

    async def _place(self, job: JobSpec, ctx: JobContext) -> _Worker:
        """The worker with the most free room for ``job``; a paused job's own worker (it
        holds the job's sandbox) when the job resumes."""
        held = self._paused_on.pop(ctx.job_id, None)
        if held is not None and ctx.resume is not None:
            if held.lost.done():
                raise WorkerLostError(f"job {ctx.job_id} was paused on {held.lost.result()}; "
                                      "what it kept there (its sandbox) is gone")
            return held
        limited = frozenset(self.slots)
        while True:
            if self._closed:
                raise WorkerLostError(f"job {ctx.job_id}: the Ray executor is closed")
            workers = list(self._workers.values())
            fitting = [w for w in workers if job.demand.fits_in(self.slots - w.used, limited)]
            if fitting:
                return max(fitting, key=self._room)
            if workers and not job.demand.fits_in(self.slots, limited):
                log.warning("job %s demands %r, more than one worker's slots %r: placed on the "
                            "least loaded worker", ctx.job_id, job.demand, self.slots)
                return max(workers, key=self._room)
            changed = self._changed  # room frees up, or a worker joins
            await changed.wait()

    def _room(self, worker: _Worker) -> float:
        return sum((amount - worker.used[name]) / amount for name, amount in self.slots.items())

    def _remember_paused(self, job_id: str, worker: _Worker) -> None:
        self._paused_on[job_id] = worker
        while len(self._paused_on) > PAUSED_REMEMBERED:
            self._paused_on.popitem(last=False)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _report(self, *, force: bool = False) -> None:
        if self._on_capacity is not None and not self._closed and (
                force or len(self._workers) != self._reported):
            self._reported = len(self._workers)
            self._on_capacity(self.capacity())

    # -- membership and leases -----------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._poke.wait(), self.poll_s)
            except TimeoutError:
                pass
            self._poke.clear()
            try:
                await self._reconcile()
            except Exception as exc:  # noqa: BLE001 - a GCS hiccup: look again next poll
                log.warning("listing the Ray nodes failed (%s); trying again in %g s",
                            describe(exc), self.poll_s)

    async def _reconcile(self) -> None:
        nodes = await asyncio.to_thread(ray.nodes)
        alive = {n["NodeID"] for n in nodes
                 if n.get("Alive") and n.get("Resources", {}).get(self.worker_resource, 0) > 0}
        for node_id, worker in list(self._workers.items()):
            if node_id not in alive:
                self._lose(worker, f"its node {node_id} left the cluster")
        for node_id in sorted(alive - self._workers.keys() - self._starting.keys()):
            self._starting[node_id] = asyncio.create_task(self._start_worker(node_id),
                                                          name=f"ray-worker-start-{node_id[:8]}")

    async def _start_worker(self, node_id: str) -> None:
        name = f"rollout-worker-{node_id[:8]}-{next(self._names)}"
        actor_class: Any = ray.remote(RolloutWorker)
        handle = actor_class.options(
            num_cpus=0, resources={self.worker_resource: WORKER_SHARE},
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            max_concurrency=self.max_concurrency, max_restarts=0, max_task_retries=0,
        ).remote(name)
        try:
            info: WorkerInfo = await asyncio.wait_for(await_ref(handle.info.remote()),
                                                      self.start_timeout_s)
        except (TimeoutError, RayError) as exc:
            log.warning("the rollout worker for node %s did not start (%s); trying again at "
                        "the next poll", node_id, describe(exc))
            kill(handle)
            return
        except asyncio.CancelledError:
            kill(handle)
            raise
        finally:
            self._starting.pop(node_id, None)
        worker = _Worker(handle, info, asyncio.get_running_loop().create_future())
        self._workers[node_id] = worker
        worker.heartbeat = asyncio.create_task(self._heartbeat(worker), name=f"ping-{name}")
        log.info("rollout worker %s joined", worker)
        self._report()
        self._notify()

    async def _heartbeat(self, worker: _Worker) -> None:
        last_answer = time.monotonic()
        while not worker.lost.done():
            sent = time.monotonic()
            try:
                left = max(0.0, last_answer + self.lease_s - sent)
                ages: dict[str, float] = await asyncio.wait_for(
                    await_ref(worker.handle.ping.remote()), left)
            except TimeoutError:
                self._lose(worker, f"it did not answer pings for {self.lease_s:g} s (lease_s); "
                                   "it was killed and its jobs' resources reclaimed")
                return
            except LOST as exc:
                self._lose(worker, describe(exc))
                return
            last_answer = time.monotonic()
            for token, age in ages.items():
                ctx = worker.runs.get(token)
                if ctx is not None:  # the job's own heartbeat, carried over
                    ctx.last_heartbeat = max(ctx.last_heartbeat, last_answer - age)
            await asyncio.sleep(max(0.0, sent + self.lease_s / 3 - time.monotonic()))

    def _lose(self, worker: _Worker, reason: str) -> None:
        """Declare ``worker`` lost: its runs raise WorkerLostError, it is killed and replaced."""
        if worker.lost.done():
            return
        log.warning("rollout worker %s lost: %s", worker, reason)
        worker.lost.set_result(f"rollout worker {worker} was lost: {reason}")
        if self._workers.get(worker.info.node_id) is worker:
            del self._workers[worker.info.node_id]
        if worker.heartbeat is not None and worker.heartbeat is not asyncio.current_task():
            worker.heartbeat.cancel()
        kill(worker.handle)
        self._report()
        self._notify()
        self._poke.set()  # a node still alive gets a fresh worker now, not at the next poll


async def _errors(ref: Any) -> list[str]:
    """What a worker's ``stop`` reported (a worker already gone has nothing left to close)."""
    try:
        errors: list[str] = await ref
    except Exception as exc:
        log.debug("stopping a rollout worker: %s", exc)
        return []
    return errors


async def _quiet(ref: Any) -> None:
    with contextlib.suppress(Exception):  # an actor that exited answers with an error
        await ref
