"""The zygote path compiles a task's hidden tests on the host, once, when the grading
interpreter reads the host's bytecode; otherwise the launcher compiles them. Both must grade
alike: the same rewards, the same flags, a hidden file that does not compile reported as the
interpreter reports it."""

from __future__ import annotations

import dis
import marshal
from types import CodeType

import pytest

from backends import grading_python
from tempering.reward import Grader, RewardResult, canary
from tempering.reward import grader as grader_module
from tempering.reward.grader import grading_spec
from tempering.reward.inside_compile import compile_hidden
from tempering.reward.runner import canary_code
from tempering.tasks import FileTree, Task
from tempering.tasks.humaneval import load_humaneval

SOLVED = ("def median(values):\n    if not values:\n        raise ValueError('empty')\n"
          "    s = sorted(values)\n    n = len(s)\n"
          "    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2\n")
HALF = "def median(values):\n    return sorted(values)[len(values) // 2]\n"  # odd lengths only
BROKEN_TEST = "def test_broken(:\n    pass\n"


def _plain(task: Task, tests: dict[str, bytes] | None = None,
           expected: int | None = None) -> Task:
    grading = task.config.grading.model_copy(update={"runner": "plain",
                                                     "expected_tests": expected})
    return Task(task.config.model_copy(update={"grading": grading}), task.instruction,
                task.workspace, FileTree.of(tests) if tests is not None else task.tests,
                task.solution)


async def _grade(task: Task, solution: str, *, host_compiles: bool,
                 monkeypatch: pytest.MonkeyPatch) -> RewardResult:
    with monkeypatch.context() as patch:
        if not host_compiles:  # as for a grading interpreter of another version
            patch.setattr(grader_module, "MAGIC_NUMBER", b"\0\0\r\n")
        async with Grader() as grader:
            result = await grader.grade_files(
                task, task.workspace.overlay({"stats.py": solution.encode()}))
            zygote = grader._zygotes.of(grading_spec(task))  # noqa: SLF001
            assert zygote is not None
            assert zygote.greeting == _sandbox_magic().hex()  # it said whose bytecode it reads
            return result


def _sandbox_magic() -> bytes:
    """The bytecode magic number of the interpreter gradings run on."""
    return bytes.fromhex(grading_python(
        "import importlib.util; print(importlib.util.MAGIC_NUMBER.hex())").strip())


@pytest.mark.parametrize("host_compiles", [True, False])
async def test_host_and_launcher_compiled_tests_grade_alike(
        median: Task, host_compiles: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    task = _plain(median)
    solved = await _grade(task, SOLVED, host_compiles=host_compiles, monkeypatch=monkeypatch)
    assert solved.reward == 1.0 and not solved.flags, solved.details
    half = await _grade(task, HALF, host_compiles=host_compiles, monkeypatch=monkeypatch)
    assert half.reward < 1.0 and half.tests_passed == 3 and not half.flags, half.flags


@pytest.mark.parametrize("host_compiles", [True, False])
async def test_a_hidden_file_that_does_not_compile_is_a_collection_error(
        median: Task, host_compiles: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    tests = {**{p: median.tests[p] for p in median.tests}, "test_broken.py": BROKEN_TEST.encode()}
    task = _plain(median, tests, expected=5)  # the median task's own five
    result = await _grade(task, SOLVED, host_compiles=host_compiles, monkeypatch=monkeypatch)
    assert "collection_error" in result.flags and result.tests_passed == 5, result.flags
    assert any("test_broken.py" in d and "SyntaxError" in d for d in result.details), \
        result.details


_SAME = ("co_names", "co_varnames", "co_freevars", "co_cellvars", "co_name", "co_qualname",
         "co_filename", "co_flags", "co_argcount", "co_posonlyargcount", "co_kwonlyargcount",
         "co_nlocals", "co_stacksize", "co_firstlineno", "co_exceptiontable")


def _same_code(a: CodeType, b: CodeType) -> None:
    """The same instructions on the same names and constants (a constant may sit at another
    index: compiling the text shares one entry between equal constants), but for the column
    table (a filled-in name or literal of another length)."""
    for field in _SAME:
        assert getattr(a, field) == getattr(b, field), (a.co_name, field)
    mine, theirs = list(dis.get_instructions(a)), list(dis.get_instructions(b))
    assert len(mine) == len(theirs), a.co_name
    for x, y in zip(mine, theirs, strict=True):
        assert x.opname == y.opname and x.offset == y.offset, (a.co_name, x, y)
        if x.opname == "LOAD_CONST":
            if isinstance(x.argval, CodeType):
                _same_code(x.argval, y.argval)
            else:
                assert type(x.argval) is type(y.argval) and x.argval == y.argval, (x, y)
        else:
            assert x.arg == y.arg, (a.co_name, x, y)


def test_filled_canary_code_is_the_compiled_canary() -> None:
    """The mutant canary's code, filled in from a compiled template, is what compiling its
    text gives: same bytecode, names, constants (each drawn literal kind), file name."""
    tasks = load_humaneval()
    kinds = set()
    for task in tasks[:80]:
        sources = {f"/w/tests/{p}": task.tests[p] for p in task.tests}
        for _ in range(3):
            made = canary.make(sources, "/w", "tests", "")
            path = f"/w/{made.path}"
            filled = canary_code(made, path)
            if made.parts is None:
                assert filled is None
                continue
            kinds.add(type(made.parts[2]).__name__)
            expected = compile_hidden({path: made.text.encode()}, rewrite=False)[path]
            assert isinstance(expected, CodeType) and filled is not None
            _same_code(marshal.loads(filled), expected)
    assert {"int", "str", "bool", "list"} <= kinds, kinds
