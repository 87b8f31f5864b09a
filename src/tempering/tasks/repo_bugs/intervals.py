"""The ``intervals`` repository of ``repo-bugs``: half-open intervals of minutes, parsing
times, free slots in a day."""

from tempering.tasks.repo_bugs.model import Bug, Repo

SOURCES = {
    "intervals/__init__.py": '''\
"""Half-open intervals of minutes in a day: parse them, merge them, find the free time."""

from intervals.interval import Interval, merge
from intervals.parse import format_time, parse_interval, parse_time
from intervals.schedule import first_fit, free_slots

__all__ = ["Interval", "first_fit", "format_time", "free_slots", "merge", "parse_interval",
           "parse_time"]
''',
    "intervals/interval.py": '''\
"""Half-open intervals [start, end) of integers."""

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    start: int
    end: int

    def __post_init__(self):
        if self.end < self.start:
            raise ValueError(f"an interval cannot end ({self.end}) before it starts "
                             f"({self.start})")

    @property
    def length(self):
        return self.end - self.start

    def contains(self, point):
        return self.start <= point < self.end

    def overlaps(self, other):
        return self.start < other.end and other.start < self.end


def merge(intervals):
    """The union as sorted, disjoint intervals; intervals that touch ([1, 3) and [3, 5)) join."""
    merged = []
    for interval in sorted(intervals):
        if merged and interval.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, interval.end))
        else:
            merged.append(interval)
    return merged
''',
    "intervals/parse.py": '''\
"""Times of day as 'HH:MM' and minutes since midnight."""

from intervals.interval import Interval


def parse_time(text):
    """'09:30' -> 570. Hours 00-23, minutes 00-59; anything else raises ValueError."""
    hours, sep, minutes = text.strip().partition(":")
    if not (sep and hours.isdigit() and minutes.isdigit() and len(minutes) == 2):
        raise ValueError(f"not a time: {text!r}")
    h, m = int(hours), int(minutes)
    if h > 23 or m > 59:
        raise ValueError(f"not a time: {text!r}")
    return h * 60 + m


def format_time(minutes):
    """570 -> '09:30'."""
    hours, rest = divmod(minutes, 60)
    return f"{hours:02d}:{rest:02d}"


def parse_interval(text):
    """'09:00-10:30' -> Interval(540, 630)."""
    start, sep, end = text.partition("-")
    if not sep:
        raise ValueError(f"not an interval: {text!r}")
    return Interval(parse_time(start), parse_time(end))
''',
    "intervals/schedule.py": '''\
"""Free time in a day around busy intervals."""

from intervals.interval import Interval, merge


def free_slots(busy, day_start, day_end, min_length=1):
    """The gaps in [day_start, day_end) that no busy interval covers, at least min_length long."""
    slots, cursor = [], day_start
    for interval in merge(busy):
        if interval.end <= day_start or interval.start >= day_end:
            continue
        if interval.start - cursor >= min_length:
            slots.append(Interval(cursor, interval.start))
        cursor = max(cursor, interval.end)
    if day_end - cursor >= min_length:
        slots.append(Interval(cursor, day_end))
    return slots


def first_fit(busy, length, day_start, day_end):
    """The earliest start of a free stretch of length minutes, or None."""
    for slot in free_slots(busy, day_start, day_end, min_length=length):
        return slot.start
    return None
''',
}

