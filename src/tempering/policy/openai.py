"""The OpenAI chat-completions wire format, and ``OpenAIPolicy``, a client of any server that
speaks it (vLLM, SGLang, ``tempering serve``, OpenAI's hosted API).

One non-streamed ``POST {base_url}/chat/completions`` per turn: a turn is consumed whole, and
a whole response carries its token ids and log-probs in one place. Token faithfulness needs the
server's help, asked for in three layers, each optional:

- ``logprobs: true`` (standard): the completion's log-probs.
- ``return_token_ids: true`` (vLLM's extension): ``prompt_token_ids`` (the full prompt) and
  ``choices[0].token_ids`` (the completion).
- ``"tempering": {"episode_id", "prefix_token_ids", "prefix_messages"}`` (``tempering serve``'s
  extension): the previous turn's tokens, which the server extends instead of re-tokenising;
  its answer's ``tempering`` object gives ``weights_version``, ``prompt_reused`` and ``text``.

The weights version of a completion is the server's word where it gives one (``tempering
serve``'s ``tempering.weights_version`` or ``X-Weights-Version``, SGLang's
``metadata.weight_version``), else ``OpenAIPolicy.weights_version`` as it was when the request
was sent: a publisher (``policy.weights.VLLMPublisher``) sets it once the server serves a new
version, so the stamp is never newer than the weights that sampled the completion.

Servers that reject unknown fields (OpenAI's) need ``send_token_prefix=False,
return_token_ids=False``; their generations carry text and log-probs only. ``prompt_reused`` is
the server's word when the prompt it returned bears it out against the prefix we hold, else the
longest prefix the prompt shares with it, so a server that re-renders the conversation to the
same tokens still yields an episode that trains as one sequence.

Failures: connection errors, timeouts, 429 and 5xx are retried with exponential backoff and
jitter (``Retry-After`` honoured); another 4xx is the request's fault and raised at once, except
a prompt over the context window, which is a ``Generation(context_exceeded=True)``.
``ChatRequest`` is the request side of the format as ``tempering serve`` validates it.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tempering.errors import ConfigError, PolicyError, PolicyTimeoutError
from tempering.policy.base import GenerateRequest, Generation, Message, SamplingParams
from tempering.trajectory.schema import ToolCall, new_id
from tempering.trajectory.toolcalls import OPEN, parse_tool_calls, render_tool_call

if TYPE_CHECKING:
    import httpx

FINISH: dict[str, Literal["stop", "length", "tool_calls"]] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls"}
"""OpenAI finish reasons to ours; anything else (``content_filter``, ``abort``) reads as stop."""
_CONTEXT = re.compile(r"context[ _]length|context window", re.IGNORECASE)


# ---- the request, as a server validates it ----

class _Function(BaseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class _WireToolCall(BaseModel):
    id: str = ""
    type: Literal["function"] = "function"
    function: _Function


class _TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a request; unknown keys are ignored, as OpenAI clients add their own."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None
    tool_calls: list[_WireToolCall] | None = None
    tool_call_id: str = ""
    name: str = ""

    def to_message(self) -> Message:
        content = (self.content if isinstance(self.content, str)
                   else "".join(p.text for p in self.content or []))
        calls = [ToolCall(id=c.id, name=c.function.name,
                          arguments=c.function.arguments if isinstance(c.function.arguments, str)
                          else json.dumps(c.function.arguments))
                 for c in self.tool_calls or []]
        return Message(role="system" if self.role == "developer" else self.role,
                       content=content, tool_calls=calls, tool_call_id=self.tool_call_id,
                       name=self.name)


class TemperingExtension(BaseModel):
    """The ``tempering`` object of a request."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str = ""
    prefix_token_ids: list[int] = []
    prefix_messages: Annotated[int, Field(ge=0)] = 0


class ChatRequest(BaseModel):
    """A chat-completions request. Honoured: the fields below; other OpenAI parameters
    (``frequency_penalty``, ``tool_choice``, ...) are accepted and ignored, as vLLM does."""

    model_config = ConfigDict(extra="ignore")

    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    temperature: Annotated[float | None, Field(ge=0.0)] = None
    top_p: Annotated[float | None, Field(gt=0.0, le=1.0)] = None
    max_tokens: Annotated[int | None, Field(ge=1)] = None
    max_completion_tokens: Annotated[int | None, Field(ge=1)] = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    logprobs: bool = False
    user: str = ""
    tempering: TemperingExtension | None = None

    def sampling(self) -> SamplingParams:
        d = SamplingParams()
        return SamplingParams(
            temperature=d.temperature if self.temperature is None else self.temperature,
            top_p=d.top_p if self.top_p is None else self.top_p,
            max_tokens=self.max_completion_tokens or self.max_tokens or d.max_tokens,
            seed=self.seed, stop=[self.stop] if isinstance(self.stop, str) else self.stop or [])


