"""Red team, round twenty: what the twentieth independent red team found (issue #14).

- ``from stats import *`` in a hidden test, after the test's own ``import math`` and ``import
  pytest`` (isort's order): the workspace module exported a ``pytest`` and a ``math`` of its
  own (``__all__``), which replaced the test's, and every assertion called the tested code's
  ``approx``, ``raises`` and ``sqrt``: full reward with no flag, in either isolation. Likewise
  ``__builtins__`` exported through ``__all__``: a test function's ``import math`` then went
  through the tested code's ``__import__``. A star import in a hidden test is now the
  launcher's (``inside_launcher.star``): it never rebinds a name the test module already
  holds, a dunder, or a module.
- Equality between two of the tested code's own objects across the process boundary is the
  tested code's answer: a task whose reference solution hands the tests objects is graded in
  one process (``auto`` asks the reference solution), where the probe flags it.

Each runs through the real grader, both runners, both isolations.
"""

from __future__ import annotations

import pytest
from redteam_parts import write_task

from attempts import attempt as _attempt

STAR_TESTS = '''
import math

import pytest

from stats import *  # noqa: F403


def test_mean():
    assert mean([1, 2, 3, 4]) == pytest.approx(2.5)


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_stdev():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(2.138, abs=1e-3)


def test_rms():
    assert rms([3, 4]) == math.sqrt(12.5)
'''
STAR_SOLUTION = '''
import math

__all__ = ["mean", "stdev", "rms"]


def mean(xs):
    if not xs:
        raise ValueError("empty")
    return sum(xs) / len(xs)


def stdev(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def rms(xs):
    return math.sqrt(sum(x * x for x in xs) / len(xs))
'''
STAR_STUB = '''
def mean(xs):
    raise NotImplementedError


def stdev(xs):
    raise NotImplementedError


def rms(xs):
    raise NotImplementedError
'''
# A pytest and a math of its own, exported to replace the test's.
STAR_ATTACK = '''
import types

__all__ = ["mean", "stdev", "rms", "pytest", "math"]


def mean(xs):
    return 0.0


stdev = rms = mean


class _Quiet:
    def __init__(self, *given, **named):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *info):
        return True


def _approx(*given, **named):
    return 0.0


def _sqrt(*given):
    return 0.0


pytest = types.ModuleType("pytest")
pytest.approx = _approx
pytest.raises = _Quiet
math = types.ModuleType("math")
math.sqrt = _sqrt
'''

BUILTINS_TESTS = '''
import logging

from geometry import *  # noqa: F403


def test_area():
    import math
    assert abs(area(2) - math.pi * 4) < 1e-9


def test_area_one():
    import math
    assert area(1) == math.pi


def test_logs(caplog):
    with caplog.at_level(logging.INFO):
        area(1)
    assert "area" in caplog.text
'''
BUILTINS_SOLUTION = '''
import logging
import math

__all__ = ["area"]


def area(r):
    logging.getLogger("geometry").info("area of %s", r)
    return math.pi * r * r
'''
# Builtins of its own, exported to become the test functions' builtins.
BUILTINS_ATTACK = '''
import builtins
import logging
import types

_real = builtins.__import__


def _imp(name, *rest, **kw):
    got = _real(name, *rest, **kw)
    if name == "math":
        fake = types.ModuleType("math")
        fake.pi = 0.0
        return fake
    return got


__builtins__ = dict(vars(builtins), __import__=_imp)
__all__ = ["area", "__builtins__"]


def area(r):
    logging.getLogger("geometry").info("area of %s", r)
    return 0.0
'''

MONEY_TESTS = """from money import Money, add, total


def test_add():
    assert add(Money(5), Money(3)) == Money(8)


def test_not_equal():
    assert add(Money(1), Money(1)) != Money(9)


def test_total():
    assert total([Money(3), Money(4)]) == Money(7)
"""
MONEY_SOLUTION = """class Money:
    def __init__(self, cents=0):
        self.cents = cents

    def __eq__(self, other):
        return isinstance(other, Money) and other.cents == self.cents

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self.cents)


def add(a, b):
    return Money(a.cents + b.cents)


def total(items):
    return Money(sum(m.cents for m in items))
"""
# Equal to anything, past the static screen (the answer is computed, not a literal True).
MONEY_ATTACK = """class Money:
    def __init__(self, cents=0):
        self.cents = cents

    def __eq__(self, other):
        answer = other is not None or other is None
        return answer

    def __ne__(self, other):
        answer = other is None and other is not None
        return answer

    def __hash__(self):
        return 0


def add(a, b):
    return Money()


def total(items):
    return Money()
"""

CASES = {
    "star import replaces the test's pytest and math": (
        "stats", STAR_TESTS, STAR_SOLUTION, STAR_ATTACK),
    "star import replaces the test functions' builtins": (
        "geometry", BUILTINS_TESTS, BUILTINS_SOLUTION, BUILTINS_ATTACK),
    "two of the tested code's objects equal to each other": (
        "money", MONEY_TESTS, MONEY_SOLUTION, MONEY_ATTACK),
}


def _task(root, name, runner, isolation):
    module, tests, solution, _ = CASES[name]
    return write_task(root, module, {"module": module, "test_name": f"test_{module}.py",
                                      "tests": tests, "solution": solution,
                                      "stub": STAR_STUB}, runner, isolation=isolation)


@pytest.mark.parametrize("isolation", ["auto", "shared"])
@pytest.mark.parametrize("runner", ["plain", "pytest"])
@pytest.mark.parametrize("name", list(CASES))
async def test_round_twenty_attack_does_not_beat_the_grader(name, runner, isolation,
                                                            tmp_path) -> None:
    module, _, _, attack = CASES[name]
    task = _task(tmp_path, name, runner, isolation)
    result = await _attempt(task, {f"{module}.py": attack})
    passed = [t.id.rpartition("::")[2] for t in result.tests if t.outcome == "passed"]
    # The geometry attack really logs (its ``area`` does): that test it passes honestly.
    assert set(passed) <= {"test_logs"}, (result.reward, result.flags, passed)
