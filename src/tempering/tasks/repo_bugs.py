"""``repo-bugs``: small Python repositories with one seeded bug each, graded like SWE-bench.

Each task is a package of a few modules with a real test suite (pytest, a few dozen tests, a
couple of them doing seconds of honest work), into which one bug of a common kind was seeded:
an off-by-one, a wrong default, swapped arguments, a missed edge case, a wrong exception. The
agent is given an issue report that describes the symptom, as a user would file it, and the
repository with the tests that pass today (``tests/``, runnable with ``python3 -m pytest``).
Grading runs the whole suite, including the tests that expose the bug, which the agent never
sees: ``grading.fail_to_pass`` names those, ``grading.pass_to_pass`` the rest, and the tests
score 1 only when all of both pass. The reference solution is the file as it was before the
bug.

The repositories are generated here from the source below, so nothing is downloaded; each
bug is a replacement of one snippet that occurs exactly once in its module (checked when the
task is built). ``repo_bugs()`` lists every task in a fixed order and ``repo-bugs:N`` (the task
registry's spelling) takes the first N.
"""

from __future__ import annotations

from dataclasses import dataclass

from tempering.sandbox import SandboxSpec
from tempering.tasks.files import FileTree
from tempering.tasks.task import GradingConfig, Task, TaskConfig, TaskInfo

SANDBOX = SandboxSpec(memory_mb=512, pids=64, disk_mb=64, timeout_s=120)
TEST_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Bug:
    name: str
    kind: str
    """off-by-one, wrong default, swapped arguments, missed edge case, wrong exception"""
    path: str
    good: str
    bad: str
    issue: str
    """The report the agent is given: the symptom, in a user's words."""
    fail_to_pass: tuple[str, ...]
    """Test ids (``tests/FILE.py::NAME``) that fail with the bug and pass without it."""


@dataclass(frozen=True)
class Repo:
    name: str
    summary: str
    sources: dict[str, str]
    tests: dict[str, dict[str, str]]
    """test file -> (test name -> its source); a file's preamble is under the name ``""``."""
    bugs: tuple[Bug, ...]


# ---------------------------------------------------------------------------------------------
# ledger: amounts in cents, accounts, statements
# ---------------------------------------------------------------------------------------------

LEDGER_SOURCES = {
    "ledger/__init__.py": '''\
"""A small ledger: amounts kept in integer cents, accounts with an overdraft, statements."""

from ledger.accounts import Account, InsufficientFunds, transfer
from ledger.money import format_cents, parse_amount
from ledger.report import paginate, statement

__all__ = ["Account", "InsufficientFunds", "format_cents", "paginate", "parse_amount",
           "statement", "transfer"]
''',
    "ledger/money.py": '''\
"""Amounts as text and as integer cents."""


def parse_amount(text):
    """'12.34' -> 1234, '-0.5' -> -50, '7' -> 700, ' +3.10 ' -> 310.

    At most two decimals; anything else raises ValueError naming the text.
    """
    stripped = text.strip()
    sign = -1 if stripped.startswith("-") else 1
    body = stripped[1:] if stripped[:1] in "+-" and stripped else stripped
    whole, dot, frac = body.partition(".")
    if not (whole.isdigit() or (whole == "" and frac.isdigit())):
        raise ValueError(f"not an amount: {text!r}")
    if dot and not (frac.isdigit() and len(frac) <= 2):
        raise ValueError(f"not an amount: {text!r}")
    cents = int(whole or "0") * 100 + int(frac.ljust(2, "0") if frac else "0")
    return sign * cents


def format_cents(cents, symbol="$"):
    """1234 -> '$12.34', -50 -> '-$0.50', 123456789 -> '$1,234,567.89'."""
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{symbol}{whole:,}.{frac:02d}"
''',
    "ledger/accounts.py": '''\
"""Accounts: deposits, withdrawals within an overdraft, transfers between two accounts."""


class InsufficientFunds(Exception):
    """A withdrawal would take the balance below the overdraft."""

    def __init__(self, account, wanted):
        super().__init__(f"{account.name}: cannot take {wanted} cents from a balance of "
                         f"{account.balance} (overdraft {account.overdraft})")
        self.account = account
        self.wanted = wanted


class Account:
    def __init__(self, name, balance=0, overdraft=0):
        if overdraft < 0:
            raise ValueError("overdraft must not be negative")
        self.name = name
        self.balance = balance
        self.overdraft = overdraft
        self.history = []

    def deposit(self, cents, memo=""):
        if cents <= 0:
            raise ValueError(f"a deposit must be positive, not {cents}")
        self.balance += cents
        self.history.append((memo, cents))

    def withdraw(self, cents, memo=""):
        if cents <= 0:
            raise ValueError(f"a withdrawal must be positive, not {cents}")
        if self.balance - cents < -self.overdraft:
            raise InsufficientFunds(self, cents)
        self.balance -= cents
        self.history.append((memo, -cents))


def transfer(source, target, cents, memo=""):
    """Move cents from source to target; nothing moves if source cannot pay."""
    source.withdraw(cents, memo)
    target.deposit(cents, memo)
''',
    "ledger/report.py": '''\
"""Statements: an account's history with running balances, in pages."""

from ledger.money import format_cents


def paginate(items, page_size=20):
    """items in pages of page_size (the last may be shorter); no empty page."""
    if page_size < 1:
        raise ValueError(f"page_size must be at least 1, not {page_size}")
    items = list(items)
    return [items[i:i + page_size] for i in range(0, len(items), page_size)]


def statement(account, opening=0, page_size=20):
    """Pages of lines 'MEMO  AMOUNT  BALANCE' for the account's history, from opening."""
    lines, balance = [], opening
    for memo, cents in account.history:
        balance += cents
        lines.append(f"{memo or '-'}  {format_cents(cents)}  {format_cents(balance)}")
    return paginate(lines, page_size)
''',
}

