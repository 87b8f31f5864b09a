"""Where episodes run: one seam with two sides, in this process or on Ray.

A ``RolloutBackend`` is built from the same three things on either side: a policy
configuration (``PolicyConfig``), the run's trajectory store (its directory) and the slots one
place offers (``Resources``: sandboxes and inference). Entered, it plays groups of tasks
(``play``) and publishes new weights to the policy that samples them (``publish``); the caller
never learns which side it is on beyond what it asked for.

- ``InProcess``: this event loop runs the scheduler, the sandboxes, one grader and the policy
  (built from its configuration), and the store records every step; a task's group prepares
  its sandbox once and each sample forks it (``tasks/setup.py``).
- ``OnRay``: the scheduler's jobs run on the rollout workers of a Ray cluster (``address``, or
  one started on this machine offering it as both the rollout and the inference node); each
  worker loads the tasks by their ``TaskRef``, grades with a grader of its own and records into
  the run's directory, whose journals the driver's store recovers at the end. With
  ``serve_policy`` the policy runs in one inference actor (``policy/ray.py``) that every worker
  samples from, and weights go there; without, each worker builds the policy itself (a client
  of a server, a scripted policy), and there is nothing to publish to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, Self

from tempering.agent.episode import EpisodeConfig
from tempering.agent.groups import run_rollouts
from tempering.errors import PolicyError
from tempering.policy.base import Policy, TrainablePolicy
from tempering.policy.config import PolicyConfig
from tempering.scheduler import JobResult, Resources, Scheduler, SchedulerConfig
from tempering.tasks.task import Task
from tempering.trajectory.schema import Trajectory
from tempering.trajectory.store import TrajectoryStore


class RolloutBackend(Protocol):
    """Plays groups of episodes somewhere; an async context manager."""

    scheduler: Scheduler
    """For its metrics (a live view): what is queued, running, paused, lost."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def play(self, tasks: Sequence[Task], *, samples: int, oversample: int = 0,
                   config: EpisodeConfig | None = None, run_id: str = "",
                   on_result: Callable[[JobResult], None] | None = None) -> list[Trajectory]:
        """``samples`` kept episodes of every task, a group per task (``oversample`` more
        started, the slowest cancelled); the kept trajectories, recorded already."""
        ...

    async def publish(self, version: int, state: Any) -> None:
        """Have the policy sample with ``state`` (a state dict) as ``version`` from its
        next completion on. ``PolicyError`` where the policy cannot take weights."""
        ...

    @property
    def published(self) -> int | None:
        """The last version ``publish`` made the policy serve (None: none yet)."""
        ...


def rollout_backend(where: Literal["asyncio", "ray"], policy: PolicyConfig,
                    store: TrajectoryStore, *, slots: Resources,
                    ray_address: str | None = None, serve_policy: bool = False,
                    scheduler_config: SchedulerConfig | None = None) -> RolloutBackend:
    """The backend for ``where`` (``asyncio``: this process; ``ray``: a Ray cluster), with
    ``slots`` per place (this process, or each rollout node)."""
    if where == "asyncio":
        return InProcess(policy, store, slots=slots, scheduler_config=scheduler_config)
    return OnRay(policy, store, slots=slots, address=ray_address, serve_policy=serve_policy,
                 scheduler_config=scheduler_config)


class _Backend:
    """What both sides share: the group plays, and the version bookkeeping of ``publish``."""

    scheduler: Scheduler
    policy: Any  # a Policy; on Ray without an inference actor, its configuration
    _grader: Any = None  # None: each place grades with a grader of its own
    _recorder: Any = None  # a Recorder, or the run directory a Ray worker opens
    _remote = False
    _publisher: Any = None
    _stack: contextlib.AsyncExitStack[Any]

    async def play(self, tasks: Sequence[Task], *, samples: int, oversample: int = 0,
                   config: EpisodeConfig | None = None, run_id: str = "",
                   on_result: Callable[[JobResult], None] | None = None) -> list[Trajectory]:
        assert self._recorder is not None, "enter the backend first"
        return await run_rollouts(tasks, self.policy, scheduler=self.scheduler,
                                  samples=samples, oversample=oversample, config=config,
                                  grader=self._grader, recorder=self._recorder, run_id=run_id,
                                  remote=self._remote, on_result=on_result)

    @property
    def published(self) -> int | None:
        return None if self._publisher is None else self._publisher.version

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()  # what __aenter__ started, in reverse


class InProcess(_Backend):
    """Scheduler, sandboxes, grader and policy on this event loop."""

    def __init__(self, policy: PolicyConfig, store: TrajectoryStore, *, slots: Resources,
                 scheduler_config: SchedulerConfig | None = None) -> None:
        self.policy_config, self.store = policy, store
        self.scheduler = Scheduler(slots, config=scheduler_config)
        self.policy: Policy | None = None

    async def __aenter__(self) -> Self:
        from tempering.policy.config import build_policy
        from tempering.reward import Grader

        async with contextlib.AsyncExitStack() as stack:
            self.policy = build_policy(self.policy_config)
            stack.push_async_callback(self.policy.aclose)
            self._grader = await stack.enter_async_context(Grader())
            await stack.enter_async_context(self.scheduler)
            self._stack = stack.pop_all()
        self._recorder = self.store
        return self


    async def publish(self, version: int, state: Any) -> None:
        from tempering.policy.weights import EnginePublisher

        if not isinstance(self.policy, TrainablePolicy):
            raise PolicyError(f"the policy {getattr(self.policy, 'name', '?')!r} takes no "
                              "weights: train a local model")
        if self._publisher is None:
            self._publisher = EnginePublisher(self.policy)  # type: ignore[arg-type]
        await self._publisher.publish(version, state=state)


class OnRay(_Backend):
    """The scheduler's jobs on a Ray cluster's rollout workers."""

    def __init__(self, policy: PolicyConfig, store: TrajectoryStore, *, slots: Resources,
                 address: str | None = None, serve_policy: bool = False,
                 scheduler_config: SchedulerConfig | None = None) -> None:
        from tempering.scheduler.ray import RayExecutor

        self.policy_config, self.store, self.serve_policy = policy, store, serve_policy
        # a fresh local Ray offers this machine as the rollout and the inference node
        executor = RayExecutor(address=address, slots_per_worker=slots, init_kwargs=(
            {} if address else {"resources": {"rollout": 1, "inference": 1}}))
        self.scheduler = Scheduler(Resources(), executor=executor, config=scheduler_config)
        self.policy = policy  # a RayPolicy once served, else the configuration
        self._remote = True

    async def __aenter__(self) -> Self:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.scheduler)
            if self.serve_policy:
                from tempering.policy.ray import start_inference

                self.policy = await start_inference(self.policy_config)
                stack.push_async_callback(self.policy.stop)
            self._stack = stack.pop_all()
        self._recorder = str(self.store.run_dir.resolve())
        return self


    async def publish(self, version: int, state: Any) -> None:
        from tempering.policy.weights import RayPublisher

        if not self.serve_policy:
            raise PolicyError("each Ray worker builds its own policy here: serve it from an "
                              "inference actor (serve_policy=True) to publish weights")
        if self._publisher is None:
            self._publisher = RayPublisher(self.policy, version=0)
        await self._publisher.publish(version, state=state)
