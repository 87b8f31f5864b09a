"""Publishing weights versions to inference engines: one ``WeightPublisher`` per kind of engine.

After each update the learner publishes version v+1 to every engine with
``await publisher.publish(v + 1, state=learner.state_dict(), path=checkpoint_dir)``; each
publisher takes what its engine needs (a state dict in process, a path for a server) and
returns once the engine serves that version. Engines swap between completions, never inside
one, and stamp every ``Generation`` with the version that sampled it, so rollouts pick up new
weights at their next turn and every token records its version.

- ``EnginePublisher``: an in-process ``LocalEngine``. The state dict goes over directly (no
  disk); ``update_weights`` *copies* each tensor into the engine's own parameters, so nothing
  aliases the learner's tensors once ``publish`` returns and the learner may train on. It runs
  in a worker thread: the swap waits for the completions in flight, which need the event loop.
- ``RayPublisher``: a ``LocalEngine`` in a Ray ``InferenceActor`` (``policy.ray``),
  reached through its ``RayPolicy``: the state dict, moved to CPU, goes through Ray's object
  store (fine for small models; a large one is published from disk with ``path=``).
- ``ServePublisher``: ``tempering serve`` over HTTP: ``POST /v1/weights {"path", "version"}``,
  with the server's token (``token=``, else ``$TEMPERING_SERVE_TOKEN``).
- ``VLLMPublisher``: vLLM's dev-mode endpoints (``VLLM_SERVER_DEV_MODE=1``): ``POST
  /pause?mode=wait`` (the requests in flight finish on the old weights; vLLM would otherwise
  mix versions inside a completion), ``POST /collective_rpc`` running every worker's
  ``reload_weights(weights_path=...)``, ``POST /resume``. vLLM's answers carry no version, so
  the publisher sets ``weights_version`` on the ``OpenAIPolicy`` clients it is given once the
  server resumed: a completion is stamped with the version its client knew when it was sent,
  never newer than the weights that sampled it.
- ``SGLangPublisher``: ``POST /update_weights_from_disk {"model_path", "weight_version"}``.
  SGLang waits for the requests in flight and stamps each answer's ``metadata.weight_version``.
- ``Publishers``: several engines at once.

A server loads the path itself: it must be readable there (same machine or a shared disk,
under the same path). Each publisher refuses to go backwards (``ConfigError``) and publishes
one version at a time; a failed publish leaves its version where it was.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tempering.errors import ConfigError, PolicyError, PolicyTimeoutError

if TYPE_CHECKING:
    import httpx
    import torch

    from tempering.policy.local import LocalEngine
    from tempering.policy.openai import OpenAIPolicy

log = logging.getLogger(__name__)

StatePath = str | os.PathLike[str]


@runtime_checkable
class WeightPublisher(Protocol):
    """Makes one or more inference engines serve a new weights version."""

    name: str

    @property
    def version(self) -> int | None:
        """The last version published (None before the first)."""
        ...

    async def publish(self, version: int, *, state: Mapping[str, torch.Tensor] | None = None,
                      path: StatePath | None = None) -> None:
        """Return once the engine serves ``version``; ``state`` and/or ``path`` hold the weights
        (a state dict; a save_pretrained directory or .safetensors file). Raises ``ConfigError``
        for a version older than the last one, ``PolicyError`` when the engine fails."""
        ...


class _Publisher:
    """Version bookkeeping shared by every publisher: forward only, one publish at a time."""

    name: str

    def __init__(self, version: int | None = None) -> None:
        self._version = version
        self._lock = asyncio.Lock()

    @property
    def version(self) -> int | None:
        return self._version

    async def publish(self, version: int, *, state: Mapping[str, torch.Tensor] | None = None,
                      path: StatePath | None = None) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ConfigError(f"{self.name}: weights version {version!r} must be an int >= 0")
        if state is None and path is None:
            raise ConfigError(f"{self.name}: publishing version {version} needs state= (a state "
                              "dict) or path= (a save_pretrained directory or .safetensors file)")
        async with self._lock:  # concurrent publishes land in the order they were asked
            if self._version is not None and version < self._version:
                raise ConfigError(f"{self.name}: cannot publish version {version} after version "
                                  f"{self._version}; versions only go forward (a resumed run "
                                  "continues from its checkpoint's version)")
            await self._publish(version, state, None if path is None else Path(path))
            self._version = version
        log.info("%s serves weights version %d", self.name, version)

    async def _publish(self, version: int, state: Mapping[str, torch.Tensor] | None,
                       path: Path | None) -> None:
        raise NotImplementedError

    def _need_path(self, version: int, path: Path | None) -> str:
        if path is None:
            raise ConfigError(f"{self.name} loads weights from disk: publish version {version} "
                              "with path= (e.g. the directory Learner.save wrote)")
        # Absolute, as the server resolves it, not against its own working directory.
        return str(path.absolute())


class EnginePublisher(_Publisher):
    """An in-process ``LocalEngine``: the state dict is copied into the engine's parameters."""

    def __init__(self, engine: LocalEngine) -> None:
        super().__init__(engine.weights_version)
        self.engine = engine
        self.name = engine.name

    async def _publish(self, version: int, state: Mapping[str, torch.Tensor] | None,
                       path: Path | None) -> None:
        weights = state if state is not None else path
        assert weights is not None  # publish() checked that one is given
        # Blocks until the completions in flight are done: off the loop, which delivers them.
        await asyncio.to_thread(self.engine.update_weights, weights, version)