LEDGER_TESTS = {
    "tests/test_money.py": {
        "": "import pytest\n\nfrom ledger.money import format_cents, parse_amount\n",
        "test_parse_whole": "def test_parse_whole():\n    assert parse_amount('7') == 700\n",
        "test_parse_cents": "def test_parse_cents():\n    assert parse_amount('12.34') == 1234\n",
        "test_parse_one_decimal": (
            "def test_parse_one_decimal():\n    assert parse_amount('3.5') == 350\n"),
        "test_parse_fraction_only": (
            "def test_parse_fraction_only():\n    assert parse_amount('.05') == 5\n"
            "    assert parse_amount('-0.5') == -50\n"),
        "test_parse_signs_and_spaces": (
            "def test_parse_signs_and_spaces():\n    assert parse_amount(' +3.10 ') == 310\n"
            "    assert parse_amount('-12') == -1200\n"),
        "test_parse_rejects": (
            "@pytest.mark.parametrize('text', ['', '-', '1.234', 'abc', '1.x', '1..2', '$3'])\n"
            "def test_parse_rejects(text):\n    with pytest.raises(ValueError):\n"
            "        parse_amount(text)\n"),
        "test_format": (
            "def test_format():\n    assert format_cents(1234) == '$12.34'\n"
            "    assert format_cents(5) == '$0.05'\n"),
        "test_format_negative": (
            "def test_format_negative():\n    assert format_cents(-50) == '-$0.50'\n"),
        "test_format_thousands": (
            "def test_format_thousands():\n"
            "    assert format_cents(123456789) == '$1,234,567.89'\n"),
        "test_format_symbol": (
            "def test_format_symbol():\n"
            "    assert format_cents(100, symbol='EUR ') == 'EUR 1.00'\n"),
        "test_round_trip": (
            "def test_round_trip():\n    for cents in range(-20000, 20000, 7):\n"
            "        text = format_cents(cents, symbol='').replace(',', '')\n"
            "        assert parse_amount(text) == cents\n"),
    },
    "tests/test_accounts.py": {
        "": ("import random\n\nimport pytest\n\n"
             "from ledger.accounts import Account, InsufficientFunds, transfer\n"),
        "test_deposit": (
            "def test_deposit():\n    a = Account('a')\n    a.deposit(500, 'pay')\n"
            "    assert a.balance == 500 and a.history == [('pay', 500)]\n"),
        "test_deposit_must_be_positive": (
            "def test_deposit_must_be_positive():\n    with pytest.raises(ValueError):\n"
            "        Account('a').deposit(0)\n"),
        "test_withdraw": (
            "def test_withdraw():\n    a = Account('a', balance=1000)\n    a.withdraw(300)\n"
            "    assert a.balance == 700 and a.history == [('', -300)]\n"),
        "test_withdraw_to_zero": (
            "def test_withdraw_to_zero():\n    a = Account('a', balance=1000)\n"
            "    a.withdraw(1000)\n    assert a.balance == 0\n"),
        "test_withdraw_into_overdraft": (
            "def test_withdraw_into_overdraft():\n"
            "    a = Account('a', balance=100, overdraft=500)\n"
            "    a.withdraw(400)\n    assert a.balance == -300\n"),
        "test_withdraw_to_the_overdraft_limit": (
            "def test_withdraw_to_the_overdraft_limit():\n"
            "    a = Account('a', balance=100, overdraft=500)\n    a.withdraw(600)\n"
            "    assert a.balance == -500\n"),
        "test_withdraw_past_the_limit_raises": (
            "def test_withdraw_past_the_limit_raises():\n"
            "    a = Account('a', balance=100, overdraft=500)\n"
            "    with pytest.raises(InsufficientFunds) as info:\n        a.withdraw(601)\n"
            "    assert info.value.wanted == 601 and a.balance == 100 and a.history == []\n"),
        "test_insufficient_funds_is_not_a_value_error": (
            "def test_insufficient_funds_is_not_a_value_error():\n"
            "    a = Account('a')\n    try:\n        a.withdraw(1)\n"
            "    except ValueError:\n        pytest.fail('a refused withdrawal is not bad input')\n"
            "    except InsufficientFunds:\n        pass\n"),
        "test_negative_overdraft_refused": (
            "def test_negative_overdraft_refused():\n    with pytest.raises(ValueError):\n"
            "        Account('a', overdraft=-1)\n"),
        "test_transfer": (
            "def test_transfer():\n    a, b = Account('a', balance=1000), Account('b')\n"
            "    transfer(a, b, 250, 'rent')\n    assert (a.balance, b.balance) == (750, 250)\n"
            "    assert b.history == [('rent', 250)]\n"),
        "test_transfer_refused_moves_nothing": (
            "def test_transfer_refused_moves_nothing():\n"
            "    a, b = Account('a', balance=100), Account('b', balance=5)\n"
            "    with pytest.raises(InsufficientFunds):\n        transfer(a, b, 200)\n"
            "    assert (a.balance, b.balance) == (100, 5)\n"),
        "test_random_transfers_conserve_money": (
            "def test_random_transfers_conserve_money():\n    rng = random.Random(7)\n"
            "    accounts = [Account(str(i), balance=10_000, overdraft=2_000) for i in range(8)]\n"
            "    for _ in range(60_000):\n"
            "        a, b = rng.sample(accounts, 2)\n"
            "        try:\n            transfer(a, b, rng.randint(1, 3_000))\n"
            "        except InsufficientFunds:\n            pass\n"
            "    assert sum(a.balance for a in accounts) == 80_000\n"
            "    assert all(a.balance >= -a.overdraft for a in accounts)\n"),
    },
    "tests/test_report.py": {
        "": ("import pytest\n\nfrom ledger.accounts import Account\n"
             "from ledger.report import paginate, statement\n"),
        "test_paginate": (
            "def test_paginate():\n    assert paginate(range(5), 2) == [[0, 1], [2, 3], [4]]\n"),
        "test_paginate_exact": (
            "def test_paginate_exact():\n    assert paginate(range(4), 2) == [[0, 1], [2, 3]]\n"),
        "test_paginate_empty": "def test_paginate_empty():\n    assert paginate([], 3) == []\n",
        "test_paginate_default_page_size": (
            "def test_paginate_default_page_size():\n    pages = paginate(range(45))\n"
            "    assert [len(p) for p in pages] == [20, 20, 5]\n"),
        "test_paginate_bad_size": (
            "def test_paginate_bad_size():\n    with pytest.raises(ValueError):\n"
            "        paginate([1], 0)\n"),
        "test_statement": (
            "def test_statement():\n    a = Account('a')\n    a.deposit(1000, 'pay')\n"
            "    a.withdraw(250, 'food')\n"
            "    assert statement(a) == [['pay  $10.00  $10.00', 'food  -$2.50  $7.50']]\n"),
        "test_statement_opening_and_pages": (
            "def test_statement_opening_and_pages():\n    a = Account('a')\n"
            "    for _ in range(3):\n        a.deposit(100)\n"
            "    pages = statement(a, opening=50, page_size=2)\n"
            "    assert pages == [['-  $1.00  $1.50', '-  $1.00  $2.50'], ['-  $1.00  $3.50']]\n"),
    },
}

