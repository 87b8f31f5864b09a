"""The test launcher that runs inside the grading sandbox (stdlib and pytest only).

It is copied into the sandbox with ``inside_guard.py`` and started as ``python3 -I -B
inside_launcher.py RUNNER`` before any workspace code exists on ``sys.path``: pytest is imported
first,
then the launcher blocks on one line of stdin (its configuration: a per-run key, the paths,
pytest's arguments, and the hidden tests' Python files). A grader can start it ahead of time,
so a grading pays for collection and the tests, not for importing pytest.

Once configured, before any tested code runs, it:
- installs the guard (``inside_guard.py``), the audit hook that alone writes the report and
  checks the runner's integrity, and tells it which of the launcher's functions may report;
- keeps the hidden tests' Python files off the disk: they are handed to the guard, and the
  files in the tests directory are empty placeholders, so a subprocess of the tested code
  (``cat tests/test_x.py``) reads nothing; test modules, conftest files and helper modules are
  compiled from the guard's copy, each assertion's operands probed for objects that claim to
  equal anything;
- makes the process undumpable (no other process of the sandbox may trace it or read its
  memory) and forgets ctypes;
- puts the hidden tests directory, then the workspace, at the *end* of ``sys.path``, so no
  workspace module can shadow the standard library or pytest;
- runs pytest with the grader's own ini file (``-c``), no plugin autoload, no cache, and
  conftest files only from the hidden tests directory.
"""

import builtins
import contextlib
import linecache
import marshal
import operator as _operator
import os
import sys
from dataclasses import astuple as _astuple
from dataclasses import fields as _fields
from dataclasses import is_dataclass as _is_dataclass
from datetime import date as _date
from datetime import datetime as _datetime
from datetime import time as _time
from datetime import timedelta as _timedelta
from decimal import Decimal
from fractions import Fraction as _Fraction
from ipaddress import IPv4Address as _IPv4Address
from ipaddress import IPv6Address as _IPv6Address
from uuid import UUID as _UUID

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import inside_boundary as boundary_module  # noqa: E402 - from the launcher's own directory
import inside_compile as compiling  # noqa: E402 - from the launcher's own read-only directory
import inside_guard as guard_module  # noqa: E402

del sys.path[0]
emit = guard_module.report
hidden_code = guard_module.hidden_code
PROBE, DONE, ENTER = compiling.PROBE, compiling.DONE, compiling.ENTER
PROBE_EQUAL, CLAIM, HELD = compiling.PROBE_EQUAL, compiling.CLAIM, compiling.HELD
COMMIT, NUMBER, STAR = compiling.COMMIT, compiling.NUMBER, compiling.STAR
WITHIN, BOUND = compiling.WITHIN, compiling.BOUND
PAIR, EQUAL, MEMBER = compiling.PAIR, compiling.EQUAL, compiling.MEMBER
OPERATOR_EQUAL, COMPARE_CHAIN = compiling.OPERATOR_EQUAL, compiling.COMPARE_CHAIN
ORDER, ORDER_PAIR, MATCHED = compiling.ORDER, compiling.ORDER_PAIR, compiling.MATCHED
STARRED_PAIR, KEYWORD_PAIR = compiling.STARRED_PAIR, compiling.KEYWORD_PAIR
ModuleSpec = type(sys.__spec__)  # importlib.machinery's, without an import inside find_spec
SOLVER = []  # the socket to the tested code's process, where one was forked for this grading
SEPARATE = ("process", "data")  # the isolations with the tested code in a process of its own


class _Fresh:
    """An object no honest value equals or orders against."""

    __slots__ = ()


_PLAIN = (int, float, str, bytes, bool, complex, type(None))
_among, shuffled = guard_module.among, guard_module.shuffled
# a Fraction's and a datetime's state, read by their own descriptors (nothing of a subclass's)
_NUMERATOR = _Fraction.__dict__["_numerator"].__get__
_DENOMINATOR = _Fraction.__dict__["_denominator"].__get__
_TZINFO = {_datetime: _datetime.__dict__["tzinfo"].__get__,
           _time: _time.__dict__["tzinfo"].__get__}
_UUID_INT = _UUID.__dict__["int"].__get__
_IP4 = _IPv4Address.__dict__["_ip"].__get__
_IP6, _SCOPE = (_IPv6Address.__dict__[n].__get__ for n in ("_ip", "_scope_id"))
_NO = _Fresh()  # no expected literal
_HONEST = _Fresh()  # ``commit``'s word for a value of the builtin kinds: nothing to probe


def _neighbour(expected):
    """A literal of the same kind that differs from ``expected`` (``_NO`` if there is none)."""
    kind = type(expected)
    if kind is bool:
        return not expected
    if kind is int:
        return expected + 1
    if kind is float and expected == expected and abs(expected) != float("inf"):
        return expected + 1.0 + abs(expected)
    if kind is str or kind is bytes:
        return expected + kind("\x00" if kind is str else b"\x00")
    if kind is list or kind is tuple:
        return kind([*expected, None])
    return _NO


def _honest(value, depth=0):
    """Whether ``value`` is made of the builtin kinds only (no object of the tested code's to
    ask): a plain value (or a value of the standard library's, ``_value_data``), or a list,
    tuple, set or dict of them, looked into a little way."""
    kind = type(value)
    if _among(kind, _PLAIN) or _value_data(value):
        return True
    if depth > 3 or not _among(kind, (list, tuple, set, frozenset, dict)):
        return False
    items = list(value.items()) if kind is dict else list(value)
    return len(items) <= 1000 and all(_honest(item, depth + 1) for item in items)


def _value_data(value):
    """Whether ``value`` is of one of the standard library's value kinds, exactly, holding
    nothing of the tested code's: a ``Decimal``, a ``Fraction`` of two ints, a ``date``, a
    ``timedelta``, a ``datetime`` or ``time`` without a time zone, a ``UUID``, an IP address
    (their state read by their slots' own descriptors; paths are not among them). An
    expected value of such a kind is data like an int: the tested value is had as one of its
    kind or is not equal to it (round forty-four's red team: an ``__eq__`` that said True to
    every ``Decimal``, ``date`` or ``Fraction`` passed 14 of 16 tests, since only fresh
    objects asked it)."""
    kind = type(value)
    if kind is Decimal or kind is _date or kind is _timedelta:
        return True
    if kind is _Fraction:
        return type(_NUMERATOR(value)) is int and type(_DENOMINATOR(value)) is int
    if kind is _datetime or kind is _time:
        return _TZINFO[kind](value) is None
    if kind is _UUID:
        return type(_UUID_INT(value)) is int
    if kind is _IPv4Address:
        return type(_IP4(value)) is int
    if kind is _IPv6Address:
        return type(_IP6(value)) is int and _among(type(_SCOPE(value)), (str, type(None)))
    return False


def _value_of(value, kind):
    """``value``, an instance of ``kind`` (one of ``_value_data``'s) or of a subclass of it
    (a ``Decimal`` of its own, pandas' ``Timestamp``, a ``datetime``), as a value of exactly
    ``kind`` made from the data ``kind`` itself keeps (its C state, its slots), nothing of the
    subclass's run; ``_NO`` for anything else, or one whose data is not of the builtin kinds
    (round forty-four's third red team: an honest ``Money(Decimal)`` was no ``Decimal``)."""
    if type(value) is kind and _value_data(value):
        return value
    try:
        if not _is(value, kind):
            return _NO
        if kind is Decimal:
            made = Decimal(value)  # the C constructor copies a Decimal's own digits
        elif kind is _Fraction:
            top, bottom = _NUMERATOR(value), _DENOMINATOR(value)
            if not (_is(top, int) and _is(bottom, int)):
                return _NO
            made = _Fraction(int.__int__(top), int.__int__(bottom))
        elif kind is _UUID:
            number = _UUID_INT(value)
            made = _UUID(int=int.__int__(number)) if _is(number, int) else _NO
        elif kind is _IPv4Address or kind is _IPv6Address:
            number = (_IP4 if kind is _IPv4Address else _IP6)(value)
            made = kind(int.__int__(number)) if _is(number, int) else _NO
        else:  # date, datetime, time, timedelta: their pickled state, read by the C type
            made = kind(*kind.__reduce__(value)[1])
    except Exception:
        return _NO
    return made if made is not _NO and type(made) is kind and _value_data(made) else _NO


def _data_form(value, depth=0):
    """An expected value made of the builtin kinds and of instances of data classes (a
    dataclass whose ``__eq__`` is the one ``dataclasses`` wrote), as builtin values: each such
    instance as the tuple of the fields its ``__eq__`` compares. The tests build these of the
    tested code's own classes (``[Interval(1, 5)]``); had so, the value compared with them
    must hold the same data, whatever its own ``__eq__`` says (red team, repo-bugs: a list
    subclass equal to any list of Intervals). ``_NO`` for anything else: a class with an
    ``__eq__`` of its own, a subclass of a builtin container, a value too big or deep."""
    kind = type(value)
    if _among(kind, _PLAIN):
        return value
    if depth > 3:
        return _NO
    try:
        if _among(kind, (list, tuple, set, frozenset)):
            items = list(kind.__iter__(value))
            if len(items) > 1000:
                return _NO
            return _whole(kind, [_data_form(item, depth + 1) for item in items])
        if kind is dict:
            pairs = list(dict.items(value))
            if len(pairs) > 1000:
                return _NO
            out = {}
            for key, item in pairs:
                key, item = _data_form(key, depth + 1), _data_form(item, depth + 1)
                if key is _NO or item is _NO:
                    return _NO
                out[key] = item
            return out
        if _written_eq(kind):
            return _whole(tuple, [_data_form(field, depth + 1) for field in _compared(value)])
    except Exception:  # an unhashable field in a set's item, a field not set
        return _NO
    return _NO


