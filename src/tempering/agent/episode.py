"""The episode loop: a policy acts through tools in a sandbox until it submits, then it is graded.

One ``Episode`` owns its conversation, its steps and one sandbox. Each turn asks the policy for
a completion (extending the previous turn's tokens, so nothing is re-tokenised), runs the first
tool call, and shows the observation, truncated head and tail. Budgets bound turns, completion
tokens and wall time; malformed output is an error observation the model can recover from.

Every way an episode can end is data: ``finish()`` always returns a ``Trajectory`` whose status
names the one boundary that failed (see ``trajectory.schema.Status``) and, when a recorder is
given, every step is journaled as it happens and the trajectory acknowledged at the end, so a
harness that dies mid-episode still leaves the episode behind.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tempering.agent.tools import TOOL_NAMES, Observation, ToolBox, tools_named
from tempering.errors import SandboxTimeoutError
from tempering.policy.base import GenerateRequest, Generation, Message, Policy, SamplingParams
from tempering.reward.result import RewardResult
from tempering.sandbox import Sandbox
from tempering.tasks.task import Task
from tempering.trajectory.schema import (
    EpisodeHeader,
    FinishReason,
    Recorder,
    Status,
    Step,
    Trajectory,
    new_id,
)

SYSTEM_PROMPT = (
    "You are an agent working in a Linux sandbox; your workspace is the current directory. "
    "Use the tools to read files, run commands and edit code. When the task is done, call "
    "submit: your workspace is then graded by hidden tests. If you cannot do it, call give_up.")


class EpisodeConfig(BaseModel):
    """Budgets and knobs of one episode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: Annotated[int, Field(ge=1)] = 30
    """Most policy turns; reaching it ends the episode (graded, finish reason max_turns)."""
    max_tokens: Annotated[int | None, Field(ge=1)] = None
    """Most completion tokens over the episode (None: no limit)."""
    wall_time_s: Annotated[float, Field(gt=0)] = 600.0
    """The episode's time budget, the policy's and its commands' together."""
    command_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    """Longest one bash command may run before it is killed (the model is told)."""
    env_grace_s: Annotated[float, Field(gt=0)] = 30.0
    """How long past its own timeout a sandbox call may go unanswered before the sandbox
    counts as not answering (status env_timeout)."""
    observation_limit: Annotated[int, Field(ge=100)] = 4000
    """Characters of an observation the model sees; longer ones keep head and tail."""
    max_consecutive_errors: Annotated[int, Field(ge=1)] = 5
    """Malformed or tool-less turns in a row that end the episode (status model_error)."""
    give_up_reward: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05
    """Reward for calling give_up: a little above a wrong or tampered answer's 0, so
    stopping honestly is never worse than cheating."""
    sampling: SamplingParams = SamplingParams()
    """Sampling parameters; a seed is varied per sample and turn, never reused."""
    system_prompt: str = SYSTEM_PROMPT
    tools: list[str] | None = None
    """Names of the tools offered (``submit`` among them); None offers all. A smaller set
    makes a shorter prompt, which matters for small models."""
    describe_tools: bool = True
    """Put the tools' schemas in the prompt (the chat template renders them). False: the
    tools still work but are not described, for a model trained to call them (the warmed-up
    tiny model): the prompt is a fraction as long, and so is every forward pass over it."""

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        unknown = sorted(set(names) - TOOL_NAMES)
        if unknown:
            raise ValueError(f"unknown tool(s) {', '.join(unknown)}; the tools are "
                             f"{', '.join(sorted(TOOL_NAMES))}")
        if "submit" not in names:
            raise ValueError("the tools must include submit, or no episode could end by it")
        return names


@dataclass(frozen=True)
class Ending:
    status: Status
    reason: FinishReason
    error: str | None = None

    @classmethod
    def failed(cls, exc: BaseException, reason: FinishReason = "error",
               where: str = "") -> Ending:
        """The ending an exception gives: a sandbox that stopped answering is the
        environment's (``env_timeout``); anything else, a bug in the harness included, is
        infrastructure (``infra_error``), never the model's fault."""
        status = Status.ENV_TIMEOUT if isinstance(exc, SandboxTimeoutError) else \
            Status.INFRA_ERROR
        return cls(status, reason, f"{where}{type(exc).__name__}: {exc}")


