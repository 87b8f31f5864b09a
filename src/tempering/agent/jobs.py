"""Episodes as scheduler jobs: heartbeats per turn, pausing at turn boundaries, any executor.

``episode_job`` plays one episode under a ``JobContext``: it heartbeats after every turn (so a
lease notices a hung episode), and when the scheduler asks it to pause it stops at the next turn
boundary and returns ``Paused`` holding the live episode, keeping its sandbox and giving back its
inference slot; resumed, it carries on from that turn, so the prefix is never redone.

The task comes as a ``TaskRef`` (``tasks/refs.py``: the task itself in this process, its name on
a Ray worker, which loads it once). The other arguments may be objects (in this process) or
references that pickle (on a Ray worker): a policy configuration instead of a ``Policy``, a run
directory instead of a store. References are resolved once per process and cached, so a worker
builds one engine, one grader and one store however many episodes it plays.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tempering.agent.episode import Ending, Episode, EpisodeConfig
from tempering.agent.play import quietly, start_episode
from tempering.policy.base import Policy
from tempering.policy.config import LocalPolicyConfig, OpenAIPolicyConfig, ScriptedPolicyConfig
from tempering.sandbox import Sandbox, open_sandbox
from tempering.scheduler.job import JobContext, Paused, at_worker_stop
from tempering.scheduler.resources import Resources
from tempering.tasks.refs import TaskRef
from tempering.tasks.setup import PreparedRoot
from tempering.trajectory.schema import Recorder, Status, Trajectory

PolicyRef = Policy | ScriptedPolicyConfig | LocalPolicyConfig | OpenAIPolicyConfig
_cache: dict[str, Any] = {}


@dataclass
class PausedEpisode:
    """A live episode stopped between turns (in-process only: it holds an open sandbox)."""

    episode: Episode
    sandbox: Sandbox


async def episode_job(ctx: JobContext, task: TaskRef, policy: PolicyRef, *,
                      config: EpisodeConfig | None = None, grader: Any = None,
                      recorder: Recorder | str | None = None, run_id: str = "",
                      group_id: str = "", sample_index: int = 0,
                      keep_when_paused: Resources | None = None,
                      root: PreparedRoot | None = None) -> Trajectory | Paused:
    """Play (or resume) one episode; see the module docstring. With ``root`` (in process: the
    group's prepared sandbox) the episode's sandbox is a fork of it."""
    paused: PausedEpisode | None = ctx.resume
    if paused is None:
        the_task = task.task()
        episode, sandbox = await start_episode(
            the_task, _policy(policy),
            root.sandbox() if root is not None else open_sandbox(the_task.sandbox),
            release=_close, prepared=root is not None, config=config, grader=grader,
            recorder=_recorder(recorder), run_id=run_id, group_id=group_id,
            sample_index=sample_index)  # one that did not start has its ending: finished below
    else:
        episode, sandbox = paused.episode, paused.sandbox
    try:
        while True:
            ending = await episode.play(until_turn=len(episode.steps) + 1)
            ctx.heartbeat()
            if ending is not None:
                break
            if ctx.pause_requested and sandbox is not None:
                keep = keep_when_paused or Resources.of(sandbox=1)
                sandbox_to_keep, sandbox = sandbox, None
                return Paused(PausedEpisode(episode, sandbox_to_keep), keep=keep)
        return await episode.finish()
    except asyncio.CancelledError:
        episode.ending = Ending(Status.INFRA_ERROR, "error", "cancelled by the scheduler")
        await asyncio.shield(episode.finish())
        raise
    finally:
        if sandbox is not None:
            await quietly(episode.close())  # the trajectory is recorded already
            await quietly(sandbox.close())


async def _close(sandbox: Sandbox) -> None:
    await quietly(sandbox.close())


def _policy(ref: PolicyRef) -> Policy:
    if isinstance(ref, ScriptedPolicyConfig | LocalPolicyConfig | OpenAIPolicyConfig):
        from tempering.policy.config import build_policy

        key = f"policy:{ref.model_dump_json()}"
        if key not in _cache:
            _cache[key] = build_policy(ref)
        policy: Policy = _cache[key]
        return policy
    return ref


def _recorder(ref: Recorder | str | None) -> Recorder | None:
    if not isinstance(ref, str):
        return ref
    from tempering.trajectory.store import TrajectoryStore

    key = f"store:{Path(ref).resolve()}"
    if key not in _cache:
        _cache[key] = opened = TrajectoryStore(ref)
        at_worker_stop(opened.close)  # flushed when a Ray executor stops this worker
    store: Recorder = _cache[key]
    return store
