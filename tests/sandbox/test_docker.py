"""What is particular to the docker backend (the shared contract is in the conformance and
security suites, which run against it too): clear engine errors, leftovers of a crashed
process reclaimed, the hardening the container is created with."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tempering.errors import SandboxStartError
from tempering.sandbox import SandboxSpec, open_sandbox
from tempering.sandbox.docker.api import DockerAPI
from tempering.sandbox.uids import uid_range

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_ready")]


def _python(script: str, status: int = 0) -> str:
    """Run ``script`` in a Python process of its own; its stdout."""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == status, run.stderr
    return run.stdout


def _containers_of(sandbox: str) -> int:
    return len(asyncio.run(DockerAPI().containers(f"tempering.sandbox={sandbox}")))


async def test_a_missing_image_names_itself_and_the_fix() -> None:
    with pytest.raises(SandboxStartError, match=r"image tempering/nope:1 .*tempering image build"):
        async with open_sandbox(SandboxSpec(backend="docker", image="tempering/nope:1")):
            pass


async def test_the_container_is_hardened() -> None:
    async with open_sandbox(SandboxSpec(backend="docker", memory_mb=128, pids=32)) as sb:
        info = (await DockerAPI().request("GET", f"/containers/tempering-{sb.id}/json")).json()
        host = info["HostConfig"]
        assert host["CapDrop"] == ["ALL"] and host["ReadonlyRootfs"] is True
        assert "no-new-privileges:true" in host["SecurityOpt"]
        # the container's limit holds the init's reserve; the commands' child cgroup has 128
        assert host["NetworkMode"] == "none" and host["Memory"] == (128 + 16) << 20
        uids = uid_range()  # a host uid of its own, as the local backend's sandboxes
        uid, gid = (int(i) for i in info["Config"]["User"].split(":"))
        assert host["PidsLimit"] == 32 and uid == gid and uids.first <= uid <= uids.last
        r = await sb.exec("grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; "
                          "touch /usr/x 2>&1; echo sockets: $(ls -A /.tempering/control | wc -l); "
                          "touch /.tempering/control/fill 2>&1 || echo no host writes")
        assert "CapEff:\t0000000000000000" in r.stdout and "NoNewPrivs:\t1" in r.stdout
        assert "Seccomp:\t2" in r.stdout and "Read-only file system" in r.stdout
        assert "sockets: 0" in r.stdout  # unlinked once the init connected: no one else can
        assert "no host writes" in r.stdout  # the bound control directory is not a disk


def test_reclaim_removes_a_crashed_process_containers() -> None:
    crash = ("import asyncio, os\n"
             "from tempering.sandbox import SandboxSpec, open_sandbox\n"
             "async def main():\n"
             "    sb = await open_sandbox(SandboxSpec(backend='docker'))\n"
             "    print(sb.id, flush=True)\n"
             "    os._exit(1)  # no cleanup: the container stays behind\n"
             "asyncio.run(main())\n")
    sandbox = _python(crash, status=1).strip()
    reclaim = ("import asyncio\n"
               "from tempering.sandbox.docker.backend import DockerSandbox\n"
               "print(asyncio.run(DockerSandbox.reclaim_async()))\n")
    assert int(_python(reclaim)) >= 1
    assert _containers_of(sandbox) == 0


async def test_a_task_recipe_builds_from_a_local_image_and_runs(tmp_path) -> None:
    from tempering.errors import SandboxUnavailableError
    from tempering.sandbox.docker.image import build_recipe

    (tmp_path / "Dockerfile").write_text("FROM tempering/python:latest\n"
                                         "COPY marker.txt /opt/marker.txt\n")
    (tmp_path / "marker.txt").write_text("from the recipe\n")
    ref = await build_recipe(tmp_path)
    assert ref.startswith("tempering/task:") and await build_recipe(tmp_path) == ref  # cached
    async with open_sandbox(SandboxSpec(backend="docker", image=ref)) as sb:
        assert (await sb.exec("cat /opt/marker.txt")).stdout == "from the recipe\n"
    (tmp_path / "Dockerfile").write_text("FROM nowhere/none:1\n")
    with pytest.raises(SandboxUnavailableError, match="nothing is pulled"):
        await build_recipe(tmp_path)


async def test_a_pool_hands_out_warm_containers() -> None:
    from tempering.sandbox import SandboxPool

    spec = SandboxSpec(backend="docker")
    async with SandboxPool(max_instances=2, warm=1, spec=spec) as pool:
        first = await pool.allocate("a", spec)
        await first.exec("echo left > f")
        await pool.release("a")
        second = await pool.allocate("b", spec, timeout=30)
        assert (await second.list(".")) == []  # never a reused container
        assert pool.stats().active == 1
        await pool.release("b")


async def test_a_spec_recipe_is_built_on_first_use(tmp_path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM tempering/python:latest\n"
                                         "COPY tool.sh /usr/bin/task-tool\n")
    (tmp_path / "tool.sh").write_text("#!/bin/sh\necho tool ready\n")
    (tmp_path / "tool.sh").chmod(0o755)
    spec = SandboxSpec(backend="docker", recipe=str(tmp_path))
    async with open_sandbox(spec) as sb:
        assert (await sb.exec("task-tool")).stdout == "tool ready\n"
    with pytest.raises(ValueError, match="not a directory with a Dockerfile"):
        SandboxSpec(backend="docker", recipe=str(tmp_path / "nope"))


def test_a_process_that_forgets_to_close_leaves_nothing() -> None:
    forget = ("import asyncio\n"
              "from tempering.sandbox import SandboxSpec, open_sandbox\n"
              "async def main():\n"
              "    sb = await open_sandbox(SandboxSpec(backend='docker'))\n"
              "    print(sb.id, sb.storage, flush=True)\n"
              "asyncio.run(main())\n")
    sandbox, storage = _python(forget).split()
    assert _containers_of(sandbox) == 0
    if storage == "volume":
        from tempering.sandbox.host import volumes

        assert not [v for v in volumes().root.iterdir() if v.name.endswith(sandbox)]