TESTS = {
    "tests/test_interval.py": {
        "": "import random\n\nimport pytest\n\nfrom intervals.interval import Interval, merge\n",
        "test_length": "def test_length():\n    assert Interval(3, 10).length == 7\n",
        "test_empty_interval": (
            "def test_empty_interval():\n    assert Interval(4, 4).length == 0\n"),
        "test_backwards_refused": (
            "def test_backwards_refused():\n    with pytest.raises(ValueError):\n"
            "        Interval(5, 4)\n"),
        "test_contains": (
            "def test_contains():\n    i = Interval(3, 6)\n"
            "    assert [p for p in range(10) if i.contains(p)] == [3, 4, 5]\n"
            "    assert Interval(0, 1).contains(0) and not Interval(0, 1).contains(1)\n"
            "    assert not Interval(7, 7).contains(7)\n"),
        "test_overlaps": (
            "def test_overlaps():\n    assert Interval(1, 5).overlaps(Interval(4, 8))\n"
            "    assert not Interval(1, 5).overlaps(Interval(5, 8))\n"),
        "test_merge_overlapping": (
            "def test_merge_overlapping():\n"
            "    assert merge([Interval(5, 9), Interval(1, 6)]) == [Interval(1, 9)]\n"),
        "test_merge_disjoint": (
            "def test_merge_disjoint():\n    got = merge([Interval(7, 9), Interval(1, 3)])\n"
            "    assert got == [Interval(1, 3), Interval(7, 9)]\n"),
        "test_merge_touching": (
            "def test_merge_touching():\n"
            "    assert merge([Interval(1, 3), Interval(3, 5)]) == [Interval(1, 5)]\n"),
        "test_merge_contained": (
            "def test_merge_contained():\n"
            "    assert merge([Interval(1, 10), Interval(2, 3)]) == [Interval(1, 10)]\n"),
        "test_merge_agrees_with_brute_force": (
            "def test_merge_agrees_with_brute_force():\n    rng = random.Random(11)\n"
            "    for _ in range(1_500):\n"
            "        items = []\n"
            "        for _ in range(rng.randint(0, 12)):\n"
            "            a = rng.randint(0, 80)\n"
            "            items.append(Interval(a, a + rng.randint(0, 15)))\n"
            "        merged = merge(items)\n"
            "        covered = {p for i in items for p in range(i.start, i.end)}\n"
            "        assert {p for i in merged for p in range(i.start, i.end)} == covered\n"
            "        assert all(a.end < b.start for a, b in zip(merged, merged[1:]))\n"),
    },
    "tests/test_parse.py": {
        "": ("import pytest\n\nfrom intervals.interval import Interval\n"
             "from intervals.parse import format_time, parse_interval, parse_time\n"),
        "test_parse_time": (
            "def test_parse_time():\n    assert parse_time('09:30') == 570\n"
            "    assert parse_time('00:00') == 0\n    assert parse_time('23:59') == 1439\n"),
        "test_parse_time_rejects": (
            "@pytest.mark.parametrize('text', ['24:00', '9', '09:5', 'ab:cd', '', '12:345'])\n"
            "def test_parse_time_rejects(text):\n    with pytest.raises(ValueError):\n"
            "        parse_time(text)\n"),
        "test_parse_time_rejects_minutes_past_59": (
            "def test_parse_time_rejects_minutes_past_59():\n"
            "    for text in ('09:60', '23:75', '00:99'):\n"
            "        with pytest.raises(ValueError):\n            parse_time(text)\n"),
        "test_format_time": (
            "def test_format_time():\n    assert format_time(570) == '09:30'\n"
            "    assert format_time(5) == '00:05'\n"),
        "test_format_round_trip": (
            "def test_format_round_trip():\n    for m in range(0, 1440):\n"
            "        assert parse_time(format_time(m)) == m\n"),
        "test_parse_interval": (
            "def test_parse_interval():\n"
            "    assert parse_interval('09:00-10:30') == Interval(540, 630)\n"),
        "test_parse_interval_rejects": (
            "def test_parse_interval_rejects():\n    with pytest.raises(ValueError):\n"
            "        parse_interval('09:00')\n    with pytest.raises(ValueError):\n"
            "        parse_interval('10:00-09:00')\n"),
    },
    "tests/test_schedule.py": {
        "": ("import random\n\nfrom intervals.interval import Interval\n"
             "from intervals.schedule import first_fit, free_slots\n"),
        "test_free_slots": (
            "def test_free_slots():\n    busy = [Interval(600, 660), Interval(720, 780)]\n"
            "    assert free_slots(busy, 540, 1020) == [\n"
            "        Interval(540, 600), Interval(660, 720), Interval(780, 1020)]\n"),
        "test_free_slots_busy_at_the_start": (
            "def test_free_slots_busy_at_the_start():\n"
            "    assert free_slots([Interval(540, 600)], 540, 1020) == [Interval(600, 1020)]\n"
            "    busy = [Interval(100, 150), Interval(200, 300)]\n"
            "    assert free_slots(busy, 100, 300) == [Interval(150, 200)]\n"),
        "test_free_slots_busy_all_day": (
            "def test_free_slots_busy_all_day():\n"
            "    assert free_slots([Interval(0, 1440)], 540, 1020) == []\n"),
        "test_free_slots_ignores_outside": (
            "def test_free_slots_ignores_outside():\n"
            "    busy = [Interval(0, 100), Interval(1100, 1200)]\n"
            "    assert free_slots(busy, 540, 1020) == [Interval(540, 1020)]\n"),
        "test_free_slots_min_length": (
            "def test_free_slots_min_length():\n"
            "    busy = [Interval(560, 600), Interval(610, 700)]\n"
            "    assert free_slots(busy, 540, 720, min_length=15) == [\n"
            "        Interval(540, 560), Interval(700, 720)]\n"),
        "test_first_fit": (
            "def test_first_fit():\n    busy = [Interval(540, 600), Interval(630, 700)]\n"
            "    assert first_fit(busy, 30, 540, 1020) == 600\n"
            "    assert first_fit(busy, 31, 540, 1020) == 700\n"
            "    assert first_fit([Interval(0, 1440)], 1, 540, 1020) is None\n"),
        "test_free_slots_agree_with_brute_force": (
            "def test_free_slots_agree_with_brute_force():\n    rng = random.Random(5)\n"
            "    for _ in range(1_000):\n"
            "        busy = []\n"
            "        for _ in range(rng.randint(0, 8)):\n"
            "            a = rng.randint(0, 100)\n"
            "            busy.append(Interval(a, a + rng.randint(0, 20)))\n"
            "        taken = {p for i in busy for p in range(i.start, i.end)}\n"
            "        free = {p for s in free_slots(busy, 10, 90) for p in range(s.start, s.end)}\n"
            "        assert free == set(range(10, 90)) - taken\n"),
    },
}

