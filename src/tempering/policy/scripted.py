"""A policy that replays a fixed list of actions: for tests, demos and reproducing a bug.

Each action is a tool call (``("bash", {"command": "ls"})``), a ``ToolCall`` as is, or raw
completion text (a ``str``) that goes through the same parsing as a model's output, so a test can
feed malformed calls. Past the end of the script it submits. A scripted policy samples nothing:
its generations carry no token ids, and ``weights_version`` is the one it was given.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from tempering.policy.base import GenerateRequest, Generation
from tempering.trajectory.schema import ToolCall

Action = tuple[str, dict[str, Any]] | ToolCall | str


class ScriptedPolicy:
    """Replays ``actions`` in order, one per turn; the turn is the number of assistant messages
    already in the conversation, so one instance serves any number of episodes at once."""

    def __init__(self, actions: Sequence[Action], *, name: str = "scripted",
                 weights_version: int = 0, delay_s: float = 0.0) -> None:
        self.actions = list(actions)
        self.name = name
        self.weights_version = weights_version
        self.delay_s = delay_s
        """Seconds each turn takes, to stand in for inference time."""

    async def aclose(self) -> None:
        """Nothing to release."""

    async def generate(self, request: GenerateRequest) -> Generation:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        turn = sum(1 for m in request.messages if m.role == "assistant")
        action: Action = (self.actions[turn] if turn < len(self.actions)
                          else ("submit", {}))
        if isinstance(action, str):
            from tempering.trajectory.toolcalls import parse_tool_calls

            parsed = parse_tool_calls(action)
            return Generation(text=action, content=parsed.content, tool_calls=parsed.calls,
                              tool_call_error=parsed.error,
                              finish_reason="tool_calls" if parsed.calls else "stop",
                              weights_version=self.weights_version)
        if isinstance(action, tuple):
            name, arguments = action
            action = ToolCall(id=f"call_{turn}", name=name, arguments=json.dumps(arguments))
        text = json.dumps({"name": action.name, "arguments": json.loads(action.arguments or "{}")})
        return Generation(text=f"<tool_call>{text}</tool_call>", tool_calls=[action],
                          finish_reason="tool_calls", weights_version=self.weights_version)
