"""A small honest engine for the serve and client tests: one token per character.

Its token ids really encode the text (``ord``), so a test can check that what travels over HTTP
is what was sampled. It renders each message as ``<role>content[calls]\\n`` and extends
``prefix_token_ids`` with only the messages after ``prefix_messages``, like an engine that
keeps KV state. Completions come from a script, one per assistant turn, as ScriptedPolicy's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tempering.policy.base import GenerateRequest, Generation, Message
from tempering.trajectory.toolcalls import parse_tool_calls


def render(messages: Sequence[Message]) -> str:
    return "".join(f"<{m.role}>{m.content}"
                   + "".join(f"[{c.name} {c.arguments}]" for c in m.tool_calls) + "\n"
                   for m in messages)


def ids(text: str) -> list[int]:
    return [ord(ch) for ch in text]


class CharPolicy:
    def __init__(self, script: Sequence[str], *, weights_version: int = 7,
                 context: int = 100_000, name: str = "chars") -> None:
        self.script = list(script)
        self.weights_version = weights_version
        self.context = context
        self.name = name
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest) -> Generation:
        self.requests.append(request)
        if request.prefix_token_ids:
            reused = len(request.prefix_token_ids)
            new = ids(render(request.messages[request.prefix_messages:]))
        else:
            reused, new = 0, ids(render(request.messages))
        if reused + len(new) > self.context:
            return Generation(text="", context_exceeded=True)
        turn = sum(m.role == "assistant" for m in request.messages)
        text = self.script[turn] if turn < len(self.script) else "done"
        parsed = parse_tool_calls(text)
        completion = ids(text)
        return Generation(
            text=text, content=parsed.content, tool_calls=parsed.calls,
            tool_call_error=parsed.error,
            finish_reason="tool_calls" if parsed.calls else "stop", prompt_reused=reused,
            prompt_token_ids=new, completion_token_ids=completion,
            logprobs=[-0.5 - (i % 7) / 8 for i in range(len(completion))],
            weights_version=self.weights_version)


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
