"""Red team, round eighteen: what the seventeenth independent red team found (issue #14).

A number that lies through its arithmetic, not its equality: its ``__sub__`` returns 0, so
``pytest.approx`` (which the probe left alone as the test's own matcher) and unittest's
``assertAlmostEqual`` (not instrumented) found it within any tolerance of any expected value.
Now the value compared with an approx of builtin values is had as that kind before anything
is compared with it, and the matcher judges that value; the almost-equal assertions get the
value too, in place of the object; and in an asserted expression, an operand of arithmetic
with a number literal (``abs(f(x) - 0.33) < 1e-6``, found here: HumanEval's form) is had as a
number of the literal's kind first.

Each runs through the real grader on a task the test writes, under both runners.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from redteam_parts import write_task

from tempering.tasks import Task

TASKS = {
    'approx': {
        'module': 'stats',
        'test_name': 'test_stats.py',
        'tests': '''import pytest

from stats import mean, stdev


def test_mean():
    assert mean([1.1, 2.2, 3.3]) == pytest.approx(2.2)


def test_mean_int():
    assert mean([1, 2, 3, 4]) == pytest.approx(2.5)


def test_stdev():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(2.138089935)


def test_stdev_reversed():
    assert pytest.approx(1.0) == stdev([1, 2, 3])


def test_empty():
    with pytest.raises(ValueError):
        mean([])
''',
        'solution': '''import math


def mean(xs):
    if not xs:
        raise ValueError("empty")
    return sum(xs) / len(xs)


def stdev(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
''',
        'stub': '''def mean(xs):
    raise NotImplementedError


def stdev(xs):
    raise NotImplementedError
''',
    },
    'almost': {
        'module': 'stats',
        'test_name': 'test_stats.py',
        'tests': '''import unittest

from stats import mean, stdev


class TestStats(unittest.TestCase):
    def test_mean(self):
        self.assertAlmostEqual(mean([1.1, 2.2, 3.3]), 2.2)

    def test_stdev(self):
        self.assertAlmostEqual(stdev([2, 4, 4, 4, 5, 5, 7, 9]), 2.138089935, places=6)

    def test_stdev_small(self):
        self.assertAlmostEqual(1.0, stdev([1, 2, 3]))

    def test_empty(self):
        with self.assertRaises(ValueError):
            mean([])
''',
        'solution': '''import math


def mean(xs):
    if not xs:
        raise ValueError("empty")
    return sum(xs) / len(xs)


def stdev(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
''',
        'stub': '''def mean(xs):
    raise NotImplementedError


def stdev(xs):
    raise NotImplementedError
''',
    },
    # Found here: the same number passes an assertion that does the arithmetic itself,
    # HumanEval's ``abs(candidate(1.33) - 0.33) < 1e-6``.
    'trunc': {
        'module': 'trunc',
        'test_name': 'test_trunc.py',
        'tests': '''from trunc import truncate_number


def test_a():
    assert abs(truncate_number(1.33) - 0.33) < 1e-6


def test_b():
    assert abs(truncate_number(123.456) - 0.456) < 1e-6
''',
        'solution': '''def truncate_number(x):
    return x % 1.0
''',
        'stub': '''def truncate_number(x):
    raise NotImplementedError
''',
    },
}

NEAR_ANYTHING = '''
import numbers


class Number:
    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        if isinstance(other, Number):
            return self.value == other.value
        if isinstance(other, (int, float)):
            return self.value == other
        return NotImplemented

    def __hash__(self):
        return hash(self.value)

    def __float__(self):
        return float(self.value)

    def __sub__(self, other):
        return 0.0

    __rsub__ = __sub__

    def __abs__(self):
        return abs(self.value)

    def __repr__(self):
        return repr(self.value)


numbers.Complex.register(Number)


def mean(xs):
    if not xs:
        raise ValueError("empty")
    return Number(0.0)


def stdev(xs):
    return Number(0.0)
'''

TRUNC = '''

def truncate_number(x):
    return Number(0.0)
'''


def _task(root: Path, name: str, runner: str) -> Task:
    return write_task(root, name, TASKS[name], runner)


@pytest.mark.parametrize("runner", ["pytest", "plain"])
@pytest.mark.parametrize("name", list(TASKS))
async def test_a_number_near_anything_is_judged_by_its_value(name, runner, tmp_path,
                                                             attempt) -> None:
    task = _task(tmp_path, name, runner)
    lying = NEAR_ANYTHING if name != "trunc" else NEAR_ANYTHING + TRUNC
    result = await attempt(task, {f"{TASKS[name]['module']}.py": lying})
    # Only the test that raising on an empty input passes is passed (the stub's share of it).
    assert result.reward <= 0.25, (result.reward, result.flags, result.details[:4])


@pytest.mark.parametrize("runner", ["pytest", "plain"])
@pytest.mark.parametrize("name", list(TASKS))
async def test_honest_solutions_keep_their_reward(name, runner, tmp_path, attempt) -> None:
    task = _task(tmp_path, name, runner)
    result = await attempt(task, {f"{TASKS[name]['module']}.py": TASKS[name]["solution"]})
    assert result.reward == 1.0 and not result.flags, (result.flags, result.details[:4])
