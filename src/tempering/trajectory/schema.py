"""The trajectory schema: the spine every part reads or writes.

One ``Trajectory`` is one episode: the task and ids that place it in a run and a group, every
``Step`` the policy took with the exact tokens it sampled, the grade, and a ``Status`` that
attributes any failure to one boundary. It is persisted as is (``SCHEMA_VERSION`` travels with
every row), so a change here is a schema change: add fields with defaults, never reuse a name.

Token faithfulness: what is trained is what was sampled. A step keeps the completion's token ids
and their log-probs as the engine returned them, never a re-tokenisation of the text. The prompt
of turn *i* usually extends the prompt and completion of turn *i-1* token for token; a step then
stores only the new tokens (``prompt_token_ids``) and how many leading tokens it shares
(``prompt_reused``). ``Trajectory.prompt_ids(i)`` rebuilds any turn's full prompt and
``Trajectory.sequence()`` the whole episode as one training sequence with its loss mask.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from tempering.reward.result import RewardResult

SCHEMA_VERSION = 1


def new_id() -> str:
    """A fresh random id (32 hex digits)."""
    return uuid.uuid4().hex


class Status(StrEnum):
    """How an episode ended, attributed to exactly one boundary."""

    OK = "ok"
    """The episode ended by the policy (submit, give up) or a budget, and was graded."""
    MODEL_ERROR = "model_error"
    """The policy's output made the episode impossible to continue (too many malformed
    actions in a row, a prompt past its context window); graded."""
    MODEL_TIMEOUT = "model_timeout"
    """The policy's own commands used up the episode's wall-time budget; graded."""
    ENV_TIMEOUT = "env_timeout"
    """The sandbox stopped answering (a call got no reply within its grace); not graded."""
    INFRA_ERROR = "infra_error"
    """The sandbox crashed, the engine or inference server failed, the harness ran out of
    memory or died; not graded."""
    TAMPERED = "tampered"
    """Grading raised a tamper flag; the reward is 0."""

    @property
    def infra(self) -> bool:
        """True for failures of the environment, which say nothing about the model."""
        return self in (Status.ENV_TIMEOUT, Status.INFRA_ERROR)


FinishReason = Literal["submit", "give_up", "max_turns", "max_tokens", "wall_time",
                       "errors", "context", "error"]


class ToolCall(BaseModel):
    """One call in the OpenAI tools format; ``arguments`` is the JSON text the model wrote."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str


class Step(BaseModel):
    """One turn: the policy's sample, the action taken and what the sandbox answered."""

    model_config = ConfigDict(frozen=True)

    index: int
    """0-based turn number."""
    text: str = ""
    """The completion as decoded text (for people; training uses the token ids)."""
    action: str = ""
    """Tool name that ran (``bash``, ``submit``, ...), ``invalid`` for a malformed call,
    ``message`` for a turn with no tool call."""
    tool_call_id: str = ""
    arguments: str = ""
    """The tool call's arguments as the model wrote them (JSON text)."""
    observation: str = ""
    """What the agent was shown, after truncation."""
    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None
    """Why the action failed (a malformed call, a bad path, a timed out command), if it did."""
    policy_s: float = 0.0
    """Seconds the policy took to produce this turn."""
    action_s: float = 0.0
    """Seconds the action took in the sandbox."""
    prompt_reused: int = 0
    """Leading tokens of this turn's prompt equal to the previous turn's prompt + completion."""
    prompt_token_ids: list[int] = []
    """The rest of this turn's prompt: tokens after the reused prefix."""
    completion_token_ids: list[int] = []
    logprobs: list[float] = []
    """Log-probability of each completion token under the sampling policy."""
    loss_mask: list[int] = []
    """1 for each completion token the policy sampled (trained on), 0 for forced ones."""
    weights_version: int = 0
    """The policy's weights version that sampled this turn."""
    inherited: bool = False
    """True for the shared prefix a branched episode copied from its parent."""

    @property
    def failed_call(self) -> bool:
        """The turn made no well-formed tool call: a malformed one (``invalid``) or none
        (``message``)."""
        return self.action in ("invalid", "message")


