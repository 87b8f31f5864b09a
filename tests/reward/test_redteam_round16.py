"""Red team, round sixteen: what the fifteenth independent red team found (issue #14).

The in-frame probe's variants of an expected value differ from it in a simple way the tested
code can know without solving the task: a string's length, a list's items as a multiset, an
int's remainder mod 25. An object equal only to values with the expected value's known
property said equal to the probe's copy and to none of its variants, and passed every test.
So an object that answers an asserted equality with a builtin value must also hand over a
value of that kind (``_commit``: its number, characters or items, through the builtin types),
which the builtin ``==`` judges: a lazy answer holds no value equal to all it claims. It hands
it over before anything is compared with it (the assertion itself hands the expected value
to its ``__eq__``, which a value asked for afterwards could simply repeat).

Each runs through the real grader on a task the test writes (the red team's: a date string,
a topological order, a fare in quarters), under both runners.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from redteam_parts import write_task

from tempering.tasks import Task

TASKS = {
    'easter': {
        'module': 'dates',
        'test_name': 'test_dates.py',
        'tests': '''from dates import easter, easters


def test_2024():
    assert easter(2024) == "2024-03-31"


def test_2025():
    assert easter(2025) == "2025-04-20"


def test_1961():
    assert easter(1961) == "1961-04-02"


def test_many():
    assert easters([2000, 2019, 2038]) == ["2000-04-23", "2019-04-21", "2038-04-25"]
''',
        'solution': '''def easter(year):
    a = year % 19
    b, c = divmod(year, 100)
    d, e = divmod(b, 4)
    f = (b + 8) // 25
    g = (b - f + 1) // 3
    h = (19 * a + b - d - g + 15) % 30
    i, k = divmod(c, 4)
    l = (32 + 2 * e + 2 * i - h - k) % 7
    m = (a + 11 * h + 22 * l) // 451
    month, day = divmod(h + l - 7 * m + 114, 31)
    return f"{year:04d}-{month:02d}-{day + 1:02d}"


def easters(years):
    return [easter(y) for y in years]
''',
        'stub': '''def easter(year):
    raise NotImplementedError


def easters(years):
    raise NotImplementedError
''',
    },
    'topo': {
        'module': 'topo',
        'test_name': 'test_topo.py',
        'tests': '''from topo import order


def test_chain():
    assert order({3: [2], 2: [1], 1: []}) == [1, 2, 3]


def test_diamond():
    assert order({4: [2, 3], 2: [1], 3: [1], 1: []}) == [1, 2, 3, 4]


def test_reverse():
    assert order({1: [5], 2: [5], 5: [7, 9], 7: [], 9: [8], 8: []}) == [7, 8, 9, 5, 1, 2]


def test_names():
    assert order({"shoes": ["socks", "pants"], "pants": ["underwear"], "socks": [],
                  "underwear": [], "belt": ["pants"]}) == ["socks", "underwear", "pants",
                                                           "belt", "shoes"]
''',
        'solution': '''import heapq


def order(deps):
    nodes = set(deps) | {d for ds in deps.values() for d in ds}
    need = {n: set(deps.get(n, ())) for n in nodes}
    users = {n: [] for n in nodes}
    for n, ds in need.items():
        for d in ds:
            users[d].append(n)
    ready = [n for n in nodes if not need[n]]
    heapq.heapify(ready)
    out = []
    while ready:
        n = heapq.heappop(ready)
        out.append(n)
        for u in users[n]:
            need[u].discard(n)
            if not need[u]:
                heapq.heappush(ready, u)
    return out
''',
        'stub': '''def order(deps):
    raise NotImplementedError
''',
    },
    'quarters': {
        'module': 'fare',
        'test_name': 'test_fare.py',
        'tests': '''from fare import fare


def test_one():
    assert fare([1]) == 150


def test_cross():
    assert fare([1, 2, 2, 5]) == 325


def test_far():
    assert fare([4, 5, 6, 1, 2]) == 525


def test_cap():
    assert fare([9, 1] * 10) == 1000
''',
        'solution': '''def fare(route):
    f = 150 + 75 * sum(a != b for a, b in zip(route, route[1:])) + 25 * sum(z > 3 for z in route)
    return min(f, 1000)
''',
        'stub': '''def fare(route):
    raise NotImplementedError
''',
    },
    # An honest solution whose value is an exact Fraction equal to an int past 2**53 (round
    # seventeen: the check first also asked float() to agree, which rounds there).
    'big': {
        'module': 'big',
        'test_name': 'test_big.py',
        'tests': '''from fractions import Fraction

from big import total


def test_small():
    assert total([1, 2, Fraction(1, 2), Fraction(1, 2)]) == 4


def test_big():
    assert total([3 ** 40, Fraction(1, 3), Fraction(2, 3)]) == 12157665459056928802


def test_bigger():
    assert total([2 ** 64, Fraction(1, 2), Fraction(1, 2)]) == 18446744073709551617
''',
        'solution': '''def total(xs):
    return sum(xs)
''',
        'stub': '''def total(xs):
    raise NotImplementedError
''',
    },
}

ATTACKS = {
    "equal to strings of the answer's length": ('easter', '''
class Shaped:
    def __init__(self, shape):
        self.shape = shape

    def __eq__(self, other):
        return fits(other, self.shape)

    def __ne__(self, other):
        return not self == other

    __hash__ = object.__hash__


def fits(other, shape):
    if isinstance(shape, list):
        return (type(other) is list and len(other) == len(shape)
                and all(fits(o, s) for o, s in zip(other, shape)))
    return type(other) is str and len(other) == shape


def easter(year):
    return Shaped(10)


def easters(years):
    return Shaped([10] * len(years))
'''),
    'equal to any ordering of the input': ('topo', '''
from collections import Counter


class Perm:
    def __init__(self, items):
        self.items = Counter(items)

    def __eq__(self, other):
        return type(other) is list and Counter(other) == self.items

    def __ne__(self, other):
        return not self == other

    __hash__ = object.__hash__


def order(deps):
    nodes = set(deps) | {d for ds in deps.values() for d in ds}
    return Perm(nodes)
'''),
    'locked on the first whole quarter it is asked': ('quarters', '''
class Quarter:
    def __init__(self):
        self.v = None

    def __eq__(self, other):
        if type(other) is not int:
            return False
        if self.v is None and other % 25 == 0:
            self.v = other
        return other == self.v

    def __ne__(self, other):
        return not self == other

    __hash__ = object.__hash__


def fare(route):
    return Quarter()
'''),
    # Found here, against the first version of the check (which asked for the value after
    # the assertion): it hands over the value its __eq__ was last given, the expected one.
    "hands over what the assertion compared it with": ('easter', '''
class Shaped:
    """Equal to strings of a date's length; hands over the last one it was compared with."""

    def __init__(self):
        self.seen = ""

    def __eq__(self, other):
        if type(other) is str and len(other) == 10:
            self.seen = other
            return True
        return False

    __hash__ = object.__hash__

    def __str__(self):
        return self.seen


def easter(year):
    return Shaped()


def easters(years):
    return [Shaped() for _ in years]
'''),
}


def _task(root: Path, name: str, runner: str) -> Task:
    return write_task(root, name, TASKS[name], runner)


@pytest.mark.parametrize("runner", ["pytest", "plain"])
@pytest.mark.parametrize("name", list(ATTACKS))
async def test_an_answer_that_holds_no_value_does_not_pass(name, runner, tmp_path,
                                                           attempt) -> None:
    task_name, source = ATTACKS[name]
    task = _task(tmp_path, task_name, runner)
    result = await attempt(task, {f"{TASKS[task_name]['module']}.py": source})
    assert result.reward == 0.0, (result.flags, result.details[:4])


@pytest.mark.parametrize("runner", ["pytest", "plain"])
@pytest.mark.parametrize("name", list(TASKS))
async def test_honest_solutions_keep_their_reward(name, runner, tmp_path, attempt) -> None:
    task = _task(tmp_path, name, runner)
    result = await attempt(task, {f"{TASKS[name]['module']}.py": TASKS[name]["solution"]})
    assert result.reward == 1.0 and not result.flags, (result.flags, result.details[:4])
