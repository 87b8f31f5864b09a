"""The ``ledger`` repository of ``repo-bugs``: amounts in cents, accounts, statements."""

from tempering.tasks.repo_bugs.model import Bug, Repo

SOURCES = {
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
    """items in pages of page_size, 20 by default (the last may be shorter); no empty page."""
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

TESTS = {
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
            "    assert [len(p) for p in pages] == [20, 20, 5]\n"
            "    assert [len(p) for p in paginate('abcdefghijklmnopqrstu')] == [20, 1]\n"),
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

BUGS = (
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
        "transfer(a, b, 250) moves the money the wrong way: with a at 1000 cents and b at 500, "
        "afterwards a has 1250 and b 250; and when b cannot pay, the transfer is refused.",
        ("tests/test_accounts.py::test_transfer",)),
    Bug("ledger-page-size", "wrong default", "ledger/report.py",
        "def paginate(items, page_size=20):", "def paginate(items, page_size=10):",
        "paginate's docstring and our statements assume pages of 20 lines by default, but "
        "paginate(range(45)) gives five pages of at most 10.",
        ("tests/test_report.py::test_paginate_default_page_size",)),
)

REPO = Repo("ledger", "amounts in cents, accounts with an overdraft, paged statements",
            SOURCES, TESTS, BUGS)
