"""Fixtures for the sandbox suites, parameterised over every backend that runs here.

The conformance and security suites are written once against the contract; each backend joins
by adding its name to BACKENDS, and each runs with every storage it has. A backend or storage
that cannot run on this host is skipped with the reason it gave, never silently passed.
"""

from __future__ import annotations

import pytest

from backends import unavailable
from tempering.errors import SandboxUnavailableError
from tempering.sandbox import SandboxSpec, open_sandbox

BACKENDS = ["local", "docker"]
STORAGES = ["memory", "volume"]


VARIANTS = [(b, st) for b in BACKENDS for st in STORAGES]
# docker with volume storage runs in CI's slow half only: the default run covers each backend
# and each storage, and that combination cost it a minute (15 min budget).
SLOW_VARIANTS = {("docker", "volume")}


@pytest.fixture(params=[pytest.param(v, marks=pytest.mark.slow) if v in SLOW_VARIANTS else v
                        for v in VARIANTS], ids=[f"{b}-{st}" for b, st in VARIANTS])
def variant(request: pytest.FixtureRequest) -> tuple[str, str]:
    backend, storage = request.param
    why = unavailable(backend)
    if why:
        pytest.skip(f"{backend} backend unavailable: {why}")
    if storage == "volume":
        try:
            from tempering.sandbox.local.backend import volumes

            volumes()
        except SandboxUnavailableError as exc:
            pytest.skip(f"volume storage unavailable: {exc}")
    return backend, storage


@pytest.fixture
def backend(variant: tuple[str, str]) -> str:
    return variant[0]


@pytest.fixture
def storage(variant: tuple[str, str]) -> str:
    return variant[1]


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