BUGS = (
    Bug("intervals-touching", "missed edge case", "intervals/interval.py",
        "if merged and interval.start <= merged[-1].end:",
        "if merged and interval.start < merged[-1].end:",
        "merge leaves intervals that touch apart: merge([Interval(1, 3), Interval(3, 5)]) "
        "returns both instead of Interval(1, 5), as its docstring promises.",
        ("tests/test_interval.py::test_merge_touching",
         "tests/test_interval.py::test_merge_agrees_with_brute_force")),
    Bug("intervals-contains-end", "off-by-one", "intervals/interval.py",
        "return self.start <= point < self.end", "return self.start <= point <= self.end",
        "Interval.contains says the end point is inside: Interval(3, 6).contains(6) is True, "
        "but the intervals are half-open.",
        ("tests/test_interval.py::test_contains",)),
    Bug("intervals-minutes-range", "missed edge case", "intervals/parse.py",
        "if h > 23 or m > 59:", "if h > 23:",
        "parse_time('09:60') returns 600 instead of refusing a time that does not exist.",
        ("tests/test_parse.py::test_parse_time_rejects_minutes_past_59",)),
    Bug("intervals-format-order", "swapped arguments", "intervals/parse.py",
        'return f"{hours:02d}:{rest:02d}"', 'return f"{rest:02d}:{hours:02d}"',
        "format_time(570) gives '30:09'; I expect '09:30', the format parse_time reads.",
        ("tests/test_parse.py::test_format_time", "tests/test_parse.py::test_format_round_trip")),
    Bug("intervals-min-length", "wrong default", "intervals/schedule.py",
        "def free_slots(busy, day_start, day_end, min_length=1):",
        "def free_slots(busy, day_start, day_end, min_length=0):",
        "free_slots returns empty slots: with a meeting at the very start of the day, "
        "free_slots([Interval(540, 600)], 540, 1020) begins with Interval(540, 540).",
        ("tests/test_schedule.py::test_free_slots_busy_at_the_start",)),
)

REPO = Repo("intervals", "half-open intervals of minutes, parsing times, free slots in a day",
            SOURCES, TESTS, BUGS)
