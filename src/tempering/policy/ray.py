"""A policy served from a Ray actor to every node: ``InferenceActor`` hosts any policy a
``PolicyConfig`` builds (the local engine on a GPU, an OpenAI-compatible client, a scripted
policy) and serves ``generate`` to every rollout worker through ``RayPolicy``, a picklable
client that a job takes with it to whichever node it runs on. ``start_inference`` places one
on a node offering the ``inference`` resource.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError

from tempering.errors import ConfigError, PolicyError
from tempering.policy.base import GenerateRequest, Generation, Policy, TrainablePolicy
from tempering.scheduler.ray_worker import (
    LOST,
    WorkerInfo,
    await_ref,
    describe,
    kill,
    node_id,
    unwrap,
)

log = logging.getLogger(__name__)


class InferenceActor:
    """One policy engine, shared by every rollout worker that holds a ``RayPolicy`` to it."""

    def __init__(self, config: Any) -> None:
        from tempering.policy.config import build_policy

        self.policy: Policy = build_policy(config)

    async def ready(self) -> str:
        """The policy's name, once it is built (so a model that fails to load fails here)."""
        return self.policy.name

    async def info(self) -> WorkerInfo:
        return WorkerInfo(self.policy.name, node_id(), os.getpid(), os.uname().nodename)

    async def generate(self, request: GenerateRequest) -> Generation:
        return await self.policy.generate(request)

    async def update_weights(self, state: Any, version: int) -> int:
        """Load new weights (a state dict or a path) as ``version``, between completions."""
        if not isinstance(self.policy, TrainablePolicy):
            raise PolicyError(f"the policy {self.policy.name!r} cannot load weights (only the "
                              "local engine can, in an inference actor)")
        # off the actor's loop: the swap waits for completions that the loop delivers
        loaded: int = await asyncio.to_thread(self.policy.update_weights, state, version)
        return loaded

    async def close(self) -> None:
        await self.policy.aclose()


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

    async def aclose(self) -> None:
        """Nothing of this client's to release: the engine is the actor's (``stop`` ends it,
        for the one that started it)."""

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
