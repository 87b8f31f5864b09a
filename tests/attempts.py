"""What an agent leaves, graded: shared by every suite that plays an agent by hand (a real
agent sandbox, the task's files written in, the agent's files and shell, the real grader)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from tempering.reward import Grader, RewardResult
from tempering.sandbox import open_sandbox
from tempering.tasks import Task


async def attempt(task: Task, files: Mapping[str, str | bytes] | None = None,
                  shell: str | None = None, grader: Grader | None = None,
                  timeout: float | None = None) -> RewardResult:
    """The task's sandbox prepared, then ``files`` written and ``shell`` run (it must exit 0),
    graded by ``grader`` (left open) or a grader of its own."""
    async with open_sandbox(task.sandbox) as sb:
        await task.prepare(sb)
        for path, data in (files or {}).items():
            await sb.write_file(path, data)
        if shell is not None:
            result = await sb.exec(shell, timeout=timeout)
            assert result.exit_code == 0, result.stderr
        async with _grader(grader) as g:
            return await g.grade(task, sb)


@asynccontextmanager
async def _grader(grader: Grader | None) -> AsyncIterator[Grader]:
    if grader is not None:
        yield grader  # borrowed: not closed here
        return
    async with Grader() as own:
        yield own