def _written_eq(kind):
    """Whether ``kind`` is a dataclass whose ``__eq__`` is the one ``dataclasses`` generated
    (compiled from a string: a hand-written one has its file), so equality is its fields'."""
    own = type.__dict__["__dict__"].__get__(kind)
    eq = own.get("__eq__")
    code = getattr(eq, "__code__", None) if type(eq) is type(_written_eq) else None
    return (code is not None and code.co_filename == "<string>"
            and "__dataclass_fields__" in own and _is_dataclass(kind))


def _variants(expected, count):
    """Up to ``count`` values of ``expected``'s kind and shape that differ from it, on both
    sides (2 -> 0, 3, 5...; an item of a list, set or dict changed, added or dropped): an
    honest value equals none. Their unchanged parts are copies too, so no part of one is the
    test's own object where the probe's copy of the expected value has a new one."""
    out = []
    for _ in range(count * 2):
        if len(out) >= count:
            break
        one = _variant(expected, 1 + os.urandom(1)[0] % 24)
        if one is _NO:
            break
        if not any(one == seen for seen in out):
            out.append(one)  # each value once: an honest value may equal one of them, once
    return out


def _variant(expected, step):
    """One value of ``expected``'s kind that differs from it, ``step`` being how far where
    that means something; ``_NO`` where there is none (None has no other value)."""
    kind, coin = type(expected), os.urandom(1)[0] & 1
    if kind is bool:
        return not expected
    if kind is int:
        return expected + step if coin else expected - step
    if kind is float:
        if expected != expected:
            return _NO  # NaN equals nothing, itself included
        if abs(expected) == float("inf"):
            return -expected if coin else (1.0 - 2 * (expected < 0)) * 1.7e308
        if os.urandom(1)[0] & 1:
            # As round as the literal, ``step`` units of its last digit away (2.5 -> 2.3,
            # 3.4...): the copy of the expected value is not the one round number among them,
            # and a wrong answer may land on one, as for ints.
            digits = Decimal(repr(expected))
            unit = Decimal(1).scaleb(digits.as_tuple().exponent)
            return float(digits + unit * step if coin else digits - unit * step)
        # A random, unround offset: no honest computation lands on it, so a value equal to
        # one is a lie (``claim``).
        delta = (1.0 + abs(expected)) * (step + int.from_bytes(os.urandom(4), "little")
                                         / 2 ** 32) / 4
        return expected + delta if coin else expected - delta
    if kind is complex:
        move = step if coin else -step
        return (complex(expected.real + move, expected.imag) if os.urandom(1)[0] & 1
                else complex(expected.real, expected.imag + move))
    if kind is str or kind is bytes:
        extra = kind(chr(96 + step) if kind is str else bytes([96 + step]))
        return expected + extra if coin or not expected else expected[:-1]
    if kind is list or kind is tuple:
        items = [_copy(item) for item in expected]
        _change(items, step)
        return kind(items)
    if kind is set or kind is frozenset:
        items = [_copy(item) for item in expected]
        if items and os.urandom(1)[0] % 3 == 0:
            items.pop(os.urandom(1)[0] % len(items))  # one dropped
        else:  # one added: like one of its items (or a small int), and not in it
            for _ in range(8):
                new = _variant(items[os.urandom(1)[0] % len(items)], step) if items else step
                if new is not _NO and new not in expected:
                    items.append(new)
                    break
            else:
                return _NO
        return kind(items)
    if kind is dict:
        pairs = [[_copy(key), _copy(value)] for key, value in expected.items()]
        pick = os.urandom(1)[0] % 3
        if pairs and pick == 0:
            pairs.pop(os.urandom(1)[0] % len(pairs))  # a key dropped
        elif pairs and pick == 1:  # a value changed
            at = os.urandom(1)[0] % len(pairs)
            value = _variant(pairs[at][1], step)
            pairs[at][1] = value if value is not _NO else [pairs[at][1]]
        else:  # a key added: like one of its keys (or a small int), and not in it
            key = _variant(pairs[0][0], step) if pairs else step
            if key is _NO or key in expected:
                return _NO
            pairs.append([key, _copy(pairs[0][1]) if pairs else 0])
        return dict(pairs)
    return _NO


def _change(items, step):
    """``items`` (a copy of a list's or tuple's) with one changed, added or dropped."""
    pick = os.urandom(1)[0] % 3
    if items and pick == 0:
        at = os.urandom(1)[0] % len(items)
        value = _variant(items[at], step)
        if value is not _NO:
            items[at] = value
            return
    if items and pick == 1:
        items.pop(os.urandom(1)[0] % len(items))
        return
    items.append(_copy(items[os.urandom(1)[0] % len(items)]) if items else step)


def _copy(value):
    """An equal value of the same kind built anew (an int or str is one, interned or not,
    only where CPython shares it): the probe asks with this, never with the test's own
    object, so identity, ``id`` and reference counts do not say which question is the
    expected value."""
    kind = type(value)
    if kind is int:
        return (value + 1) - 1 if not -5 <= value <= 256 else value
    if kind is float:
        return value + 0.0 if value == value else float("nan")
    if kind is str or kind is bytes:
        return value[:1] + value[1:] if len(value) > 1 else value
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        return kind(_copy(item) for item in value)
    if kind is dict:
        return {_copy(key): _copy(item) for key, item in value.items()}
    return value


def probe_equal(value, other, given=None):
    """What the instrumented test compares ``value`` with, in its own frame, before it
    asserts ``value == other``: nothing for a value of the builtin kinds; else fresh objects,
    values of ``other``'s kind and shape that differ from it, and a copy of ``other``, in an
    order the value cannot predict. Asked from the test's own frame, each question comes
    from where the assertion will: the value cannot tell them apart by the stack (a depth it
    can measure without a frame), and must answer ``other`` as it will at the assertion.
    ``given``: what ``commit`` made of it (``_HONEST``: of the builtin kinds, walked once)."""
    if given is _HONEST or _honest(value):
        return []
    asks = [_Fresh() for _ in range(1 + os.urandom(1)[0] % 4)]
    if _honest(other):
        # Many of them: a value that bets on one number before the assertion (and answers
        # it consistently after) wins only if it bets on the copy.
        asks += _variants(other, 12 + os.urandom(1)[0] % 20)
        asks.append(_copy(other))
    else:
        asks += _record_asks(other, 4 + os.urandom(1)[0] % 8)
    return shuffled(asks)


def _record_asks(other, count):
    """Where ``other`` is a record (an object of a class with an ``__eq__`` of its own and
    attributes of the builtin kinds, ``Interval(1, 5)``) or a list or tuple holding some: a
    copy of it and up to ``count`` variants, each with one record's every attribute changed;
    else nothing. The records are made anew without the class's code (``_record``), so the
    value cannot tell the copy from the test's own object. Equal to a variant is a lie: the
    items' own ``__eq__`` (the agent writes the class) decides a container's ``==``, and one
    that says True to a record with none of the expected one's data holds no value (red team,
    round forty: a lenient ``Interval.__eq__`` passed every list of the right length)."""
    kind = type(other)
    if _among(kind, (list, tuple)):
        if len(other) > 1000:
            return []
        items = list(kind.__iter__(other))
    else:
        kind, items = None, [other]
    records = [at for at, item in enumerate(items) if not _honest(item)]
    copies = [_record(item) if at in records else _copy(item) for at, item in enumerate(items)]
    if not records or any(copies[at] is _NO for at in records):
        return []
    asks = [copies[0] if kind is None else kind(copies)]
    for _ in range(count):
        at = records[os.urandom(1)[0] % len(records)]
        changed = _record(items[at], 1 + os.urandom(1)[0] % 24)
        if changed is _NO:
            break
        one = [_record(item) if i in records and i != at else _copy(item)
               for i, item in enumerate(items)]
        one[at] = changed
        asks.append(one[0] if kind is None else kind(one))
    return asks


_GETSET = type(type.__dict__["__dict__"])


def _far(value, step):
    """A value of ``value``'s kind that no tolerance confuses with it: a number moved by at
    least its own size and one (an honest record's ``__eq__`` may compare within a tolerance,
    ``math.isclose(a, b, rel_tol=1e-2)``, which a variant one digit away passes: red team,
    round forty-one); anything else as ``_variant`` makes it."""
    kind, sign = type(value), 1 if os.urandom(1)[0] & 1 else -1
    if kind is int:
        return value + sign * (1 + abs(value)) * step
    if kind is float and value == value and abs(value) != float("inf"):
        return value + sign * (1.0 + abs(value)) * (step + os.urandom(1)[0] / 256)
    return _variant(value, step)