class RayPublisher(_Publisher):
    """A local engine hosted by an ``InferenceActor``, through its ``RayPolicy`` client."""

    def __init__(self, policy: Any, version: int | None = None) -> None:
        super().__init__(version)
        self.policy = policy
        self.name = f"ray:{policy.name}"

    async def _publish(self, version: int, state: Mapping[str, torch.Tensor] | None,
                       path: Path | None) -> None:
        weights: Any = (self._need_path(version, path) if state is None else
                        {k: v.detach().to("cpu") for k, v in state.items()})
        await self.policy.update_weights(weights, version)


class _HTTPPublisher(_Publisher):
    """A server's root URL (an OpenAI base URL's ``/v1`` is dropped) and an HTTP client."""

    def __init__(self, base_url: str, *, timeout_s: float, name: str | None,
                 kind: str) -> None:
        super().__init__()
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url {base_url!r} must start with http:// or https://, "
                              "e.g. http://127.0.0.1:8000")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s={timeout_s} must be positive (loading a large model "
                              "takes minutes)")
        root = base_url.rstrip("/")
        self.root = root[:-3] if root.endswith("/v1") else root
        self.timeout_s = timeout_s
        """Seconds one call may take: a reload waits for the completions in flight."""
        self.name = name or f"{kind}:{self.root}"

    async def _call(self, client: httpx.AsyncClient, method: str, path: str,
                    **kwargs: Any) -> httpx.Response:
        """One call; a PolicyError unless the answer is a 200."""
        import httpx

        url = self.root + path
        try:
            response = await client.request(method, url, **kwargs)
        except httpx.TimeoutException as exc:
            raise PolicyTimeoutError(f"{url} did not answer within timeout_s={self.timeout_s:g}"
                                     " s; raise it for a large model") from exc
        except httpx.TransportError as exc:
            raise PolicyError(f"cannot reach {url} ({type(exc).__name__}: {exc}); is the "
                              "server running there?") from exc
        if response.status_code != 200:
            raise PolicyError(f"{method} {url} answered {response.status_code}: "
                              f"{_error_message(response)}")
        return response

    def _client(self) -> httpx.AsyncClient:
        import httpx

        return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s))


