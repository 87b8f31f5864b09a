"""The episodes ``PolicyServer`` records: what each one keeps, how it is journaled, how it ends.

Design. An ``EpisodeBook`` holds the open episodes by id; a ``ServedEpisode`` is one of them:
its header (system prompt, instruction, tools), the steps recorded so far, the last answered
request (messages, reply, tokens, answer) and the requests sampling now. The server decides
which episode a request belongs to and answers it; this module keeps the record.

Continuation. A request continues an episode's last turn when it repeats that turn's messages,
then the reply as a client sends it back (the same calls, the text with or without the
markup), then new tool or user messages: the last turn's prompt and completion tokens are then
the next prompt's prefix, and the new messages' text becomes the last step's ``observation``.
Anything else rewrote the history, and is rendered afresh.

Journaling. A ``recorder`` (``agent.episode.Recorder``, e.g. ``TrajectoryStore``) journals each
episode as it happens, so a server killed outright leaves it behind: ``begin`` on first sight,
``record_step`` once a step is final (the next turn brought its observation, or rewrote the
history so none will come), ``append`` at the end. Journals are append-only, so the last
completion, whose observation is still out, is not journaled: a crash loses it, never records
it twice. A journaling failure costs crash safety, never the completion.

Ends. ``end`` hands the ``Trajectory`` to the recorder and ``on_trajectory``; an episode idle
for ``ttl_s`` (the sweeper checks a few times per ``ttl_s``) and those open at ``expire_all``
go the same way as ``infra_error``. A failed hand-over keeps the episode, so it can be ended
again, and the recorder's ``append`` is not repeated.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from tempering.policy.base import Generation, Message, Policy
from tempering.reward.result import RewardResult
from tempering.serve.http import Response
from tempering.trajectory.schema import (
    EpisodeHeader,
    FinishReason,
    Status,
    Step,
    Trajectory,
    new_id,
)

if TYPE_CHECKING:
    from tempering.trajectory.schema import Recorder

log = logging.getLogger(__name__)

OnTrajectory = Callable[[Trajectory], Awaitable[object] | object]


class EndRequest(BaseModel):
    """The body of ``POST /v1/episodes/{id}/end`` (all optional)."""

    model_config = ConfigDict(extra="forbid")

    reward: Annotated[float | None, Field(ge=0.0, le=1.0)] = None
    """The episode's reward, recorded as ``RewardResult(components={"external": reward})``."""
    task_id: str = ""
    status: Status = Status.OK
    finish_reason: FinishReason | None = None
    error: str | None = None
    run_id: str = ""
    group_id: str = ""
    sample_index: int = 0


@dataclass
class ServedEpisode:
    id: str
    system_prompt: str = ""
    instruction: str = ""
    tools: str = ""
    trajectory_id: str = field(default_factory=new_id)  # the journal's and the trajectory's
    started_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    running: list[tuple[list[Message], asyncio.Event]] = field(default_factory=list)
    """The requests sampling now, by their messages (a retry waits for its original)."""
    steps: list[Step] = field(default_factory=list)
    begun: bool = False
    journaled: int = 0  # how many of the steps the recorder has (they are final)
    appended: bool = False
    messages: list[Message] = field(default_factory=list)
    """The last answered request's messages; ``fingerprint`` its other fields."""
    fingerprint: bytes = b""
    answer: Response | None = None
    reply: Generation | None = None
    tokens: list[int] = field(default_factory=list)
    """The last turn's prompt + completion tokens (empty when the policy gave none)."""

    def continuation(self, messages: list[Message]) -> tuple[int, str] | None:
        """``(messages the last turn's tokens render, the new messages' text)`` when
        ``messages`` continue the last turn; None when the history was rewritten."""
        k = len(self.messages)
        if (self.reply is None or len(messages) <= k or messages[:k] != self.messages
                or not _is_reply(messages[k], self.reply)):
            return None
        return k + 1, "\n".join(m.content for m in messages[k + 1:] if m.role in ("tool", "user"))


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


def _is_reply(message: Message, reply: Generation) -> bool:
    """Whether ``message`` is the reply as a client sends it back: the same calls, and the text
    as answered (the content outside calls) or as written (with the markup)."""
    return (message.role == "assistant"
            and [(c.name, _canonical(c.arguments)) for c in message.tool_calls]
            == [(c.name, _canonical(c.arguments)) for c in reply.tool_calls]
            and message.content.strip() in (reply.text.strip(), reply.content.strip()))


