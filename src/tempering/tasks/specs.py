"""Tasks named on a command line or in a config: ``tasks.specs`` in ``tempering train``,
``tempering rollout``'s TASK arguments.

A spec is a task directory, ``humaneval[:N]`` (the first N of HumanEval's 164 problems),
``switchboard[:LAYOUTS]`` (the built-in family a tiny model can learn) or ``repo-bugs[:N]``
(small repositories with one seeded bug each). A spec that names none of these is a
``ConfigError`` naming it.
"""

from __future__ import annotations

from pathlib import Path

from tempering.errors import ConfigError
from tempering.tasks.task import Task


def _count(spec: str, count: str, what: str) -> int | None:
    """The ``N`` of ``NAME:N`` (None without one); a ConfigError naming ``spec`` otherwise."""
    if not count:
        return None
    if not count.isdigit() or int(count) < 1:
        raise ConfigError(f"{spec!r}: the count after {spec.partition(':')[0]}: must be a "
                          f"whole number{what}")
    return int(count)


def load_task_specs(specs: list[str], *, slow: tuple[float, float, float] | None = None,
                    ) -> list[Task]:
    """The tasks ``specs`` name (as ``tempering rollout`` takes them); ``slow`` gives the
    switchboard family heavy-tailed grading time (``tasks.builtin``)."""
    from tempering.tasks import load_task

    tasks: list[Task] = []
    for spec in specs:
        name, _, count = spec.partition(":")
        if name == "humaneval":
            from tempering.tasks.humaneval import load_humaneval

            first = _count(spec, count, "")
            tasks += load_humaneval()[:first]
        elif name == "switchboard":
            from tempering.tasks.builtin import switchboard

            tasks += switchboard(layouts=_count(spec, count, " of table layouts") or 4,
                                 slow=slow)
        elif name == "repo-bugs":
            from tempering.tasks.repo_bugs import repo_bugs

            try:
                tasks += repo_bugs(_count(spec, count, ""))
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        elif Path(spec).is_dir():
            tasks.append(load_task(spec))
        else:
            raise ConfigError(f"task {spec!r} is neither a task directory, humaneval[:N], "
                              "switchboard[:LAYOUTS] nor repo-bugs[:N]")
    return tasks
