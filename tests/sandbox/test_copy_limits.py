"""Copies out of a sandbox are bounded while they are read, on every backend and storage: a
sparse file, hard links, a deep or a crowded tree cost the host what the limits allow, not what
the shape claims, and a cancelled copy stops."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from tempering.errors import SandboxFileTooLargeError
from tempering.sandbox import CopyLimits, open_sandbox
from tempering.sandbox.copyout import Walk

MiB = 1 << 20
NESTED = "python3 -c \"import os\nfor i in range(1100): os.mkdir('d'); os.chdir('d')\""


def host_bytes(root: Path) -> int:
    """Bytes the tree under ``root`` allocates on the host (a hard-linked file once)."""
    seen: dict[tuple[int, int], int] = {}
    for top, _, names in os.walk(root):
        for name in names:
            info = os.lstat(os.path.join(top, name))
            seen[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    return sum(seen.values())


def host_files(root: Path) -> int:
    return sum(len(names) for _, _, names in os.walk(root))


async def run(sb, shell: str) -> None:  # type: ignore[no-untyped-def]
    r = await sb.exec(shell, timeout=60)
    assert r.exit_code == 0, r.stderr


async def test_read_file_refuses_a_sparse_file_before_loading_it(make_spec) -> None:
    async with open_sandbox(make_spec(disk_mb=8)) as sb:
        await run(sb, "truncate -s 2G big && truncate -s 1E huge && head -c 100000 /dev/zero > f")
        start = time.perf_counter()
        with pytest.raises(SandboxFileTooLargeError, match=r"'big'.* 2147483648 bytes.*16777216"):
            await sb.read_file("big")
        with pytest.raises(SandboxFileTooLargeError, match="'huge'"):
            await sb.read_file("huge")
        assert time.perf_counter() - start < 1.0  # refused from its size, nothing read
        assert len(await sb.read_file("f")) == 100_000
        with pytest.raises(SandboxFileTooLargeError, match="over the limit of 50000 bytes"):
            await sb.read_file("f", limit=50_000)
        assert len(await sb.read_file("f", limit=100_000)) == 100_000


async def test_download_leaves_a_sparse_file_behind(make_spec, tmp_path: Path) -> None:
    async with open_sandbox(make_spec(disk_mb=8)) as sb:
        await run(sb, "mkdir src && truncate -s 2G src/big && echo hi > src/small")
        skipped = await sb.download("src", tmp_path / "out")
        assert skipped == ["src/big"]
        assert (tmp_path / "out" / "small").read_text() == "hi\n"
        assert not (tmp_path / "out" / "big").exists()
        with pytest.raises(SandboxFileTooLargeError, match="'src/big'"):
            await sb.download("src/big", tmp_path / "one", limits=CopyLimits())
    assert host_bytes(tmp_path) < MiB


async def test_download_keeps_hard_links_as_links(make_spec, tmp_path: Path) -> None:
    async with open_sandbox(make_spec(disk_mb=64)) as sb:
        await run(sb, "head -c 1M /dev/urandom > f && python3 -c \"import os\n"
                      "for i in range(2000): os.link('f', 'l%d' % i)\"")
        assert await sb.download(".", tmp_path / "out") == []
        out = tmp_path / "out"
        assert host_files(out) == 2001
        assert os.stat(out / "l1999").st_ino == os.stat(out / "f").st_ino
        assert host_bytes(out) < 2 * MiB  # one 1 MiB file, not 2 GB
        tree = await sb.read_tree(".")
    # In memory the file is taken once and its other names listed as left out.
    assert list(tree.files) == ["f"] and len(tree.files["f"]) == MiB
    assert "l0 (hard link of f, taken once)" in tree.left_out


async def test_deep_trees_are_walked_without_recursion(make_spec, tmp_path: Path) -> None:
    async with open_sandbox(make_spec()) as sb:
        await run(sb, NESTED + " && echo top > top.txt")
        skipped = await sb.download(".", tmp_path / "out")
        tree = await sb.read_tree(".")
    deepest = "/".join(["d"] * 65)
    assert skipped == [deepest]
    assert (tmp_path / "out" / Path(*["d"] * 64)).is_dir()
    assert tree.files == {"top.txt": b"top\n"}
    assert tree.left_out == (f"{deepest} (deeper than 64 directories)",)


# Room for 30,000 files in the workdir of every storage (one inode per 4 KiB of a tmpfs, and
# docker's workdir holds 7/16 of the budget).
MANY = {"disk_mb": 512, "memory_mb": 1024}


@pytest.mark.slow
async def test_many_empty_files_stop_at_the_caps(make_spec, tmp_path: Path) -> None:
    async with open_sandbox(make_spec(**MANY)) as sb:
        await run(sb, "echo keep > a.txt && mkdir junk && python3 -c \"\n"
                      "for i in range(30000): open('junk/e%d' % i, 'w').close()\"")
        tree = await sb.read_tree(".")
        small = CopyLimits(max_files=1000, max_entries=5000)
        skipped = await sb.download(".", tmp_path / "out", limits=small)
    assert tree.files["a.txt"] == b"keep\n" and len(tree.files) == 10_000
    assert tree.left_out[0].endswith("(more than 10000 files)")
    assert tree.left_out[-1] == "... (19901 more entries left out)"  # 100 listed, then counted
    assert host_files(tmp_path / "out") == 1000 and (tmp_path / "out" / "a.txt").exists()
    # What was examined and not taken (the directory itself counts), and the directory whose
    # names stopped being read.
    assert len(skipped) == 5000 - 1000 - 1 + 1 and "junk" in skipped


@pytest.mark.slow
async def test_a_cancelled_download_stops(make_spec, tmp_path: Path) -> None:
    async with open_sandbox(make_spec(**MANY)) as sb:
        await run(sb, "python3 -c \"\nfor i in range(20000): open('e%d' % i, 'w').close()\"")
        out = tmp_path / "out"
        copy = asyncio.create_task(sb.download(".", out))
        while not out.exists() or host_files(out) < 100:  # noqa: ASYNC110 - a thread fills it
            await asyncio.sleep(0.005)
        copy.cancel()
        start = time.perf_counter()
        with pytest.raises(asyncio.CancelledError):
            await copy
        assert time.perf_counter() - start < 0.5
        copied = host_files(out)
        await asyncio.sleep(0.3)
    assert host_files(out) == copied < 20_000  # nothing more was written once it returned


def test_a_file_that_grows_while_read_is_cut_off(tmp_path: Path) -> None:
    """The read stops one byte past the allowance: a file grown after its size was checked
    (by a process still running in the sandbox) is left out, not followed."""
    for take in ("read", "copy"):
        (tmp_path / "g").write_bytes(b"x" * MiB)
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            walk = Walk(fd, CopyLimits(max_file_bytes=2 * MiB))
            for entry in walk.entries():
                with open(tmp_path / "g", "ab") as f:
                    f.write(b"y" * 4 * MiB)  # after the walk checked its size
                if take == "read":
                    assert walk.read(entry) is None
                else:
                    with open(tmp_path / "copy", "wb") as out:
                        assert walk.copy(entry, out.fileno()) is False
                    assert (tmp_path / "copy").stat().st_size <= 2 * MiB + 1
        finally:
            os.close(fd)
        assert walk.left_out == [("g", "grew past 2097152 bytes while it was read")]
        assert walk.total == 0


async def test_fork_copies_a_deep_tree(make_spec) -> None:
    """A fork copies the whole tree (memory storage copies it file by file) however deep."""
    async with open_sandbox(make_spec()) as sb:
        await run(sb, NESTED[:-1] + "\nopen('f', 'w').write('bottom')\"")
        child = await sb.fork()
        try:
            r = await child.exec(["python3", "-c", "import os\nn = 0\nwhile os.path.isdir('d'):"
                                  "\n    os.chdir('d'); n += 1\nprint(n, open('f').read())"])
        finally:
            await child.close()
    assert r.stdout == "1100 bottom\n", r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("memory_mb,disk_mb", [(256, 16), (128, 512), (1024, 256)])
async def test_what_the_fitted_limits_admit_fits_a_grading_sandbox(make_spec, memory_mb,
                                                                   disk_mb) -> None:
    """A workspace at ``CopyLimits.fitting(spec)``'s file count and bytes is written into
    a fresh sandbox of ``spec`` with memory storage, its workdir and all: what the grader
    reads out of an agent's sandbox never fails to go back in (which would raise, and drop a
    failing agent's episode as an infra error)."""
    spec = make_spec(memory_mb=memory_mb, disk_mb=disk_mb, storage="memory")
    limits = CopyLimits().fitting(spec)
    files = limits.max_files - 1  # and the directory: entries, as the copy counts them
    each = limits.max_total_bytes // limits.max_files // 4096 * 4096  # pages, as it counts
    async with open_sandbox(spec) as sb:
        code = (f"import os\nos.mkdir('w')\nname = 'f' * 100\nfor i in range({files}):\n"
                f"    open('w/' + name + str(i), 'wb').write(b'x' * {each})\n")
        r = await sb.exec(["python3", "-c", code], timeout=120)
        assert r.exit_code == 0, r.stderr
        assert (await sb.exec("echo alive")).stdout == "alive\n"
