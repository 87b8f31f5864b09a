"""Gradings forked from one zygote share nothing, and their report channel cannot fill the host.

Each test grades agent files through the real ``Grader`` (the zygote runs for HumanEval's
``plain`` runner): the solution is the attack. What it finds comes back as its failure message,
the last line of the hidden test's traceback."""

from __future__ import annotations

from pathlib import Path

import writable
from polling import until
from tempering.reward import Grader, RewardResult
from tempering.sandbox.host import host
from tempering.tasks import Task
from tempering.tasks.humaneval import load_humaneval

# The whole filesystem, tried as the grading uid (``tests/writable.py``); what it finds is the
# hidden test's failure.
WALK = writable.WALK + """

def has_close_elements(numbers, threshold):
    assert False, walk(("/workspace", "/tmp", "/dev/shm"), LEAVE)
"""

# Leaves 200 MiB in /dev/shm (or as much as it may), then solves the task.
FILL = '''import os

try:
    with open("/dev/shm/fill-" + os.urandom(8).hex(), "wb") as f:
        for _ in range(200):
            f.write(bytes(1 << 20))
except OSError:
    pass


def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
'''

# Sends 512 MiB down every socket and pipe it holds: the report channel is one of them.
FLOOD = '''import os
import stat

line = b"x" * 65535 + b"\\n"
for fd in range(3, 256):
    try:
        if not (stat.S_ISSOCK(os.fstat(fd).st_mode) or stat.S_ISFIFO(os.fstat(fd).st_mode)):
            continue
        for _ in range((512 << 20) // len(line)):
            os.write(fd, line)
    except OSError:
        pass


def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
'''


def _task() -> Task:
    return load_humaneval()[0]  # has_close_elements; graded by the zygote


async def _grade(grader: Grader, source: str, isolation: str = "auto") -> RewardResult:
    task = _task()
    if isolation != "auto":
        grading = task.config.grading.model_copy(update={"isolation": isolation})
        task = Task(task.config.model_copy(update={"grading": grading}), task.instruction,
                    task.workspace, task.tests, task.solution)
    return await grader.grade_files(task, task.workspace.overlay({"solution.py": source.encode()}))


def _found(result: RewardResult) -> dict[str, list[str]]:
    [test] = result.tests
    assert "AssertionError: {" in test.message, test.message
    return writable.parse(test.message)


def _forked(grader: Grader) -> bool:
    return any(z.alive for z in grader._zygotes.started())  # noqa: SLF001 - which path graded


async def test_a_grading_can_write_only_its_own_storage_and_finds_nothing_of_earlier_ones(
) -> None:
    async with Grader() as grader:
        first = _found(await _grade(grader, "LEAVE = True\n" + WALK))
        second = _found(await _grade(grader, "LEAVE = False\n" + WALK))
        assert _forked(grader)
    for found in (first, second):
        assert found["own"] == ["/dev/shm", "/tmp", "/workspace"], found
        assert found["others"] == [], found  # not /dev, /run, /var/tmp, /.tempering...
    assert second["marks"] == [], second


def _owner_memory() -> int:
    """Memory charged below this process's sandbox cgroups, live or removed (a removed cgroup's
    tmpfs pages stay charged to its parent)."""
    h = host()
    dirs = h.hierarchy.owner_dirs(h.tag)
    if h.hierarchy.version == 1:
        return int((dirs["memory"] / "memory.usage_in_bytes").read_text())
    return int((dirs[""] / "memory.current").read_text())


async def test_what_gradings_leave_in_dev_shm_does_not_accumulate() -> None:
    task = _task()
    solved = task.workspace.overlay(dict(task.solution.files))  # type: ignore[union-attr]
    async with Grader() as grader:
        assert (await grader.grade_files(task, solved)).reward == 1.0  # the zygote is up
        before = _owner_memory()
        for _ in range(4):
            assert (await _grade(grader, FILL)).reward == 1.0
        assert _forked(grader)
        # Four gradings of 200 MiB each; the last one's storage is freed as its mount
        # namespace goes, which the kernel finishes a moment after the grading ended.
        try:
            await until(lambda: _owner_memory() - before < 32 << 20, timeout=10.0)
        except AssertionError:
            raise AssertionError(f"{(_owner_memory() - before) >> 20} MiB left behind by "
                                 "four gradings") from None


def _rss(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) << 10


async def _flood_growth(grader: Grader, isolation: str = "shared") -> tuple[int, RewardResult]:
    """How far this process's peak RSS rose over its RSS while one flooding grading ran."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = _rss("VmRSS")
    result = await _grade(grader, FLOOD, isolation)
    return _rss("VmHWM") - before, result


async def test_a_flood_on_the_zygote_report_channel_is_cut_at_the_limit() -> None:
    """With the tested code in the tests' process, which holds the report channel."""
    async with Grader() as grader:
        await _grade(grader, FLOOD, "shared")  # the zygote and this process's buffers are warm
        grown, result = await _flood_growth(grader)
        assert _forked(grader)
    limit = 8 << 20  # GRADING_OUTPUT_LIMIT
    assert grown < 2 * limit, f"host RSS grew {grown >> 20} MiB"
    assert result.reward == 0.0 and result.tests_passed == 0
    assert "went over" in result.log, result.log


async def test_a_flood_from_the_tested_codes_own_process_reaches_nothing() -> None:
    """With process isolation the tested code holds no report channel: what it writes to its
    descriptors goes nowhere, and the host does not grow."""
    async with Grader() as grader:
        await _grade(grader, FLOOD, "process")
        grown, result = await _flood_growth(grader, "process")
        assert _forked(grader)
    assert grown < 8 << 20, f"host RSS grew {grown >> 20} MiB"
    assert result.reward == 0.0 and result.tests_passed == 0


async def test_a_flood_on_the_launcher_report_keeps_the_host_bounded() -> None:
    async with Grader(zygote=False) as grader:
        await _grade(grader, FLOOD, "shared")
        grown, result = await _flood_growth(grader)
        assert not grader._zygotes.started()  # noqa: SLF001 - a launcher sandbox graded it
    assert grown < 6 * (8 << 20), f"host RSS grew {grown >> 20} MiB"
    assert result.log, "the launcher's output was not read"
