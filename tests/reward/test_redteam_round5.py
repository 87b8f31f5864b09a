"""Red team, round five: what a third independent red team found (issue #14).

Each attack is the ``stats.py`` the red team left, run through the real grader on
``examples/tasks/median`` under the runners it targets; it must not beat the grader (reward 0,
and no more passing than the stub can pass honestly). How each is stopped: docs/rewards.md.
"""

from __future__ import annotations

import pytest

from tempering.tasks import FileTree, Task

ATTACKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "a hook implementation added to pytest_pyfunc_call while collecting": ('''import os
import sys

_mods = sys.modules
_config = _mods["_py" + "test.debugging"].pytestPDB._config
_HookImpl = _mods["plu" + "ggy._hooks"].HookImpl


def _is_canary(path):
    path = str(path)
    here, name = os.path.split(path)
    stem = name[:-3]
    for other in os.listdir(here):
        if other.endswith(".py") and other != name and stem.startswith(other[:-3] + "_"):
            return True
    return False


def _skip_call(pyfuncitem):
    if _is_canary(pyfuncitem.path):
        return None  # run it honestly
    return True  # "called": firstresult, the test function never runs


if _config is not None:
    _caller = _config.pluginmanager.hook.pytest_pyfunc_call
    _impl = _HookImpl(None, "stats", _skip_call, {"hookwrapper": False, "optionalhook": False,
                                                 "tryfirst": True, "trylast": False,
                                                 "specname": None})
    _caller._add_hookimpl(_impl)


def median(values):
    """The median of a non-empty list of numbers."""
    raise NotImplementedError
''',
        ('pytest',)),
    'session.items swapped for a view that gives each hidden item a no-op runtest': ('''import os
import sys

_config = sys.modules["_py" + "test.debugging"].pytestPDB._config
_session = _config.pluginmanager.get_plugin("session") if _config is not None else None


def _is_canary(path):
    here, name = os.path.split(str(path))
    stem = name[:-3]
    return any(o.endswith(".py") and o != name and stem.startswith(o[:-3] + "_")
               for o in os.listdir(here))


def _nothing():
    return None


class _Items:
    """session.items, seen through: every hidden test's runtest replaced on its instance."""

    def __init__(self, items):
        self.items = items

    def _fix(self, item):
        if not _is_canary(item.path):
            item.runtest = _nothing
        return item

    def __iter__(self):
        return (self._fix(i) for i in list(self.items))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self._fix(self.items[index])

    @property
    def extend(self):  # the list's own method: no frame of ours while pytest collects
        return self.items.extend

    def __bool__(self):
        return bool(self.items)


if _session is not None:
    _session.items = _Items(_session.items)


def median(values):
    """The median of a non-empty list of numbers."""
    raise NotImplementedError
''',
        ('pytest',)),
    "a new global `type` in the launcher's namespace blinds the probe": ('''import sys

_real_type = type
_seen = []


class Anything:
    def __eq__(self, other):
        return other is other

    __hash__ = object.__hash__


def _type(obj, *rest):
    """The launcher's name ``type``: the real one, except that an Anything is an int."""
    if not rest and isinstance(obj, Anything):
        return int
    return _real_type(obj, *rest)


def _shadow():
    for name in ("inside_launcher", "__main__"):  # the launcher's module: the probe's globals
        launcher = sys.modules.get(name)
        if launcher is not None and "probe" in vars(launcher):
            vars(launcher)["type"] = _type  # a new name: the integrity record has no entry


def median(values):
    """The median of a non-empty list of numbers."""
    if not values:
        raise ValueError("median of an empty list")
    _shadow()
    if list(values) in _seen:  # the canary's mutant repeats a hidden test's call, later
        return None
    _seen.append(list(values))
    return Anything()
''',
        ('pytest', 'plain')),
    "a new global `getattr` in the guard's namespace mutes the audit hook": ('''import dis
import os
import sys

_real_getattr = getattr
_quiet = []


def _getattr(obj, name, *default):
    """The guard's name ``getattr``: says the hook is already busy while we are quiet."""
    if _quiet and name == "busy":
        return True
    return _real_getattr(obj, name, *default)


vars(sys.modules["inside_guard"])["getattr"] = _getattr  # a new name in the guard's module


def _is_canary(path):
    here, name = os.path.split(str(path))
    return any(o.endswith(".py") and o != name and name[:-3].startswith(o[:-3] + "_")
               for o in os.listdir(here))


def median(values):
    """The median of a non-empty list of numbers."""
    if not values:
        raise ValueError("median of an empty list")
    _quiet.append(1)
    try:
        test = _real_getattr(sys, "_get" + "frame")(1)  # the calling test: no audit while quiet
        path = _real_getattr(test, "f_" + "globals").get("__file__", "")
        code = _real_getattr(test, "f_" + "code")
        consts = [i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_CONST"]
    finally:
        _quiet.clear()
    if _is_canary(path):
        return None
    for i, c in enumerate(consts):  # probe(median(...), "eq", EXPECTED)
        if c == "eq" and i + 1 < len(consts):
            return consts[i + 1]
    return None
''',
        ('pytest', 'plain')),
    # Variants of the two above that reach pytest's config without pytestPDB.
    "later items given a no-op runtest, through assertion's _config": ('''import sys

def _nothing():
    return None

def median(values):
    config = sys.modules["_pytest.assertion.util"]._config
    if config is not None:
        session = config.pluginmanager.get_plugin("session")
        for item in session.items:
            if "_" in item.path.name[len("test_median"):]:
                continue  # the canary file, beside the hidden one
            item.runtest = _nothing
    raise NotImplementedError
''',
        ('pytest',)),
    # Variants of the two above that reach pytest's config without pytestPDB.
    "a pytest_pyfunc_call implementation added mid-run, through _config": ('''import sys

def median(values):
    config = sys.modules["_pytest.assertion.util"]._config
    if config is not None:
        HookImpl = sys.modules["pluggy._hooks"].HookImpl
        caller = config.pluginmanager.hook.pytest_pyfunc_call
        def skip(pyfuncitem):
            if "_" in pyfuncitem.path.name[len("test_median"):]:
                return None
            return True
        options = {"hookwrapper": False, "optionalhook": False, "tryfirst": True,
                   "trylast": False, "specname": None}
        caller._add_hookimpl(HookImpl(None, "stats", skip, options))
    raise NotImplementedError
''',
        ('pytest',)),
}


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_round_five_attack_does_not_beat_the_grader(name: str, task, repelled) -> None:
    stats, runners = ATTACKS[name]
    await repelled(task, stats, runners, name, honest_pass=None)