class EpisodeHeader(BaseModel):
    """What is known of an episode when it begins: journaled first, so that a harness that dies
    mid-episode still leaves a trajectory (its fields are the ``Trajectory``'s of that name)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    run_id: str = ""
    group_id: str = ""
    sample_index: int = 0
    parent_id: str | None = None
    branch_step: int | None = None
    policy: str = ""
    system_prompt: str = ""
    instruction: str = ""
    tools: str = ""
    started_at: float = 0.0


class Trajectory(BaseModel):
    """One episode, from prompt to grade."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = SCHEMA_VERSION
    trajectory_id: str = Field(default_factory=new_id)
    run_id: str = ""
    task_id: str
    group_id: str = ""
    """Episodes of one group share a task and prompt (GRPO's group)."""
    sample_index: int = 0
    parent_id: str | None = None
    """For a branched episode: the trajectory whose prefix it continues."""
    branch_step: int | None = None
    """For a branched episode: steps before this index were inherited from the parent."""
    policy: str = ""
    """Which policy produced it (``local:<model>``, ``openai:<model>``, ``scripted``)."""
    system_prompt: str = ""
    instruction: str = ""
    tools: str = ""
    """The tools offered, as the OpenAI tools JSON."""
    steps: list[Step] = []
    status: Status = Status.OK
    finish_reason: FinishReason = "submit"
    error: str | None = None
    """For a failed episode: what failed, in one line, with the boundary's error class."""
    reward: RewardResult | None = None
    """None when the episode was not graded (infra failures)."""
    marks: list[str] = []
    """Labels added by filters, e.g. ``recovered`` for an error observation followed by
    success."""
    started_at: float = 0.0
    """Unix time the episode started."""
    duration_s: float = 0.0
    grade_s: float = 0.0

    @property
    def reward_value(self) -> float | None:
        return None if self.reward is None else self.reward.reward

    @property
    def failed_calls(self) -> int:
        """The policy's own turns (inherited ones aside) that made no well-formed tool call
        (``Step.failed_call``)."""
        return sum(s.failed_call and not s.inherited for s in self.steps)

    @property
    def versions(self) -> list[int]:
        return sorted({s.weights_version for s in self.steps})

    def prompt_ids(self, i: int) -> list[int]:
        """The full prompt the policy was fed at turn ``i``."""
        full: list[int] = []
        for step in self.steps[: i + 1]:
            if step.prompt_reused > len(full):
                raise ValueError(f"step {step.index} reuses {step.prompt_reused} tokens but the "
                                 f"previous turn had only {len(full)}")
            full = full[: step.prompt_reused] + step.prompt_token_ids
            if step.index < i:
                full = full + step.completion_token_ids
        return full

    def sequence(self) -> tuple[list[int], list[int], list[float], list[int]] | None:
        """The episode as one token sequence: ``(ids, loss_mask, logprobs, versions)``.

        Observation and prompt tokens carry mask 0, log-prob 0 and version -1. None when some
        turn's prompt does not extend the previous turn token for token (an engine that
        re-rendered the conversation): train per turn then, with ``prompt_ids(i)``.
        """
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        for step in self.steps:
            if not step.completion_token_ids and not step.prompt_token_ids:
                continue
            if step.prompt_reused != len(ids):
                return None
            n_prompt = len(step.prompt_token_ids)
            ids += step.prompt_token_ids + step.completion_token_ids
            mask += [0] * n_prompt + (step.loss_mask or [1] * len(step.completion_token_ids))
            logprobs += [0.0] * n_prompt + (step.logprobs
                                            or [0.0] * len(step.completion_token_ids))
            versions += [-1] * n_prompt + [step.weights_version] * len(step.completion_token_ids)
        return ids, mask, logprobs, versions


class Recorder(Protocol):
    """Where an episode journals its steps (``TrajectoryStore`` is one)."""

    def begin(self, trajectory_id: str, header: EpisodeHeader) -> None: ...
    def record_step(self, trajectory_id: str, step: Step) -> None: ...
    def append(self, trajectory: Trajectory) -> None: ...