def _record(item, step=None):
    """A new object of ``item``'s class with the same attributes (``step`` None), or with
    every attribute changed (``_far``, ``step`` units away; at least one must change),
    made by ``object.__new__`` and the instance dict's own descriptor: none of the class's
    code runs. ``_NO`` where ``item`` is no record: its class has no Python ``__eq__`` of its
    own (identity, an enum), keeps slots, or an attribute is not of the builtin kinds."""
    kind = type(item)
    try:
        eq = slot = None
        for klass in type.__dict__["__mro__"].__get__(kind)[:-1]:
            space = type.__dict__["__dict__"].__get__(klass)
            if "__slots__" in space:
                return _NO
            if eq is None and "__eq__" in space:
                eq = space["__eq__"]
            if slot is None and "__dict__" in space:
                slot = space["__dict__"]
        if type(eq) is not type(_record) or type(slot) is not _GETSET:
            return _NO
        made, changed = {}, 0
        for name, value in dict.items(slot.__get__(item)):
            if type(name) is not str or not _honest(value):
                return _NO
            far = _NO if step is None else _far(value, step)  # None has no other value
            changed += far is not _NO
            made[name] = _copy(value) if far is _NO else far
        if step is not None and not changed:
            return _NO
        new = object.__new__(kind)
        slot.__set__(new, made)
        return new
    except Exception:  # a class object.__new__ cannot make, a variant that raised
        return _NO


def claim(value, asked, other, said):
    """The instrumented test found ``value == asked`` true while probing; ``said`` is what
    earlier answers of the same probe said (bit 1: equal to ``other``, the other operand, as
    the probe's copy of it; bit 2: equal to one value like it). A fresh object, a second
    value or an unround float variant is a lie: a real value equals at most one number (a
    wrong answer may be the int, str or float as round as the literal that a variant names;
    no honest computation lands on an unround one)."""
    if type(asked) is not _Fresh and _honest(asked) and _honest(other) and asked == other:
        return said | 1  # the probe's copy of the other operand (both of builtin kinds)
    if type(asked) is not _Fresh and not said & 2 and _plausible(asked, other):
        return said | 2  # a wrong answer that happens to be this variant
    _lie(value, "claims to equal what it is not", "compares true with what it is not")


def _plausible(asked, other):
    """Whether a wrong answer could be ``asked``: anything but a float less round than the
    float literal it varies (``_variants``' unround offsets)."""
    if type(asked) is not float or type(other) is not float or asked != asked:
        return True
    digits = Decimal(repr(asked)).as_tuple().exponent
    return type(digits) is int and digits >= Decimal(repr(other)).as_tuple().exponent


def commit(value, other):
    """Before anything is compared with ``value``: what it holds as a value of ``other``'s
    builtin kind (``_commit``), while it has heard nothing of the expected value (the
    assertion itself hands that to its ``__eq__``); ``_HONEST`` for a value of the builtin
    kinds (so the probe and ``held`` need not walk it again); None where nothing is to be had
    (compared with an object that is not of the builtin kinds)."""
    if _honest(value):
        return _HONEST
    if _honest(other):
        return _commit(value, other)
    data = _data_form(other)
    if data is not _NO:
        return _commit(value, data)
    shape = _shape(value, other)
    if shape is not _NO:
        return shape
    expected = _approximated(other)
    return None if expected is _NO else _commit(value, expected)


_CONTAINERS = (list, tuple, set, frozenset, dict)


def _shape(value, other):
    """``value`` as a builtin container of ``other``'s kind holding what it holds (a
    subclass's own stored items, whatever its ``__eq__``, ``__iter__`` or slicing say; any
    other object through its own iteration or mapping), when ``other`` is a builtin container
    of objects that are not all of the builtin kinds (``[Interval(1, 5)]`` of a class the
    agent wrote): the builtin container's ``==`` then compares the items, so no container of
    the tested code's decides it (red team, round thirty-nine: a list subclass equal to any
    list of Intervals, which kept its lie through any change to ``Interval``). ``_NO`` for
    another ``other``, or a value that cannot be had so."""
    kind = type(other)
    if not _among(kind, _CONTAINERS):
        return _NO
    try:
        if kind is dict:
            return dict(_pairs(value, len(other)))
        items = _items(value, (list, tuple) if _among(kind, (list, tuple))
                       else (set, frozenset), len(other))
        return _NO if items is _NO else kind(items)
    except Exception:
        return _NO


def _approximated(other):
    """What a ``pytest.approx`` of builtin values stands for (``_NO`` for anything else): the
    value compared with it is had as that kind, and the matcher judges that value, so no
    arithmetic of the tested code's (a ``__sub__`` that returns 0) is asked to say how near."""
    kind = type(other)
    if _exact(getattr(kind, "__module__", "")) != "_pytest.python_api" or \
            not _exact(kind.__name__).startswith("Approx"):
        return _NO
    try:
        expected = vars(other).get("expected", _NO)
    except TypeError:  # no instance dict
        return _NO
    return expected if expected is not _NO and _honest(expected) else _NO


def _number_like(value, like):
    """The number ``value`` is to be had as, to be compared with or ordered against the
    number ``like``: a float for an int where ``value`` is no int (a ``Fraction``, a float
    subclass: not cut to a whole number), else ``like``."""
    return float(like) if type(like) is int and not _is(value, int) else like


def number(value, like):
    """``value``, an operand of arithmetic with the number literal ``like`` in an assertion,
    as a number of ``like``'s kind (``_commit``), so that its own arithmetic (a ``__sub__``
    that returns 0) does not decide how near it is."""
    if _among(type(value), _PLAIN):
        return value
    like = _number_like(value, like)
    given = _commit(value, like)
    if given is _NO or not _honest(given):
        raise AssertionError(f"a {type(value).__qualname__} is no {type(like).__name__}: "
                             "it cannot be had as one")
    return given


def held(left, right, left_said, right_said, left_given=None, right_given=None):
    """After ``assert left == right`` held: a side probed against the other must have said
    so when probed, and only that (an object that answers the assertion and not the same
    question a moment before tells the questions apart); and what it handed over before the
    probe (``commit``) must equal the other side. None: a side not probed (a literal, a
    matcher such as ``pytest.approx``)."""
    for value, other, said, given in ((left, right, left_said, left_given),
                                      (right, left, right_said, right_given)):
        if said is None or given is _HONEST or _honest(value):
            continue
        if not _honest(other):
            data = _data_form(other)
            if data is not _NO:  # the tested code's data classes: the same data, had so
                _holds_the_same(value, data, given, honest=True)
                continue
            if _among(type(other), _CONTAINERS):  # the same items, by the builtin ``==``
                _holds_the_same(value, other, given, honest=False)
                continue
            if _approximated(other) is _NO:
                continue
            if given is None or given is _NO or not _honest(given) or not other == given:
                raise AssertionError(f"a {type(value).__qualname__} is not within "
                                     f"{_shown(other)} as a value of its kind")
            continue
        if said != 1:
            _lie(value, "changes its equality from call to call", "is equal, then not")
        if given is None:
            given = _NO  # probed, yet nothing was committed before: not to be had
        # Not flagged (an honest class may print or iterate otherwise than it compares),
        # but not passed either: the tests ask for a value, and this one holds none equal.
        if given is _NO:
            raise AssertionError(f"a {type(value).__qualname__} is no {type(other).__name__}: "
                                 f"it cannot be had as one")
        if not _honest(given) or not given == other:
            raise AssertionError(f"a {type(value).__qualname__} compares equal to "
                                 f"{_shown(other)} but holds {_shown(given)}")


def _holds_the_same(value, want, given, honest):
    """After the assertion held: what ``value`` handed over before it (``commit``, into a
    builtin container of ``want``'s kind; of the builtin kinds throughout if ``honest``) must
    equal ``want`` by the builtin container's ``==``, else the assertion fails."""
    if given is None or given is _NO or type(given) is not type(want) or (
            honest and not _honest(given)) or not want == given:
        shown = "nothing" if given is None or given is _NO else _text(repr(given))
        raise AssertionError(f"a {type(value).__qualname__} compares equal to "
                             f"{_text(repr(want))[:80]} but holds {shown[:80]}")


def _commit(value, like, depth=0):
    """``value`` as a value of ``like``'s builtin kind, made by the builtin types from what it
    holds: its number, its characters, its items (a subclass of the kind, an enum, Counter,
    OrderedDict, namedtuple: the builtin data underneath; any other object: through its own
    conversion, ``float()``, ``list()``..., which must hand over concrete values). An object
    that says equal to anything holds no value it can hand over that equals them all, so
    whatever the probe's variants are, a lazy answer fails here: the tested code must commit
    to a value, before anything is compared with it, and the builtin ``==`` judges it.
    ``_NO`` if it cannot be had."""
    kind = type(like)
    if _among(type(value), _PLAIN) and type(value) is kind:
        return value
    if depth > 3:
        return _NO
    if _value_data(like):
        return _value_of(value, kind)
    try:
        if kind is bool or kind is int:
            if _is(value, int):
                return kind(int.__int__(value))
            whole = _as(kind, value)  # int(): exact, a Fraction past 2**53 too
            if kind is int and type(whole) is int:
                return _whole_number(value, whole)
            return whole
        if kind is float:
            return float.__float__(value) if _is(value, float) else _as(float, value)
        if kind is complex:
            return _as(complex, value)
        if kind is str:
            return str.__str__(value) if _is(value, str) else _exact(_as(str, value))
        if kind is bytes:
            return bytes.__bytes__(value) if _is(value, bytes) else _as(bytes, value)
        if kind is type(None):
            return value if value is None else _NO
        if kind is list or kind is tuple:
            if not _is(value, type) and _is_dataclass(type(value)):
                value = _dataclass_items(value)
            items = _items(value, (list, tuple), len(like))
            if items is _NO or len(items) != len(like):
                return items if items is _NO else kind(items)
            return _whole(kind, [_commit(item, near, depth + 1)
                                 for item, near in zip(items, like, strict=True)])
        if kind is set or kind is frozenset:
            items = _items(value, (set, frozenset), len(like))
            if items is _NO:
                return _NO
            return _whole(kind, [_commit(item, _like(item, like), depth + 1)
                                 for item in items])
        if kind is dict:
            out = {}
            for key, item in _pairs(value, len(like)):
                key = _commit(key, _like(key, like), depth + 1)
                if key is _NO or key not in like:
                    return _NO
                item = _commit(item, like[key], depth + 1)
                if item is _NO:
                    return _NO
                out[key] = item
            return out
    except Exception:
        return _NO
    return _NO