class EpisodeBook:
    """The open episodes of a server of ``policy``, journaled into ``recorder`` and handed to
    ``recorder`` and ``on_trajectory`` when they end or sit idle for ``ttl_s``."""

    def __init__(self, policy: Policy, *, recorder: Recorder | None = None,
                 on_trajectory: OnTrajectory | None = None, ttl_s: float = 3600.0) -> None:
        self.policy = policy
        self.recorder = recorder
        self.on_trajectory = on_trajectory
        self.ttl_s = ttl_s
        self._open: dict[str, ServedEpisode] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._open)

    def get(self, episode_id: str) -> ServedEpisode | None:
        return self._open.get(episode_id)

    def begin(self, episode_id: str, messages: list[Message],
              tools: list[dict[str, Any]] | None) -> ServedEpisode:
        episode = self._open[episode_id] = ServedEpisode(
            episode_id, tools=json.dumps(tools) if tools else "",
            system_prompt=next((m.content for m in messages if m.role == "system"), ""),
            instruction=next((m.content for m in messages if m.role == "user"), ""))
        self._journal(episode)
        return episode

    def record(self, episode: ServedEpisode, messages: list[Message], gen: Generation,
               prompt: list[int], observation: str | None, policy_s: float) -> None:
        """Record ``gen`` as the episode's next step, ``observation`` (the new messages' text
        when this turn continued the last) on the step before."""
        if observation is not None and episode.steps:
            episode.steps[-1] = episode.steps[-1].model_copy(update={"observation": observation})
        self._journal(episode)  # this turn continued or replaced them: the steps are final
        call = gen.tool_calls[0] if gen.tool_calls else None
        episode.steps.append(Step(
            index=len(episode.steps), text=gen.text,
            action=call.name if call else "invalid" if gen.tool_call_error else "message",
            tool_call_id=call.id if call else "", arguments=call.arguments if call else "",
            error=gen.tool_call_error, policy_s=policy_s, prompt_reused=gen.prompt_reused,
            prompt_token_ids=gen.prompt_token_ids, completion_token_ids=gen.completion_token_ids,
            logprobs=gen.logprobs, loss_mask=[1] * len(gen.completion_token_ids),
            weights_version=gen.weights_version))
        episode.messages, episode.reply = messages, gen
        episode.tokens = prompt + gen.completion_token_ids if gen.completion_token_ids else []

    def trajectory(self, episode: ServedEpisode, end: EndRequest) -> Trajectory:
        """The episode as a ``Trajectory``, ended as ``end`` says."""
        reward = None if end.reward is None else RewardResult(
            reward=end.reward, components={"external": end.reward}, tests_passed=0,
            tests_total=0, flags=[])
        return Trajectory(
            **end.model_dump(exclude={"reward", "finish_reason"}), reward=reward,
            finish_reason=end.finish_reason or ("error" if end.status.infra else "submit"),
            trajectory_id=episode.trajectory_id, policy=self.policy.name, steps=episode.steps,
            system_prompt=episode.system_prompt, instruction=episode.instruction,
            tools=episode.tools, started_at=episode.started_at,
            duration_s=time.time() - episode.started_at)

    async def end(self, episode: ServedEpisode, trajectory: Trajectory) -> None:
        """Forget the episode and hand ``trajectory`` over; when that fails, keep the episode
        and raise, so the client may end it again."""
        del self._open[episode.id]
        try:
            await self._hand_over(episode, trajectory)
        except Exception:
            self._open[episode.id] = episode
            raise

    def start_sweeping(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep())

    def stop_sweeping(self) -> bool:
        """Stop the idle sweeper; False when it was not running."""
        if self._sweeper is None:
            return False
        self._sweeper.cancel()
        self._sweeper = None
        return True

    async def expire_all(self, why: str) -> None:
        for episode in list(self._open.values()):
            await self._expire(episode, why)

    def _journal(self, episode: ServedEpisode) -> None:
        """Begin the episode's journal if not yet, and journal its final steps not yet there.
        A failure costs crash safety, not the completion: the steps stay here for the end, and
        the next turn tries again."""
        if self.recorder is None:
            return
        try:
            if not episode.begun:
                self.recorder.begin(episode.trajectory_id, EpisodeHeader(
                    task_id="", policy=self.policy.name, started_at=episode.started_at,
                    system_prompt=episode.system_prompt, instruction=episode.instruction,
                    tools=episode.tools))
                episode.begun = True
            for step in episode.steps[episode.journaled:]:
                self.recorder.record_step(episode.trajectory_id, step)
                episode.journaled += 1
        except Exception:
            log.exception("journaling episode %s failed; it is kept in memory until its end",
                          episode.id)

    async def _hand_over(self, episode: ServedEpisode, trajectory: Trajectory) -> None:
        if self.recorder is not None and not episode.appended:
            await asyncio.to_thread(self.recorder.append, trajectory)
            episode.appended = True  # ending again after on_trajectory failed: not twice
        if self.on_trajectory is not None:
            result = self.on_trajectory(trajectory)
            if inspect.isawaitable(result):
                await result

    async def _expire(self, episode: ServedEpisode, why: str) -> None:
        self._open.pop(episode.id, None)
        try:
            await self._hand_over(episode, self.trajectory(episode, EndRequest(
                status=Status.INFRA_ERROR, error=f"PolicyServer: {why}")))
        except Exception:  # with a recorder, its journal still holds the episode
            log.exception("storing expired episode %s failed", episode.id)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(self.ttl_s / 4, 30.0)))
            idle = time.monotonic() - self.ttl_s
            for episode in [e for e in self._open.values()
                            if not e.running and e.last_active < idle]:
                await self._expire(episode, f"idle for more than episode_ttl_s="
                                            f"{self.ttl_s:g} s without being ended")