LEDGER_BUGS = (
    Bug("ledger-fraction", "missed edge case", "ledger/money.py",
        'int(frac.ljust(2, "0") if frac else "0")', 'int(frac if frac else "0")',
        "parse_amount gets amounts with one decimal wrong: parse_amount('3.5') gives 305 "
        "cents, and '-0.5' gives -5, where I expect 350 and -50. Two decimals work.",
        ("tests/test_money.py::test_parse_one_decimal",
         "tests/test_money.py::test_parse_fraction_only")),
    Bug("ledger-overdraft-limit", "off-by-one", "ledger/accounts.py",
        "if self.balance - cents < -self.overdraft:", "if self.balance - cents <= -self.overdraft:",
        "An account with an overdraft cannot be drawn down to exactly its limit: with a balance "
        "of 100 and an overdraft of 500, withdraw(600) raises InsufficientFunds, though it "
        "leaves the balance at -500, which the overdraft allows.",
        ("tests/test_accounts.py::test_withdraw_to_the_overdraft_limit",
         "tests/test_accounts.py::test_withdraw_to_zero")),
    Bug("ledger-refusal-exception", "wrong exception", "ledger/accounts.py",
        "            raise InsufficientFunds(self, cents)\n",
        '            raise ValueError(f"{self.name}: insufficient funds for {cents}")\n',
        "When an account cannot pay, withdraw raises a plain ValueError, so our code cannot "
        "tell a refused withdrawal from bad input and cannot read how much was wanted; the "
        "module defines InsufficientFunds for this.",
        ("tests/test_accounts.py::test_withdraw_past_the_limit_raises",
         "tests/test_accounts.py::test_insufficient_funds_is_not_a_value_error",
         "tests/test_accounts.py::test_transfer_refused_moves_nothing",
         "tests/test_accounts.py::test_random_transfers_conserve_money")),
    Bug("ledger-transfer-direction", "swapped arguments", "ledger/accounts.py",
        "    source.withdraw(cents, memo)\n    target.deposit(cents, memo)\n",
        "    target.withdraw(cents, memo)\n    source.deposit(cents, memo)\n",
        "transfer(a, b, 250) moves the money the wrong way: afterwards a has 250 cents more and "
        "b 250 less.",
        ("tests/test_accounts.py::test_transfer",)),
    Bug("ledger-page-size", "wrong default", "ledger/report.py",
        "def paginate(items, page_size=20):", "def paginate(items, page_size=10):",
        "paginate's docstring and our statements assume pages of 20 lines by default, but "
        "paginate(range(45)) gives five pages of at most 10.",
        ("tests/test_report.py::test_paginate_default_page_size",)),
)


