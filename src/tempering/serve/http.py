"""A small HTTP/1.1 JSON server on asyncio streams, for loopback APIs such as ``tempering serve``.

Design. A ``Router`` maps ``(method, path pattern)`` to an async handler; a pattern is a path
with ``{name}`` segments (``/v1/episodes/{id}/end``), which reach the handler percent-decoded
in ``Request.params``. A handler returns a ``Response`` (status, a JSON-able body, extra
headers) or raises ``HTTPError``; ``HTTPServer`` does the rest: parsing, keep-alive, body
limits, the status line, and errors as ``{"error": {"message", "type", "param", "code"}}``
(the shape OpenAI-compatible clients read). A handler that raises anything else costs its own
request a 500, never the connection or the server.

Deliberately small, with no web framework to depend on: ``Content-Length`` bodies only (a
chunked request is refused with 411), no TLS, no streaming answers; headers are capped at
64 KiB (asyncio's stream limit) and bodies at ``max_body_bytes``. Every connection is its own
task, so requests from many clients run at once and the handlers they reach overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, NamedTuple, Self, TypeVar
from urllib.parse import unquote

from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class HTTPError(Exception):
    """Raised by a handler to answer ``status`` with ``message`` in the JSON error shape."""

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param,
                          "code": self.code}}


class Response(NamedTuple):
    body: Any
    """Anything ``json.dumps`` takes."""
    status: int = 200
    headers: Mapping[str, str] = {}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    """The target without its query string."""
    headers: Mapping[str, str]
    """Names lower-cased."""
    body: bytes
    params: Mapping[str, str] = field(default_factory=dict)
    """The route pattern's ``{name}`` segments, percent-decoded."""

    def json(self, model: type[M]) -> M:
        """The body validated as ``model`` (an empty body as ``{}``); 400 naming the fields."""
        try:
            data = json.loads(self.body or b"{}")
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
                shown = (f" (got {json.dumps(got)[:60]})" if isinstance(got, (str, int, float))
                         else "")
                problems.append(f"{loc.lstrip('.') or 'body'}: {err['msg']}{shown}")
            raise HTTPError(400, "; ".join(problems),
                            param=".".join(map(str, exc.errors()[0]["loc"]))) from None


Handler = Callable[[Request], Awaitable[Response]]


class Router:
    """``(method, path pattern) -> handler``; unknown paths are 404s listing the endpoints,
    known paths with another method 405s with ``Allow``."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], dict[str, Handler]]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        for shown, _, methods in self._routes:
            if shown == pattern:
                methods[method] = handler
                return
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(pattern))
        self._routes.append((pattern, re.compile(regex), {method: handler}))

    def resolve(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        for _, regex, methods in self._routes:
            if match := regex.fullmatch(path):
                if method not in methods:
                    raise HTTPError(405, f"{path} takes {', '.join(methods)}, not {method}",
                                    headers={"Allow": ", ".join(methods)})
                return methods[method], {k: unquote(v) for k, v in match.groupdict().items()}
        endpoints = ", ".join(f"{m} {p}" for p, _, methods in self._routes for m in methods)
        raise HTTPError(404, f"no endpoint {path}: this server has {endpoints}")


class HTTPServer:
    """Serves ``router`` at ``http://{host}:{port}``; ``port=0`` picks a free port."""

    def __init__(self, router: Router, *, host: str = "127.0.0.1", port: int = 0,
                 max_body_bytes: int = 32 << 20, keepalive_s: float = 75.0) -> None:
        self.router, self.host, self.port = router, host, port
        self.max_body_bytes, self.keepalive_s = max_body_bytes, keepalive_s
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and cancel the requests in progress."""
        if self._server is None:
            return
        self._server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self._server = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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
            path = target.split("?", 1)[0]
            handler, params = self.router.resolve(method, path)
            response = await handler(Request(method, path, headers, body, params))
        except HTTPError as exc:
            response = Response(exc.body(), exc.status, exc.headers)
        except (asyncio.IncompleteReadError, ConnectionError):
            return False  # the client went away mid-request
        except Exception as exc:  # a bug must cost one request, not the client's connection
            log.exception("serving a request failed")
            response = Response(HTTPError(500, f"{type(exc).__name__}: {exc}").body(), 500)
        await _send(writer, response, keep_alive)
        return keep_alive


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


async def _send(writer: asyncio.StreamWriter, response: Response, keep_alive: bool) -> None:
    payload = json.dumps(response.body).encode()
    lines = [f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}",
             "Content-Type: application/json", f"Content-Length: {len(payload)}",
             f"Connection: {'keep-alive' if keep_alive else 'close'}",
             # a value from the request (an episode id) must not split the header block
             *(f"{k}: {v}" for k, v in response.headers.items()
               if v.isascii() and v.isprintable())]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
    await writer.drain()
