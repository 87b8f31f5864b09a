"""Which sandbox backends can run on this host, and why not: shared by every suite that skips
a backend with the reason it gave rather than passing silently."""

from __future__ import annotations

import asyncio
import os
import subprocess
from functools import cache

from tempering.errors import SandboxError, SandboxUnavailableError

# A root filesystem whose python3 runs every grading (``scripts/python-roots.sh`` builds them):
# the grading code runs on the sandbox's interpreter, the host's by default, so a host with
# another Python version (Ubuntu 24.04's 3.12) is tested by running the suite with this set.
GRADING_ROOTFS = os.environ.get("TEMPERING_TEST_GRADING_ROOTFS") or None


def grading_python(source: str) -> str:
    """What ``source`` prints, run by the interpreter gradings run on: the host's python3 (a
    local sandbox's /usr is the host's), or that of ``GRADING_ROOTFS``."""
    argv = ["/usr/bin/python3", "-c", source]
    if GRADING_ROOTFS:
        argv = ["chroot", GRADING_ROOTFS, *argv]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


@cache
def unavailable(backend: str) -> str | None:
    """Why ``backend`` cannot run here (for the docker backend: no engine, or no default
    image), or None when it can."""
    try:
        if backend == "local":
            from tempering.sandbox.local.backend import host

            host()
        elif backend == "docker":
            from tempering.sandbox.docker.api import DockerAPI
            from tempering.sandbox.docker.backend import default_image

            async def image() -> str | None:
                return await DockerAPI().image_id(default_image())

            if asyncio.run(image()) is None:
                return f"no image {default_image()}: run `tempering image build`"
    except (SandboxUnavailableError, SandboxError) as exc:
        return str(exc)
    return None
