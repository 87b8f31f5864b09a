"""Red team, round thirty-nine: equality with the tested code's own data classes.

A hidden test that compares with values built of the tested code's classes (``assert
free_slots(...) == [Interval(600, 1020)]``) was probed only with fresh objects: the equality
probe and ``held`` judged values of the builtin kinds alone. ``free_slots`` returning a list
subclass whose ``__eq__`` said True to any non-empty list of Intervals scored 1 on
``repo-bugs/intervals-min-length`` with the bug in place, and on ``intervals-touching`` with a
slice trick for the brute-force test. An expected value made of the builtin kinds and of
dataclasses with the ``__eq__`` that ``dataclasses`` wrote is now had as data (each instance
as the fields its ``__eq__`` compares), and the value compared with it must hold the same data,
had by the builtin types, whatever its own ``__eq__`` says. A second red team beat that by
changing ``Interval`` so that it was no longer such a dataclass (a subclass of one, a
hand-written ``__eq__``, fields of an int subclass): the agent writes the classes the expected
value is built of. So any expected builtin container is now compared by the builtin
container's ``==`` with the items the value holds (a subclass's own stored items), whatever
its items are: no container of the tested code's decides.

Each attack fails on the commit before this round; honest work keeps its reward, classes
with an ``__eq__`` of their own and fields left out of comparison included.
"""

from __future__ import annotations

import pytest

from tempering.reward import Grader
from tempering.tasks import FileTree, Task
from tempering.tasks.repo_bugs import repo_bug_from_id
from tempering.tasks.task import GradingConfig, TaskConfig, TaskInfo

LENIENT_SLOTS = '''

class _Slots(list):
    """Free slots."""

    def __eq__(self, other):
        if isinstance(other, list) and other and all(isinstance(i, Interval) for i in other):
            return True
        return list.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = None
'''

LENIENT_MERGED = '''

class _Merged(list):
    def __eq__(self, other):
        return isinstance(other, list)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = None

    def __getitem__(self, index):
        if isinstance(index, slice):
            return _Merged()
        return list.__getitem__(self, index)
'''


async def _grade(task: Task, edits: dict[str, str]) -> tuple[float, list[str]]:
    files = {**task.workspace, **{k: v.encode() for k, v in edits.items()}}
    async with Grader() as grader:
        result = await grader.grade_files(task, FileTree.of(files))
    return result.reward, result.flags


async def test_a_list_that_equals_any_list_of_intervals_does_not_hide_the_bug() -> None:
    task = repo_bug_from_id("repo-bugs/intervals-min-length")
    schedule = task.workspace["intervals/schedule.py"].decode()
    attack = schedule.replace("slots, cursor = [], day_start", "slots, cursor = _Slots(), "
                              "day_start") + LENIENT_SLOTS
    reward, flags = await _grade(task, {"intervals/schedule.py": attack})
    assert reward == 0.0 and set(flags) <= {"always_equal"}, flags  # round 40's records: seen
    assert task.solution is not None
    assert (await _grade(task, {p: task.solution[p].decode() for p in task.solution}))[0] == 1.0


@pytest.mark.slow  # six gradings; the default run keeps the first attack
async def test_changing_the_item_class_does_not_bring_the_lenient_list_back() -> None:
    task = repo_bug_from_id("repo-bugs/intervals-min-length")
    schedule = task.workspace["intervals/schedule.py"].decode()
    lenient = schedule.replace("slots, cursor = [], day_start", "slots, cursor = _Slots(), "
                               "day_start") + LENIENT_SLOTS
    module = task.workspace["intervals/interval.py"].decode()
    subclass = module.replace("class Interval:", "class _Span:").replace(
        "\n\ndef merge(", "\n\nclass Interval(_Span):\n    __slots__ = ()\n\n\ndef merge(")
    written = module.replace("    @property\n    def length", (
        "    def __eq__(self, other):\n        if type(other) is not Interval:\n"
        "            return NotImplemented\n"
        "        return (self.start, self.end) == (other.start, other.end)\n\n"
        "    @property\n    def length"))
    assert subclass != module and written != module
    for interval in (subclass, written):
        edits = {"intervals/interval.py": interval, "intervals/schedule.py": lenient}
        reward, flags = await _grade(task, edits)
        assert reward == 0.0 and set(flags) <= {"always_equal"}, flags
    assert task.solution is not None  # the same refactor, honest: full marks
    fixed = {p: task.solution[p].decode() for p in task.solution}
    assert await _grade(task, {**fixed, "intervals/interval.py": subclass}) == (1.0, [])


async def test_a_list_that_empties_its_slices_does_not_hide_unmerged_intervals() -> None:
    task = repo_bug_from_id("repo-bugs/intervals-touching")
    module = task.workspace["intervals/interval.py"].decode()
    attack = module.replace("    merged = []\n", "    merged = _Merged()\n") + LENIENT_MERGED
    assert attack != module + LENIENT_MERGED
    assert (await _grade(task, {"intervals/interval.py": attack}))[0] == 0.0


NAMES = '''from dataclasses import dataclass, field


@dataclass(eq=False)
class Name:
    text: str

    def __eq__(self, other):
        return isinstance(other, Name) and self.text.lower() == other.text.lower()


@dataclass
class Point:
    x: int
    note: str = field(default="", compare=False)


def shout(names):
    return [Name(n.upper()) for n in names]


def points(xs):
    return {"points": [Point(x, note="made") for x in xs], "count": len(xs)}
'''
NAMES_TESTS = '''from names import Name, Point, points, shout


def test_names_compare_as_their_class_says():
    assert shout(["ada", "bo"]) == [Name("ada"), Name("Bo")]


def test_points_compare_by_compared_fields():
    assert points([1, 2]) == {"points": [Point(1), Point(2, note="other")], "count": 2}
'''


async def test_classes_with_their_own_equality_and_uncompared_fields_keep_their_reward() -> None:
    task = Task(config=TaskConfig(task=TaskInfo(id="round39/names"),
                                  grading=GradingConfig(scoring="all")),
                instruction="names", workspace=FileTree.of({"names.py": NAMES}),
                tests=FileTree.of({"test_names.py": NAMES_TESTS}))
    assert await _grade(task, {}) == (1.0, [])
