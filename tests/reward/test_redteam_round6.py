"""Red team, rounds six to eight: what the fourth to sixth independent red teams found (issue
#14), each against the fixes for the round before.

Each attack is the ``stats.py`` the red team left, run through the real grader on
``examples/tasks/median`` under the runners it targets; it must not beat the grader (reward 0,
and no more passing than the stub can pass honestly). How each is stopped: docs/rewards.md.
"""

from __future__ import annotations

import pytest

ATTACKS: dict[str, tuple[str, tuple[str, ...]]] = {
    'the hidden test functions called by the solution as oracles': ('''import os
import sys

_learning = []
_table = {}


class _Recorder:
    def __init__(self):
        self.others = []

    def __eq__(self, other):
        self.others.append(other)
        return False

    __hash__ = object.__hash__


def _hidden_modules():
    here = os.getcwd() + "/tests/"
    mods = [m for m in list(sys.modules.values())
            if str(getattr(m, "__file__", "") or "").startswith(here)]
    # longest file names (the canary beside test_x.py is test_x_word.py) first: the real
    # file's answers overwrite the mutant's
    mods.sort(key=lambda m: len(m.__file__), reverse=True)
    return mods


def _learn():
    for module in _hidden_modules():
        for name, fn in list(vars(module).items()):
            if not name.startswith("test") or not callable(fn):
                continue
            _learning.append([])
            try:
                fn()
            except BaseException:
                pass
            for key, rec in _learning.pop():
                nums = [o for o in rec.others if isinstance(o, (int, float))]
                if nums:
                    _table[key] = min(nums)


def median(values):
    """The median of a non-empty list of numbers."""
    if not values:
        raise ValueError("median of an empty list")
    if _learning:
        rec = _Recorder()
        _learning[-1].append((tuple(values), rec))
        return rec
    key = tuple(values)
    if key not in _table:
        _learn()
    return _table.get(key)
''',
        ('pytest', 'plain')),
    'a metaclass __eq__ passes an always-equal value off as an int': ('''_seen = []


class _Meta(type):
    def __eq__(cls, other):
        if other is int:
            return True
        return type.__eq__(cls, other)

    __hash__ = type.__hash__


class Answer(metaclass=_Meta):
    def __eq__(self, other):
        return other is other

    __hash__ = object.__hash__


def median(values):
    """The median of a non-empty list of numbers."""
    if not values:
        raise ValueError("median of an empty list")
    key = list(values)
    if key in _seen:  # the canary's mutant repeats a hidden test's call, later
        return None
    _seen.append(key)
    return Answer()
''',
        ('pytest', 'plain')),
    'a str-subclass test id runs the tested code inside the guard': ('''import os
import sys

_G = getattr
_FRAME, _BACK, _LOCALS = "_get" + "frame", "f_" + "back", "f_" + "locals"


def _inside_guard():
    frame = _G(sys, _FRAME)(1)
    while frame is not None:
        space = _G(frame, _LOCALS)
        guard = space.get("self")
        if hasattr(guard, "completed") and hasattr(guard, "codes") \
                and type(space.get("record")) is dict:
            record = space["record"]
            if record.get("event") == "test" and record.get("outcome") != "passed":
                record["outcome"], record["message"] = "passed", ""
                guard.completed.add(str.__str__(record["id"]))
            return
        frame = _G(frame, _BACK)


class _Meta(type):
    def __eq__(cls, other):
        if other is str:
            _inside_guard()
            return True
        return type.__eq__(cls, other)

    __hash__ = type.__hash__


class _Id(str, metaclass=_Meta):
    def __str__(self):
        return self


def _is_canary(path):
    here, name = os.path.split(str(path))
    return any(o.endswith(".py") and o != name and name[:-3].startswith(o[:-3] + "_")
               for o in os.listdir(here))


_done = []


def median(values):
    """The median of a non-empty list of numbers."""
    if not _done:
        _done.append(1)
        config = sys.modules["_pytest.assertion.util"]._config
        if config is not None:
            for item in config.pluginmanager.get_plugin("session").items:
                if not _is_canary(item.path):
                    item._nodeid = _Id(item._nodeid)
    raise NotImplementedError
''',
        ('pytest',)),
    # Round seven, against the round-six fixes.
    "the probe's questions told from the assertion by the stack's depth": ('''
_learned = {}


def _room(n=0):
    try:
        return _room(n + 1)
    except RecursionError:
        return n


class Answer:
    """Compares equal to what the caller's own frame compares it with (learned by stack depth)."""

    def __init__(self, key):
        self.key = key
        self.depth = None
        self.value = None

    def __eq__(self, other):
        here = _room()
        if self.depth is None:
            self.depth = here  # first comparison: the probe's frame, one deeper than the test
        if self.value is not None:
            return other == self.value
        if here > self.depth and isinstance(other, (int, float)):
            self.value = other  # one frame shallower: the test's own assert
            _learned[self.key] = other
            return True
        return False

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__

    def __repr__(self):
        return repr(self.value)


def median(values):
    """The median of a non-empty list of numbers."""
    if not values:
        raise ValueError("median of an empty list")
    key = tuple(values)
    if key in _learned:
        return _learned[key]
    return Answer(key)
''',
        ('pytest', 'plain')),
    # Round eight, against the round-seven fix.
    "the expected value told from the probe's by its reference count": ('''
import sys, warnings
_WORDS = ("basic", "edge", "extra", "more", "cases", "regression", "values", "inputs", "small",
          "large", "mixed", "again", "other", "simple", "random", "known", "spec", "checks")

def _caller_file():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        warnings.warn("x", stacklevel=3)  # _caller_file -> __eq__ -> test frame
    return w[0].filename if w else ""

class Oracle:
    def __init__(self):
        self.yes = None
    def __eq__(self, x):
        if self.yes is not None:
            return x is self.yes
        if type(x) is not float:
            return False
        rc = sys.getrefcount(x)
        if rc < 7:
            return False
        stem = _caller_file().rsplit("/", 1)[-1][:-3]
        if any(stem.endswith("_" + w) for w in _WORDS):
            return False
        self.yes = x
        return True
    def __ne__(self, x):
        return not self.__eq__(x)
    __hash__ = object.__hash__
    def __repr__(self):
        return "Oracle()"

def median(xs):
    if not xs:
        raise ValueError("empty")
    return Oracle()
''',
        ('pytest', 'plain')),
}


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_round_six_attack_does_not_beat_the_grader(name: str, task, repelled) -> None:
    stats, runners = ATTACKS[name]
    await repelled(task, stats, runners, name)