class Episode:
    """One agent episode in one sandbox (which the caller owns and closes).

    ``sandbox`` is None only for an episode whose sandbox failed to start: it is finished at
    once, so the failure is recorded like any other ending.
    """

    def __init__(self, task: Task, policy: Policy, sandbox: Sandbox | None, *,
                 config: EpisodeConfig | None = None, grader: Any = None,
                 recorder: Recorder | None = None, run_id: str = "", group_id: str = "",
                 sample_index: int = 0, trajectory_id: str | None = None) -> None:
        self.task, self.policy, self.sandbox = task, policy, sandbox
        self.config = config or EpisodeConfig()
        self.grader, self.recorder = grader, recorder
        self.run_id, self.group_id, self.sample_index = run_id, group_id, sample_index
        self.trajectory_id = trajectory_id or new_id()
        self.parent_id: str | None = None
        self.branch_step: int | None = None
        self.tool_specs = tools_named(self.config.tools)
        self.tools = None if sandbox is None else ToolBox(
            sandbox, observation_limit=self.config.observation_limit,
            env_grace_s=self.config.env_grace_s,
            allowed=frozenset(t["function"]["name"] for t in self.tool_specs))
        self.messages = [Message(role="system", content=self.config.system_prompt),
                         Message(role="user", content=task.instruction)]
        self.steps: list[Step] = []
        self.prefix_ids: list[int] = []
        self.prefix_messages = 0
        self.tokens_used = 0
        self.errors_in_row = 0
        self.started_at = time.time()
        self.deadline = time.monotonic() + self.config.wall_time_s
        self.ending: Ending | None = None

    # ---- the loop ----

    def begin(self) -> None:
        """Start the journal: the header, and any steps taken before there was a recorder (a
        branch's inherited prefix, a prefix that ended the episode by itself)."""
        if self.recorder is not None:
            self.recorder.begin(self.trajectory_id, self._header())
            for step in self.steps:
                self.recorder.record_step(self.trajectory_id, step)

    async def play(self, *, until_turn: int | None = None) -> Ending | None:
        """Take turns until the episode ends (returns how) or ``until_turn`` turns are taken."""
        while self.ending is None and (until_turn is None or len(self.steps) < until_turn):
            try:
                self.ending = await self._turn()
            except asyncio.CancelledError:
                self.ending = Ending(Status.INFRA_ERROR, "error", "cancelled mid-episode")
                raise
            except Exception as exc:  # noqa: BLE001 - a failed rollout is data, attributed
                self.ending = Ending.failed(exc)
        return self.ending

    async def _turn(self) -> Ending | None:
        turn = len(self.steps)
        if self.tools is None:
            return Ending(Status.INFRA_ERROR, "error", "no sandbox")
        if turn >= self.config.max_turns:
            return Ending(Status.OK, "max_turns")
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return Ending(Status.MODEL_TIMEOUT, "wall_time")
        request = GenerateRequest(
            messages=list(self.messages),
            tools=self.tool_specs if self.config.describe_tools else [],
            sampling=self._sampling(turn),
            prefix_token_ids=self.prefix_ids, prefix_messages=self.prefix_messages,
            episode_id=self.trajectory_id)
        t0 = time.perf_counter()
        try:
            gen = await asyncio.wait_for(self.policy.generate(request), remaining)
        except TimeoutError:
            return Ending(Status.MODEL_TIMEOUT, "wall_time")
        policy_s = time.perf_counter() - t0
        if gen.context_exceeded:
            return Ending(Status.MODEL_ERROR, "context", "the prompt outgrew the policy's "
                          "context window")
        self._extend_prefix(gen)
        self.tokens_used += len(gen.completion_token_ids)
        self.messages.append(Message(role="assistant", content=gen.content,
                                     tool_calls=gen.tool_calls))
        self.prefix_messages = len(self.messages) if gen.completion_token_ids else 0

        t1 = time.perf_counter()
        call = gen.tool_calls[0] if gen.tool_calls and not gen.tool_call_error else None
        if call is None:
            why = gen.tool_call_error or "no tool call: call one of the tools, or submit"
            obs = Observation(text=f"Error: {why}", error=why)
            self.messages.append(Message(role="user", content=obs.text))
            action = "invalid" if gen.tool_call_error else "message"
        else:
            timeout = min(self.config.command_timeout_s, self.deadline - time.monotonic())
            obs = await self.tools.execute(call, timeout=max(timeout, 0.001))
            action = call.name
            for extra in gen.tool_calls:
                text = obs.text if extra is call else "Error: ignored, one tool call per turn"
                self.messages.append(Message(role="tool", content=text,
                                             tool_call_id=extra.id, name=extra.name))
        step = Step(
            index=turn, text=gen.text, action=action,
            tool_call_id=call.id if call else "", arguments=call.arguments if call else "",
            observation=obs.text, exit_code=obs.exit_code, timed_out=obs.timed_out,
            error=obs.error, policy_s=policy_s, action_s=time.perf_counter() - t1,
            prompt_reused=gen.prompt_reused, prompt_token_ids=gen.prompt_token_ids,
            completion_token_ids=gen.completion_token_ids, logprobs=gen.logprobs,
            loss_mask=[1] * len(gen.completion_token_ids),
            weights_version=gen.weights_version)
        self.steps.append(step)
        if self.recorder is not None:
            self.recorder.record_step(self.trajectory_id, step)
        return self._after(obs)

    def _after(self, obs: Observation) -> Ending | None:
        if obs.ends is not None:
            return Ending(Status.OK, obs.ends)
        failed = obs.error is not None and obs.exit_code is None and not obs.timed_out
        self.errors_in_row = self.errors_in_row + 1 if failed else 0
        if self.errors_in_row >= self.config.max_consecutive_errors:
            return Ending(Status.MODEL_ERROR, "errors", f"{self.errors_in_row} malformed or "
                          "failed actions in a row")
        if obs.timed_out and self.deadline - time.monotonic() <= 0:
            return Ending(Status.MODEL_TIMEOUT, "wall_time",
                          "a command ran until the episode's time budget was spent")
        if self.config.max_tokens is not None and self.tokens_used >= self.config.max_tokens:
            return Ending(Status.OK, "max_tokens")
        return None

    def _sampling(self, turn: int) -> SamplingParams:
        base = self.config.sampling
        if base.seed is None:
            return base
        key = f"{base.seed}:{self.group_id}:{self.sample_index}:{self.trajectory_id}:{turn}"
        return base.model_copy(update={"seed": zlib.crc32(key.encode()) & 0x7FFFFFFF})

    def _extend_prefix(self, gen: Generation) -> None:
        if not gen.completion_token_ids:
            self.prefix_ids = []
            return
        reused = self.prefix_ids[:gen.prompt_reused] if gen.prompt_reused else []
        self.prefix_ids = reused + gen.prompt_token_ids + gen.completion_token_ids

    # ---- the end ----

    async def finish(self, ending: Ending | None = None) -> Trajectory:
        """Grade (unless the environment failed or the agent gave up) and record the episode."""
        ending = ending or self.ending or Ending(Status.INFRA_ERROR, "error", "never played")
        reward: RewardResult | None = None
        grade_s = 0.0
        if ending.reason == "give_up":
            reward = RewardResult(reward=self.config.give_up_reward, components={},
                                  tests_passed=0, tests_total=0, flags=["gave_up"])
        elif not ending.status.infra:
            t0 = time.perf_counter()
            try:
                reward = await self._grade()
            except Exception as exc:  # noqa: BLE001 - a failure to grade is recorded
                ending = Ending.failed(exc, ending.reason, "grading: ")
            grade_s = time.perf_counter() - t0
            if reward is not None and reward.tampered:
                ending = Ending(Status.TAMPERED, ending.reason, ending.error)
        trajectory = self.trajectory(ending, reward, grade_s)
        if self.recorder is not None:
            self.recorder.append(trajectory)
        return trajectory

    def trajectory(self, ending: Ending, reward: RewardResult | None = None,
                   grade_s: float = 0.0) -> Trajectory:
        """The episode as it stands, ended by ``ending`` (not recorded)."""
        return Trajectory(
            **self._header().model_dump(), trajectory_id=self.trajectory_id, steps=self.steps,
            status=ending.status, finish_reason=ending.reason, error=ending.error,
            reward=reward, duration_s=time.time() - self.started_at, grade_s=grade_s)

    async def _grade(self) -> RewardResult:
        from tempering.reward import grade

        if self.sandbox is None:
            raise RuntimeError("no sandbox to grade")
        grading = grade(self.task, self.sandbox, grader=self.grader)
        return await asyncio.wait_for(grading, self.task.config.grading.timeout_s * 2
                                      + self.config.env_grace_s + 30)

    async def close(self) -> None:
        if self.tools is not None:
            await self.tools.close()

    def _header(self) -> EpisodeHeader:
        return EpisodeHeader(
            run_id=self.run_id, task_id=self.task.id, group_id=self.group_id,
            sample_index=self.sample_index, parent_id=self.parent_id,
            branch_step=self.branch_step, policy=getattr(self.policy, "name", "policy"),
            system_prompt=self.config.system_prompt, instruction=self.task.instruction,
            tools=json.dumps(self.tool_specs), started_at=self.started_at)
