"""``PolicyServer``: any Policy behind an OpenAI-compatible HTTP server that records every
completion, token for token, as trajectory data (``tempering serve``).

Any agent harness that speaks OpenAI (an SDK, LangChain, a shell script with curl) can then be
trained on: it talks to the server as to vLLM, and the server keeps what training needs, the
exact prompt and completion tokens, log-probs and weights version of every turn.

HTTP/1.1 on asyncio streams, without a web framework: keep-alive, ``Content-Length`` bodies,
JSON in and out, errors in OpenAI's ``{"error": {...}}`` shape. Every connection is its own task,
so requests from many clients run at once and a batching engine batches them.

Episodes. A request belongs to the episode named by the ``X-Tempering-Episode`` header, else
``tempering.episode_id`` in the body, else the body's ``user`` (a fresh id otherwise, returned
in the answer). For each episode the server keeps the last request's messages, the reply it
generated and their tokens (prompt + completion). When a request's messages are those plus the
reply plus new ones (tool results, a user turn), the policy extends the kept tokens with only
the new messages (``GenerateRequest.prefix_token_ids``), so nothing is re-tokenised, and the new
messages become the previous step's ``observation``; a rewritten history is rendered afresh
(``prompt_reused`` 0). The server trusts only tokens it produced: a client's
``tempering.prefix_token_ids`` must agree with them, or the request is refused.
``POST /v1/episodes/{id}/end`` turns the steps into a ``Trajectory`` for ``on_trajectory``;
episodes idle past ``episode_ttl_s``, and those still open at ``close()``, are handed over with
status ``infra_error``, so memory stays bounded and nothing recorded is dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus
from typing import Annotated, Any, NamedTuple, Self, TypeVar
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tempering.errors import PolicyError
from tempering.policy.base import GenerateRequest, Generation, Message, Policy
from tempering.policy.openai import ChatRequest, TemperingExtension, completion_response
from tempering.reward.result import RewardResult
from tempering.trajectory.schema import FinishReason, Status, Step, Trajectory, new_id

log = logging.getLogger(__name__)

OnTrajectory = Callable[[Trajectory], Awaitable[object] | object]
M = TypeVar("M", bound=BaseModel)
_EPISODE_PATH = re.compile(r"/v1/episodes/([^/]+)(/end)?")


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


class HTTPError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param,
                          "code": self.code}}


class _Reply(NamedTuple):
    body: dict[str, Any]
    headers: dict[str, str] = {}
    status: int = 200


@dataclass
class _Episode:
    id: str
    system_prompt: str = ""
    instruction: str = ""
    tools: str = ""
    started_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    busy: int = 0
    steps: list[Step] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    """The last request's messages."""
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