def tool_calls_to_openai(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def completion_response(gen: Generation, *, model: str, prompt: list[int],
                        logprobs: bool) -> dict[str, Any]:
    """``gen`` as a chat-completions answer, with vLLM's token-id fields (``prompt`` is the
    full prompt). The content is the text outside calls when there are calls, else the text
    as written, so a client can parse markup the policy could not."""
    ids = gen.completion_token_ids
    return {
        "id": f"chatcmpl-{new_id()}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant",
                        "content": (gen.content or None) if gen.tool_calls else gen.text,
                        "tool_calls": tool_calls_to_openai(gen.tool_calls)},
            "logprobs": {"content": [
                {"token": f"token_id:{ids[i]}" if i < len(ids) else "", "logprob": lp,
                 "bytes": None, "top_logprobs": []} for i, lp in enumerate(gen.logprobs)]}
            if logprobs else None,
            "finish_reason": gen.finish_reason, "token_ids": ids}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                  "total_tokens": len(prompt) + len(ids)},
        "prompt_token_ids": prompt}


def render_text(content: str, calls: list[ToolCall]) -> str:
    """The completion text a Hermes-style model wrote for ``content`` and ``calls`` (for servers
    that return the parsed form only; training uses token ids, never this)."""
    marks = []
    for c in calls:
        try:
            marks.append(render_tool_call(c.name, c.arguments))
        except ValueError:  # arguments that are not JSON: keep them as written
            marks.append(f'{OPEN}{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}'
                         "</tool_call>")
    return "\n".join([content, *marks] if content else marks)


def _excerpt(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _error_message(response: httpx.Response) -> str:
    """The server's own error message where it sent one in OpenAI's shape, else the body."""
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str) and message:
            return _excerpt(message)
    except (ValueError, AttributeError):
        pass
    return _excerpt(response.text) or "(empty body)"


def _served_version(data: dict[str, Any], header: str | None) -> int | None:
    """The weights version the server says sampled the answer, if it says one."""
    ext, meta = data.get("tempering"), data.get("metadata")
    for said in (ext.get("weights_version") if isinstance(ext, dict) else None, header,
                 meta.get("weight_version") if isinstance(meta, dict) else None):
        if isinstance(said, int) and not isinstance(said, bool):
            return said
        if isinstance(said, str) and said.isdigit():  # SGLang's is "default" until one is set
            return int(said)
    return None


def _reused(prefix: list[int], prompt: list[int], claimed: object) -> int:
    if not prefix or not prompt:
        return 0
    if (isinstance(claimed, int) and 0 <= claimed <= min(len(prefix), len(prompt))
            and prompt[:claimed] == prefix[:claimed]):
        return claimed
    n = 0
    for a, b in zip(prefix, prompt, strict=False):
        if a != b:
            break
        n += 1
    return n


# ---- the client ----