def _whole_number(value, whole):
    """``whole``, the int that ``int(value)`` gave, unless ``value``'s float says it is no
    whole number (``Fraction(3, 2)``, ``Decimal("2.5")``): then that float, which no int
    equals. ``int()`` cuts, so a wrong answer of 1.5 would pass for 1 (a value too big for
    a float keeps its exact int: both sides round alike)."""
    try:
        near = _as(float, value)
    except Exception:
        return whole
    if type(near) is float and near == near and near != float(whole):
        return near
    return whole


def _is(value, kinds):
    """``isinstance(value, kinds)`` by ``value``'s own type alone: ``isinstance`` also asks
    ``value.__class__``, which the tested code's class can make a property whose getter is a
    callable that is no function, run in the asking frame (red team, round forty-one: the
    commit's frame, holding the expected value, was read so)."""
    return issubclass(type(value), kinds)


def _dataclass_items(value):
    """A dataclass's fields as a tuple compares them (those its written ``__eq__`` compares,
    as ``_data_form`` has the expected value), read in a frame that holds nothing else: a
    field can be a property of the tested code's (``_as``)."""
    return tuple(_compared(value)) if _written_eq(type(value)) else _astuple(value)


def _compared(value):
    """The values of the fields a dataclass instance's ``__eq__`` compares, in order."""
    return [object.__getattribute__(value, f.name) for f in _fields(type(value)) if f.compare]


def _as(kind, value):
    """``kind(value)`` (``int``, ``float``, ``str``, ``dict``...), called from a frame that
    holds nothing else. The tested code's conversion may be a callable that is no function
    (``__int__ = functools.partial(eval, "...")``, or ``next`` of a ``map`` over
    ``iter(locals, None)``): CPython calls it with no arguments, and it then runs in the frame
    that asked, reading its locals and globals with no frame read the guard could see. The
    frame that commits a value holds the expected one (red team, round forty: ``like`` read
    so, and committed, passed every test). Every call into the tested code that commits,
    probes or shows a value is made from such a frame: here, ``_shown``, ``_items``,
    ``_pairs`` or ``_dataclass_items``."""
    return kind(value)


def _shown(value):
    """``value``'s repr for a message, cut short, asked from a frame that holds nothing else
    (``_as``)."""
    return _text(repr(value))[:80]


def _whole(kind, items):
    """A container of ``items`` (``_NO`` if one of them could not be had)."""
    return _NO if any(item is _NO for item in items) else kind(items)


def _pairs(value, count):
    """Up to ``count + 1`` (key, item) pairs of ``value``: a dict's (a subclass's own data),
    else what its own mapping protocol hands a builtin dict, asked from a frame that holds
    nothing else (``_as``)."""
    pairs = dict.items(value) if _is(value, dict) else _as(dict, value).items()
    return list(pairs)[:count + 1]


def _like(item, values):
    """The value among ``values`` (a set's or a dict's keys) that ``item`` is to be had as: one
    it equals, else one of its builtin kind's, else any."""
    for value in values:
        if type(value) is type(item) or issubclass(type(item), type(value)):
            return value
    return next(iter(values), None)


def _items(value, kinds, count):
    """Up to ``count + 1`` items of ``value``: a builtin container's (a subclass's own data),
    else what its iteration hands over."""
    for kind in kinds:
        if _is(value, kind):
            return list(kind.__iter__(value))[:count + 1]
    out = []
    for item in value:
        out.append(item)
        if len(out) > count:
            break
    return out


def probe(value, kind, expected=_NO):
    """``value``, unless it claims to equal (or order against) what no honest value does: a
    fresh object, or a literal of the expected value's kind other than the expected value.
    Then the assertion fails and it is flagged. It asks a number of times the value cannot
    predict, each comparison on its own (one that raises does not excuse the others). For
    order comparisons, ``in`` and ``assertEqual`` and its kin; an asserted ``==`` is probed
    in the test's own frame (``probe_equal``)."""
    if _among(type(value), _PLAIN):
        return value
    given = value
    if kind == "eq" and expected is not _NO and _honest(expected) and not _honest(value):
        # Before it hears anything: a value of the expected one's kind, which the assertion
        # (assertEqual, assertAlmostEqual...) then works on, the object's own arithmetic
        # and comparisons left out.
        given = _commit(value, expected)
        if given is _NO or not _honest(given):
            raise AssertionError(f"a {type(value).__qualname__} is no "
                                 f"{type(expected).__name__}: it cannot be had as one")
    _ask(value, kind, expected)
    return given


def pair(first, second, near=False):
    """The first two arguments of an equality assertion (``assertEqual(f(x), expected)``,
    ``assert_allclose``...) neither of which is a literal: each probed against the other's
    value as it is at run time, so a value of the tested code's is had as one of the
    expected value's builtin kind before it hears anything (``probe``), whether the test
    wrote the expected value as a literal or holds it in a variable (red team, round
    forty-three: an ``__eq__`` that said True to numbers until ``__int__`` had run passed
    ``assertEqual(f(x), expected)`` in a loop). ``near``: an assertion within a tolerance,
    for which an expected int is a float (no value is cut to a whole number)."""
    return (probe(first, "eq", _floated(second) if near else second),
            probe(second, "eq", _floated(first) if near else first))


def _floated(value, depth=0):
    """``value`` with its ints (not bools) as floats, in lists, tuples and dict values."""
    kind = type(value)
    if kind is int:
        return float(value)
    if depth > 3 or not _honest(value):
        return value
    if kind is list or kind is tuple:
        return kind(_floated(item, depth + 1) for item in value)
    if kind is dict:
        return {key: _floated(item, depth + 1) for key, item in value.items()}
    return value


def equal(left, right, negate=False):
    """``left == right`` (``left != right`` if ``negate``) anywhere in the hidden code but an
    assertion's top level, where neither is a literal (``all(f(v) == e for v, e in CASES)``,
    ``ok = f(x) == expected``): each side probed, and a value that is not of the builtin kinds
    had as one of the other's kind first (``_commit``), before it hears anything, as ``pair``
    does. The operands' own answer then stands only where what they handed over backs it: a
    side that says equal but handed over something else, or nothing of the other's kind, is
    not equal. An honest inequality stays one (a ``Path`` is no ``str``, a ``Fraction`` no
    float), and where the operands' own ``==`` gives no bool (numpy's elementwise arrays) it
    is the answer when the values handed over are equal, so ``(f(x) == expected).all()``
    reads as written."""
    return _backed(left, right, "NotEq" if negate else "Eq")


_OPERATORS = {"Eq": _operator.eq, "NotEq": _operator.ne, "Lt": _operator.lt,
              "LtE": _operator.le, "Gt": _operator.gt, "GtE": _operator.ge}


def order(left, right, op):
    """``left < right`` (``op``: ``Lt``, ``LtE``, ``Gt``, ``GtE``) anywhere in the hidden code
    where neither is a literal (``e - EPS <= f(x)``, ``assertTrue(lo < f(x) < hi)``): as
    ``equal`` does, a value that is not of the builtin kinds had as a number of the other's
    kind first, and its own answer standing only where that number backs it (round
    forty-four's red team: an object less and greater than every number passed a band)."""
    return _backed(left, right, op)


def _backed(left, right, op):
    """``left <op> right``, each side not of the builtin kinds had as one of the other's kind
    first (``_commit``; for an order, only against a number), the answer the operands' own
    where what they handed over backs it."""
    ordering = op not in ("Eq", "NotEq")
    sides, backed = [], True
    for value, other in ((left, right), (right, left)):
        if _among(type(value), _PLAIN):
            sides.append(value)
            continue
        given = value
        if _honest(other) and not _honest(value) and (
                not ordering or _among(type(other), (int, float))):
            given = _commit(value, _number_like(value, other) if ordering else other)
            if given is _NO or not _honest(given):
                backed = False  # nothing of the other's kind to hand over
        _ask(value, "order" if ordering else "eq", _NO if ordering else other)
        sides.append(given)
    function = _OPERATORS[op]
    mine = function(left, right)
    if sides[0] is left and sides[1] is right:
        return mine  # nothing handed over: both of the builtin kinds, or neither
    held = backed and function(sides[0], sides[1])
    if type(mine) is not bool:
        return mine if held else op == "NotEq"
    if op == "NotEq":
        return mine or not held
    return mine and held