def _parse(model: type[M], raw: bytes) -> M:
    try:
        data = json.loads(raw or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HTTPError(400, f"the body is not JSON ({exc}); send a JSON object") from None
    if not isinstance(data, dict):
        raise HTTPError(400, f"the body must be a JSON object, not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors()[:3]:
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            got = err.get("input")
            shown = f" (got {json.dumps(got)[:60]})" if isinstance(got, (str, int, float)) else ""
            problems.append(f"{loc.lstrip('.') or 'body'}: {err['msg']}{shown}")
        raise HTTPError(400, "; ".join(problems),
                        param=".".join(map(str, exc.errors()[0]["loc"]))) from None


def _request_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """``(method, target, version, headers)``, header names lower-cased."""
    request_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HTTPError(400, f"not an HTTP/1.x request line: {request_line[:80]!r}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    if not headers.get("content-length", "0").isdigit():
        raise HTTPError(400, f"Content-Length {headers['content-length']!r} is not a number")
    return parts[0], parts[1], parts[2], headers


def _header_safe(value: str) -> bool:
    return value.isascii() and value.isprintable()


class PolicyServer:
    """Serves ``policy`` at ``http://{host}:{port}/v1``; ``port=0`` picks a free port."""

    def __init__(self, policy: Policy, *, host: str = "127.0.0.1", port: int = 0,
                 model_name: str | None = None, on_trajectory: OnTrajectory | None = None,
                 episode_ttl_s: float = 3600.0, max_body_bytes: int = 32 << 20,
                 keepalive_s: float = 75.0) -> None:
        self.policy = policy
        self.host, self.port = host, port
        self.model_name = model_name or policy.name
        self.on_trajectory = on_trajectory
        """Called with each ended episode's Trajectory (awaited if it returns an awaitable)."""
        self.episode_ttl_s = episode_ttl_s
        self.max_body_bytes = max_body_bytes
        self.keepalive_s = keepalive_s
        self._episodes: dict[str, _Episode] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._created = int(time.time())

    @property
    def url(self) -> str:
        """The OpenAI base URL, for ``OpenAIPolicy(server.url, ...)`` or any OpenAI SDK."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = asyncio.create_task(self._sweep())

    async def close(self) -> None:
        """Stop serving; episodes still open are handed over as ``infra_error``."""
        if self._server is None:
            return
        self._server.close()
        for task in [*self._connections, *([self._sweeper] if self._sweeper else [])]:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self._server = None
        for episode in list(self._episodes.values()):
            await self._expire(episode, "the server closed before the episode ended")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- HTTP ----

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while await self._exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; whether the connection stays open for another."""
        keep_alive = False  # until the body is read, an error leaves the stream unusable
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.keepalive_s)
            except (TimeoutError, asyncio.IncompleteReadError):
                return False  # idle past keep-alive, or closed between requests
            except asyncio.LimitOverrunError:
                raise HTTPError(431, "the request headers exceed 64 KiB") from None
            method, target, version, headers = _request_head(head)
            if "transfer-encoding" in headers:
                raise HTTPError(411, "chunked bodies are not supported; send Content-Length")
            length = int(headers.get("content-length", "0"))
            if length > self.max_body_bytes:
                raise HTTPError(413, f"the body has {length} bytes, over the server's limit of "
                                f"{self.max_body_bytes} (max_body_bytes)")
            if length and headers.get("expect", "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await reader.readexactly(length)
            connection = headers.get("connection", "").lower()
            keep_alive = (connection == "keep-alive" if version == "HTTP/1.0"
                          else connection != "close")
            reply = await self._route(method, target, headers, body)
        except HTTPError as exc:
            reply = _Reply(exc.body(), exc.headers, exc.status)
        except (asyncio.IncompleteReadError, ConnectionError):
            return False  # the client went away mid-request
        except Exception as exc:  # a bug must cost one request, not the client's connection
            log.exception("serving a request failed")
            reply = _Reply(HTTPError(500, f"{type(exc).__name__}: {exc}").body(), status=500)
        await self._send(writer, reply, keep_alive)
        return keep_alive

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, reply: _Reply, keep_alive: bool) -> None:
        payload = json.dumps(reply.body).encode()
        lines = [f"HTTP/1.1 {reply.status} {HTTPStatus(reply.status).phrase}",
                 "Content-Type: application/json", f"Content-Length: {len(payload)}",
                 f"Connection: {'keep-alive' if keep_alive else 'close'}",
                 *(f"{k}: {v}" for k, v in reply.headers.items() if _header_safe(v))]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
        await writer.drain()

    async def _route(self, method: str, target: str, headers: dict[str, str],
                     body: bytes) -> _Reply:
        path = target.split("?", 1)[0]
        table: dict[str, dict[str, Callable[[], Awaitable[_Reply]]]] = {
            "/health": {"GET": self._health}, "/v1/models": {"GET": self._models},
            "/v1/chat/completions": {"POST": partial(self._chat, headers, body)}}
        routes = table.get(path)
        if routes is None and (match := _EPISODE_PATH.fullmatch(path)):
            episode_id = unquote(match[1])
            routes = ({"POST": partial(self._end, episode_id, body)} if match[2]
                      else {"GET": partial(self._episode, episode_id)})
        if routes is None:
            raise HTTPError(404, f"no endpoint {path}: this server has GET /health, GET "
                            "/v1/models, POST /v1/chat/completions, GET /v1/episodes/{id} and "
                            "POST /v1/episodes/{id}/end")
        handler = routes.get(method)
        if handler is None:
            raise HTTPError(405, f"{path} takes {', '.join(routes)}, not {method}",
                            headers={"Allow": ", ".join(routes)})
        return await handler()

    # ---- endpoints ----

    async def _health(self) -> _Reply:
        return _Reply({"status": "ok", "policy": self.policy.name,
                       "episodes": len(self._episodes)})

    async def _models(self) -> _Reply:
        return _Reply({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                   "created": self._created,
                                                   "owned_by": "tempering"}]})

    async def _episode(self, episode_id: str) -> _Reply:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise HTTPError(404, f"no open episode {episode_id!r}")
        return _Reply({"episode_id": episode_id, "policy": self.policy.name,
                       "steps": [s.model_dump(mode="json") for s in episode.steps]})

    async def _chat(self, headers: dict[str, str], body: bytes) -> _Reply:
        req = _parse(ChatRequest, body)
        if req.stream:
            raise HTTPError(400, "stream: true is not supported: tempering serve answers each "
                            "completion whole; leave stream out or send false", param="stream")
        if req.n != 1:
            raise HTTPError(400, f"n={req.n}: one choice per request; send n requests",
                            param="n")
        ext = req.tempering or TemperingExtension()
        episode_id = headers.get("x-tempering-episode") or ext.episode_id or req.user or new_id()
        messages = [m.to_message() for m in req.messages]
        episode = self._episodes.get(episode_id)
        if episode is None:
            episode = self._episodes[episode_id] = _Episode(
                episode_id, tools=json.dumps(req.tools) if req.tools else "",
                system_prompt=next((m.content for m in messages if m.role == "system"), ""),
                instruction=next((m.content for m in messages if m.role == "user"), ""))
        continued = episode.continuation(messages)
        prefix, prefix_messages = ((episode.tokens, continued[0]) if continued and episode.tokens
                                   else ([], 0))
        if ext.prefix_token_ids and episode.steps and (
                ext.prefix_token_ids != prefix or ext.prefix_messages != prefix_messages):
            raise HTTPError(400, f"tempering.prefix_token_ids ({len(ext.prefix_token_ids)} "
                            f"tokens over {ext.prefix_messages} messages) disagree with episode "
                            f"{episode_id!r}'s last turn ({len(prefix)} tokens over "
                            f"{prefix_messages} messages"
                            + ("" if continued else "; these messages do not continue it")
                            + "): send that turn's messages and reply unchanged, or no prefix "
                            "to have the conversation rendered afresh", param="tempering")
        episode.busy += 1
        try:
            start = time.perf_counter()
            gen = await self.policy.generate(GenerateRequest(
                messages=messages, tools=req.tools or [], sampling=req.sampling(),
                prefix_token_ids=prefix, prefix_messages=prefix_messages,
                episode_id=episode_id))
            policy_s = time.perf_counter() - start
        except PolicyError as exc:
            raise HTTPError(500, f"the policy {self.policy.name} failed: {exc}") from exc
        finally:
            episode.busy -= 1
            episode.last_active = time.monotonic()
        if gen.context_exceeded:
            raise HTTPError(400, f"the conversation does not fit {self.model_name}'s context "
                            "window (its maximum context length); end the episode or shorten "
                            "the conversation", code="context_length_exceeded", param="messages")
        if gen.prompt_reused > len(prefix):
            raise HTTPError(500, f"the policy {self.policy.name} claims to reuse "
                            f"{gen.prompt_reused} tokens of a {len(prefix)}-token prefix")
        prompt = prefix[:gen.prompt_reused] + gen.prompt_token_ids
        self._record(episode, messages, gen, prompt, continued[1] if continued else None,
                     policy_s)
        answer = completion_response(gen, model=self.model_name, prompt=prompt,
                                     logprobs=req.logprobs)
        answer["tempering"] = {"weights_version": gen.weights_version, "episode_id": episode_id,
                               "prompt_reused": gen.prompt_reused, "text": gen.text,
                               "step": len(episode.steps) - 1}
        return _Reply(answer, {"X-Weights-Version": str(gen.weights_version),
                               "X-Tempering-Episode": episode_id})

    def _record(self, episode: _Episode, messages: list[Message], gen: Generation,
                prompt: list[int], observation: str | None, policy_s: float) -> None:
        if observation is not None and episode.steps:
            episode.steps[-1] = episode.steps[-1].model_copy(update={"observation": observation})
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

    async def _end(self, episode_id: str, body: bytes) -> _Reply:
        end = _parse(EndRequest, body)
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise HTTPError(404, f"no open episode {episode_id!r}: never seen, already ended, "
                            f"or idle for more than episode_ttl_s={self.episode_ttl_s:g} s")
        if episode.busy:
            raise HTTPError(409, f"episode {episode_id!r} has a completion running; end it "
                            "after the answer")
        trajectory = self._trajectory(episode, end)
        del self._episodes[episode_id]
        try:
            await self._hand_over(trajectory)
        except Exception as exc:  # keep the episode: the client may end it again
            self._episodes[episode_id] = episode
            log.exception("on_trajectory failed for episode %s", episode_id)
            raise HTTPError(500, f"storing the trajectory failed ({type(exc).__name__}: {exc});"
                            " the episode is kept, end it again") from exc
        return _Reply({"episode_id": episode_id, "trajectory_id": trajectory.trajectory_id,
                       "steps": len(trajectory.steps), "status": trajectory.status.value,
                       "reward": trajectory.reward_value})

    def _trajectory(self, episode: _Episode, end: EndRequest) -> Trajectory:
        reward = None if end.reward is None else RewardResult(
            reward=end.reward, components={"external": end.reward}, tests_passed=0,
            tests_total=0, flags=[])
        return Trajectory(
            run_id=end.run_id, task_id=end.task_id, group_id=end.group_id,
            sample_index=end.sample_index, policy=self.policy.name,
            system_prompt=episode.system_prompt, instruction=episode.instruction,
            tools=episode.tools, steps=episode.steps, status=end.status,
            finish_reason=end.finish_reason or ("error" if end.status.infra else "submit"),
            error=end.error, reward=reward, started_at=episode.started_at,
            duration_s=time.time() - episode.started_at)

    async def _hand_over(self, trajectory: Trajectory) -> None:
        if self.on_trajectory is not None:
            result = self.on_trajectory(trajectory)
            if inspect.isawaitable(result):
                await result

    async def _expire(self, episode: _Episode, why: str) -> None:
        self._episodes.pop(episode.id, None)
        try:
            await self._hand_over(self._trajectory(episode, EndRequest(
                status=Status.INFRA_ERROR, error=f"PolicyServer: {why}")))
        except Exception:
            log.exception("on_trajectory failed for expired episode %s", episode.id)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(self.episode_ttl_s / 4, 30.0)))
            idle = time.monotonic() - self.episode_ttl_s
            for episode in [e for e in self._episodes.values()
                            if not e.busy and e.last_active < idle]:
                await self._expire(episode, f"idle for more than episode_ttl_s="
                                            f"{self.episode_ttl_s:g} s without being ended")
