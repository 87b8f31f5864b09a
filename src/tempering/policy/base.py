"""The policy boundary: one protocol for every inference engine.

A policy takes a conversation (OpenAI chat messages and tools) and returns one ``Generation``:
the text, the tool calls parsed from it, and, when the engine can tell, the exact prompt and
completion token ids, the completion's log-probs and the weights version that sampled it.

Token faithfulness across turns: an episode passes the previous turn's prompt + completion
tokens as ``GenerateRequest.prefix_token_ids``; an engine that can (the local one, ``tempering
serve``) renders only the new messages after that prefix instead of re-tokenising the whole
conversation, and says how many prefix tokens it kept in ``Generation.prompt_reused``.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from tempering.trajectory.schema import ToolCall


class Message(BaseModel):
    """One chat message in the OpenAI format."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = []
    """For an assistant message: the calls it made."""
    tool_call_id: str = ""
    """For a tool message: the call it answers."""
    name: str = ""

    def to_openai(self) -> dict[str, Any]:
        """This message as the JSON an OpenAI-compatible server expects."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in self.tool_calls]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
            if self.name:
                out["name"] = self.name
        return out


class SamplingParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = 1.0
    """Softmax temperature; 0 samples greedily."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    max_tokens: int = 256
    """Most tokens in one completion."""
    seed: int | None = None
    """Makes the sample reproducible for the same prompt and weights."""
    stop: list[str] = []


class GenerateRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    messages: list[Message]
    tools: list[dict[str, Any]] = []
    """OpenAI tools (``{"type": "function", "function": {...}}``)."""
    sampling: SamplingParams = SamplingParams()
    prefix_token_ids: list[int] = []
    """The previous turn's prompt + completion tokens, to extend rather than re-tokenise."""
    prefix_messages: int = 0
    """How many of ``messages`` the prefix tokens already render."""
    episode_id: str = ""
    """The trajectory this turn belongs to (``tempering serve`` records against it)."""


class Generation(BaseModel):
    """One completion, with everything training needs to use it faithfully."""

    model_config = ConfigDict(frozen=True)

    text: str
    """The completion as text, tool-call markup included."""
    content: str = ""
    """The text outside tool calls."""
    tool_calls: list[ToolCall] = []
    tool_call_error: str | None = None
    """Why tool-call markup in the text could not be parsed, if it could not."""
    finish_reason: Literal["stop", "length", "tool_calls"] = "stop"
    prompt_reused: int = 0
    """Leading tokens of the prompt taken from ``GenerateRequest.prefix_token_ids``."""
    prompt_token_ids: list[int] = []
    """The prompt tokens after the reused prefix (all of them when nothing was reused)."""
    completion_token_ids: list[int] = []
    logprobs: list[float] = []
    weights_version: int = 0
    context_exceeded: bool = False
    """The prompt did not fit the model's context window; nothing was sampled."""


@runtime_checkable
class Policy(Protocol):
    """Anything that turns a conversation into the next turn."""

    name: str
    """For the trajectory: ``local:<model>``, ``openai:<model>``, ``scripted``."""

    async def generate(self, request: GenerateRequest) -> Generation:
        """Sample one completion. Raises ``PolicyError`` when the engine fails."""
        ...

    async def aclose(self) -> None:
        """Release what it holds (an engine's worker and memory, a client's connections),
        once its owner is done with it; a request after that fails with ``PolicyError``."""
        ...


@runtime_checkable
class TrainablePolicy(Policy, Protocol):
    """A policy whose weights a learner replaces while it serves (``LocalEngine``)."""

    def update_weights(self, state: Any, version: int) -> int:
        """Serve ``state`` (a state dict, or a ``save_pretrained`` directory) as ``version``
        from the next completion on; blocks until the swap is done (from a coroutine: in a
        thread). Returns the version now served."""
        ...
