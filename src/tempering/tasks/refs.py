"""Task references: one grammar for naming tasks, wherever tasks are named.

    REF     = DIR | FAMILY | FAMILY:N | ID
    FAMILY  = humaneval | switchboard | repo-bugs
    ID      = HumanEval/12 | switchboard/echo-0 | repo-bugs/ledger-fraction

A DIR is a task directory (ours or harbor's); a FAMILY is a built-in family, all of it or its
first N (for ``switchboard``, N table layouts: 4 by default); an ID is one task of a family,
as its ``task.id`` says. A directory that holds a task wins over a family of the same name.
Configs (``tasks.specs``), ``tempering rollout`` and ``tempering tasks validate`` take REFs
(``select``); a reference that names none is a ``ConfigError`` naming it.

``TaskRef`` names exactly one task (its directory or its id) and is what a job carries: made
from a ``Task`` (``TaskRef.of``) it holds the task itself in this process, and pickles to its
name alone, which another process loads once (``TaskRef.task``). A task made in code, with
neither a directory nor a built-in id, cannot leave this process: pickling its reference is a
``ConfigError`` saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tempering.errors import ConfigError
from tempering.tasks.task import Task

FAMILIES = ("humaneval", "switchboard", "repo-bugs")
ID_PREFIXES = ("HumanEval/", "switchboard/", "repo-bugs/")
_loaded: dict[str, Task] = {}  # one task per name, per process


def select(refs: Sequence[str], *, slow: tuple[float, float, float] | None = None
           ) -> list[Task]:
    """Every task ``refs`` name, in order; ``slow`` gives the switchboard family heavy-tailed
    grading time (``tasks.builtin``)."""
    tasks: list[Task] = []
    for ref in refs:
        name, _, count = ref.partition(":")
        if _is_task_dir(ref) or name not in FAMILIES:
            tasks.append(_load(ref))
        elif name == "humaneval":
            from tempering.tasks.humaneval import load_humaneval

            tasks += load_humaneval()[:_count(ref, count, "")]
        elif name == "switchboard":
            from tempering.tasks.builtin import switchboard

            tasks += switchboard(layouts=_count(ref, count, " of table layouts") or 4,
                                 slow=slow)
        else:
            from tempering.tasks.repo_bugs import repo_bugs

            try:
                tasks += repo_bugs(_count(ref, count, ""))
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
    return tasks


@dataclass(frozen=True, eq=False)
class TaskRef:
    """One task, by the name another process can load it by (``name``: its directory,
    resolved, or its built-in id; None for a task made in code)."""

    name: str | None
    _task: Task | None = field(default=None, repr=False)

    @classmethod
    def of(cls, task: Task) -> TaskRef:
        if task.root is not None:
            return cls(str(task.root.resolve()), task)
        return cls(task.id if task.id.startswith(ID_PREFIXES) else None, task)

    @classmethod
    def named(cls, name: str) -> TaskRef:
        """The task one REF names (a directory or an ID, not a family); loaded on use."""
        if not (_is_task_dir(name) or name.startswith(ID_PREFIXES)):
            raise ConfigError(f"task {name!r} is neither a task directory nor a task id "
                              f"({', '.join(p + '...' for p in ID_PREFIXES)})")
        return cls(name)

    def task(self) -> Task:
        """The task: the one it was made from, or loaded by name (once per process)."""
        if self._task is not None:
            return self._task
        assert self.name is not None  # only a reference made from a task has no name
        return _load(self.name)

    def __getstate__(self) -> dict[str, Any]:
        if self.name is None:
            raise ConfigError(f"task {self.task().id!r} has no directory or built-in id that "
                              "another process could load it by")
        return {"name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "name", state["name"])
        object.__setattr__(self, "_task", None)


def _is_task_dir(ref: str) -> bool:
    path = Path(ref)
    return path.is_dir() and ((path / "task.toml").is_file() or not ref.startswith(FAMILIES))


def _load(ref: str) -> Task:
    """The one task ``ref`` names (a directory or an id), loaded once per process."""
    key = str(Path(ref).resolve()) if not ref.startswith(ID_PREFIXES) else ref
    if key in _loaded:
        return _loaded[key]
    by_id: Callable[[str], Task]
    if ref.startswith("switchboard/") and not _is_task_dir(ref):
        from tempering.tasks.builtin import switchboard_from_id

        by_id = switchboard_from_id
    elif ref.startswith("repo-bugs/") and not _is_task_dir(ref):
        from tempering.tasks.repo_bugs import repo_bug_from_id

        by_id = repo_bug_from_id
    elif ref.startswith("HumanEval/") and not _is_task_dir(ref):
        by_id = _humaneval_by_id
    elif Path(ref).is_dir():
        from tempering.tasks import load_task

        by_id = load_task
    else:
        raise ConfigError(f"task {ref!r} is neither a task directory, "
                          f"{', '.join(f + '[:N]' for f in FAMILIES)} nor a task id "
                          f"({', '.join(p + '...' for p in ID_PREFIXES)})")
    try:
        task = _loaded[key] = by_id(ref)
    except (ValueError, KeyError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"task {ref!r}: {exc}") from None
    return task


def _humaneval_by_id(task_id: str) -> Task:
    from tempering.tasks.humaneval import load_humaneval

    for task in load_humaneval():
        _loaded.setdefault(task.id, task)
    if task_id not in _loaded:
        raise KeyError(f"no HumanEval problem has the id {task_id!r} (HumanEval/0 to /163)")
    return _loaded[task_id]


def _count(ref: str, count: str, what: str) -> int | None:
    """The ``N`` of ``FAMILY:N`` (None without one); a ConfigError naming ``ref`` otherwise."""
    if not count:
        return None
    if not count.isdigit() or int(count) < 1:
        raise ConfigError(f"{ref!r}: the count after {ref.partition(':')[0]}: must be a "
                          f"whole number{what} of at least 1")
    return int(count)
