"""Workspaces shaped to break the copy out of the agent's sandbox, graded by the real grader on
both backends: each gets an honest grade (the stub 0, a solution 1) with the junk left out and
noted (``files_left_out``), never an exception (which would make a failing episode an
``infra_error`` that the default filters drop instead of training on its 0)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends import unavailable
from tempering.reward import Grader
from tempering.sandbox import open_sandbox
from tempering.tasks import Task

MiB = 1 << 20
PY = "python3 -c \"import os\n{}\""
ATTACKS = {  # name: (disk_mb of the agent's sandbox, what the agent runs)
    "nested_1100_dirs": (256, PY.format("for i in range(1100): os.mkdir('d'); os.chdir('d')")),
    "sparse_2_GiB": (8, "truncate -s 2G big"),
    "hard_links_20000": (256, "head -c 1M /dev/urandom > f && "
                              + PY.format("for i in range(20000): os.link('f', 'l%d' % i)")),
    "empty_files_100000": (256, "mkdir junk && "
                                + PY.format("for i in range(100000): "
                                            "open('junk/e%d' % i, 'w').close()")),
    # More real bytes than a grading sandbox's workdir holds (docker's is half of disk_mb).
    "fills_the_grading_disk": (64, "for i in $(seq 12); do head -c 4M /dev/urandom > b$i; done"),
}


@contextlib.contextmanager
def peak_bytes(root: Path) -> Iterator[list[int]]:
    """The most bytes the tree under ``root`` allocated while the block ran (polled)."""
    peak, done = [0], threading.Event()

    def poll() -> None:
        while not done.wait(0.01):
            total = 0
            for top, _, names in os.walk(root):
                for name in names:
                    with contextlib.suppress(OSError):
                        total += os.lstat(os.path.join(top, name)).st_blocks * 512
            peak[0] = max(peak[0], total)

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()


# docker: in CI's second run (scripts/test.sh -m slow); local, the same attacks, by default
@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.slow)])
def on_backend(request: pytest.FixtureRequest, median: Task) -> Task:
    why = unavailable(request.param)
    if why:
        pytest.skip(f"{request.param} backend unavailable: {why}")
    if request.param == "docker":
        request.applymarker(pytest.mark.docker)
    spec = median.sandbox.model_copy(update={"backend": request.param})
    return dataclasses.replace(median, config=median.config.model_copy(update={"sandbox": spec}))


# the slowest: in CI's second run (scripts/test.sh -m slow)
@pytest.mark.parametrize("attack", [pytest.param(a, marks=pytest.mark.slow)
                                    if a == "empty_files_100000" else a for a in ATTACKS])
async def test_a_shaped_workspace_gets_an_honest_grade(on_backend: Task, attack: str,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    disk_mb, shell = ATTACKS[attack]
    spec = on_backend.sandbox.model_copy(update={"disk_mb": disk_mb})
    task = dataclasses.replace(on_backend,
                               config=on_backend.config.model_copy(update={"sandbox": spec}))
    assert task.solution is not None
    results = {}
    async with Grader() as grader, open_sandbox(task.sandbox) as sb:
        await task.prepare(sb)
        r = await sb.exec(shell, timeout=120)
        assert r.exit_code == 0, r.stderr
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a copy would land
        with peak_bytes(tmp_path) as host_disk:
            results[False] = await grader.grade(task, sb)  # it leaves the sandbox as it was
            await sb.write_file("stats.py", task.solution["stats.py"])
            results[True] = await grader.grade(task, sb)
    assert host_disk[0] < 64 * MiB  # the copy is bounded while it is made, not after
    stub, solution = results[False], results[True]
    for result in (stub, solution):
        assert "files_left_out" in result.flags and not result.tampered, result.details[:5]
        assert len(result.details) <= 110  # listed, then counted: not one line per junk file
    assert stub.reward == 0.0 and stub.tests_passed == 0, stub.flags
    assert solution.reward == 1.0, (solution.flags, solution.details[:5], solution.log[-500:])