class ServePublisher(_HTTPPublisher):
    """``tempering serve`` at ``base_url``: ``POST /v1/weights`` with a path it loads itself,
    authorised by the server's ``token`` (default: ``$TEMPERING_SERVE_TOKEN``)."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 600.0,
                 name: str | None = None) -> None:
        super().__init__(base_url, timeout_s=timeout_s, name=name, kind="serve")
        self._token = token or os.environ.get("TEMPERING_SERVE_TOKEN")
        if not self._token:
            raise ConfigError("ServePublisher needs the server's token (PolicyServer.token, "
                              "or what `tempering serve` printed or wrote to --token-file): "
                              "pass token=, or set $TEMPERING_SERVE_TOKEN")

    def _client(self) -> httpx.AsyncClient:
        import httpx

        return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s),
                                 headers={"Authorization": f"Bearer {self._token}"})

    async def current(self) -> int | None:
        """The version the server serves now (``GET /v1/weights``)."""
        async with self._client() as client:
            version = (await self._call(client, "GET", "/v1/weights")).json()["weights_version"]
        return version if isinstance(version, int) else None

    async def _publish(self, version: int, state: Mapping[str, torch.Tensor] | None,
                       path: Path | None) -> None:
        body = {"path": self._need_path(version, path), "version": version}
        async with self._client() as client:
            served = (await self._call(client, "POST", "/v1/weights", json=body)).json()
        if served.get("weights_version") != version:
            raise PolicyError(f"{self.root} was asked for version {version} but says it serves "
                              f"{served.get('weights_version')!r}")


class _ClientsPublisher(_HTTPPublisher):
    def __init__(self, base_url: str, *, clients: Sequence[OpenAIPolicy], timeout_s: float,
                 name: str | None, kind: str) -> None:
        super().__init__(base_url, timeout_s=timeout_s, name=name, kind=kind)
        self.clients = list(clients)
        """``OpenAIPolicy`` clients of this server: their ``weights_version`` is set once the
        server serves a new version, for answers that carry none."""

    def _served(self, version: int) -> None:
        for client in self.clients:
            client.weights_version = version


class VLLMPublisher(_ClientsPublisher):
    """A vLLM OpenAI server started with ``VLLM_SERVER_DEV_MODE=1``: pause (in-flight requests
    finish), ``reload_weights(weights_path=...)`` on every worker, resume."""

    def __init__(self, base_url: str, *, clients: Sequence[OpenAIPolicy] = (),
                 timeout_s: float = 600.0, name: str | None = None) -> None:
        super().__init__(base_url, clients=clients, timeout_s=timeout_s, name=name, kind="vllm")

    async def _publish(self, version: int, state: Mapping[str, torch.Tensor] | None,
                       path: Path | None) -> None:
        weights_path = self._need_path(version, path)
        async with self._client() as client:
            try:
                await self._call(client, "POST", "/pause", params={"mode": "wait"})
            except PolicyError as exc:
                raise PolicyError(f"{exc}; weight reloads need vLLM's dev endpoints: start it "
                                  "with VLLM_SERVER_DEV_MODE=1 (and keep it off untrusted "
                                  "networks)") from exc
            try:
                await self._call(client, "POST", "/collective_rpc", json={
                    "method": "reload_weights", "kwargs": {"weights_path": weights_path}})
            except PolicyError as exc:
                # Some layers may hold new weights: serving them as either version would lie.
                raise PolicyError(f"{exc}; the server stays paused (its weights may be half "
                                  f"loaded): publish version {version} again or restart it. "
                                  "reload_weights(weights_path=) needs a recent vLLM") from exc
            await self._call(client, "POST", "/resume")
        self._served(version)


class SGLangPublisher(_ClientsPublisher):
    """An SGLang server: ``POST /update_weights_from_disk``, which waits for the requests in
    flight and tags later answers with ``metadata.weight_version``."""

    def __init__(self, base_url: str, *, clients: Sequence[OpenAIPolicy] = (),
                 timeout_s: float = 600.0, name: str | None = None) -> None:
        super().__init__(base_url, clients=clients, timeout_s=timeout_s, name=name,
                         kind="sglang")

    async def _publish(self, version: int, state: Mapping[str, torch.Tensor] | None,
                       path: Path | None) -> None:
        body = {"model_path": self._need_path(version, path), "weight_version": str(version),
                "abort_all_requests": False}
        async with self._client() as client:
            answer = (await self._call(client, "POST", "/update_weights_from_disk",
                                       json=body)).json()
        if not answer.get("success", False):
            raise PolicyError(f"{self.root}/update_weights_from_disk did not load version "
                              f"{version}: {answer.get('message') or answer}")
        self._served(version)


class Publishers(_Publisher):
    """Publishes to several engines concurrently; if any fails, raises once all have finished,
    naming which failed (the others serve the new version)."""

    def __init__(self, publishers: Sequence[WeightPublisher]) -> None:
        if not publishers:
            raise ConfigError("Publishers needs at least one publisher")
        self.publishers = list(publishers)
        known = [p.version for p in self.publishers if p.version is not None]
        super().__init__(min(known) if known else None)
        self.name = f"publishers[{', '.join(p.name for p in self.publishers)}]"

    async def _publish(self, version: int, state: Mapping[str, torch.Tensor] | None,
                       path: Path | None) -> None:
        results = await asyncio.gather(
            *(p.publish(version, state=state, path=path) for p in self.publishers),
            return_exceptions=True)
        failed = [(p, r) for p, r in zip(self.publishers, results, strict=True)
                  if isinstance(r, BaseException)]
        if failed:
            fine = len(self.publishers) - len(failed)
            raise PolicyError(
                f"publishing version {version} failed on {len(failed)} of "
                f"{len(self.publishers)} engine(s): "
                + "; ".join(f"{p.name}: {type(e).__name__}: {e}" for p, e in failed)
                + f" ({fine} other(s) serve version {version}); fix them and publish again"
            ) from failed[0][1]


def _error_message(response: httpx.Response) -> str:
    """The message in the shapes servers answer errors in: OpenAI's ``{"error": {"message"}}``,
    FastAPI's ``{"detail"}``, vLLM's ``{"error": "..."}``, SGLang's ``{"message"}``."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        for found in (error.get("message") if isinstance(error, dict) else error,
                      body.get("detail"), body.get("message")):
            if isinstance(found, str) and found:
                return found[:500]
    return " ".join(response.text.split())[:500] or "(empty body)"
