"""Playing episodes: one from start to grade, or a prefix branched into N siblings.

``run_episode`` opens the task's sandbox (or takes one), plays, grades, closes, and always
returns a trajectory: a sandbox that cannot even start gives an ``infra_error`` trajectory, not
an exception, so no task is ever lost. ``start_episode`` is that start, shared with the
scheduler's episode jobs (``jobs.py``), which play the same episode a turn at a time.

``run_branches`` plays a shared prefix of ``at`` turns once, forks the sandbox copy-on-write
``n`` times and continues each sibling independently from the same conversation and tokens
(the shell's working directory and exported variables are carried over too). Each sibling's
trajectory holds the prefix steps marked ``inherited``, with ``parent_id`` and ``branch_step``
saying where it came from, so a learner can weigh the shared prefix once.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Awaitable, Callable
from typing import Any

from tempering.agent.episode import Ending, Episode, EpisodeConfig
from tempering.policy.base import Policy
from tempering.sandbox import Sandbox, SandboxPool, open_sandbox
from tempering.tasks.task import Task
from tempering.trajectory.schema import Recorder, Trajectory, new_id


async def run_episode(task: Task, policy: Policy, *, config: EpisodeConfig | None = None,
                      grader: Any = None, recorder: Recorder | None = None,
                      sandbox: Sandbox | None = None, pool: SandboxPool | None = None,
                      run_id: str = "", group_id: str = "", sample_index: int = 0,
                      trajectory_id: str | None = None) -> Trajectory:
    """Play one episode of ``task`` with ``policy`` and grade it.

    The sandbox is ``sandbox`` if given (left open), else one from ``pool`` (released), else a
    fresh one from ``task.sandbox`` (closed).
    """
    trajectory_id = trajectory_id or new_id()

    async def release(opened: Sandbox) -> None:  # what this call opened, it gives back
        if sandbox is None:
            await quietly(pool.release(trajectory_id) if pool is not None else opened.close())

    opening = (_given(sandbox) if sandbox is not None else
               pool.allocate(trajectory_id, task.sandbox, timeout=None) if pool is not None else
               open_sandbox(task.sandbox))
    episode, opened = await start_episode(
        task, policy, opening, release=release, config=config, grader=grader,
        recorder=recorder, run_id=run_id, group_id=group_id, sample_index=sample_index,
        trajectory_id=trajectory_id)
    try:
        if episode.ending is None:
            try:
                await episode.play()
            except asyncio.CancelledError:
                await asyncio.shield(episode.finish())
                raise
        return await episode.finish()
    finally:
        await quietly(episode.close())
        if opened is not None:
            await release(opened)


async def start_episode(task: Task, policy: Policy, opening: Awaitable[Sandbox], *,
                        release: Callable[[Sandbox], Awaitable[None]], prepared: bool = False,
                        **episode: Any) -> tuple[Episode, Sandbox | None]:
    """An ``Episode`` of ``task`` (``episode``: its other arguments), begun in the sandbox that
    ``opening`` gives, with the task's ``prepare`` run there unless ``prepared`` (a fork of a
    prepared sandbox). A sandbox that does not open or prepare ends the episode at once as an
    ``infra_error``, recorded by its ``finish`` like any other: a failure is data. Returns the
    episode and the sandbox that opened (the caller's to ``release``), if one did; cancelled
    while it prepares, it releases the sandbox itself, since the caller never gets it."""
    try:
        sandbox = await opening
    except Exception as exc:  # noqa: BLE001 - a sandbox that will not start is data too
        failed = Episode(task, policy, None, **episode)
        failed.begin()
        failed.ending = Ending.failed(exc, where="sandbox: ")
        return failed, None
    started = Episode(task, policy, sandbox, **episode)
    started.begin()
    if not prepared:
        try:
            await task.prepare(sandbox)
        except Exception as exc:  # noqa: BLE001
            started.ending = Ending.failed(exc, where="sandbox: ")
        except BaseException:
            await asyncio.shield(release(sandbox))
            raise
    return started, sandbox


async def _given(sandbox: Sandbox) -> Sandbox:
    return sandbox


async def run_branches(task: Task, policy: Policy, *, at: int, n: int,
                       config: EpisodeConfig | None = None, grader: Any = None,
                       recorder: Recorder | None = None, run_id: str = "",
                       group_id: str = "") -> list[Trajectory]:
    """Play ``at`` turns once, then continue ``n`` siblings from there; one trajectory each.

    If the prefix itself ends the episode (the agent submitted, or a failure), that single
    trajectory is returned.
    """
    if at < 0 or n < 1:
        raise ValueError(f"branching needs at >= 0 and n >= 1, got at={at}, n={n}")
    group_id = group_id or new_id()
    async with open_sandbox(task.sandbox) as root:
        await task.prepare(root)
        prefix = Episode(task, policy, root, config=config, grader=grader, recorder=None,
                         run_id=run_id, group_id=group_id, sample_index=-1)
        try:
            ending = await prefix.play(until_turn=at)
            if ending is not None:
                prefix.recorder = recorder
                prefix.begin()
                return [await prefix.finish()]
            shell_state = await _shell_state(prefix)
            forks = await asyncio.gather(*(root.fork() for _ in range(n)),
                                         return_exceptions=True)
        finally:
            await quietly(prefix.close())
    siblings = [_sibling(prefix, i, fork, shell_state, recorder) for i, fork in enumerate(forks)]
    try:
        return list(await asyncio.gather(*(_continue(s, f) for s, f in zip(siblings, forks,
                                                                            strict=True))))
    finally:
        for fork in forks:
            if isinstance(fork, Sandbox):
                await quietly(fork.close())


def _sibling(prefix: Episode, i: int, fork: Sandbox | BaseException, shell_state: str,
             recorder: Recorder | None) -> Episode:
    sandbox = fork if isinstance(fork, Sandbox) else None
    child = Episode(prefix.task, prefix.policy, sandbox, config=prefix.config,
                    grader=prefix.grader, recorder=recorder, run_id=prefix.run_id,
                    group_id=prefix.group_id, sample_index=i)
    child.parent_id, child.branch_step = prefix.trajectory_id, len(prefix.steps)
    child.messages = list(prefix.messages)
    child.steps = [s.model_copy(update={"inherited": True}) for s in prefix.steps]
    child.prefix_ids, child.prefix_messages = list(prefix.prefix_ids), prefix.prefix_messages
    child.tokens_used, child.errors_in_row = prefix.tokens_used, prefix.errors_in_row
    child.started_at, child.deadline = prefix.started_at, prefix.deadline
    if child.tools is not None:
        child.tools.shell_setup = shell_state
    child.begin()
    if not isinstance(fork, Sandbox):
        child.ending = Ending.failed(fork, where="fork: ")
    return child


async def _continue(child: Episode, fork: Sandbox | BaseException) -> Trajectory:
    try:
        if child.ending is None:
            await child.play()
        return await child.finish()
    finally:
        await quietly(child.close())


async def _shell_state(episode: Episode) -> str:
    """Shell lines that recreate the prefix's working directory and exported variables."""
    shell = episode.tools.shell if episode.tools is not None else None
    if shell is None or shell.closed:
        return ""
    result = await shell.run('printf "%s\\n" "$PWD"; export -p', timeout=10)
    if result.exit_code != 0:
        return ""
    cwd, _, exports = result.stdout.partition("\n")
    return f"cd {shlex.quote(cwd)}\n{exports}"


async def quietly(work: Any) -> None:
    """Await cleanup whose failure must not replace a result already recorded."""
    try:
        await work
    except Exception:  # noqa: BLE001, S110 - cleanup after the trajectory is already recorded
        pass
