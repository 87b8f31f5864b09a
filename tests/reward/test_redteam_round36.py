"""Red team, round thirty-six: the grader's own reading of what the agent left.

1. The screen took the path of a left-out entry from its description (``"path (why)"``, cut at
   the first ``" ("``): a link named ``stats.py (x)`` made it keep the task's ``stats.py``
   while the agent had made ``stats.py`` a directory holding a file, and writing both into the
   grading sandbox raised: any failing episode became an infrastructure error. The screen now
   decides on the exact paths left out (``FileTree.left_out_paths``), a path the agent made a
   directory is never kept as the task's file, and an added file that clashes with the graded
   tree is dropped with a note (``path_conflict``).
2. Lint handed the agent's file names to ruff as arguments: a file named
   ``--stdin-filename=x.py`` was an option, ruff linted its (empty) stdin and lint scored 1.
   Names now follow ``--`` as ``./name``, and stdin is empty.
3. The rules counted a file that is not UTF-8 (a latin-1 coding cookie) as one changed line,
   and saw imports only in import statements (``__import__("subprocess")`` passed). Lines are
   now counted as the interpreter reads the file, and an import by call or by code in a string
   counts; one that no reading can name (``__import__(name)``) breaks ``forbidden_imports``.
4. A file whose name is not UTF-8 reached the result as a lone surrogate, which no trajectory
   could store. Such names are left out of the copy (listed, escaped), and the trajectory
   journal writes any such string escaped rather than failing.

Each fails on the commit before this round; honest work keeps its reward.
"""

from __future__ import annotations

import pytest
from redteam_parts import MEDIAN_SOLUTION, humaneval_task

from attempts import attempt as _attempt
from conftest import EXAMPLES
from tempering.reward import Grader
from tempering.sandbox import CopyLimits
from tempering.tasks import FileTree, load_task
from tempering.trajectory.journal import model_json

SLUG = (EXAMPLES / "slugify" / "solution" / "slug.py").read_text()
PADDING = "".join(f"PAD_{i} = {i}\n" for i in range(200))  # 200 lint-clean lines


async def test_a_left_out_name_is_never_parsed_for_a_path(task) -> None:  # type: ignore[no-untyped-def]
    result = await _attempt(task, shell="rm stats.py && mkdir stats.py && echo 'x = 1' > "
                                        "stats.py/a.py && ln -s nowhere 'stats.py (x)'")
    assert result.reward == 0.0 and not result.tampered, (result.flags, result.details[:3])
    assert "files_left_out" in result.flags and result.tests_passed == 0


async def test_a_file_the_agent_made_a_directory_is_not_kept_when_partly_read(median) -> None:  # type: ignore[no-untyped-def]
    # The directory holds more entries than the copy looks at: it is left out, partly read.
    async with Grader(limits=CopyLimits(max_entries=40)) as grader:
        result = await _attempt(median, shell="rm stats.py && mkdir stats.py && cd stats.py "
                                              "&& touch $(seq 1 60)", grader=grader)
    assert result.reward == 0.0 and not result.tampered, (result.flags, result.details[:3])
    assert "files_left_out" in result.flags


async def test_clashing_paths_in_a_given_tree_are_dropped_with_a_note(median) -> None:  # type: ignore[no-untyped-def]
    tree = FileTree.of({**median.workspace.files, "stats.py": MEDIAN_SOLUTION,
                        "helpers": "x = 1\n", "helpers/util.py": "y = 2\n"})
    async with Grader() as grader:
        result = await grader.grade_files(median, tree)
    assert result.reward == 1.0 and result.flags == ["path_conflict"], result.details[:3]
    assert sum("path_conflict" in d for d in result.details) == 2


async def test_file_names_never_reach_ruff_as_options() -> None:
    task = load_task(EXAMPLES / "slugify")
    dirty = "import os\n" + SLUG + "# " + "x" * 120 + "\n"  # two findings
    plain = await _attempt(task, {"slug.py": dirty})
    attack = await _attempt(task, {"slug.py": dirty, "--stdin-filename=x.py": ""})
    assert plain.components["lint"] == attack.components["lint"] == 0.5, (
        plain.components, attack.components)


async def test_rules_read_code_as_the_interpreter_does() -> None:
    task = load_task(EXAMPLES / "slugify")
    honest = await _attempt(task, {"slug.py": SLUG})
    assert honest.reward == 1.0 and not honest.flags, honest.details[:3]
    body = SLUG + "\n\n" + PADDING + '\n\ndef _shell():\n    return __import__("subprocess").run\n'
    latin = ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + body).encode("latin-1")
    result = await _attempt(task, {"slug.py": latin})
    failed = " ".join(d for d in result.details if d.startswith("rule_failed"))
    assert "max_changed_lines" in failed and "forbidden_imports" in failed, result.details
    assert result.components["rules"] < 0.5


@pytest.mark.parametrize("code", ['mod = "sub" + "process"\n__import__(mod)\n',
                                  'exec("import subprocess")\n',
                                  "load = __import__\n"])
async def test_imports_no_statement_names_break_forbidden_imports(code: str) -> None:
    task = load_task(EXAMPLES / "slugify")
    result = await _attempt(task, {"slug.py": SLUG + "\n\n" + code})
    assert any(d.startswith("rule_failed: forbidden_imports") for d in result.details), (
        result.details)


async def test_a_name_that_is_not_utf8_is_left_out_and_the_result_stores() -> None:
    task = humaneval_task("HumanEval/0")
    result = await _attempt(task, shell="printf 'x = 1\\n' > \"$(printf 'a\\377.py')\"")
    assert result.reward == 0.0 and "files_left_out" in result.flags
    assert any("a\\xff.py (name is not UTF-8)" in d for d in result.details), result.details
    assert all(path.isprintable() for path in result.changed_files)
    result.model_dump_json()
    assert b"\\\\udcff" in model_json(result.model_copy(update={"changed_files": ["a\udcff"]}))

