"""Sandboxes: isolated, limited, pooled environments where agents act and graders grade.

    spec = SandboxSpec(backend="local", cpus=1.0, memory_mb=512)
    async with open_sandbox(spec) as sb:
        result = await sb.exec("python3 -c 'print(2 + 2)'")

Backends are chosen by ``spec.backend`` and imported on use (``spec.BACKENDS``), so importing
this package pulls in no backend's dependencies.
"""

from __future__ import annotations

import importlib
from collections.abc import Generator
from types import TracebackType
from typing import Any

from tempering.errors import (
    ResourceExhaustedError,
    SandboxClosedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxStartError,
    SandboxUnavailableError,
)
from tempering.sandbox.base import Sandbox, ShellSession
from tempering.sandbox.copyout import READ_FILE_LIMIT, CopyLimits, TreeCopy
from tempering.sandbox.pool import PoolStats, SandboxPool
from tempering.sandbox.spec import BACKENDS, ExecResult, SandboxSpec, SandboxUsage


def backend_class(name: str) -> Any:
    """The sandbox class registered under ``name``, imported now."""
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


async def create_sandbox(spec: SandboxSpec | None = None) -> Sandbox:
    """Start a sandbox; the caller must ``close()`` it."""
    spec = spec or SandboxSpec()
    sandbox: Sandbox = await backend_class(spec.backend).create(spec)
    return sandbox


class open_sandbox:  # noqa: N801 - used like a function: `async with open_sandbox(spec) as sb`
    """Start a sandbox for an ``async with`` block (closed on exit), or ``await`` it."""

    def __init__(self, spec: SandboxSpec | None = None) -> None:
        self._spec = spec
        self._sandbox: Sandbox | None = None

    def __await__(self) -> Generator[Any, None, Sandbox]:
        return create_sandbox(self._spec).__await__()

    async def __aenter__(self) -> Sandbox:
        self._sandbox = await create_sandbox(self._spec)
        return self._sandbox

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._sandbox is not None:
            await self._sandbox.close()


__all__ = [
    "SandboxSpec", "ExecResult", "SandboxUsage", "Sandbox", "ShellSession", "SandboxPool",
    "PoolStats", "open_sandbox", "create_sandbox", "backend_class", "SandboxError",
    "SandboxStartError", "SandboxClosedError", "SandboxPathError", "SandboxFileNotFoundError",
    "SandboxNotFoundError", "SandboxUnavailableError", "ResourceExhaustedError",
    "SandboxFileTooLargeError", "CopyLimits", "TreeCopy", "READ_FILE_LIMIT",
]
