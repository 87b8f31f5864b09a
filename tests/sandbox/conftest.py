"""Fixtures for the sandbox suites, parameterised over every backend that runs here.

The conformance and security suites are written once against the contract; each backend joins
by adding its name to BACKENDS (the docker backend will), and each runs with both storages. A
backend or storage that cannot run on this host is skipped with the reason it gave, never
silently passed.
"""

from __future__ import annotations

import pytest

from tempering.errors import SandboxUnavailableError
from tempering.sandbox import SandboxSpec, open_sandbox

BACKENDS = ["local"]
STORAGES = ["memory", "volume"]


def _available(backend: str) -> str | None:
    try:
        if backend == "local":
            from tempering.sandbox.local import host

            host()
    except SandboxUnavailableError as exc:
        return str(exc)
    return None


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    why = _available(request.param)
    if why:
        pytest.skip(f"{request.param} backend unavailable: {why}")
    return request.param


@pytest.fixture(params=STORAGES)
def storage(request: pytest.FixtureRequest, backend: str) -> str:
    if request.param == "volume":
        try:
            from tempering.sandbox.local import volumes

            volumes()
        except SandboxUnavailableError as exc:
            pytest.skip(f"volume storage unavailable: {exc}")
    return request.param


@pytest.fixture
def make_spec(backend: str, storage: str):  # type: ignore[no-untyped-def]
    def make(**kw) -> SandboxSpec:  # type: ignore[no-untyped-def]
        kw.setdefault("storage", storage)
        kw.setdefault("memory_mb", 256)
        kw.setdefault("pids", 64)
        kw.setdefault("disk_mb", 64)
        kw.setdefault("timeout_s", 20)
        return SandboxSpec(backend=backend, **kw)
    return make


@pytest.fixture
async def sb(make_spec):  # type: ignore[no-untyped-def]
    async with open_sandbox(make_spec()) as sandbox:
        yield sandbox
