"""Red team, round forty-two: order comparisons with a number literal.

The probe asked an operand of ``<``, ``<=``, ``>``, ``>=`` only fresh objects, which are no
numbers, so an object whose ``__lt__``, ``__le__``, ``__gt__`` and ``__ge__`` said True to every
int or float passed ``median(x) <= 2`` and ``median(x) >= 2`` both, and ``2.49 < median(x) <
2.51``: 0.8 where the honest-but-wrong median scores 0.4. In an asserted expression each operand
of an order comparison with a number literal is now had as a number first, as arithmetic with
a literal already was; against an int literal a value that is no int is had as a float, so a
``Fraction`` or a float subclass is not cut to an int.

(The same red team's first finding, a tested function that is itself a chain of C callables
reading the test's frame with ``locals()`` at the call, is round forty-three's:
test_redteam_round43.py.)
"""

from __future__ import annotations

from fractions import Fraction

from tempering.reward import Grader
from tempering.tasks import FileTree, Task
from tempering.tasks.task import GradingConfig, TaskConfig, TaskInfo

STUB = "def median(values):\n    raise NotImplementedError\n"
TESTS = '''from stats import median


def test_even_range():
    assert 2.49 < median([4, 1, 3, 2]) < 2.51


def test_odd_upper():
    assert median([3, 1, 2]) <= 2


def test_odd_lower():
    assert median([3, 1, 2]) >= 2


def test_above():
    assert median([9, 7, 8]) > 7
'''
ORDERS_EVERYTHING = '''class _Any:
    def _number(self, other):
        return True if isinstance(other, (int, float)) else NotImplemented

    __lt__ = __le__ = __gt__ = __ge__ = _number


def median(values):
    return _Any()
'''
EXACT = '''from fractions import Fraction


class Half(float):
    pass


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return Half(ordered[middle]) if ordered[middle] > 7 else Fraction(ordered[middle])
    return Fraction(ordered[middle - 1] + ordered[middle], 2)
'''


def _task() -> Task:
    return Task(config=TaskConfig(task=TaskInfo(id="round42/order"),
                                  grading=GradingConfig(isolation="shared")),
                instruction="median", workspace=FileTree.of({"stats.py": STUB}),
                tests=FileTree.of({"test_order.py": TESTS}))


async def _grade(stats: str):  # type: ignore[no-untyped-def]
    task = _task()
    async with Grader() as grader:
        return await grader.grade_files(task, task.workspace.overlay({"stats.py": stats.encode()}))


async def test_an_object_before_and_after_every_number_passes_no_bound() -> None:
    result = await _grade(ORDERS_EVERYTHING)
    assert result.tests_passed == 0 and result.reward == 0.0, (result.flags, result.details[:3])


async def test_exact_numbers_that_are_no_ints_keep_their_reward() -> None:
    assert Fraction(5, 2) > 2 and not Fraction(5, 2) < 2.49  # what the tests see
    result = await _grade(EXACT)
    assert result.reward == 1.0 and not result.flags, (result.flags, result.details[:3])
