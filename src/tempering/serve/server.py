"""``PolicyServer``: any Policy behind an OpenAI-compatible API that records every completion,
token for token, as trajectory data (``tempering serve``). ``policy.http`` is the transport,
``policy.episodes`` the record of each episode (continuation, steps, journaling, ends, idle
expiry); this module is the endpoints.

Episodes. A request belongs to the episode its ``X-Tempering-Episode`` header names, else
``tempering.episode_id``, else ``user`` (else a fresh one). A request that continues the
episode's last turn (same messages, the reply, then new tool or user messages) has the policy
extend that turn's tokens with only the new messages (``prefix_token_ids``); a rewritten
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

Ends. ``POST /v1/episodes/{id}/end`` hands the ``Trajectory`` to the ``recorder`` and
``on_trajectory``; idle episodes (``episode_ttl_s``) and those open at ``close()`` go the same
way as ``infra_error``. A ``recorder`` also journals each episode as it happens, so a server
killed outright leaves it behind.

The operator's token. Whoever reaches the server could otherwise end episodes with the reward
of their choice, read other episodes, and publish weights (a version far ahead, which the
trainer's next publish cannot go back from): listening on loopback is no protection, as every
process of the machine reaches it. So those endpoints (``POST /v1/weights``, ``GET
/v1/episodes/{id}``, ``POST /v1/episodes/{id}/end``) take ``Authorization: Bearer <token>``, a
secret generated at start (``token``) or given by the operator, compared in constant time; a
missing or wrong one is a 401 that says where the token comes from. Completions, models,
health and the served weights version stay open: they are what an OpenAI client samples
episodes with, and none of them sets a reward or a weight.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Self

from pydantic import BaseModel, ConfigDict, Field

from tempering.errors import ConfigError, PolicyError
from tempering.policy.base import GenerateRequest, Policy, TrainablePolicy
from tempering.policy.openai import ChatRequest, TemperingExtension, completion_response
from tempering.serve.episodes import EndRequest, EpisodeBook, OnTrajectory, ServedEpisode
from tempering.serve.http import HTTPError, HTTPServer, Request, Response, Router
from tempering.trajectory.schema import new_id

if TYPE_CHECKING:
    from tempering.trajectory.schema import Recorder

__all__ = ["EndRequest", "OnTrajectory", "PolicyServer", "WeightsRequest"]

log = logging.getLogger(__name__)
Handler = Callable[[Request], Awaitable[Response]]
MIN_TOKEN_CHARS = 16


class WeightsRequest(BaseModel):
    """The body of ``POST /v1/weights``."""

    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1)]
    """Absolute path, on the server's machine, of a save_pretrained directory or a .safetensors
    file holding the new weights."""
    version: Annotated[int, Field(ge=0)]
    """The version the new weights become; never below the one served."""


class PolicyServer:
    """Serves ``policy`` at ``http://{host}:{port}/v1``; ``port=0`` picks a free port."""

    def __init__(self, policy: Policy, *, host: str = "127.0.0.1", port: int = 0,
                 model_name: str | None = None, on_trajectory: OnTrajectory | None = None,
                 recorder: Recorder | None = None, episode_ttl_s: float = 3600.0,
                 max_body_bytes: int = 32 << 20, keepalive_s: float = 75.0,
                 allow_weight_updates: bool | None = None, token: str | None = None) -> None:
        if token is not None and len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"the server's token has {len(token)} characters; give at least "
                              f"{MIN_TOKEN_CHARS} (random), or none to have one generated")
        self.token = token or secrets.token_urlsafe(32)
        """The secret that ending episodes, reading them and publishing weights take, as
        ``Authorization: Bearer <token>``; generated unless given. Hand it to the trainer
        (``ServePublisher(url, token=...)``) and to whatever ends episodes, never to the
        agents."""
        self.policy = policy
        self.model_name = model_name or policy.name
        self._episodes = EpisodeBook(policy, recorder=recorder, on_trajectory=on_trajectory,
                                     ttl_s=episode_ttl_s)
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
        router.add("GET", "/v1/episodes/{id}", self._operator(self._episode))
        router.add("POST", "/v1/episodes/{id}/end", self._operator(self._end))
        router.add("GET", "/v1/weights", self._weights)
        router.add("POST", "/v1/weights", self._operator(self._update_weights))
        self.http = HTTPServer(router, host=host, port=port, max_body_bytes=max_body_bytes,
                               keepalive_s=keepalive_s)
        self._created = int(time.time())

    @property
    def on_trajectory(self) -> OnTrajectory | None:
        """Called with each ended episode's Trajectory (awaited if it returns an awaitable)."""
        return self._episodes.on_trajectory

    @on_trajectory.setter
    def on_trajectory(self, value: OnTrajectory | None) -> None:
        self._episodes.on_trajectory = value

    @property
    def recorder(self) -> Recorder | None:
        """Journals episodes as they happen and stores them at their end (``append`` runs in
        a worker thread: it may fsync). Thread-safe, as ``TrajectoryStore`` is."""
        return self._episodes.recorder

    @recorder.setter
    def recorder(self, value: Recorder | None) -> None:
        self._episodes.recorder = value

    @property
    def episode_ttl_s(self) -> float:
        """Seconds an episode may sit idle before it is handed over as ``infra_error``."""
        return self._episodes.ttl_s

    @episode_ttl_s.setter
    def episode_ttl_s(self, value: float) -> None:
        self._episodes.ttl_s = value

    @property
    def port(self) -> int:
        return self.http.port

    @property
    def url(self) -> str:
        """The OpenAI base URL, for ``OpenAIPolicy(server.url, ...)`` or any OpenAI SDK."""
        return self.http.url + "/v1"

    async def start(self) -> None:
        await self.http.start()
        self._episodes.start_sweeping()

    async def close(self) -> None:
        """Stop serving; episodes still open are handed over as ``infra_error``."""
        if not self._episodes.stop_sweeping():
            return
        await self.http.close()
        await self._episodes.expire_all("the server closed before the episode ended")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- endpoints ----

    def _operator(self, handler: Handler) -> Handler:
        """``handler`` behind the token: checked before the body is even parsed."""
        async def checked(request: Request) -> Response:
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if not (scheme.lower() == "bearer" and hmac.compare_digest(
                    given.strip().encode(), self.token.encode())):
                raise HTTPError(401, f"{request.method} {request.path} needs this server's "
                                "token: send `Authorization: Bearer <token>` (`tempering "
                                "serve` prints it on stderr or writes it to --token-file; "
                                "PolicyServer.token in Python)" if not given else
                                f"{request.method} {request.path}: wrong token; use the one "
                                "this server printed or was started with",
                                code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return await handler(request)
        return checked

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
            episode = (self._episodes.get(episode_id)
                       or self._episodes.begin(episode_id, messages, req.tools))
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
        self._episodes.record(episode, messages, gen, prompt,
                              continued[1] if continued else None, policy_s)
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
        trajectory = self._episodes.trajectory(episode, end)
        try:
            await self._episodes.end(episode, trajectory)
        except Exception as exc:  # the book keeps the episode: the client may end it again
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
                         "updatable": self.allow_weight_updates
                         and isinstance(self.policy, TrainablePolicy)})

    async def _update_weights(self, request: Request) -> Response:
        if not self.allow_weight_updates:
            raise HTTPError(403, f"this server listens on {self.http.host}, beyond loopback, so "
                            "it loads no weights from a path; serve on 127.0.0.1 or pass "
                            "allow_weight_updates=True (tempering serve "
                            "--allow-weight-updates) on a trusted network")
        body = request.json(WeightsRequest)
        if not isinstance(self.policy, TrainablePolicy):
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
                loaded = await asyncio.to_thread(self.policy.update_weights, path, body.version)
            except (PolicyError, OSError, ValueError) as exc:
                raise HTTPError(400, f"loading weights version {body.version} from {path} "
                                f"failed: {exc}", param="path") from exc
            self._posted_version = loaded if isinstance(loaded, int) else body.version
        return Response({"weights_version": self._weights_version(),
                         "policy": self.policy.name})

    # ---- episodes ----

    def _open_episode(self, episode_id: str) -> ServedEpisode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise HTTPError(404, f"no open episode {episode_id!r}: never seen, already ended, "
                            f"or idle for more than episode_ttl_s={self.episode_ttl_s:g} s")
        return episode


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost may resolve anywhere
        return False