def compare_chain(first, later, ops):
    """A chain of comparisons (``f(x) == f(y) == expected``, ``lo <= f(x) < hi``): each link
    ``equal`` or ``order``, in order, to the first that fails; each operand after ``first``
    worked out (``later``: a function of no arguments each) only while the links before it
    hold, as the chain itself does (round forty-four's third red team: ``n > 100 > boom()``
    called ``boom`` when the first link failed)."""
    left = first
    for make, op in zip(later, ops, strict=True):
        right = make()
        if not _backed(left, right, op):
            return False
        left = right
    return True


def order_pair(first, second):
    """The first two arguments of an order assertion (``assertGreaterEqual(f(x), lo)``): a
    value not of the builtin kinds had as a number of the other's kind (a float for an int),
    asked fresh objects besides; each handed on."""
    out = []
    for value, other in ((first, second), (second, first)):
        given = value
        if not _honest(value) and _among(type(other), (int, float)):
            given = _commit(value, _number_like(value, other))
            if given is _NO or not _honest(given):
                raise AssertionError(f"a {type(value).__qualname__} is no number: it cannot "
                                     "be had as one")
        if not _among(type(value), _PLAIN):
            _ask(value, "order", _NO)
        out.append(given)
    return tuple(out)


def member(item, container):
    """The first two arguments of ``assertIn(item, container)`` (and ``assertNotIn``): an
    ``item`` of no builtin kind, with a builtin container of data, had as a value of its
    items' kinds (``_members``; one that is in it if any is, else any, else an object equal
    to nothing), so that the builtin ``in`` decides, never the item's own ``__eq__``; else
    ``item``, probed. A container's own kind is not the item's: ``Fraction(5, 2)`` is in
    ``[2.5]`` (round forty-four: it was had as a list, and an honest answer failed)."""
    if _honest(item) and _held_objects(container):
        # ``assertIn(expected, [f(x)])``: each item of the tested code's had as one of the
        # expected value's kind (one that cannot be, as an object equal to nothing)
        items = list(container)[:1000]
        had = []
        for each in items:
            given = each if _honest(each) else _commit(each, item)
            had.append(given if given is not _NO and _honest(given) else _Fresh())
        return item, had
    if _honest(item) or not _data_container(container):
        return probe(item, "eq"), container
    givens = _members(item, container)
    _ask(item, "eq", _NO)
    for given in givens:
        if given in container:
            return given, container
    return (givens[0] if givens else _Fresh()), container


def _held_objects(container):
    """Whether ``container`` is a builtin list, tuple or set holding a value that is not of
    the builtin kinds (a result of the tested code's, where the test looks for its expected
    value: ``expected in [f(x)]``)."""
    return _among(type(container), (list, tuple, set, frozenset)) and \
        not _honest(container) and len(container) <= 1000


def _data_container(container):
    return _among(type(container), (list, tuple, set, frozenset, dict)) and _honest(container)


def _members(item, container, most=8):
    """``item`` had as a value of the kind (and shape) of each of ``container``'s items (a
    dict's keys), once a kind, at most ``most`` of them: the values of the builtin kinds it
    hands over (``_commit``), in the order of the items."""
    givens, seen = [], set()
    for like in list(container)[:1000]:
        shape = (type(like), len(like) if _among(type(like), _CONTAINERS) else None)
        if shape in seen:
            continue
        seen.add(shape)
        given = _commit(item, like)
        if given is not _NO and _honest(given):
            givens.append(given)
        if len(seen) >= most:
            break
    return givens


def matched(subject, values):
    """The subject of a ``match`` whose cases compare it with literal ``values`` only: a
    value not of the builtin kinds had as one of their kinds (``_members``; one among them if
    any is, else any, else an object equal to none), so that the builtin ``==`` matches it
    (round forty-four's red team: ``case 2.5:`` matched an object equal to every number)."""
    if _honest(subject) or not values:
        return subject
    givens = _members(subject, values)
    _ask(subject, "eq", _NO)
    for given in givens:
        if given in values:
            return given
    return givens[0] if givens else _Fresh()


def operator_equal(func, left, right):
    """``func(left, right)`` where the hidden code calls a function named ``eq`` or ``ne``
    (``operator.eq(f(x), expected)``): ``equal`` when it is the operator module's."""
    if func is _operator.eq or func is _operator.__eq__:
        return equal(left, right)
    if func is _operator.ne or func is _operator.__ne__:
        return equal(left, right, True)
    return func(left, right)


def starred_pair(args, near=False):
    """The arguments of an equality assertion given as ``*args``: the first two probed
    against each other (``pair``)."""
    args = list(args)
    if len(args) >= 2:
        args[:2] = pair(args[0], args[1], near)
    return args


_PAIRED_KEYWORDS = (("first", "second"), ("actual", "desired"), ("a", "b"), ("x", "y"))


def keyword_pair(kwargs, near=False):
    """The keyword arguments of an equality assertion (``first=``, ``second=``; numpy's
    ``actual=``, ``desired=``): the two compared ones probed against each other (``pair``)."""
    kwargs = dict(kwargs)
    for one, other in _PAIRED_KEYWORDS:
        if one in kwargs and other in kwargs:
            kwargs[one], kwargs[other] = pair(kwargs[one], kwargs[other], near)
            break
    return kwargs


def _ask(value, kind, expected):
    """Ask ``value`` (and what it holds) whether it equals (``eq``) or orders against
    (``order``) fresh objects and neighbours of ``expected``, a number of times it cannot
    predict; a true answer flags it and fails the assertion (``_lie``)."""
    suspects = [(value, expected)]
    for _ in range(1000):  # containers compare their items: look inside, bounded
        if not suspects:
            break
        item, near = suspects.pop()
        kind_of = type(item)
        if _among(kind_of, (list, tuple, set, frozenset)):
            suspects.extend((v, _NO) for v in list(item)[:200])
            continue
        if kind_of is dict:
            suspects.extend((v, _NO) for v in list(item.values())[:200])
            continue
        if _among(kind_of, _PLAIN):
            continue
        others = [_Fresh() for _ in range(1 + os.urandom(1)[0] % 4)]
        if kind == "eq" and near is not _NO:
            step = near
            for _ in range(1 + os.urandom(1)[0] % 8):  # 2 -> 3, 4, 5...: any number of them
                step = _neighbour(step)
                if step is _NO or (type(step) is type(near) and step == near):
                    break  # a bool's neighbour's neighbour is the bool itself
                others.append(step)
        claims = False
        for other in shuffled(others):
            try:
                claims = bool(item == other) if kind == "eq" else bool(item < other)
            except Exception:
                continue
            if claims:
                break
        if claims:
            _lie(item, f"claims to {'equal' if kind == 'eq' else 'order against'} what it "
                 "is not", "compares true with what it is not")


def _lie(value, detail, message):
    """Flag ``value`` as always_equal (``detail``) and fail its assertion (``message``)."""
    name = type(value).__qualname__
    emit("audit", flag="always_equal", detail=f"a {name} that {detail}",
         where=_exact(getattr(type(value), "__module__", "?")))
    raise AssertionError(f"{name} {message}")


def done():
    """Called by the instrumentation where a hidden test function returns normally: the
    guard counts a pass only for a test whose function got there (so a runner made to skip
    the test's body, or to report a failed one as passed, is seen)."""
    emit("done")


def enter():
    """Called by the instrumentation as a hidden test function begins: the guard flags a
    call of it that the tested code made (a hidden test used as an oracle)."""
    emit("enter")


def bound(names, touched=()):
    """Called by the instrumentation after each module-level statement of a hidden module
    (``inside_compile.bind_checked``), with the names it binds and those it reads: the guard
    checks that nothing else of the module's namespace changed since the last statement, and
    that the caller is that module's own code."""
    frame = sys._getframe(1)
    emit("bound", space=frame.f_globals, names=names, touched=touched, caller=frame.f_code)


def within(item, container):
    """``assert item in container`` (``inside_compile``): for a data ``item`` and a container
    that is no builtin one (an object of the tested code's, whose ``__contains__`` could say
    yes to anything it is shown), the container is had as data first, a str for a str (its
    ``str()``), else a list of its items, each of which must be of the builtin kinds, and
    ``in`` is the builtin's. An ``item`` of no builtin kind in a builtin container of data
    (``f(x) in (expected, float(expected))``) is had as a value of its items' kinds first
    (``_members``), and its own answer stands only where one of those values is in it (red
    team, round forty-four: an ``__eq__`` that said True to numbers until ``__int__`` ran).
    Anything else is ``in`` as written."""
    if not _honest(item):
        if type(container) is range:  # a number in a range: had as an int first
            given = _commit(item, 0)
            return given is not _NO and type(given) is int and bool(item in container) \
                and given in container
        if not _data_container(container):
            return item in container
        givens = _members(item, container)
        mine = item in container
        return bool(mine) and any(given in container for given in givens)
    if _held_objects(container):  # ``expected in [f(x)]``: each item of the tested code's
        return any(equal(item, each) for each in list(container)[:1000])  # had as data
    if _among(type(container), (str, bytes, list, tuple, set, frozenset, dict, range)):
        return item in container
    try:
        if type(item) is str:
            text = str(container)
            return isinstance(text, str) and item in str.__str__(text)
        items = [*container]
    except Exception:  # noqa: BLE001 - it cannot be had as data: not in it
        return False
    return all(_honest(each) for each in items) and item in items


