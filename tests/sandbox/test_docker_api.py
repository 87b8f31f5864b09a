"""The Docker Engine client and the default image, against the real engine.

Skipped, with the reason, where no engine answers (`bash scripts/setup.sh` starts one)."""

from __future__ import annotations

import asyncio

import pytest

from tempering.errors import SandboxUnavailableError
from tempering.sandbox.docker.api import DockerAPI, DockerAPIError
from tempering.sandbox.docker.image import PACKAGES, REPOSITORY, closure, image_tag

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def engine() -> DockerAPI:
    engine = DockerAPI()
    try:
        asyncio.run(engine.ping())
    except SandboxUnavailableError as exc:
        pytest.skip(f"no Docker engine: {exc}")
    return engine


async def test_missing_engine_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(SandboxUnavailableError, match="no Docker engine answers at .*nope.sock"):
        await DockerAPI(str(tmp_path / "nope.sock")).ping()


async def test_ping_and_errors_name_the_object(engine: DockerAPI) -> None:
    assert (await engine.ping()).count(".") >= 1
    assert await engine.image_id("tempering/no-such-image:never") is None
    with pytest.raises(DockerAPIError, match="inspecting container nope: .*404") as info:
        await engine.request("GET", "/containers/nope-never/json", what="inspecting container nope")
    assert info.value.status == 404


def test_the_image_is_the_closure_of_installed_packages() -> None:
    packages = closure(PACKAGES)
    names = {p.name for p in packages}
    assert {"python3", "python3-pytest", "libc6", "python3-pluggy", "dash"} <= names
    assert image_tag(packages) == image_tag(closure(PACKAGES))  # repeatable
    with pytest.raises(SandboxUnavailableError, match="apt-get install -y no-such-package"):
        closure(["no-such-package"])


async def test_build_is_cached_and_runs_pytest_as_a_user(engine: DockerAPI) -> None:
    from tempering.sandbox.docker.image import build_default_image

    ref = await build_default_image(engine)
    assert ref.startswith(f"{REPOSITORY}:") and await engine.image_id(ref) is not None
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await build_default_image(engine) == ref
    assert loop.time() - start < 2.0  # found, not rebuilt
    name = f"tempering-test-{id(ref)}"
    script = "id -u; python3 -c 'import pytest; print(pytest.__version__)'"
    await engine.request("POST", "/containers/create", params={"name": name}, body={
        "Image": ref, "Cmd": ["sh", "-c", script], "Labels": {"tempering.test": name},
        "HostConfig": {"NetworkMode": "none"}}, what="creating a test container")
    try:
        await engine.request("POST", f"/containers/{name}/start", what="starting it")
        await engine.request("POST", f"/containers/{name}/wait", what="waiting for it")
        logs = (await engine.request("GET", f"/containers/{name}/logs",
                                     params={"stdout": 1, "stderr": 1})).body
        assert len(await engine.containers(f"tempering.test={name}")) == 1
    finally:
        await engine.remove(name)
    text = _demux(logs)
    assert text.splitlines()[0] == "1000" and text.splitlines()[1].count(".") == 2, text
    assert await engine.containers(f"tempering.test={name}") == []


def _demux(stream: bytes) -> str:
    """Docker's multiplexed log stream: 8-byte headers, then the frame."""
    out, i = [], 0
    while i + 8 <= len(stream):
        size = int.from_bytes(stream[i + 4:i + 8], "big")
        out.append(stream[i + 8:i + 8 + size])
        i += 8 + size
    return b"".join(out).decode()