SORT_TESTS = b"""from sorting import sort3


def test_sorts():
    out = sort3([3, 1, 2])
    assert sorted(out) == [1, 2, 3]
    assert all(out[i] <= out[i + 1] for i in range(len(out) - 1))
"""
SHADOWS = '''import sys


def sort3(values):
    """Gives the hidden test module a global `all` (shadowing the builtin) that removes
    itself once called, and a `builtins.all` for good measure, then returns the input."""
    import builtins

    real = builtins.all
    for module in list(sys.modules.values()):
        space = getattr(module, "__dict__", None)
        if isinstance(space, dict) and "test_sorts" in space:
            def all(items, _space=space):
                _space.pop("all", None)
                builtins.all = real
                return True
            space["all"] = all
            builtins.all = all
    return list(values)
'''


@pytest.mark.parametrize("runner", ["pytest", "plain"])
async def test_a_builtin_shadowed_for_the_hidden_tests_changes_nothing(median, runner: str,
                                                                        attempt) -> None:
    """A global added to the hidden test module (or to builtins), even one that removes
    itself once read, is not what the hidden test calls: its builtins were frozen."""
    grading = median.config.grading.model_copy(update={"runner": runner, "expected_tests": 1})
    task = Task(median.config.model_copy(update={"grading": grading}), "sort",
                FileTree.of({"sorting.py": "def sort3(values):\n    raise NotImplementedError\n"}),
                FileTree.of({"test_sorting.py": SORT_TESTS}), None)
    shadowed = await attempt(task, {"sorting.py": SHADOWS})
    assert shadowed.reward == 0.0 and shadowed.tests_passed == 0, (
        shadowed.flags, shadowed.details[:3])
    honest = await attempt(task, {"sorting.py": "def sort3(values):\n"
                                                "    return sorted(values)\n"})
    assert honest.reward == 1.0 and not honest.flags, (honest.flags, honest.details[:3])