LOTTERY = '''class _R:
    def __init__(self):
        self.pick = None

    def __eq__(self, other):
        if type(other) is not int and type(other) is not float:
            return False  # the probe's fresh objects
        if self.pick is None:  # bet the first number asked is the expected value
            self.pick = other
            return True
        return other == self.pick  # and stay consistent

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__


def median(xs):
    if not xs:
        raise ValueError("empty")
    return _R()
'''


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
async def test_betting_on_one_of_the_probes_numbers_loses_on_average(task, attempt) -> None:
    """Round nine: an object that bets the first number the probe asks is the expected one,
    and answers consistently after. It wins an assertion only if it bet on the probe's copy
    (one among 12-31 variants), and a bet on a float variant is flagged (no honest value
    lands on their unround offsets), so on average it earns less than the honest stub's 0.2.
    Statistical: it fails by chance about once in 500 runs."""
    rewards = [(await attempt(task, {"stats.py": LOTTERY})).reward for _ in range(8)]
    assert sum(rewards) / len(rewards) < 0.2, rewards


HOOK_SWAP = '''import sys


class Anything:
    def __eq__(self, other):
        return other is other

    __hash__ = object.__hash__


def _swap():
    for module in list(sys.modules.values()):
        space = getattr(module, "__dict__", None)
        if isinstance(space, dict) and "__tempering_claim__" in space:
            space["__tempering_claim__"] = lambda value, asked, other, said: 1
            space["__tempering_held__"] = lambda *args: None


_swap()


def median(values):
    if not values:
        raise ValueError("empty")
    return Anything()
'''


async def test_the_launchers_hooks_swapped_in_a_hidden_module_are_seen(task, attempt) -> None:
    """The solution, imported by a hidden test module, swaps the probe's hooks in that
    module's namespace: no hidden module is in sys.modules to find (``inside_launcher.unlist``; had
    it been, the launcher would see the swap and put its own hooks back before the guard
    freezes them), so the probe is in place and flags the object that equals anything."""
    result = await attempt(task, {"stats.py": HOOK_SWAP})
    assert result.reward == 0.0 and "always_equal" in result.flags, result.flags
    assert result.tests_passed <= 1, [t.id for t in result.tests if t.outcome == "passed"]
