"""The Ray actors and their clients: a rollout worker per CPU node, an inference engine per GPU.

``RolloutWorker`` is an async actor (one event loop, many jobs at once, like the in-process
executor): ``run`` builds a worker-side ``JobContext`` (the same class the scheduler hands out,
so ``ctx.pause_requested`` and ``ctx.resume`` mean the same thing on a cluster) and awaits the
job on the actor's loop. The driver addresses each run by a token it made up, which is how
``pause`` and ``cancel`` reach the right run; either can overtake the ``run`` call it is about
(Ray does not order calls to an async actor), so a token it does not know yet is remembered and
applied when the run arrives. ``ping`` shares the loop with the jobs on purpose: a job that
blocks the loop (a hung C call, a ``time.sleep``) stops the pings, and the driver's lease then
declares the whole worker lost and kills it, which is the only way to get its resources back.

``InferenceActor`` hosts any policy a ``PolicyConfig`` builds (the local engine on a GPU, an
OpenAI-compatible client, a scripted policy) and serves ``generate`` to every rollout worker
through ``RayPolicy``, a picklable client that a job takes with it to whichever node it runs on.
``start_inference`` places one on a node offering the ``inference`` resource.

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
    RayError,
    RayTaskError,
    WorkerCrashedError,
)

from tempering.errors import ConfigError, PolicyError
from tempering.policy.base import GenerateRequest, Generation
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


def _node_id() -> str:
    return str(ray.get_runtime_context().get_node_id())


class RolloutWorker:
    """Runs scheduler jobs on one node's event loop."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._runs: dict[str, tuple[JobContext, asyncio.Task[Any]]] = {}
        self._early_pause: OrderedDict[str, None] = OrderedDict()
        self._early_cancel: OrderedDict[str, None] = OrderedDict()

    async def info(self) -> WorkerInfo:
        return WorkerInfo(self.name, _node_id(), os.getpid(), os.uname().nodename)

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


class InferenceActor:
    """One policy engine, shared by every rollout worker that holds a ``RayPolicy`` to it."""

    def __init__(self, config: Any) -> None:
        from tempering.policy.config import build_policy

        self.policy = build_policy(config)

    async def ready(self) -> str:
        """The policy's name, once it is built (so a model that fails to load fails here)."""
        return self.policy.name

    async def info(self) -> WorkerInfo:
        return WorkerInfo(self.policy.name, _node_id(), os.getpid(), os.uname().nodename)

    async def generate(self, request: GenerateRequest) -> Generation:
        return await self.policy.generate(request)

    async def update_weights(self, state: Any, version: int) -> int:
        """Load new weights (a state dict or a path) as ``version``, between completions."""
        update = getattr(self.policy, "update_weights", None)
        if update is None:
            raise PolicyError(f"the policy {self.policy.name!r} cannot load weights (only the "
                              "local engine can, in an inference actor)")
        # off the actor's loop: the swap waits for completions that the loop delivers
        loaded: int = await asyncio.to_thread(update, state, version)
        return loaded

    async def close(self) -> None:
        close = getattr(self.policy, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result


class RayPolicy:
    """A ``Policy`` that samples from an ``InferenceActor``: picklable, so a job on any node can
    hold one (pass it in with ``functools.partial``) and reach the engine on a GPU node."""

    def __init__(self, actor: Any, name: str) -> None:
        self.actor, self.name = actor, name

    async def generate(self, request: GenerateRequest) -> Generation:
        generation: Generation = await self._call("generate", request)
        return generation

    async def update_weights(self, state: Any, version: int) -> int:
        """Make the engine serve ``version`` (``InferenceActor.update_weights``)."""
        loaded: int = await self._call("update_weights", state, version)
        return loaded

    async def _call(self, method: str, *args: Any) -> Any:
        """The actor's ``method``; its own errors re-raised as they were, a lost actor as
        ``PolicyError``."""
        try:
            return await getattr(self.actor, method).remote(*args)
        except RayTaskError as exc:
            raise unwrap(exc) from exc
        except LOST as exc:
            raise PolicyError(f"the inference actor serving {self.name!r} is gone "
                              f"({describe(exc)}): start another with start_inference") from exc

    async def info(self) -> WorkerInfo:
        """Where the engine runs."""
        info: WorkerInfo = await self.actor.info.remote()
        return info

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Close the engine and kill its actor (for the one that started it; other holders'
        calls then raise PolicyError)."""
        try:
            await asyncio.wait_for(await_ref(self.actor.close.remote()), timeout_s)
        except (TimeoutError, RayError) as exc:
            log.debug("closing inference actor %s: %s", self.name, exc)
        kill(self.actor)
        # ray.kill only asks: until the actor is really gone a call may still be served. Wait
        # for that, so that once stop() returns every later call fails.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                await asyncio.wait_for(await_ref(self.actor.ready.remote()), 1.0)
            except (TimeoutError, RayError):
                return
            await asyncio.sleep(0.05)

    def __repr__(self) -> str:
        return f"RayPolicy({self.name!r})"


async def start_inference(config: Any, *, resource: str = "inference", amount: float = 1.0,
                          num_gpus: float | None = None, max_concurrency: int = 1000,
                          start_timeout_s: float = 600.0) -> RayPolicy:
    """Start an ``InferenceActor`` hosting the policy ``config`` describes (a ``PolicyConfig``)
    on a node offering ``amount`` of ``resource``, and return a client for it.

    ``num_gpus`` defaults to 1 for a config whose ``device`` is CUDA, else 0. Ray must be
    running (a started ``RayExecutor``, or ``ray.init(address=...)``).
    """
    if not ray.is_initialized():
        raise ConfigError("start_inference needs Ray: start a RayExecutor first, or call "
                          "ray.init(address=...)")
    offered = (await asyncio.to_thread(ray.cluster_resources)).get(resource, 0.0)
    if offered < amount:
        raise ConfigError(f"no node offers {amount:g} of the resource {resource!r} (the cluster "
                          f"has {offered:g}): start a GPU node with ray start --address=HEAD:6379 "
                          f"--num-gpus=1 --resources='{{\"{resource}\": 1}}'")
    if num_gpus is None:
        num_gpus = 1.0 if str(getattr(config, "device", "cpu")).startswith("cuda") else 0.0
    actor_class: Any = ray.remote(InferenceActor)
    handle = actor_class.options(num_cpus=0, num_gpus=num_gpus, resources={resource: amount},
                                 max_concurrency=max_concurrency, max_restarts=0
                                 ).remote(config)
    try:
        name: str = await asyncio.wait_for(await_ref(handle.ready.remote()), start_timeout_s)
    except TimeoutError as exc:
        kill(handle)
        raise PolicyError(f"the inference actor did not start within {start_timeout_s:g} s: "
                          f"is {resource!r} free on some node (another actor may hold it)?"
                          ) from exc
    except RayError as exc:
        kill(handle)
        raise PolicyError(f"the inference actor failed to start: {describe(exc)}") from exc
    return RayPolicy(handle, name)
