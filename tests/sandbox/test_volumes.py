"""Copy-on-write volumes on a real loop-mounted btrfs: the building block for O(1) forks.

Runs on a private image and mount point, unmounted afterwards; skipped with the reason where
the host lacks btrfs, loop devices or btrfs-progs.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tempering.errors import SandboxUnavailableError
from tempering.sandbox.volumes import BtrfsPool


@pytest.fixture(scope="module")
def volumes():  # type: ignore[no-untyped-def]
    if os.geteuid() != 0:
        pytest.skip("btrfs volumes need root")
    base = Path(tempfile.mkdtemp(prefix="tempering-volumes-", dir="/var/tmp"))
    pool = BtrfsPool(base / "volumes.img", base / "mnt", image_size=2 << 30)
    try:
        pool.mount()
    except SandboxUnavailableError as exc:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"btrfs volumes unavailable: {exc}")
    yield pool
    pool.unmount(remove_image=True)
    shutil.rmtree(base)


def _fill(path: Path, mib: int) -> None:
    for i in range(mib):
        (path / f"f{i}").write_bytes(os.urandom(1 << 20))


def test_create_write_and_destroy(volumes) -> None:
    vol = volumes.create("plain", 32 << 20)
    (vol / "hello.txt").write_text("hi")
    assert volumes.subvolume_id("plain") > 5
    volumes.destroy("plain")
    assert not vol.exists()
    volumes.destroy("plain")  # absent: nothing to do


def test_snapshot_is_a_copy_on_write_copy(volumes) -> None:
    src = volumes.create("parent", 64 << 20)
    _fill(src, 8)
    os.sync()
    child = volumes.snapshot("parent", "child", 64 << 20)
    assert sorted(os.listdir(child)) == sorted(os.listdir(src))
    assert (child / "f3").read_bytes() == (src / "f3").read_bytes()
    (child / "f3").write_bytes(b"changed")
    (src / "new").write_text("only in the parent")
    assert (src / "f3").stat().st_size == 1 << 20
    assert not (child / "new").exists()
    volumes.destroy("child")
    volumes.destroy("parent")


def test_snapshot_cost_does_not_grow_with_clean_data(volumes) -> None:
    small, big = volumes.create("small", 256 << 20), volumes.create("big", 256 << 20)
    _fill(small, 1)
    _fill(big, 100)
    os.sync()

    def best_of(name: str) -> float:
        times = []
        for i in range(5):
            start = time.perf_counter()
            volumes.snapshot(name, f"{name}-{i}", 256 << 20)
            times.append(time.perf_counter() - start)
            volumes.destroy(f"{name}-{i}")
        return min(times)

    # 100x the data, and the snapshot stays within a few times the cost (it is metadata only).
    assert best_of("big") < 5 * best_of("small") + 0.005
    volumes.destroy("small")
    volumes.destroy("big")


def test_quota_stops_writes(volumes) -> None:
    vol = volumes.create("capped", 8 << 20)
    with pytest.raises(OSError) as info:
        _fill(vol, 32)
        os.sync()
        _fill(vol, 32)
    assert info.value.errno in (errno.EDQUOT, errno.ENOSPC)
    volumes.destroy("capped")


def test_bad_names_are_refused(volumes) -> None:
    for bad in ("", "..", "a/b", "x" * 300):
        with pytest.raises(ValueError):
            volumes.create(bad, 1 << 20)


def test_writeback_flushes_after_a_poke(volumes) -> None:
    vol = volumes.create("written", 64 << 20)
    _fill(vol, 4)
    writeback = volumes.writeback()
    before = writeback.flushes
    writeback.poke()
    writeback.poke()  # a burst of pokes is one flush
    deadline = time.monotonic() + 5
    while writeback.flushes == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writeback.flushes == before + 1
    volumes.destroy("written")


async def test_commands_in_volume_sandboxes_start_writeback() -> None:
    import asyncio

    from tempering.sandbox import SandboxSpec, open_sandbox
    from tempering.sandbox.local.backend import volumes as host_volumes

    try:
        writeback = host_volumes().writeback()
    except SandboxUnavailableError as exc:
        pytest.skip(f"volume storage unavailable: {exc}")
    async with open_sandbox(SandboxSpec(storage="volume")) as sb:
        before = writeback.flushes
        await sb.exec("head -c 1M /dev/urandom > data")
        for _ in range(100):
            if writeback.flushes > before:
                break
            await asyncio.sleep(0.05)
        assert writeback.flushes > before


async def test_auto_storage_is_a_volume_where_the_host_can_make_them() -> None:
    from tempering.sandbox import SandboxSpec, open_sandbox
    from tempering.sandbox.host import why_no_volumes

    async with open_sandbox(SandboxSpec()) as sb:
        assert SandboxSpec().storage == "auto"
        why = why_no_volumes()
        assert sb.storage == ("volume" if why is None else "memory")  # type: ignore[attr-defined]
        if why is not None:
            pytest.skip(f"auto fell back to memory here: {why}")
        child = await sb.fork()
        async with child:
            assert child.storage == "volume"  # type: ignore[attr-defined]


def test_auto_storage_falls_back_to_memory_without_btrfs_tools(tmp_path: Path) -> None:
    """A host without mkfs.btrfs (PATH holds only bubblewrap) still runs sandboxes, on memory,
    and says why."""
    import subprocess
    import sys

    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bubblewrap is not installed")
    (tmp_path / "bwrap").symlink_to(bwrap)
    script = (
        "import asyncio\n"
        "from tempering.sandbox import SandboxSpec, open_sandbox\n"
        "from tempering.sandbox.host import why_no_volumes\n"
        "async def main():\n"
        "    async with open_sandbox(SandboxSpec()) as sb:\n"
        "        r = await sb.exec(['/bin/sh', '-c', 'echo data > f && cat f'])\n"
        "        child = await sb.fork()\n"
        "        async with child:\n"
        "            copied = await child.read_file('f')\n"
        "        print(sb.storage, r.stdout.strip(), copied.decode().strip())\n"
        "        print(why_no_volumes())\n"
        "asyncio.run(main())\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    first, why = proc.stdout.splitlines()
    assert first == "memory data data"
    assert "mkfs.btrfs is missing" in why
