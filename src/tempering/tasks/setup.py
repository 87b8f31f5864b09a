"""Prepare once, fork per sample.

A task may have a setup step (``[setup] command``: an install, a compile). ``prepared(task)``
runs it once per task per process, in a sandbox of the task holding its pristine files (with
every CPU of the host unless ``[setup] cpus`` says less: it runs once, not per sample), and
reads back what it left in the workdir and the captured directories (within the limits, links
in captured directories as links): that tree is the prepared task's pristine tree. Every
sample starts from it (``Task.prepare`` writes it), and every grading is taken against it, so
what the setup made is never counted as the agent's work, and the grading sandbox holds it
too. What the setup leaves elsewhere (``/tmp``, a link in the workdir) is not carried: a
grading could not see it, so the agent does not either.

``PreparedRoot`` is a group's shared start: one sandbox of the task, prepared once (started,
its files written), that each of the group's samples forks (a btrfs snapshot on volume
storage: milliseconds, whatever the workspace's size) instead of starting and writing a
sandbox of its own. The root never runs anything of an agent's, so every fork starts as
pristine as a fresh sandbox would.
"""

from __future__ import annotations

import asyncio
import dataclasses

from tempering.errors import ConfigError, SandboxError
from tempering.sandbox import Sandbox, open_sandbox
from tempering.sandbox.spec import host_cpus
from tempering.tasks.capture import tree_problems
from tempering.tasks.files import FileTree, Limits, read_sandbox_tree
from tempering.tasks.task import SetupConfig, Task

SETUP_OUTPUT_TAIL = 800
_prepared: dict[str, Task] = {}  # by the unprepared task's digest
_preparing: dict[tuple[int, str], asyncio.Lock] = {}


async def prepared(task: Task, limits: Limits | None = None) -> Task:
    """``task`` as its setup step leaves it (itself if it has none): a task without a setup
    step whose pristine tree is what the setup made. Run once per task per process;
    ConfigError says why a setup failed, with its output's tail."""
    if not task.config.setup.command:
        return task
    if task.digest in _prepared:
        return _prepared[task.digest]
    key = (id(asyncio.get_running_loop()), task.digest)
    async with _preparing.setdefault(key, asyncio.Lock()):
        if task.digest not in _prepared:
            _prepared[task.digest] = await _run_setup(task, limits or Limits())
    return _prepared[task.digest]


def without_setup(task: Task) -> Task:
    """``task`` with no setup step: its files as the task holds them, nothing run on them."""
    return dataclasses.replace(task, config=task.config.model_copy(
        update={"setup": SetupConfig()}))


async def _run_setup(task: Task, limits: Limits) -> Task:
    setup = task.config.setup
    bare = without_setup(task)
    cpus = min(setup.cpus or host_cpus(), host_cpus())
    try:
        async with open_sandbox(task.sandbox.model_copy(update={"cpus": cpus})) as sb:
            await bare.prepare(sb)
            done = await sb.exec(["bash", "-c", setup.command], timeout=setup.timeout_s)
            if not done.ok:
                why = "timed out" if done.timed_out else f"exited with {done.exit_code}"
                tail = (done.stderr or done.stdout).strip()[-SETUP_OUTPUT_TAIL:]
                raise ConfigError(f"task {task.id}: its setup {setup.command!r} {why}: {tail}")
            workspace = await read_sandbox_tree(sb, limits, spec=task.sandbox)
            environment = {d: await read_sandbox_tree(sb, limits, spec=task.sandbox, src=d,
                                                      links=True) for d in task.captured}
    except SandboxError as exc:
        raise ConfigError(f"task {task.id}: its setup could not run: {exc}") from None
    problems = tree_problems(environment, task.tests)
    if problems:
        raise ConfigError(f"task {task.id}: what its setup left in a captured directory: "
                          + "; ".join(problems))
    left = [*workspace.left_out, *(f"{d}/{e}" for d, t in environment.items()
                                   for e in t.left_out)]
    if left:
        raise ConfigError(f"task {task.id}: its setup left what a task cannot carry: "
                          f"{', '.join(left[:3])} (links and special files in the workdir, "
                          "or past the limits)")
    return dataclasses.replace(bare, workspace=FileTree(workspace.files, workspace.modes),
                               environment=environment)


class PreparedRoot:
    """The sandbox a group of samples of one task forks from, prepared once on first use."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self._root: Sandbox | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def sandbox(self) -> Sandbox:
        """A sandbox of the task, ready for an agent: a fork of the prepared root."""
        async with self._lock:
            if self._closed:
                raise SandboxError(f"the prepared root of task {self.task.id} is closed")
            if self._root is None or self._root.closed:
                root = await open_sandbox(self.task.sandbox)
                try:
                    await self.task.prepare(root)
                except BaseException:
                    await root.close()
                    raise
                self._root = root
            root = self._root
        return await root.fork()

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            if self._root is not None:
                await self._root.close()
                self._root = None

    async def __aenter__(self) -> PreparedRoot:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
