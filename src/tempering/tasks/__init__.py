"""Tasks: what an agent is asked to do, the files it starts with, and how it is graded.

    from tempering.tasks import load_task
    task = load_task("path/to/task")         # a validated task directory (see task.py)
    await task.prepare(sb)                   # the workspace goes in, never the hidden tests

Built-in suites live beside it (``humaneval.py``).
"""

from __future__ import annotations

from tempering.tasks.files import FileTree, Limits
from tempering.tasks.task import Task, TaskConfig, load_task

__all__ = ["Task", "TaskConfig", "load_task", "FileTree", "Limits"]