def star(name, level, wanted=None):
    """``from name import *`` in a hidden module (``inside_compile``'s ``star``): each name the
    module exports (its ``__all__``, or its public names) that the hidden module reads and
    binds nowhere itself and that is no builtin's (``wanted``, from its syntax), bound in the
    hidden module unless it is private or special to pytest (``setup_function``,
    ``pytestmark``, ``test*``), a module, or a name the hidden module already binds to
    something else. A module that exports ``pytest``, ``math`` or ``__builtins__`` of its own
    making would otherwise replace what the test imported first, and a test would call the
    tested code's ``approx`` or ``sqrt`` with the expected value; a star-imported
    ``setup_function`` is handed every test, a ``sorted`` computes a fixture's expected
    value (the red team of round twenty-two)."""
    namespace = sys._getframe(1).f_globals
    # The module itself (its leaf, for a dotted name), without the import system's own
    # ``*`` handling, which would ask for every name it exports, wanted or not.
    module = __import__(name, namespace, None, ("__name__",), level)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    for each in list(names):
        # Not a private or special name, nor one pytest would run: a star-imported
        # ``setup_function`` is called with each hidden test, a ``pytestmark`` marks them all.
        if type(each) is not str or each.startswith(("_", "test", "Test", "setup", "teardown",
                                                     "setUp", "tearDown", "pytest")) \
                or (wanted is not None and each not in wanted) or hasattr(builtins, each):
            continue
        value = getattr(module, each)
        if isinstance(value, type(sys)) or (each in namespace and namespace[each] is not value):
            continue
        namespace[each] = value


def load_hidden(path, name):
    """The hidden module at ``path``, run from its code compiled ahead (None if there is no
    such hidden file)."""
    code = hidden_code(path)
    if code is None:
        return None
    module = type(sys)(name)
    sys.modules[name] = module  # while it runs, as any module (dataclasses look it up there)
    _run_hidden(module, path, code)
    return module


# The hidden modules run in this process, as id: path. Ids, not the modules: a list of them
# here would be one more place the tested code could find them (round twenty-three).
HIDDEN = {}


def unlist():
    """Take every hidden module out of ``sys.modules``, and out of the modules named as their
    parents (pytest's importlib mode binds ``tests.test_x`` in ``tests``): in one process, the
    tested code would read a test's expected values through them (the red team of round
    twenty-two)."""
    hidden = set(HIDDEN)
    for name, value in list(sys.modules.items()):
        if id(value) not in hidden or type(value) is not type(sys) or \
                vars(value).get("__file__") != HIDDEN[id(value)]:
            continue
        del sys.modules[name]
        parent, _, child = name.rpartition(".")
        holder = sys.modules.get(parent) if parent else None
        if type(holder) is type(sys) and id(vars(holder).get(child)) in hidden:
            del vars(holder)[child]


def _run_hidden(module, path, code):
    """Run a hidden file's compiled ``code`` (or raise the error compiling it raised) in
    ``module``, which the guard watches from before its code runs to after."""
    if isinstance(code, BaseException):
        raise code
    hooks = {PROBE: probe, DONE: done, ENTER: enter, PROBE_EQUAL: probe_equal, CLAIM: claim,
             HELD: held, COMMIT: commit, NUMBER: number, STAR: star, WITHIN: within,
             BOUND: bound, PAIR: pair, EQUAL: equal, MEMBER: member,
             OPERATOR_EQUAL: operator_equal, STARRED_PAIR: starred_pair,
             KEYWORD_PAIR: keyword_pair, COMPARE_CHAIN: compare_chain, ORDER: order,
             ORDER_PAIR: order_pair, MATCHED: matched}
    module.__file__ = path
    module.__dict__.update(hooks)
    HIDDEN[id(module)] = path
    # Its file is an empty placeholder: it has no lines to show (3.13's linecache reads an
    # empty file as one blank line, on which pytest's traceback of a collection error fails).
    linecache.cache[path] = (0, None, [], path)
    # While the tests are collected, the hidden modules are in sys.modules, as any module is
    # (dataclasses look one up there, a helper package's relative imports need it, a test
    # module may import another's data), and the guard sees to it that nothing but a
    # module's own statements bind its names (``inside_compile``'s ``BOUND``); collected,
    # they are taken out (``unlist``).
    emit("loading", module=module)  # before its code runs: reading that code is seen
    exec(code, module.__dict__)
    for name, hook in hooks.items():  # the tested code it imported could have swapped them
        if module.__dict__.get(name) is not hook:
            emit("audit", flag="runner_tampered", detail=f"the {name} of {path} was replaced",
                 where=path)
    module.__dict__.update(hooks)  # what the guard freezes into the module's code, next
    emit("loaded", module=module, path=path)  # its builtins frozen; its functions must stay


class HiddenFinder:
    """Imports of the hidden tests' helper modules, served from the guard's copy."""

    def __init__(self, tests):
        self.tests = tests

    def find_spec(self, fullname, path=None, target=None):
        last = fullname.rpartition(".")[2]
        for base in (path or [self.tests]):
            for candidate, package in ((f"{base}/{last}.py", False),
                                       (f"{base}/{last}/__init__.py", True)):
                if not candidate.startswith(self.tests + "/") or \
                        hidden_code(candidate) is None:
                    continue
                spec = ModuleSpec(fullname, self, origin=candidate, is_package=package)
                spec.has_location = True
                if package:
                    spec.submodule_search_locations = [os.path.dirname(candidate)]
                return spec
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        path = module.__spec__.origin
        if type(module) is not type(sys) or not isinstance(path, str):
            raise ImportError(f"not a module of the hidden tests: {module!r}")
        _run_hidden(module, path, hidden_code(path))


def prepare(config, fd, pytest_hooks=False):
    """Guard this process; returns (workspace, tests). Nothing of the tested code ran yet."""
    workspace, tests = config["workspace"], config["tests"]
    codes = compiling.compile_hidden(config.pop("sources", {}), rewrite=pytest_hooks,
                                     probes=config.get("isolation") not in SEPARATE)
    codes.update((path, marshal.loads(code))  # compiled by the host, for this interpreter
                 for path, code in config.pop("compiled", {}).items())
    imported = {} if config.get("isolation") in SEPARATE else imports_of(codes.values())
    guard = guard_module.install(fd, bytes.fromhex(config.pop("key")), workspace, tests,
                                 config["launcher_dir"], codes)
    hidden = list(codes)
    del codes
    guard.allow(_lie, done, enter, bound, load_hidden, _run_hidden, HiddenFinder.find_spec,
                HiddenFinder.exec_module, run_tests, run_plain, run_verifier)
    if pytest_hooks:
        guard.allow(*HOOKS, hooks=True)  # only when pytest's hook machinery calls them
    # Across the process boundary nothing of the tested code's runs here: no integrity to
    # record and check before every outcome.
    guard.alone = config.get("isolation") in SEPARATE
    _frameless_signals(type(guard).__call__.__code__)
    _audited_refcounts()
    _untracing()
    del guard  # from here on, only audit events reach it
    guard_module.undumpable()
    finder = next((i for i, f in enumerate(sys.meta_path)
                   if getattr(f, "__name__", "") == "PathFinder"), len(sys.meta_path))
    sys.meta_path.insert(finder, HiddenFinder(tests.rstrip("/")))
    os.chdir(workspace)
    if config.get("isolation") in SEPARATE:
        if not SOLVER:
            raise RuntimeError("process isolation, and no solver was forked")
        boundary_module.install(SOLVER[0], workspace, tests,  # the workspace's modules
                                only_data=config.get("isolation") == "data", hidden=hidden)
        sys.path.append(tests)
    else:
        for sock in SOLVER:  # not needed: it ends when its socket does
            sock.close()
        sys.path.extend([tests, workspace])
        preload(imported, workspace, tests)
    return workspace, tests


def imports_of(codes):
    """The absolute imports in the hidden tests' compiled ``codes`` (at any depth), and the
    standard modules they name in strings, as (module, names it imports from it)."""
    import dis

    found, stack = {}, [c for c in codes if type(c) is type(prepare.__code__)]
    while stack:
        code = stack.pop()
        stack += [c for c in code.co_consts if type(c) is type(code)]
        consts, module = [], None  # LOAD_CONST level, LOAD_CONST names, IMPORT_NAME
        for ins in dis.get_instructions(code):
            op = ins.opname
            if op == "IMPORT_NAME":
                module = ins.argval if len(consts) == 2 and consts[0] == 0 else None
                if module is not None:
                    found.setdefault(module, set())
            elif op == "IMPORT_FROM" and module is not None:
                found[module].add(ins.argval)
            elif not op.startswith("STORE_"):  # binding what it imported, between the names
                module = None
            consts = [*consts[-1:], ins.argval] if op == "LOAD_CONST" else []
            named = ins.argval if op == "LOAD_CONST" and type(ins.argval) is str else ""
            if named.partition(".")[0] in _NAMED_MODULES and all(
                    part.isidentifier() for part in named.split(".")):
                found.setdefault(named, set())  # importlib.import_module("statistics")
    return found


