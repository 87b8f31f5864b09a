"""Which sandbox backends can run on this host, and why not: shared by every suite that skips
a backend with the reason it gave rather than passing silently."""

from __future__ import annotations

import asyncio
from functools import cache

from tempering.errors import SandboxError, SandboxUnavailableError


@cache
def unavailable(backend: str) -> str | None:
    """Why ``backend`` cannot run here (for the docker backend: no engine, or no default
    image), or None when it can."""
    try:
        if backend == "local":
            from tempering.sandbox.local import host

            host()
        elif backend == "docker":
            from tempering.sandbox.docker import default_image
            from tempering.sandbox.engine import Engine

            async def image() -> str | None:
                return await Engine().image_id(default_image())

            if asyncio.run(image()) is None:
                return f"no image {default_image()}: run `tempering image build`"
    except (SandboxUnavailableError, SandboxError) as exc:
        return str(exc)
    return None