class OpenAIPolicy:
    """A Policy served by an OpenAI-compatible server at ``base_url`` (ending in ``/v1``)."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 120.0, retries: int = 3, backoff_s: float = 0.5,
                 extra_body: dict[str, Any] | None = None, name: str | None = None,
                 send_token_prefix: bool = True, return_token_ids: bool = True,
                 max_connections: int = 256) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url {base_url!r} must start with http:// or https://, "
                              "e.g. http://127.0.0.1:8000/v1")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ConfigError(f"timeout_s={timeout_s}, retries={retries}, backoff_s={backoff_s}:"
                              " timeout_s must be positive, retries and backoff_s at least 0")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.name = name or f"openai:{model}"
        self.timeout_s = timeout_s
        """Seconds one attempt may take (a whole completion); retries each get their own."""
        self.retries = retries
        self.backoff_s = backoff_s
        self.extra_body = dict(extra_body or {})
        """Merged into every request body last (e.g. ``{"top_k": 20}`` for vLLM)."""
        self.send_token_prefix = send_token_prefix
        self.return_token_ids = return_token_ids
        self.weights_version: int | None = None
        """The version the server serves, for answers that carry none (vLLM's); set by a
        weights publisher once the server serves it."""
        self._api_key = api_key
        self._max_connections = max_connections
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx

            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            # No pool timeout: waiting for a free connection is queueing, not a dead server.
            self._client = httpx.AsyncClient(
                headers=headers, timeout=httpx.Timeout(self.timeout_s, pool=None),
                limits=httpx.Limits(max_connections=self._max_connections,
                                    max_keepalive_connections=self._max_connections))
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def body(self, request: GenerateRequest) -> dict[str, Any]:
        """The JSON sent for ``request``."""
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model, "messages": [m.to_openai() for m in request.messages],
            "temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens,
            "logprobs": True}
        if request.tools:
            body["tools"] = request.tools
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = s.stop
        if self.return_token_ids:
            body["return_token_ids"] = True
        if self.send_token_prefix:
            body["tempering"] = {"episode_id": request.episode_id,
                                 "prefix_token_ids": request.prefix_token_ids,
                                 "prefix_messages": request.prefix_messages}
        return body | self.extra_body

    async def generate(self, request: GenerateRequest) -> Generation:
        headers = {"X-Tempering-Episode": request.episode_id} if request.episode_id else {}
        sent_version = self.weights_version  # a publish during the request may come too late
        response = await self._post(self.body(request), headers)
        if response.status_code == 400 and _CONTEXT.search(response.text):
            return Generation(text="", context_exceeded=True)
        try:
            data = response.json()
        except ValueError:
            raise PolicyError(f"{self.url} answered 200 with a body that is not JSON: "
                              f"{_excerpt(response.text)}") from None
        try:
            version = _served_version(data, response.headers.get("x-weights-version"))
            return self._generation(request, data, sent_version if version is None else version)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise PolicyError(f"{self.url} answered with a completion of an unexpected shape "
                              f"({type(exc).__name__}: {detail}): "
                              f"{_excerpt(response.text)}") from None

    async def _post(self, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        import httpx

        client = self._http()
        attempts = self.retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            retry_after: float | None = None
            try:
                response = await client.post(self.url, json=body, headers=headers)
            except httpx.TimeoutException as exc:
                if last:
                    raise PolicyTimeoutError(
                        f"{self.url} did not answer within timeout_s={self.timeout_s:g} s "
                        f"({attempts} attempt(s)); raise timeout_s or check the server's "
                        f"load") from exc
            except httpx.TransportError as exc:  # refused, reset, closed mid-answer
                if last:
                    raise PolicyError(f"cannot reach {self.url} ({type(exc).__name__}: {exc}) "
                                      f"after {attempts} attempt(s); is the server running "
                                      "there?") from exc
            else:
                status = response.status_code
                if status == 200 or (status == 400 and _CONTEXT.search(response.text)):
                    return response
                if status != 429 and status < 500:  # the request's fault: retrying cannot help
                    raise PolicyError(f"{self.url} answered {status}: "
                                      f"{_error_message(response)}")
                if last:
                    raise PolicyError(f"{self.url} answered {status} to {attempts} attempt(s); "
                                      f"the last said: {_error_message(response)}")
                try:
                    retry_after = float(response.headers.get("retry-after", ""))
                except ValueError:
                    retry_after = None
            # Equal jitter keeps a thousand clients refused at once from retrying in lockstep.
            delay = self.backoff_s * 2 ** attempt
            delay = delay / 2 + random.uniform(0, delay / 2)
            await asyncio.sleep(min(max(delay, retry_after or 0.0), 60.0))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _generation(self, request: GenerateRequest, data: dict[str, Any],
                    version: int | None) -> Generation:
        choice = data["choices"][0]
        message = choice.get("message") or {}
        raw = message.get("content") or ""
        content, error = raw, None
        calls = [ToolCall(id=c.get("id") or f"call_{n}", name=c["function"]["name"],
                          arguments=(a if isinstance(a := c["function"].get("arguments", "{}"),
                                                     str) else json.dumps(a)))
                 for n, c in enumerate(message.get("tool_calls") or [])]
        if not calls and OPEN in raw:  # a server without a tool parser: the markup as written
            parsed = parse_tool_calls(raw)
            content, calls, error = parsed.content, parsed.calls, parsed.error
        ext = data.get("tempering") or {}
        text = ext.get("text")
        if not isinstance(text, str):
            text = raw if OPEN in raw else render_text(content, calls)
        logprobs = [float(t["logprob"]) for t in (choice.get("logprobs") or {}).get("content")
                    or []]
        completion = list(choice.get("token_ids") or [])
        if completion and logprobs and len(completion) != len(logprobs):
            raise ValueError(f"{len(completion)} completion token ids but {len(logprobs)} "
                             "log-probs")
        prompt = list(data.get("prompt_token_ids") or choice.get("prompt_token_ids") or [])
        reused = _reused(request.prefix_token_ids, prompt, ext.get("prompt_reused"))
        finish = FINISH.get(choice.get("finish_reason") or "stop", "stop")
        return Generation(
            text=text, content=content, tool_calls=calls, tool_call_error=error,
            finish_reason="tool_calls" if calls and finish == "stop" else finish,
            prompt_reused=reused, prompt_token_ids=prompt[reused:],
            completion_token_ids=completion, logprobs=logprobs,
            weights_version=version or 0)