# The standard modules a hidden test may name in a string (``importlib.import_module``,
# ``pytest.importorskip``): preloaded as if imported (round twenty-three). Not those that
# do something when imported, or open a display.
_NAMED_MODULES = frozenset(sys.stdlib_module_names) - {
    "this", "antigravity", "idlelib", "turtle", "turtledemo", "tkinter", "test", "__main__"}


def preload(imported, workspace, tests):
    """Import now, before the seal, each module the hidden tests import that is neither the
    tested code's nor theirs (``statistics``, ``json``): the integrity record then holds it,
    and the tested code that replaces its ``median`` (the tests' oracle) is seen doing so. A
    module loaded only later, by the tests, would be recorded by nobody (the red team of
    round twenty-two). One that fails to import is left for the test to fail on."""
    import importlib
    import importlib.util

    for name, names in imported.items():
        try:
            spec = importlib.util.find_spec(name.partition(".")[0])
            places = [spec.origin or "", *(spec.submodule_search_locations or [])]
            if any(p.startswith((workspace.rstrip("/") + "/", tests.rstrip("/") + "/"))
                   for p in places):
                continue
            module = importlib.import_module(name)
            for each in names:  # ``from xml import etree``: a submodule
                if hasattr(module, "__path__") and not hasattr(module, each):
                    importlib.import_module(f"{name}.{each}")
        except Exception:  # noqa: BLE001 - the test's own import will say why
            continue


def _audited_refcounts():
    """``sys.getrefcount`` raises an audit event (``tempering.refcount``) the guard flags
    when the tested code asks: how many references an object has tells the test's own
    objects from the probe's, which no frame would."""
    def getrefcount(obj, _count=sys.getrefcount, _audit=sys.audit):
        _audit("tempering.refcount")
        return _count(obj) - 1  # this frame's own reference

    getrefcount.__doc__ = sys.getrefcount.__doc__
    sys.getrefcount = getrefcount


def _untracing():
    """``sys.settrace(None)`` and ``sys.setprofile(None)`` where none is set: nothing to do,
    so nothing asked. The guard refuses both calls whoever makes them (its audit event does
    not say which function is set), and ``doctest`` restores the trace function it found,
    None, in a ``finally``: refused there, it left ``linecache.getlines`` replaced, and an
    honest test of the solution's docstrings was ``runner_tampered`` (red team, round
    forty-three). Setting a function is refused as before."""
    for name in ("settrace", "setprofile"):
        def unset(function, _set=getattr(sys, name), _get=getattr(sys, "get" + name[3:])):
            if function is None and _get() is None:
                return None
            return _set(function)

        unset.__name__ = unset.__qualname__ = name
        unset.__doc__ = getattr(sys, name).__doc__
        setattr(sys, name, unset)


def _frameless_signals(guard_code):
    """Signal handlers the tested code installs get no frame, and never run inside the guard.

    A Python signal handler is called with the frame it interrupted, the one way to a frame
    that raises no audit event; and it can run between two bytecodes of the guard itself,
    where nothing it does is audited. So ``signal.signal`` wraps a callable handler: it is
    called with ``None`` for the frame, and not at all if the signal came while the guard ran
    (such a signal is dropped).

    ``SIGCHLD`` is never ignored: the kernel would then reap every child itself, and
    ``subprocess`` reads a child it cannot wait for as exit status 0, so every judge the test
    started "passed" (red team, round fifty-four); the disposition stays the default (children
    wait to be reaped), which is all that honest code asking for it loses. The enum values
    ``signal.SIG_DFL``/``SIG_IGN`` are passed as the ints ``_signal`` takes (the standard
    ``signal(SIGPIPE, SIG_DFL)`` of a command-line module failed to import; round
    fifty-four)."""
    import _signal
    import signal as signal_module

    def install(signalnum, handler, _install=_signal.signal, _guard=guard_code,
                _chld=_signal.SIGCHLD, _ign=_signal.SIG_IGN, _dfl=_signal.SIG_DFL):
        if callable(handler):
            def frameless(signum, frame, _user=handler, _guard=_guard):
                while frame is not None:
                    if frame.f_code is _guard:
                        return None
                    frame = frame.f_back
                return _user(signum, None)

            return _install(_as_int(signalnum), frameless)
        signalnum, handler = _as_int(signalnum), _as_int(handler)
        if signalnum == _chld and handler == _ign:
            handler = _dfl
        return _install(signalnum, handler)

    def _as_int(value):  # as the standard library's ``signal._enum_to_int``
        try:
            return int(value)
        except (ValueError, TypeError):
            return value

    install.__doc__ = _signal.signal.__doc__
    _signal.signal = signal_module.signal = install


class Report:
    """The pytest plugin: one line per collected test, test begun, outcome and test finished."""

    def __init__(self):
        self.outcomes = {}
        self.messages = {}

    def pytest_sessionstart(self, session):
        # pytest and its plugins are loaded; the tests are not collected yet. The hidden
        # files are served by the launcher first: pytest's assertion rewriter, first on
        # sys.meta_path, would read a test module another one imports by name
        # (``from test_stats import CASES``) from its empty placeholder.
        finders = [f for f in sys.meta_path if type(f) is HiddenFinder]
        for finder in finders:
            sys.meta_path.remove(finder)
        sys.meta_path[:0] = finders
        emit("seal", plugin=self, pluginmanager=session.config.pluginmanager)
        debugging = sys.modules.get("_pytest.debugging")
        if debugging is not None:  # a class attribute any module could read the config from
            debugging.pytestPDB._config = debugging.pytestPDB._pluginmanager = None

    def pytest_collectreport(self, report):
        if report.failed:
            emit("collect_error", id=_exact(report.nodeid),
                   message=_exact(report.longrepr)[-1500:])

    shared = True  # the tested code is in this process

    def pytest_collection_finish(self, session):
        unlist()  # pytest holds the modules it collected; nobody else need find them
        if self.shared:  # and no global of pytest's holds the config, which holds them
            mark = sys.modules.get("_pytest.mark.structures")
            if mark is not None:
                mark.MARK_GEN._config = None
        emit("hooks", pluginmanager=session.config.pluginmanager)  # as they run the tests
        emit("collected", ids=[_exact(item.nodeid) for item in session.items])

    def _configless(self):
        """In one process, what pytest's assertion plugin sets for the test's assertion
        messages (``util._config``, the item's own ``_reprcompare``) is a way from any module
        to the config, the session and every collected item, their modules and parameters
        among them (the red team of round twenty-three): off while the test runs, at the cost
        of the detailed comparison in a failure's message."""
        if self.shared:
            util = sys.modules.get("_pytest.assertion.util")
            if util is not None:
                util._config = util._reprcompare = None

    def pytest_runtest_setup(self, item):
        self._configless()

    def pytest_runtest_call(self, item):
        self._configless()

    def pytest_runtest_teardown(self, item):
        self._configless()

    def pytest_runtest_logstart(self, nodeid, location):
        emit("begin", id=_exact(nodeid))

    def pytest_runtest_logreport(self, report):
        nodeid = _exact(report.nodeid)
        outcome = self.outcomes.get(nodeid)
        xfail = hasattr(report, "wasxfail")
        when = report.when
        if when == "setup":
            outcome = ("xfailed" if xfail else "skipped") if report.skipped else (
                "error" if report.failed else None)
        elif when == "call":
            if report.passed:
                outcome = "xpassed" if xfail else "passed"
            elif report.skipped:
                outcome = "xfailed" if xfail else "skipped"
            else:
                outcome = "failed"
        elif when == "teardown" and report.failed and outcome in (None, "passed"):
            outcome = "error"
        self.outcomes[nodeid] = outcome
        if not report.passed:
            self.messages[nodeid] = _exact(report.longrepr)[-1500:]
        if when == "teardown":
            message = "" if outcome == "passed" else self.messages.get(nodeid, "")
            emit("test", id=nodeid, outcome=_exact(outcome or "error"), message=message)

    def pytest_runtest_logfinish(self, nodeid, location):
        emit("finish", id=_exact(nodeid))

    def pytest_sessionfinish(self, session, exitstatus):
        # Here, not after pytest.main: pytest's unconfigure then undoes its own class patches.
        self.ended = True
        emit("end", exitstatus=int(exitstatus), crossed=_crossed())

    ended = False


def _exact(value):
    """``value`` as an exact ``str``: a record holds nothing whose methods are the tested
    code's (a ``str`` subclass would run them inside the guard)."""
    text = value if isinstance(value, str) else _text(value)
    return "".join([text]) if isinstance(text, str) else ""


def _text(value):
    try:
        return str(value or "")
    except Exception as exc:  # an object of the tested code's whose str() raises
        return f"<unprintable: {type(exc).__name__}>"


