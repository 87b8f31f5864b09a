"""A small async client for the Docker Engine API, over its unix socket.

The docker backend talks to the engine directly (no ``docker`` CLI on any path, no client
library): HTTP/1.1 on ``/var/run/docker.sock`` (or ``$DOCKER_HOST=unix://...``), one connection
per request, JSON in and out, request bodies streamed from files or iterators (an image import
is hundreds of MB), chunked and streamed responses read incrementally. Errors name the daemon
or the object and say what to do: a missing engine is ``SandboxUnavailableError``; an engine
answer >= 400 is ``DockerAPIError`` with its status and message.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from tempering.errors import SandboxError, SandboxUnavailableError

DEFAULT_SOCKET = "/var/run/docker.sock"
API = "/v1.41"  # Docker 20.10 and later
CHUNK = 1 << 16


class DockerAPIError(SandboxError):
    """The engine answered a request with an error status."""

    def __init__(self, status: int, message: str, what: str) -> None:
        hint = ""
        if "no space left on device" in message.lower():
            hint = ("; the engine's disk is full: free space under /var/lib/docker (`docker "
                    "system prune`) or under the volume pool")
        super().__init__(f"{what}: the Docker engine answered {status}: {message}{hint}")
        self.status, self.message = status, message


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def socket_path() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        return host.removeprefix("unix://")
    if host:
        raise SandboxUnavailableError(
            f"DOCKER_HOST={host!r} is not a unix socket; the docker backend talks to a local "
            "engine: unset DOCKER_HOST or set it to unix:///var/run/docker.sock")
    return DEFAULT_SOCKET


class DockerAPI:
    """The Docker engine at a unix socket."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or socket_path()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_unix_connection(self.path, limit=1 << 20)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise SandboxUnavailableError(
                f"no Docker engine answers at {self.path} ({exc.strerror}): start it with "
                "`dockerd &` as root (install it with `apt-get install -y docker.io`), or run "
                "`bash scripts/setup.sh`, which does both") from None
        except PermissionError:
            raise SandboxUnavailableError(
                f"no permission to use the Docker engine at {self.path}: run as root or as a "
                "member of the docker group") from None

    async def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                      body: Any = None, data: bytes | Iterable[bytes] | None = None,
                      content_type: str = "application/json", what: str = "",
                      ok: Iterable[int] = ()) -> Response:
        """One request; ``body`` is sent as JSON, ``data`` as raw bytes (or an iterable of
        chunks, sent chunked). Statuses >= 400 raise DockerAPIError unless listed in ``ok``."""
        reader, writer = await self._connect()
        try:
            await self._send_or_answer(reader, writer, method, path, params, body, data,
                                       content_type, what)
            status, headers = await _read_head(reader)
            payload = b"".join([chunk async for chunk in _read_body(reader, headers)])
        finally:
            writer.close()
            await _closed(writer)
        if status >= 400 and status not in set(ok):
            raise DockerAPIError(status, _message(payload), what or f"{method} {path}")
        return Response(status, headers, payload)

    async def stream(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                     body: Any = None, data: bytes | Iterable[bytes] | None = None,
                     content_type: str = "application/json",
                     what: str = "") -> AsyncIterator[bytes]:
        """The response body as it arrives (progress of a build or an import)."""
        reader, writer = await self._connect()
        try:
            await self._send_or_answer(reader, writer, method, path, params, body, data,
                                       content_type, what)
            status, headers = await _read_head(reader)
            if status >= 400:
                payload = b"".join([c async for c in _read_body(reader, headers)])
                raise DockerAPIError(status, _message(payload), what or f"{method} {path}")
            async for chunk in _read_body(reader, headers):
                yield chunk
        finally:
            writer.close()
            await _closed(writer)

    async def _send_or_answer(self, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter, method: str, path: str,
                              params: Mapping[str, Any] | None, body: Any,
                              data: bytes | Iterable[bytes] | None, content_type: str,
                              what: str) -> None:
        """Send the request; if the engine hangs up mid-upload, raise what it answered."""
        try:
            await self._send(writer, method, path, params, body, data, content_type)
        except ConnectionError:
            try:
                status, headers = await _read_head(reader)
                payload = b"".join([c async for c in _read_body(reader, headers)])
            except (SandboxError, ConnectionError):
                status, payload = 0, b"the connection broke while sending the request"
            raise DockerAPIError(status, _message(payload), what or f"{method} {path}") from None

    async def _send(self, writer: asyncio.StreamWriter, method: str, path: str,
                    params: Mapping[str, Any] | None, body: Any,
                    data: bytes | Iterable[bytes] | None, content_type: str) -> None:
        query = ""
        if params:
            query = "?" + urlencode({k: [_param(x) for x in v] if isinstance(v, list) else
                                     _param(v) for k, v in params.items() if v is not None},
                                    doseq=True)
        head = [f"{method} {API}{quote(path)}{query} HTTP/1.1", "Host: docker",
                "User-Agent: tempering", "Connection: close"]  # one request per connection
        if body is not None:
            data = json.dumps(body).encode()
        if data is None:
            head.append("Content-Length: 0")
        elif isinstance(data, bytes):
            head += [f"Content-Type: {content_type}", f"Content-Length: {len(data)}"]
        else:
            head += [f"Content-Type: {content_type}", "Transfer-Encoding: chunked"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        if isinstance(data, bytes):
            writer.write(data)
        elif data is not None:
            for chunk in data:
                if chunk:
                    writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    await writer.drain()
            writer.write(b"0\r\n\r\n")
        await writer.drain()

    # ---- the calls the backend and the image builder use ----

    async def ping(self) -> str:
        """The engine's version; raises SandboxUnavailableError if none answers."""
        info = (await self.request("GET", "/version", what="asking the engine its version"))
        version: str = info.json().get("Version", "?")
        return version

    async def image_id(self, ref: str) -> str | None:
        """The id of a local image, or None if the engine has no such image."""
        response = await self.request("GET", f"/images/{ref}/json", ok=(404,),
                                      what=f"looking up image {ref}")
        return None if response.status == 404 else str(response.json()["Id"])

    async def containers(self, label: str) -> list[dict[str, Any]]:
        """Containers (running or not) carrying ``label`` (``key`` or ``key=value``)."""
        filters = json.dumps({"label": [label]})
        found: list[dict[str, Any]] = (await self.request(
            "GET", "/containers/json", params={"all": 1, "filters": filters},
            what="listing containers")).json()
        return found

    async def remove(self, container: str) -> None:
        """Remove a container and its anonymous volumes, killing it if it runs."""
        await self.request("DELETE", f"/containers/{container}", params={"force": 1, "v": 1},
                           ok=(404,), what=f"removing container {container}")


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _message(payload: bytes) -> str:
    try:
        return str(json.loads(payload).get("message", payload.decode(errors="replace")))
    except (ValueError, AttributeError):
        return payload.decode(errors="replace").strip()[:500]


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        raise SandboxError("the Docker engine closed the connection without answering") from None
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {":status": str(status)}
    for line in lines[1:]:
        if ":" in line:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
    return status, headers


async def _read_body(reader: asyncio.StreamReader,
                     headers: Mapping[str, str]) -> AsyncIterator[bytes]:
    if headers.get(":status") in ("204", "304"):
        return  # no body, whatever else the headers say
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            yield await reader.readexactly(size)
            await reader.readline()
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            chunk = await reader.read(min(left, CHUNK))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk
    else:
        while chunk := await reader.read(CHUNK):
            yield chunk


async def _closed(writer: asyncio.StreamWriter) -> None:
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass
