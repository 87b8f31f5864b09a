"""Tool calls in completion text: the Hermes/Qwen markup, parsed strictly, rendered the same way.

A model calls a tool by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
Parsing never raises: markup that is not a valid call becomes ``ParsedCompletion.error``, a
sentence naming what was wrong, which the episode shows the model as an error observation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tempering.trajectory.schema import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedCompletion:
    content: str
    """The text outside tool-call markup, stripped."""
    calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None
    """Why some markup was not a valid call (the valid ones are still in ``calls``)."""


def render_tool_call(name: str, arguments: dict[str, Any] | str) -> str:
    """The markup a model writes for one call."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    return f"{OPEN}{json.dumps({'name': name, 'arguments': args})}{CLOSE}"


def parse_tool_calls(text: str, *, id_prefix: str = "call") -> ParsedCompletion:
    """Every ``<tool_call>`` in ``text``; unterminated or invalid markup becomes the error."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    for n, match in enumerate(_CALL.finditer(text)):
        body = match.group(1).strip()
        if not match.group(0).endswith(CLOSE):
            errors.append(f"tool call {n + 1} is missing its closing {CLOSE}")
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"tool call {n + 1} is not valid JSON ({exc.msg} at column "
                          f"{exc.colno}): {body[:80]!r}")
            continue
        except RecursionError:  # the model's text, not the system, is at fault
            errors.append(f"tool call {n + 1} is nested too deeply to read: {body[:80]!r}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(f"tool call {n + 1} needs an object with a string \"name\": "
                          f"{body[:80]!r}")
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models double-encode
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, RecursionError):
                errors.append(f"tool call {n + 1}'s \"arguments\" is a string that is not JSON")
                continue
        if not isinstance(args, dict):
            errors.append(f"tool call {n + 1}'s \"arguments\" must be an object, not "
                          f"{type(args).__name__}")
            continue
        try:
            arguments = json.dumps(args)
        except RecursionError:
            errors.append(f"tool call {n + 1}'s \"arguments\" are nested too deeply to read")
            continue
        calls.append(ToolCall(id=f"{id_prefix}_{n}", name=obj["name"], arguments=arguments))
    content = _CALL.sub("", text).strip()
    return ParsedCompletion(content=content, calls=calls,
                            error="; ".join(errors) if errors else None)