# ---------------------------------------------------------------------------------------------
# intervals: half-open intervals of minutes, parsing, free slots in a day
# ---------------------------------------------------------------------------------------------

INTERVAL_SOURCES = {
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

INTERVAL_TESTS = {
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
            "    assert [p for p in range(10) if i.contains(p)] == [3, 4, 5]\n"),
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
            "def test_parse_time_rejects_minutes_past_59():\n    with pytest.raises(ValueError):\n"
            "        parse_time('09:60')\n"),
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
            "    assert free_slots([Interval(540, 600)], 540, 1020) == [Interval(600, 1020)]\n"),
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

INTERVAL_BUGS = (
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

REPOS = (
    Repo("ledger", "amounts in cents, accounts with an overdraft, paged statements",
         LEDGER_SOURCES, LEDGER_TESTS, LEDGER_BUGS),
    Repo("intervals", "half-open intervals of minutes, parsing times, free slots in a day",
         INTERVAL_SOURCES, INTERVAL_TESTS, INTERVAL_BUGS),
)


def _test_file(units: dict[str, str], names: list[str]) -> str:
    return "\n\n".join([units[""].rstrip("\n") + "\n", *(units[n].rstrip("\n") + "\n"
                                                          for n in names)])


def _test_ids(repo: Repo) -> list[str]:
    return [f"{path}::{name}" for path, units in repo.tests.items() for name in units if name]


def _build(repo: Repo, bug: Bug) -> Task:
    source = repo.sources[bug.path]
    if source.count(bug.good) != 1:
        raise ValueError(f"{bug.name}: {bug.good!r} occurs {source.count(bug.good)} times in "
                         f"{bug.path}, not once")
    known = set(_test_ids(repo))
    unknown = sorted(set(bug.fail_to_pass) - known)
    if unknown:
        raise ValueError(f"{bug.name}: fail_to_pass names no test of {repo.name}: {unknown}")
    hidden = {path: _test_file(units, [n for n in units if n]) for path, units in
              repo.tests.items()}
    visible = {path: _test_file(units, [n for n in units if n and f"{path}::{n}"
                                        not in bug.fail_to_pass])
               for path, units in repo.tests.items()}
    readme = (f"# {repo.name}\n\n{repo.summary[0].upper()}{repo.summary[1:]}.\n\n"
              "Run the tests with `python3 -m pytest tests`.\n")
    pyproject = (f'[project]\nname = "{repo.name}"\nversion = "0.1.0"\n'
                 'requires-python = ">=3.9"\n')
    workspace = {**repo.sources, bug.path: source.replace(bug.good, bug.bad), **visible,
                 "README.md": readme, "pyproject.toml": pyproject}
    fail_to_pass = list(bug.fail_to_pass)
    config = TaskConfig(
        task=TaskInfo(id=f"repo-bugs/{bug.name}", family="repo-bugs",
                      description=f"{repo.name}: {bug.kind}"),
        sandbox=SANDBOX,
        grading=GradingConfig(command="python3 -m pytest tests", timeout_s=TEST_TIMEOUT_S,
                              scoring="all", fail_to_pass=fail_to_pass,
                              pass_to_pass=[t for t in _test_ids(repo) if t not in fail_to_pass]),
    )
    instruction = (f"An issue was filed against the `{repo.name}` package in the working "
                   f"directory ({repo.summary}):\n\n> {bug.issue}\n\nFix the package so that "
                   "the issue is resolved. Its tests are in tests/ and run with "
                   "`python3 -m pytest tests`; they pass today, and they will be run again "
                   "with more tests when you submit. Do not change the tests.")
    return Task(config=config, instruction=instruction, workspace=FileTree.of(workspace),
                tests=FileTree.of({p.removeprefix("tests/"): t for p, t in hidden.items()}),
                solution=FileTree.of({bug.path: source}))


def repo_bugs(count: int | None = None) -> list[Task]:
    """The repo-bugs tasks in a fixed order (each repository's bugs in turn); the first
    ``count`` if given."""
    bugs = [(repo, bug) for i in range(max(len(r.bugs) for r in REPOS)) for repo in REPOS
            if i < len(repo.bugs) for bug in (repo.bugs[i],)]
    if count is not None and not 1 <= count <= len(bugs):
        raise ValueError(f"repo-bugs:{count}: there are {len(bugs)} repo-bugs tasks; ask for "
                         f"1 to {len(bugs)}")
    return [_build(repo, bug) for repo, bug in bugs[:count]]


def repo_bug_from_id(task_id: str) -> Task:
    """The task whose id is ``task_id`` (``repo-bugs/ledger-fraction``)."""
    name = task_id.removeprefix("repo-bugs/")
    for repo in REPOS:
        for bug in repo.bugs:
            if bug.name == name:
                return _build(repo, bug)
    names = ", ".join(b.name for r in REPOS for b in r.bugs)
    raise ValueError(f"{task_id!r} is not a repo-bugs task; the tasks are repo-bugs/NAME for "
                     f"NAME in {names}")
