"""``PolicyServer``: any Policy behind an OpenAI-compatible API that records every completion,
token for token, as trajectory data (``tempering serve``). ``policy.http`` is the transport;
this module is the endpoints and the episodes.

Episodes. A request belongs to the episode its ``X-Tempering-Episode`` header names, else
``tempering.episode_id``, else ``user`` (else a fresh one). The server keeps each episode's
last request, the reply and their tokens; a request that continues them (same messages, the
reply, then new tool or user messages) has the policy extend those tokens with only the new
messages (``prefix_token_ids``), which become the last step's ``observation``; a rewritten
history is rendered afresh. Only the server's own tokens are trusted: a client's
``tempering.prefix_token_ids`` must agree with them.

Retries. A request repeating the episode's last request (a client that timed out or lost the
answer) is answered with the recorded answer, byte for byte, and records nothing; while the
original is still sampling, the retry waits for it. Replaying rather than sampling again keeps
the answer a client continues from the one recorded, even when a retry races its original.

Weights. ``POST /v1/weights {"path", "version"}`` has the policy's ``update_weights`` load a
save_pretrained directory or .safetensors file on the server's machine (in a thread: it waits
for the completions in flight), never to an older version; ``GET /v1/weights`` reads it. Off
loopback, the endpoint is refused unless ``allow_weight_updates``: it makes the server load files.

Ends and journaling. ``POST /v1/episodes/{id}/end`` hands the ``Trajectory`` to the
``recorder`` and ``on_trajectory``; idle episodes (``episode_ttl_s``) and those open at
``close()`` go the same way as ``infra_error``. A ``recorder`` (``agent.episode.Recorder``, e.g.
``TrajectoryStore``) also journals each episode as it happens, so a server killed outright
leaves it behind: ``begin`` on first sight, ``record_step`` once a step is final (the next
turn brought its observation, or rewrote the history so none will come), ``append`` at the
end. Journals are append-only, so the last completion, whose observation is still out, is not
journaled: a crash loses it, never records it twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Self

from pydantic import BaseModel, ConfigDict, Field

from tempering.errors import PolicyError
from tempering.policy.base import GenerateRequest, Generation, Message, Policy
from tempering.policy.http import HTTPError, HTTPServer, Request, Response, Router
from tempering.policy.openai import ChatRequest, TemperingExtension, completion_response
from tempering.reward.result import RewardResult
from tempering.trajectory.schema import (
    EpisodeHeader,
    FinishReason,
    Status,
    Step,
    Trajectory,
    new_id,
)

if TYPE_CHECKING:
    from tempering.agent.episode import Recorder  # the agent package pulls in sandboxes

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


class WeightsRequest(BaseModel):
    """The body of ``POST /v1/weights``."""

    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1)]
    """Absolute path, on the server's machine, of a save_pretrained directory or a .safetensors
    file holding the new weights."""
    version: Annotated[int, Field(ge=0)]
    """The version the new weights become; never below the one served."""


@dataclass
class _Episode:
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


class PolicyServer:
    """Serves ``policy`` at ``http://{host}:{port}/v1``; ``port=0`` picks a free port."""

    def __init__(self, policy: Policy, *, host: str = "127.0.0.1", port: int = 0,
                 model_name: str | None = None, on_trajectory: OnTrajectory | None = None,
                 recorder: Recorder | None = None, episode_ttl_s: float = 3600.0,
                 max_body_bytes: int = 32 << 20, keepalive_s: float = 75.0,
                 allow_weight_updates: bool | None = None) -> None:
        self.policy = policy
        self.model_name = model_name or policy.name
        self.on_trajectory = on_trajectory
        """Called with each ended episode's Trajectory (awaited if it returns an awaitable)."""
        self.recorder = recorder
        """Journals episodes as they happen and stores them at their end (``append`` runs in
        a worker thread: it may fsync). Thread-safe, as ``TrajectoryStore`` is."""
        self.episode_ttl_s = episode_ttl_s
        self.allow_weight_updates = (_is_loopback(host) if allow_weight_updates is None
                                     else allow_weight_updates)
        """Whether ``POST /v1/weights`` loads weights (default: only when listening on loopback,
        as anyone who reaches the server could otherwise make it load files)."""
        self._weights_lock = asyncio.Lock()  # one load at a time, checked against the version
        self._posted_version: int | None = None
        router = Router()
        router.add("GET", "/health", self._health)
        router.add("GET", "/v1/models", self._models)
        router.add("POST", "/v1/chat/completions", self._chat)
        router.add("GET", "/v1/episodes/{id}", self._episode)
        router.add("POST", "/v1/episodes/{id}/end", self._end)
        router.add("GET", "/v1/weights", self._weights)
        router.add("POST", "/v1/weights", self._update_weights)
        self.http = HTTPServer(router, host=host, port=port, max_body_bytes=max_body_bytes,
                               keepalive_s=keepalive_s)
        self._episodes: dict[str, _Episode] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._created = int(time.time())

    @property
    def port(self) -> int:
        return self.http.port

    @property
    def url(self) -> str:
        """The OpenAI base URL, for ``OpenAIPolicy(server.url, ...)`` or any OpenAI SDK."""
        return self.http.url + "/v1"

    async def start(self) -> None:
        await self.http.start()
        self._sweeper = asyncio.create_task(self._sweep())

    async def close(self) -> None:
        """Stop serving; episodes still open are handed over as ``infra_error``."""
        if self._sweeper is None:
            return
        self._sweeper.cancel()
        self._sweeper = None
        await self.http.close()
        for episode in list(self._episodes.values()):
            await self._expire(episode, "the server closed before the episode ended")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- endpoints ----

    async def _health(self, _: Request) -> Response:
        return Response({"status": "ok", "policy": self.policy.name,
                         "episodes": len(self._episodes)})

    async def _models(self, _: Request) -> Response:
        return Response({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                     "created": self._created,
                                                     "owned_by": "tempering"}]})

    async def _episode(self, request: Request) -> Response:
        episode = self._open_episode(request.params["id"])
        return Response({"episode_id": episode.id, "trajectory_id": episode.trajectory_id,
                         "policy": self.policy.name,
                         "steps": [s.model_dump(mode="json") for s in episode.steps]})

    async def _chat(self, request: Request) -> Response:
        req = request.json(ChatRequest)
        if req.stream or req.n != 1:
            raise HTTPError(400, "stream: true is not supported: tempering serve answers each "
                            "completion whole; leave stream out or send false" if req.stream
                            else f"n={req.n}: one choice per request; send n requests",
                            param="stream" if req.stream else "n")
        ext = req.tempering or TemperingExtension()
        episode_id = (request.headers.get("x-tempering-episode") or ext.episode_id or req.user
                      or new_id())
        messages = [m.to_message() for m in req.messages]
        # Its other fields, which a retry repeats: hashed, as they hold the prefix's tokens.
        fingerprint = hashlib.blake2b(req.model_dump_json(exclude={"messages"}).encode(),
                                      digest_size=16).digest()
        while True:  # a retry of a request still sampling waits for its answer
            episode = self._episodes.get(episode_id) or self._begin(episode_id, req, messages)
            running = next((done for m, done in episode.running if m == messages), None)
            if running is None:
                break
            await running.wait()
        if episode.answer is not None and messages == episode.messages:  # a retry
            if fingerprint != episode.fingerprint:
                raise HTTPError(409, f"episode {episode_id!r} already answered these messages "
                                "with other fields (tools, sampling, ...): a retry must repeat "
                                "its request, and another sample needs another episode")
            episode.last_active = time.monotonic()
            return episode.answer._replace(headers={**episode.answer.headers,
                                                    "X-Tempering-Replay": "true"})
        continued = episode.continuation(messages)
        prefix, prefix_messages = ((episode.tokens, continued[0]) if continued and episode.tokens
                                   else ([], 0))
        if ext.prefix_token_ids and episode.steps and (
                ext.prefix_token_ids != prefix or ext.prefix_messages != prefix_messages):
            raise HTTPError(400, f"tempering.prefix_token_ids ({len(ext.prefix_token_ids)} "
                            f"tokens over {ext.prefix_messages} messages) disagree with episode "
                            f"{episode_id!r}'s last turn ({len(prefix)} over {prefix_messages}"
                            f"{'' if continued else '; these messages do not continue it'}): "
                            "send that turn's messages and reply unchanged, or no prefix to "
                            "have the conversation rendered afresh", param="tempering")
        entry = (messages, asyncio.Event())
        episode.running.append(entry)
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
            episode.running.remove(entry)
            entry[1].set()
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
        episode.answer = Response(answer, headers={
            "X-Weights-Version": str(gen.weights_version), "X-Tempering-Episode": episode_id})
        episode.fingerprint = fingerprint
        return episode.answer

    async def _end(self, request: Request) -> Response:
        end = request.json(EndRequest)
        episode = self._open_episode(request.params["id"])
        if episode.running:
            raise HTTPError(409, f"episode {episode.id!r} has a completion running; end it "
                            "after the answer")
        trajectory = self._trajectory(episode, end)
        del self._episodes[episode.id]
        try:
            await self._hand_over(episode, trajectory)
        except Exception as exc:  # keep the episode: the client may end it again
            self._episodes[episode.id] = episode
            log.exception("storing episode %s failed", episode.id)
            raise HTTPError(500, f"storing the trajectory failed ({type(exc).__name__}: {exc});"
                            " the episode is kept, end it again") from exc
        return Response({"episode_id": episode.id, "trajectory_id": trajectory.trajectory_id,
                         "steps": len(trajectory.steps), "status": trajectory.status.value,
                         "reward": trajectory.reward_value})

    def _weights_version(self) -> int | None:
        version = getattr(self.policy, "weights_version", None)
        return version if isinstance(version, int) else self._posted_version

    async def _weights(self, _: Request) -> Response:
        return Response({"weights_version": self._weights_version(), "policy": self.policy.name,
                         "updatable": self.allow_weight_updates and callable(
                             getattr(self.policy, "update_weights", None))})

    async def _update_weights(self, request: Request) -> Response:
        if not self.allow_weight_updates:
            raise HTTPError(403, f"this server listens on {self.http.host}, beyond loopback, so "
                            "it loads no weights from a path; serve on 127.0.0.1 or pass "
                            "allow_weight_updates=True on a trusted network")
        body = request.json(WeightsRequest)
        update = getattr(self.policy, "update_weights", None)
        if not callable(update):
            raise HTTPError(400, f"the policy {self.policy.name} ({type(self.policy).__name__}) "
                            "cannot load new weights: it has no update_weights; serve a local "
                            "model (LocalEngine) to publish weights to it")
        path = Path(body.path)
        if not path.is_absolute():
            raise HTTPError(400, f"path {body.path!r} is relative; send the absolute path on "
                            "the server's machine (same machine or a shared disk)", param="path")
        async with self._weights_lock:
            current = self._weights_version()
            if current is not None and body.version < current:
                raise HTTPError(409, f"version {body.version} is older than version {current} "
                                "already served; versions only go forward", param="version")
            try:
                loaded = await asyncio.to_thread(update, path, body.version)
            except (PolicyError, OSError, ValueError) as exc:
                raise HTTPError(400, f"loading weights version {body.version} from {path} "
                                f"failed: {exc}", param="path") from exc
            self._posted_version = loaded if isinstance(loaded, int) else body.version
        return Response({"weights_version": self._weights_version(),
                         "policy": self.policy.name})

    # ---- episodes ----

    def _open_episode(self, episode_id: str) -> _Episode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise HTTPError(404, f"no open episode {episode_id!r}: never seen, already ended, "
                            f"or idle for more than episode_ttl_s={self.episode_ttl_s:g} s")
        return episode

    def _begin(self, episode_id: str, req: ChatRequest, messages: list[Message]) -> _Episode:
        episode = self._episodes[episode_id] = _Episode(
            episode_id, tools=json.dumps(req.tools) if req.tools else "",
            system_prompt=next((m.content for m in messages if m.role == "system"), ""),
            instruction=next((m.content for m in messages if m.role == "user"), ""))
        self._journal(episode)
        return episode

    def _record(self, episode: _Episode, messages: list[Message], gen: Generation,
                prompt: list[int], observation: str | None, policy_s: float) -> None:
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

    def _journal(self, episode: _Episode) -> None:
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

    def _trajectory(self, episode: _Episode, end: EndRequest) -> Trajectory:
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

    async def _hand_over(self, episode: _Episode, trajectory: Trajectory) -> None:
        if self.recorder is not None and not episode.appended:
            await asyncio.to_thread(self.recorder.append, trajectory)
            episode.appended = True  # ending again after on_trajectory failed: not twice
        if self.on_trajectory is not None:
            result = self.on_trajectory(trajectory)
            if inspect.isawaitable(result):
                await result

    async def _expire(self, episode: _Episode, why: str) -> None:
        self._episodes.pop(episode.id, None)
        try:
            await self._hand_over(episode, self._trajectory(episode, EndRequest(
                status=Status.INFRA_ERROR, error=f"PolicyServer: {why}")))
        except Exception:  # with a recorder, its journal still holds the episode
            log.exception("storing expired episode %s failed", episode.id)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(self.episode_ttl_s / 4, 30.0)))
            idle = time.monotonic() - self.episode_ttl_s
            for episode in [e for e in self._episodes.values()
                            if not e.running and e.last_active < idle]:
                await self._expire(episode, f"idle for more than episode_ttl_s="
                                            f"{self.episode_ttl_s:g} s without being ended")


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost may resolve anywhere
        return False