def _tryfirst(plugin_class):
    """pytest's reports reach the plugin before any other plugin's hook (which the tested code
    could make raise) can stop them."""
    import pytest

    for name in ("pytest_runtest_logreport", "pytest_runtest_logstart", "pytest_collectreport",
                 "pytest_collection_finish", "pytest_runtest_setup", "pytest_runtest_call",
                 "pytest_runtest_teardown"):
        setattr(plugin_class, name, pytest.hookimpl(tryfirst=True)(getattr(plugin_class, name)))
    # Sealed last at the session's start: pytest's own plugins have registered by then.
    plugin_class.pytest_sessionstart = pytest.hookimpl(trylast=True)(
        plugin_class.pytest_sessionstart)


def run_tests(config, fd):
    import pytest
    from _pytest import config as pytest_config
    from _pytest import python as pytest_python
    from _pytest.pathlib import import_path, module_name_from_path

    workspace, tests = prepare(config, fd, pytest_hooks=True)
    plugin = Report()
    plugin.shared = config.get("isolation") not in SEPARATE

    def import_hidden(path, *, mode="importlib", root=None, **kwargs):
        name = module_name_from_path(path, root) if root is not None else path.stem
        module = load_hidden(str(path), name)  # no parent binds it (unlist)
        if module is None:
            return import_path(path, mode=mode, root=root, **kwargs)
        return module

    pytest_python.import_path = import_hidden
    pytest_config.import_path = import_hidden
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    emit("start", pid=os.getpid())
    code = pytest.main([
        "-c", config["ini"], "--rootdir", workspace, "--confcutdir", tests,
        "--import-mode=importlib", "-p", "no:cacheprovider", "-q", "--tb=short",
        "--continue-on-collection-errors",
        "--no-header", "-rN", *config["args"], *config["canaries"]],
        plugins=[plugin])
    if not plugin.ended:  # pytest stopped before the session could finish
        emit("end", exitstatus=int(code), crossed=_crossed())


def run_plain(config, fd):
    """Test functions and ``Test*`` classes without fixtures, called directly: the same report
    and guard as under pytest, without pytest's start-up (for suites like HumanEval)."""
    workspace, tests = prepare(config, fd)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # the tested code's prints go nowhere; the report has its own fd
    os.dup2(quiet, 2)
    emit("seal")
    emit("start", pid=os.getpid())
    files = []
    for arg in [*config["args"], *config["canaries"]]:  # a file given twice runs once
        path = os.path.join(workspace, arg)
        if os.path.isdir(path):
            for top, dirs, names in os.walk(path):
                dirs.sort()
                files += [os.path.join(top, n) for n in sorted(names) if n.endswith(".py")
                          and (n.startswith("test_") or n.endswith("_test.py"))]
        else:
            files.append(path)
    items = []
    for index, path in enumerate(dict.fromkeys(os.path.normpath(f) for f in files)):
        rel = os.path.relpath(path, workspace)
        try:
            module = load_hidden(path, f"tempering_test_{index}")
            if module is None:
                raise ImportError(f"{rel} is not one of the hidden tests")
        except BaseException:
            emit("collect_error", id=rel, message=_traceback())
            continue
        for name, value in list(vars(module).items()):
            if name.startswith("test") and callable(value) and not isinstance(value, type):
                code = getattr(value, "__code__", None)  # defined in this file, not swapped in
                if type(code) is type(load_hidden.__code__) and code.co_filename == path:
                    items.append((f"{rel}::{name}", value))
            elif name.startswith("Test") and isinstance(value, type):
                for method in sorted(vars(value)):
                    if method.startswith("test"):
                        items.append((f"{rel}::{name}::{method}",
                                      lambda cls=value, m=method: getattr(cls(), m)()))
    emit("collected", ids=[item_id for item_id, _ in items])
    unlist()
    skips = _pytest_outcomes()
    for item_id, function in [] if config.get("collect_only") else items:
        emit("begin", id=item_id)
        try:
            function()
            outcome, message = "passed", ""
        except BaseException as exc:
            outcome, message = _plain_outcome(exc, skips), _traceback()
        emit("test", id=item_id, outcome=outcome, message=message)
        emit("finish", id=item_id)
    emit("end", exitstatus=0, crossed=_crossed())


def _pytest_outcomes():
    """{pytest's Skipped: "skipped", XFailed: "xfailed"}, once the hidden tests are loaded
    (in one process, one that imports pytest has it preloaded before any tested code ran): a
    test is skipped by the class, not by its name; an exception of the tested code's called
    ``Skipped`` is a failure (round twenty-five)."""
    outcomes = sys.modules.get("_pytest.outcomes")
    if type(outcomes) is not type(sys):
        return {}
    found = vars(outcomes)
    return {kind: outcome for kind, outcome in ((found.get("Skipped"), "skipped"),
                                                (found.get("XFailed"), "xfailed"))
            if isinstance(kind, type) and issubclass(kind, BaseException)}


def _plain_outcome(exc, kinds):
    return next((outcome for kind, outcome in kinds.items() if isinstance(exc, kind)),
                "failed")


def _crossed():
    """What crossed the process boundary that was not plain data (``Boundary.crossed``);
    None in one process."""
    return boundary_module.INSTALLED[0].crossed() if boundary_module.INSTALLED else None


def _traceback():
    import traceback  # only on a failure: it costs 3 ms to import

    try:
        return traceback.format_exc()[-1500:]
    except Exception as exc:
        return f"<unprintable traceback: {type(exc).__name__}>"


def run_verifier(config, fd):
    """Call ``function(workspace)`` from a task's verifier file, compiled by the host as
    hidden code (the guard keeps the tested code out of its frames and values as out of the
    tests'); report its scores."""
    workspace, _ = prepare({**config, "tests": config.get("tests", "/nonexistent"),
                            "launcher_dir": os.path.dirname(os.path.abspath(__file__))}, fd)
    # Its own helpers first, whatever it later appends (the workspace, in one process: the
    # agent's ``cases.py`` stood in for the verifier's own; red team, round thirty-four).
    sys.path.insert(0, os.path.dirname(config["file"]))
    emit("seal")
    module = load_hidden(config["file"], "tempering_verifier")
    if module is None:
        raise ImportError(f"{config['file']} is not the verifier's file")
    scores = getattr(module, config["function"])(workspace)
    emit("scores", scores=scores if guard_module._plain(scores) else str(scores))


HOOKS = (Report.pytest_sessionstart, Report.pytest_collectreport,
         Report.pytest_collection_finish, Report.pytest_runtest_logstart,
         Report.pytest_runtest_logreport, Report.pytest_runtest_logfinish,
         Report.pytest_sessionfinish, Report.pytest_runtest_setup, Report.pytest_runtest_call,
         Report.pytest_runtest_teardown)


def _line(fd):
    """One line from ``fd``, read without a buffer that would keep the key afterwards."""
    parts = []
    while not parts or not parts[-1].endswith(b"\n"):
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        parts.append(chunk)
    return b"".join(parts).strip()


def _first_line(fd):
    """The first line of ``fd``, read a byte at a time: nothing after it is read (the
    configuration that follows must not be in the memory of a process forked now)."""
    line = bytearray()
    while len(line) < 4096:
        byte = os.read(fd, 1)
        if not byte or byte == b"\n":
            break
        line += byte
    return bytes(line)


def main():
    if not boundary_module.nested():
        os.write(2, b"tempering-launcher: this python3 did not load the grader's nestguard.so "
                    b"(a libc other than glibc, or a python3 that is a script?), which keeps "
                    b"the programs the tests start apart\n")
        os._exit(boundary_module.NOT_NESTED)
    runner = sys.argv[1]
    if runner == "pytest":
        import importlib

        import pytest  # noqa: F401 - loaded before the configuration arrives: a warm start
        from _pytest.config import default_plugins

        later = ["_pytest.config.compat", "_pytest._argcomplete", "faulthandler", "pdb"]
        for name in [f"_pytest.{n}" for n in default_plugins] + later:
            with contextlib.suppress(ImportError):  # pytest.main would import them later
                importlib.import_module(name)
        import inspect

        # Fills inspect's cache of which file is which module: the first failure's report
        # (the failing canary's, in every run) would otherwise work it out for every module.
        inspect.getmodule(main.__code__)
        _tryfirst(Report)
    import ctypes  # noqa: F401 - for undumpable(), which then forgets it

    guard_module.preseal(os.path.dirname(os.path.abspath(__file__)))  # the slow half of sealing
    freeze()
    configured(runner)  # frozen, unlike this frame: it runs the tested code


def freeze():
    """The launcher's and the guard's global names made constants (``inside_guard.freeze``):
    once the tested code runs, no binding it adds or changes redirects them. The builtins
    that read their caller's frame are the guard's before that (``frame_readers``)."""
    guard_module.frame_readers()
    guard_module.freeze([guard_module, compiling, sys.modules[__name__]])
    guard_module.freeze_frame_handlers()


def configured(runner):
    """Read the isolation (``process WORKDIR``: fork the tested code's process now, before
    anything secret is read, or ``shared``), then the configuration; run, and exit."""
    mode = _first_line(0)
    if mode.startswith(b"process "):
        SOLVER.append(boundary_module.fork_solver(mode[8:].decode())[0])
    config = marshal.loads(bytes.fromhex(_line(0).decode()))  # from the host: trusted
    {"pytest": run_tests, "plain": run_plain, "verifier": run_verifier}[runner](
        config, os.dup(1))
    sys.stdout.flush()
    os._exit(0)  # nothing the tested code registered (atexit, threads) runs after the report


if __name__ == "__main__":
    main()
