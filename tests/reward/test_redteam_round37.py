"""Red team, round thirty-seven: what the grader writes beside the agent's tree, and what ruff
reads of the agent's files.

1. A task whose hidden tests live in a nested directory (``tests_dir = "checks/hidden"``) and
   ships nothing under ``checks/``: an agent that left a plain file named ``checks`` made the
   grader fail writing the hidden tests below it, under both runners, so that an unsolved
   episode became an infrastructure error (dropped, never a zero). The tests directory and
   each directory above it now belong to the graded tree whatever the workspace holds, and a
   file of the agent's in their place is dropped with a note (``path_conflict``).
2. ruff was given the agent's bytes, and reads UTF-8 only: a source whose coding cookie says
   utf-7 hid its code from ruff inside what reads, in UTF-8, as comments (``# +AAo-code``:
   ``+AAo-`` is a newline to the interpreter), and lint scored the sloppy file 0.75 rather
   than 0. ruff now lints the text the interpreter reads.

Each fails on the commit before this round; honest work keeps its reward.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from redteam_parts import MEDIAN_SOLUTION, honest_then

from attempts import attempt as _attempt
from conftest import EXAMPLES
from tempering.tasks import Task, load_task

SLUG = (EXAMPLES / "slugify" / "solution" / "slug.py").read_text()
NESTED_TESTS = '''from stats import median


def test_odd():
    assert median([3, 1, 2]) == 2


def test_even():
    assert median([4, 1, 2, 3]) == 2.5
'''


def nested_task(root: Path, runner: str) -> Task:
    """The median task with its hidden tests in ``checks/hidden``, nothing under ``checks/``
    in the workspace."""
    (root / "task.toml").parent.mkdir(parents=True, exist_ok=True)
    (root / "task.toml").write_text(
        '[task]\nid = "nested"\ndescription = "median, hidden tests in checks/hidden"\n\n'
        '[grading]\ncommand = "python3 -m pytest checks/hidden"\ntests_dir = "checks/hidden"\n'
        f'runner = "{runner}"\ntimeout_s = 60\n')
    (root / "instruction.md").write_text("Implement median in stats.py.\n")
    for path, text in {"workspace/stats.py": "def median(values):\n    raise "
                                             "NotImplementedError\n",
                       "solution/stats.py": MEDIAN_SOLUTION,
                       "tests/test_median.py": NESTED_TESTS}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return load_task(root)


@pytest.mark.parametrize("runner", ["plain", "pytest"])
async def test_a_file_named_like_a_parent_of_the_tests_dir_fails_the_agent(
        tmp_path: Path, runner: str) -> None:
    task = nested_task(tmp_path / runner, runner)
    result = await honest_then(task, {"stats.py": MEDIAN_SOLUTION}, {"checks": "x\n"})
    assert result.reward == 0.0 and result.tests_total == 2, (result.flags, result.details[:3])
    assert result.flags == ["path_conflict"] and not result.tampered, result.details[:3]
    solved = await _attempt(task, {"stats.py": MEDIAN_SOLUTION, "checks": "x\n"})
    assert solved.reward == 1.0 and solved.flags == ["path_conflict"], solved.details[:3]


SLOPPY = ("import os, sys\nimport collections\n" + SLUG.replace(
    "def slugify(title: str) -> str:", "def slugify( title : str )->str :\n    unused = 1 ;  x=2")
    + "\n\n\n# " + "z" * 150 + "\n")


def _utf7(text: str) -> bytes:
    """``text`` as a utf-7 source whose every line, read as UTF-8, is a comment."""
    body = "".join(f"# +AAo-{line.replace('+', '+-')}\n" for line in text.split("\n"))
    return ("# coding: utf-7\n" + body).encode()


async def test_ruff_reads_the_code_the_interpreter_reads() -> None:
    task = load_task(EXAMPLES / "slugify")
    assert SLOPPY in _utf7(SLOPPY).decode("utf-7").replace("# \n", "")
    plain = await _attempt(task, {"slug.py": SLOPPY})
    hidden = await _attempt(task, {"slug.py": _utf7(SLOPPY)})
    assert plain.tests_passed == plain.tests_total == hidden.tests_passed, hidden.details[:3]
    assert plain.components["lint"] == hidden.components["lint"] == 0.0, (
        plain.components, hidden.components)
    latin = ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + SLOPPY).encode("latin-1")
    findings = [d for d in (await _attempt(task, {"slug.py": latin})).details
                if d.startswith("lint:")]
    assert len(findings) > 5 and not any("E902" in d for d in findings), findings
