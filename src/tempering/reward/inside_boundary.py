"""The hidden tests in one process, the tested code in another (``grading.isolation``).

In one process, the tested code can reach whatever decides the outcome: the test's frames and
locals, the runner, the objects it hands the assertions (an object that says it equals
anything, or whose subtraction returns 0). The guard and the probe (``inside_guard.py``,
``inside_launcher.py``) close each such path they know of. With process isolation there is no
path to close: the launcher forks a **solver** before it holds anything secret, and the tested code
only ever runs there. The hidden tests import the workspace's modules as proxies
(``BoundaryFinder``); a call goes over a socket, and what comes back is **data**: the builtin
kinds (None, bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set,
frozenset, range), decoded here from JSON into exact builtin values, which the test's own
``==`` compares. With ``grading.isolation = "data"`` that is all that comes back: modules,
functions and classes of the tested code's arrive as handles that can only be called (and
their attributes read), and an object of another kind is refused (the test waiting on it
fails). With ``process``, such an object comes back as a handle (``Remote``) whose
operations go back to the solver; mixed with data it is first had as a value of the data's
kind, asked anew each time (a mutable object's value may change between two asks), so no
answer of the tested code's is ever a verdict on a value it has not seen; but what it says
it is may differ from one ask to the next. Exceptions come back as the builtin exception (or
a stand-in class for one of the tested code's, a subclass of the same builtin), with its
message. A callable the test passes (a key function, a class) is called back here, with data.

What the solver can do is answer, wrongly or not: it sees the arguments and nothing else (no
frame, no expected value, no report channel, no key; on the zygote path the tests directory is
an empty directory in its mount namespace). Equality between two of the tested code's own
objects is the tested code's answer, as it is in any harness.

Stdlib only: this runs in the grading sandbox on both sides.
"""

import _frozen_importlib_external
import builtins
import io
import json
import os
import socket
import struct
import sys
import threading

LIMIT = 64 << 20  # bytes of one message, either way
DEPTH = 200  # nesting of one value
OUTPUT = 1 << 20  # characters of the tested code's prints forwarded per call
_INT = 1 << 53  # ints beyond this travel as hex (no digit limit; JSON readers differ)


class BoundaryError(Exception):
    """What the tested code sent cannot be taken as data, or its process is gone."""


# ---- the wire ----


def send(sock, message):
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > LIMIT:
        raise BoundaryError(f"a message of {len(data)} bytes is over the limit of {LIMIT}")
    sock.sendall(struct.pack("=I", len(data)) + data)


def receive(sock):
    head = exactly(sock, 4)
    size = struct.unpack("=I", head)[0]
    if size > LIMIT:
        raise BoundaryError(f"a message of {size} bytes is over the limit of {LIMIT}")
    try:
        return json.loads(exactly(sock, size))
    except (ValueError, RecursionError) as exc:
        raise BoundaryError(f"an unreadable message: {exc}") from None


def exactly(sock, size):
    """``size`` bytes from the stream or datagram socket ``sock`` (a message that may not fit
    one read: a value across the boundary, the zygote's configuration)."""
    parts, got = [], 0
    while got < size:
        part = sock.recv(min(size - got, 1 << 20))
        if not part:
            raise BoundaryError("the other end closed the socket mid-message (the tested "
                                "code's process ended, or the host)")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def pack(value, refer, depth=0):
    """``value`` as JSON-ready data: the builtin kinds by their own storage (a subclass's
    methods are never asked), anything else as ``refer(value)``."""
    if depth > DEPTH:
        raise BoundaryError(f"a value nested deeper than {DEPTH}")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if -_INT < value < _INT else ["I", hex(value)]
    if kind is float:
        return value
    deeper = depth + 1
    if kind is list:
        return ["l", *[pack(v, refer, deeper) for v in list.__iter__(value)]]
    if kind is tuple:
        return ["t", *[pack(v, refer, deeper) for v in tuple.__iter__(value)]]
    if kind is dict:
        out = ["d"]
        for k, v in dict.items(value):
            out += [pack(k, refer, deeper), pack(v, refer, deeper)]
        return out
    if kind is set or kind is frozenset:
        return ["s" if kind is set else "f",
                *[pack(v, refer, deeper) for v in kind.__iter__(value)]]
    if kind is bytes:
        return ["b", value.hex()]
    if kind is bytearray:
        return ["B", value.hex()]
    if kind is complex:
        return ["c", value.real, value.imag]
    if kind is range:
        return ["R", pack(value.start, refer), pack(value.stop, refer), pack(value.step, refer)]
    if kind is slice:
        return ["S", pack(value.start, refer, deeper), pack(value.stop, refer, deeper),
                pack(value.step, refer, deeper)]
    if value is Ellipsis:
        return ["E"]
    if kind.__module__ == "pathlib" and kind.__name__ in ("PosixPath", "PurePosixPath"):
        return ["p", str(value)]
    if kind is type and getattr(builtins, value.__name__, None) is value:
        return ["T", value.__name__]  # int, str, ValueError...: the same class on both sides
    tag = _VALUES.get((kind.__module__, kind.__qualname__))
    if tag is not None:
        return [tag, *_value_parts(tag, value)]
    plain = _base(value)
    if plain is not None:
        FLATTENED[0] += 1
        return pack(plain, refer, depth)
    return refer(value)


FLATTENED = [0]  # values of builtin kinds' subclasses sent as the builtin kind (the solver's)


# The standard library's value types that tests pass and compare: data too.
_VALUES = {("fractions", "Fraction"): "F", ("decimal", "Decimal"): "D",
           ("datetime", "date"): "date", ("datetime", "datetime"): "datetime",
           ("datetime", "time"): "time", ("datetime", "timedelta"): "timedelta"}


def _value_parts(tag, value):
    if tag == "F":
        return [hex(value.numerator), hex(value.denominator)]
    if tag == "D":
        return [str(value)]
    if tag == "timedelta":
        return [value.days, value.seconds, value.microseconds]
    return [value.isoformat()]


def _value(tag, rest):
    """A value of ``_VALUES``'s kinds from its parts (``BoundaryError`` if they are wrong)."""
    try:
        if tag == "F" and len(rest) == 2 and all(type(v) is str for v in rest):
            from fractions import Fraction

            return Fraction(int(rest[0], 16), int(rest[1], 16))
        if tag == "D" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) < 10000:
            from decimal import Decimal

            return Decimal(rest[0])
        if tag == "timedelta" and len(rest) == 3 and all(type(v) is int for v in rest):
            from datetime import timedelta

            return timedelta(days=rest[0], seconds=rest[1], microseconds=rest[2])
        if len(rest) == 1 and type(rest[0]) is str and len(rest[0]) < 100:
            import datetime

            return getattr(datetime, tag).fromisoformat(rest[0])
    except (ValueError, ZeroDivisionError, OverflowError, ArithmeticError) as exc:
        raise BoundaryError(f"not a {tag}: {exc}") from None
    raise BoundaryError(f"not a {tag}: {str(rest)[:80]}")


def _base(value):
    """A value of a builtin kind's subclass as that kind, from its own storage (an ``IntEnum``
    as its int, a namedtuple as its tuple, a ``Counter`` as its dict); None for others."""
    for kind, whole in ((bool, None), (int, int.__int__), (float, float.__float__),
                        (str, str.__str__), (bytes, bytes.__bytes__),
                        (complex, complex.__complex__), (list, list.copy),
                        (tuple, lambda t: tuple(tuple.__iter__(t))), (dict, dict.copy),
                        (set, set.copy), (frozenset, lambda f: frozenset(frozenset.__iter__(f))),
                        (bytearray, lambda b: bytearray(bytes.__bytes__(bytes(b))))):
        if kind in type(value).__mro__:
            return None if whole is None else whole(value)
    return None


def unpack(data, resolve, depth=0):
    """Exact builtin values from ``pack``'s data; references through ``resolve``."""
    if depth > DEPTH:
        raise BoundaryError(f"a value nested deeper than {DEPTH}")
    kind = type(data)
    if data is None or kind is bool or kind is str or kind is int or kind is float:
        return data
    if kind is not list or not data or type(data[0]) is not str:
        raise BoundaryError(f"not a value: {str(data)[:80]}")
    tag, rest, deeper = data[0], data[1:], depth + 1
    if tag == "l":
        return [unpack(v, resolve, deeper) for v in rest]
    if tag == "t":
        return tuple(unpack(v, resolve, deeper) for v in rest)
    if tag == "d":
        if len(rest) % 2:
            raise BoundaryError("a dict with a key and no value")
        items = [unpack(v, resolve, deeper) for v in rest]
        return dict(zip(items[::2], items[1::2], strict=False))
    if tag in ("s", "f"):
        return (set if tag == "s" else frozenset)(unpack(v, resolve, deeper) for v in rest)
    if tag in ("b", "B") and len(rest) == 1 and type(rest[0]) is str:
        return (bytes if tag == "b" else bytearray).fromhex(rest[0])
    if tag == "I" and len(rest) == 1 and type(rest[0]) is str:
        return int(rest[0], 16)
    if tag == "c" and len(rest) == 2 and all(type(v) in (int, float) for v in rest):
        return complex(rest[0], rest[1])
    if tag == "S" and len(rest) == 3:
        return slice(*[unpack(v, resolve, deeper) for v in rest])
    if tag == "E" and not rest:
        return Ellipsis
    if tag == "R" and len(rest) == 3:
        return range(*[_int(unpack(v, resolve, deeper)) for v in rest])
    if tag == "p" and len(rest) == 1 and type(rest[0]) is str:
        import pathlib

        return pathlib.Path(rest[0])
    if tag == "T" and len(rest) == 1 and type(rest[0]) is str:
        kind = getattr(builtins, rest[0], None)
        if isinstance(kind, type):
            return kind
    if tag in ("F", "D", "date", "datetime", "time", "timedelta"):
        return _value(tag, rest)
    if tag in ("r", "e"):
        return resolve(data)
    raise BoundaryError(f"not a value: {str(data)[:80]}")


def _int(value):
    if type(value) is not int:
        raise BoundaryError(f"a range bound that is not an int: {value!r}")
    return value


def _text(value, limit=4000):
    """An exact str of at most ``limit`` characters, whatever ``value``'s str does."""
    try:
        text = str(value)
    except BaseException as exc:  # noqa: BLE001 - the tested code's __str__
        text = f"<unprintable: {type(exc).__name__}>"
    return str.__str__(text)[:limit] if isinstance(text, str) else ""


# ---- the solver: the tested code's process ----

CONVERT = {"int": int, "float": float, "complex": complex, "str": str, "bytes": bytes,
           "bool": bool, "list": list, "tuple": tuple, "dict": dict, "set": set,
           "frozenset": frozenset}
BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
          "xor", "lshift", "rshift", "eq", "ne", "lt", "le", "gt", "ge")
UNARY = ("neg", "pos", "abs", "invert", "len", "iter", "next", "hash", "str", "repr", "index",
         "reversed")


class Solver:
    """Serves the launcher's requests on ``sock``: imports, attributes, calls, operations."""

    def __init__(self, sock):
        self.sock = sock
        self.warned = []  # warnings issued during the call, for the test's process
        self.objects = {}  # number: object (kept alive, so ids stay unique)
        self.numbers = {}  # id(object): number
        self.callbacks = {}

    def refer(self, value):
        number = self.numbers.get(id(value))
        if number is None or self.objects.get(number) is not value:
            number = len(self.objects) + 1
            self.objects[number] = value
            self.numbers[id(value)] = number
        if isinstance(value, type) and issubclass(value, BaseException):
            bases = [c.__name__ for c in value.__mro__
                     if c.__module__ == "builtins" and issubclass(c, BaseException)]
            return ["r", number, "exc", _text(value.__qualname__, 200),
                    _text(getattr(value, "__module__", ""), 200), bases]
        kind = ("module" if type(value) is type(sys) else "class" if isinstance(value, type)
                else "function" if callable(value) else "object")
        name = getattr(value, "__name__", None) if kind != "object" else None
        return ["r", number, kind, _text(name if isinstance(name, str)
                                         else type(value).__qualname__, 200), "", []]

    def resolve(self, data):
        if data[0] == "r" and len(data) >= 2 and data[1] in self.objects:
            return self.objects[data[1]]
        if data[0] == "e" and len(data) >= 2:  # a callable of the test's, called back
            return self.callback(data[1])
        raise BoundaryError(f"no such object: {str(data)[:80]}")

    def callback(self, number):
        def call(*args, **kwargs):
            send(self.sock, ["callback", number, pack(list(args), self.refer),
                             pack(kwargs, self.refer)])
            return self.answer(receive(self.sock))

        return call

    def answer(self, message):
        """The launcher's reply to a callback (serving requests it makes meanwhile)."""
        while message[0] not in ("ok", "raise"):
            self.serve_one(message)
            message = receive(self.sock)
        if message[0] == "ok":
            return unpack(message[1], self.resolve)
        raise _raised(message, lambda data: self.resolve(data))

    def serve(self):
        while True:
            try:
                message = receive(self.sock)
            except BoundaryError:
                os._exit(0)  # the launcher is gone
            self.serve_one(message)

    def serve_one(self, message):
        warned, self.warned = self.warned, []
        try:
            reply = ["ok", pack(self.perform(message), self.refer)]
        except BaseException as exc:  # noqa: BLE001 - the tested code's, told to the test
            reply = self.raised(exc)
        _flush()
        printed = [*map(_drain, (1, 2)), self.warned[:100]]
        self.warned = warned
        try:
            send(self.sock, [*reply, *printed])
        except BoundaryError as exc:
            send(self.sock, [*self.raised(exc), *printed])

    def warn(self, message, category, filename, lineno, file=None, line=None):
        """``warnings.showwarning`` in the solver: a warning goes to the test's process, where
        pytest's capture (or the test's own) sees it, as it would in one process."""
        self.warned.append([_text(message), _text(getattr(category, "__name__", "")),
                            _text(filename, 500), lineno if type(lineno) is int else 0])

    def raised(self, exc):
        kind = type(exc)
        if kind.__module__ == "builtins":
            which = ["n", kind.__name__]
        else:
            which = self.refer(kind)
        try:
            args = pack(list(exc.args), self.refer)
        except BaseException:  # noqa: BLE001 - arguments that are not data
            args = None
        import traceback

        try:
            where = "".join(traceback.format_exception(exc)[-12:])[-3000:]
        except BaseException:  # noqa: BLE001
            where = ""
        attributes = {}
        for name, value in getattr(exc, "__dict__", {}).items():
            try:
                attributes[name] = pack(value, self.refer)
            except BaseException:  # noqa: BLE001 - not data: left out
                continue
        return ["raise", which, args, _text(exc), where, attributes]


    def perform(self, message):
        op = message[0]
        value = lambda i: unpack(message[i], self.resolve)  # noqa: E731
        if op == "stats":
            return {"flattened": FLATTENED[0]}
        if op == "import":
            import importlib

            return importlib.import_module(message[1])
        target = value(1)
        if op == "getattr":
            return getattr(target, message[2])
        if op == "setattr":
            return setattr(target, message[2], value(3))
        if op == "delattr":
            return delattr(target, message[2])
        if op == "call":
            args, kwargs = value(2), value(3)
            result = target(*args, **kwargs)
            return [result, args, kwargs]  # the arguments as the call left them
        if op == "as":
            return CONVERT[message[2]](target)
        if op == "dir":
            return [n for n in dir(target) if isinstance(n, str)]
        if op == "public":
            names = getattr(target, "__all__", None)
            if names is None:
                names = [n for n in vars(target) if not n.startswith("_")]
            return list(names)
        if op == "instance":
            return isinstance(value(2), target)
        if op == "subclass":
            return issubclass(value(2), target)
        if op == "contains":
            return value(2) in target
        if op == "getitem":
            return target[value(2)]
        if op == "setitem":
            target[value(2)] = value(3)
            return None
        if op == "delitem":
            del target[value(2)]
            return None
        if op == "round":
            return round(target, *value(2))
        if op == "format":
            return format(target, message[2])
        if op == "enter":
            return target.__enter__()
        if op == "exit":
            return bool(target.__exit__(None, None, None))
        if op in UNARY:
            function = {"len": len, "iter": iter, "next": next, "hash": hash, "str": str,
                        "repr": repr, "abs": abs, "reversed": reversed,
                        "index": lambda v: v.__index__()}.get(op)
            if function is None:
                function = getattr(__import__("operator"), op)
            return function(target)
        if op in BINARY:
            import operator

            other = value(2)
            if message[3]:  # reflected: the handle is on the right
                target, other = other, target
            function = getattr(operator, op + "_" if op in ("and", "or") else op)
            return function(target, other)
        raise BoundaryError(f"no such operation: {op!r}")


def _flush():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a stream the tested code put there
            pass


def _drain(fd):
    """What the tested code (or a subprocess of its) wrote to ``fd`` (1 or 2, a memory file)
    since the last call (once its streams are flushed), as text; the file is emptied."""
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        if not size:  # most calls print nothing: three system calls fewer
            return ""
        data = os.pread(fd, min(size, OUTPUT), 0)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        return ""
    return data.decode("utf-8", "replace")

def solve(sock, workspace):
    """The solver's life, in the forked process: wait for the launcher's word, then serve."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    for fd in (1, 2):  # what it prints, down to the descriptor, goes to the test per call
        try:
            made = os.memfd_create(f"tempering-{fd}")
        except (AttributeError, OSError):
            made = os.open(os.devnull, os.O_RDWR)
        os.dup2(made, fd)
        os.close(made)
    streams = [io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                errors="backslashreplace", line_buffering=True)
               for fd in (1, 2)]
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__ = streams
    go = receive(sock)
    if go != ["go"]:
        os._exit(0)
    os.chdir(workspace)
    sys.path.append(workspace)
    sys.argv = [""]
    import warnings

    solver = Solver(sock)
    warnings.showwarning = solver.warn
    warnings.simplefilter("always")  # the test's process filters them, as pytest's would
    solver.serve()


def fork_solver(workspace, hide=None, before=None):
    """Fork the solver (closing every other descriptor) and return the launcher's end of its
    socket and its pid. ``before(child_pid)``, in the child, runs first (namespaces, user);
    then the solver enters a Landlock domain of its own (``own_domain``)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            keep = theirs.fileno()
            os.closerange(3, keep)
            os.closerange(keep + 1, 1 << 16)
            if before is not None:
                before()
            own_domain()
            solve(theirs, workspace)
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"tempering-solver: {exc!r}\n".encode())
        os._exit(0)
    theirs.close()
    return ours, pid


# ---- programs kept apart ----

NOT_NESTED = 86  # the launcher's exit status without nestguard (runner.NOT_NESTED)
MAKE_BLOCK = 1 << 11  # LANDLOCK_ACCESS_FS_MAKE_BLOCK


def nested():
    """Whether this interpreter loaded nestguard (``sandbox/nestguard.c``: each program it
    starts runs in a Landlock domain of its own, out of reach of the others), which then
    told so in ``TEMPERING_NEST``. Its variables are taken out of the environment the tests
    see, and ``subprocess`` kept from ``posix_spawn``, which the guard refuses (its child
    execs unseen)."""
    loaded = os.environ.pop("TEMPERING_NEST", None) == "loaded"
    os.environ.pop("LD_PRELOAD", None)
    import subprocess

    subprocess._USE_POSIX_SPAWN = False
    return loaded


def own_domain():
    """This process in a Landlock domain of its own (nestguard.c's ``enter_own_domain``):
    the solver runs the tested code, and the programs the tests start (in domains of their
    own) are out of its reach, as it is out of theirs. Fails closed: OSError."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    attr = struct.pack("=Q", MAKE_BLOCK)
    ruleset = libc.syscall(444, attr, len(attr), 0)  # landlock_create_ruleset
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "Landlock: the solver's own domain")
    try:
        if libc.prctl(38, 1, 0, 0, 0) < 0 or libc.syscall(446, ruleset, 0) < 0:  # NNP, restrict
            raise OSError(ctypes.get_errno(), "Landlock: the solver's own domain")
    finally:
        os.close(ruleset)


# ---- the launcher's side ----


class Boundary:
    """The launcher's connection to its solver."""

    def __init__(self, sock):
        self.sock = sock
        self.lock = threading.RLock()
        self.handles = {}  # number: Remote or stand-in exception class
        self.local = {}  # number: a callable of the test's, called back
        self.local_numbers = {}
        self.objects = self.refused = 0  # handles of instances made; values refused
        self.only_data = False  # grading.isolation = "data": no handle of an instance
    def start(self):
        send(self.sock, ["go"])

    def refer(self, value):
        if type(value) is Remote or type(value) is RemoteModule:
            return ["r", object.__getattribute__(value, "_number")]
        number = getattr(value, "__tempering_remote__", None) if isinstance(value, type) \
            else None
        if type(number) is int and self.handles.get(number) is value:
            return ["r", number]
        if callable(value) and not isinstance(value, type(sys)):
            if self.is_test(value):
                self.refused += 1
                raise TypeError("a hidden test cannot be handed to the tested code")
            number = self.local_numbers.get(id(value))
            if number is None:
                number = self.local_numbers[id(value)] = len(self.local) + 1
                self.local[number] = value
            return ["e", number]
        self.refused += 1
        raise TypeError(f"a {type(value).__qualname__} cannot be passed to the tested code: "
                        "it runs in another process (grading.isolation = 'process'), and only "
                        "data, callables and its own objects cross")

    tests = "/nonexistent/"  # the hidden tests' directory, set by install

    def is_test(self, value):
        """Whether ``value`` is a test (a ``test*`` function or ``Test*`` class of the hidden
        tests), or a function of theirs pytest would call as one (``setup_*``): called back by
        the tested code, a test hands it its expected values in how it fails."""
        code = getattr(value, "__code__", None)
        name = getattr(value, "__name__", "")
        if isinstance(value, type):
            return type(name) is str and name.startswith("Test")
        return type(code) is type(_text.__code__) and code.co_filename.startswith(
            self.tests) and code.co_name.startswith(("test", "setup", "teardown"))

    def resolve(self, data):
        if data[0] == "e":
            raise BoundaryError("the tested code sent a reference of the test's")
        if len(data) != 6 or type(data[1]) is not int or not all(
                type(v) is str for v in data[2:5]) or type(data[5]) is not list:
            raise BoundaryError(f"a malformed reference: {str(data)[:80]}")
        _, number, kind, name, module, bases = data
        known = self.handles.get(number)
        if known is not None:
            return known
        if kind == "exc":
            made = _stand_in(name, module, bases, number)
        elif kind == "module":
            made = RemoteModule(self, number, name)
        elif kind == "object" and self.only_data:
            self.refused += 1
            raise TypeError(f"the tested code answered with a {name}, which is not data: with "
                            "grading.isolation = 'data' only data comes back from it")
        else:
            made = Remote(self, number, kind, name)
            self.objects += kind == "object"
        self.handles[number] = made
        return made

    def request(self, *message):
        with self.lock:
            send(self.sock, list(message))
            while True:
                reply = receive(self.sock)
                if type(reply) is not list or not reply or type(reply[0]) is not str:
                    raise BoundaryError("an unreadable reply")
                if reply[0] == "callback":
                    self._call_back(reply)
                    continue
                self._printed(reply)
                if reply[0] == "ok" and len(reply) >= 2:
                    return unpack(reply[1], self.resolve)
                if reply[0] == "raise":
                    exc = _raised(reply, self.resolve)
                    if isinstance(exc, StopIteration | StopAsyncIteration) and \
                            message[0] != "next":
                        # Out of anything but an iterator's ``__next__``, as PEP 479 has it
                        # for a generator: else ``all(map(f, cases))`` or a ``for`` over
                        # ``zip(map(f, xs), want)`` ends at the first call, checking nothing
                        # (round twenty-five).
                        raise RuntimeError(f"the tested code raised {type(exc).__name__} "
                                           "outside an iterator") from exc
                    raise exc
                raise BoundaryError(f"an unexpected reply: {reply[0][:40]!r}")

    def _printed(self, reply):
        tail = reply[-3:] if reply[0] == "ok" and len(reply) == 5 or \
            reply[0] == "raise" and len(reply) == 9 else []
        if not tail:
            return
        for text, stream in zip(tail[:2], (sys.stdout, sys.stderr), strict=False):
            if type(text) is str and text and stream is not None:
                stream.write(text)
        if type(tail[2]) is list:
            import warnings

            for warned in tail[2]:
                if type(warned) is list and len(warned) == 4 and type(warned[0]) is str \
                        and type(warned[2]) is str and type(warned[3]) is int:
                    kind = getattr(builtins, str(warned[1]), None)
                    if not (isinstance(kind, type) and issubclass(kind, Warning)):
                        kind = UserWarning
                    warnings.warn_explicit(warned[0], kind, warned[2], warned[3])

    def _call_back(self, reply):
        try:
            function = self.local[reply[1]]
            args, kwargs = unpack(reply[2], self.resolve), unpack(reply[3], self.resolve)
            if type(args) is not list or type(kwargs) is not dict or \
                    not all(type(k) is str for k in kwargs):
                raise BoundaryError("malformed arguments of a call back")
            answer = ["ok", pack(function(*args, **kwargs), self.refer)]
        except Exception as exc:  # the test's own function raised: tell the tested code its
            # kind only (an assertion's message holds what the test expected)
            answer = ["raise", ["n", type(exc).__name__ if type(exc).__module__ == "builtins"
                                and not isinstance(exc, AssertionError) else "Exception"],
                      None, "", "", {}]
        send(self.sock, answer)

    def crossed(self):
        """What crossed that was not plain data, for the report's end: instances of the
        tested code's classes held as handles, the test's callables called back, values
        refused, and (the solver's word) values of builtin subclasses sent as the builtin.
        A reference solution whose run crossed none of these exchanges data only, which is
        what ``auto`` asks of a task before it grades it across the boundary."""
        try:
            flattened = self.request("stats")
        except Exception:  # noqa: BLE001 - a solver that is gone or will not say
            flattened = {"flattened": -1}
        got = flattened.get("flattened", -1) if type(flattened) is dict else -1
        return {"objects": self.objects, "callbacks": len(self.local),
                "refused": self.refused, "flattened": got if type(got) is int else -1}

    # what the proxies ask

    def call(self, target, args, kwargs):
        packed_args = pack(list(args), self.refer)
        result, after, after_kw = self.request("call", target, packed_args,
                                               pack(kwargs, self.refer))
        if self.only_data:  # what it did to its copies of the arguments stays there: a
            return result  # test's ``f(xs) == oracle(xs)`` reads xs after (round 24)
        for given, now in zip(args, after, strict=False):  # what the call did to them
            _update(given, now)
        for name, given in kwargs.items():
            if type(after_kw) is dict:
                _update(given, after_kw.get(name))
        return result

    def convert(self, remote, kind):
        """``remote`` had as a value of ``kind`` now (a mutable object's value may change
        between two asks; whatever it says, the builtin comparison is made here)."""
        try:
            value = self.request("as", object.__getattribute__(remote, "_ref"), kind)
        except BoundaryError:
            raise
        except Exception:  # noqa: BLE001 - it cannot be had as that kind
            return _NOT
        return value if type(value) is CONVERT[kind] else _NOT


class _Not:
    __slots__ = ()


_NOT = _Not()


def _update(given, now):
    """Make the test's own mutable argument ``given`` hold ``now`` (what the tested code left
    in its copy)."""
    kind = type(given)
    if kind not in (list, dict, set, bytearray) or type(now) is not kind:
        return
    if kind is list or kind is bytearray:
        given[:] = now
    else:
        given.clear()
        given.update(now)


def _raised(reply, resolve):
    """The exception a ``raise`` reply tells of, to raise here."""
    _, which, args, message, where = reply[:5]
    attributes = reply[5] if len(reply) > 5 and type(reply[5]) is dict else {}
    kind = None
    if type(which) is list and len(which) == 2 and which[0] == "n" and type(which[1]) is str:
        kind = getattr(builtins, which[1], None)
        if which[1] in ("KeyboardInterrupt", "GeneratorExit"):  # would stop the run itself
            kind = _stand_in(which[1], "builtins", ["Exception"], 0)
    elif type(which) is list and which[:1] == ["r"]:
        kind = resolve(which)
    if not (isinstance(kind, type) and issubclass(kind, BaseException)):
        kind = BoundaryError
    try:
        values = unpack(args, resolve) if args is not None else None
    except (BoundaryError, TypeError):
        values = None
    try:
        exc = kind(*values) if type(values) is list else kind(message)
    except Exception:  # noqa: BLE001 - a builtin that wants other arguments
        exc = kind(message) if kind is not BoundaryError else BoundaryError(message)
    if getattr(kind, "__tempering_remote__", None) is not None:
        exc._message = message if type(message) is str else ""
    for name, value in attributes.items():  # what it set on itself (``self.line = 3``)
        if type(name) is str and not name.startswith("__"):
            try:
                setattr(exc, name, unpack(value, resolve))
            except (BoundaryError, AttributeError, TypeError):
                continue
    if type(where) is str and where:
        exc.add_note("in the tested code's process:\n" + where.rstrip())
    return exc


def _stand_in(name, module, bases, number):
    """A local exception class for one of the tested code's: a subclass of the builtin
    exceptions it derives from, so ``pytest.raises(ValueError)`` and ``except`` work."""
    chosen = []
    for base in bases:
        kind = getattr(builtins, base, None) if type(base) is str else None
        if isinstance(kind, type) and issubclass(kind, BaseException) and kind not in (
                KeyboardInterrupt, GeneratorExit) and not any(issubclass(c, kind)
                                                              for c in chosen):
            chosen.append(kind)
    try:
        made = type(name.rpartition(".")[2] or "Error", tuple(chosen) or (Exception,),
                    {"__module__": module or "tested", "__qualname__": name,
                     "__tempering_remote__": number, "__str__": _stand_in_str})
    except TypeError:  # bases whose layouts conflict: the first one only
        made = type(name.rpartition(".")[2] or "Error", (chosen[0],),
                    {"__module__": module or "tested", "__qualname__": name,
                     "__tempering_remote__": number, "__str__": _stand_in_str})
    return made


def _stand_in_str(self):
    message = self.__dict__.get("_message")
    return message if type(message) is str else BaseException.__str__(self)


def _binary(op, reflected=False):
    def method(self, other):
        boundary = object.__getattribute__(self, "_boundary")
        ref = object.__getattribute__(self, "_ref")
        kind = type(other)
        if kind is Remote or kind is RemoteModule:
            return boundary.request(op, ref, ["r", object.__getattribute__(other, "_number")],
                                    reflected)
        name = kind.__name__ if kind in _DATA else None
        if name is None:
            return NotImplemented
        if kind is bool:
            name = "int"  # True + handle: the handle as a number
        mine = boundary.convert(self, name)
        if mine is _NOT:
            return NotImplemented
        import operator

        function = getattr(operator, op + "_" if op in ("and", "or") else op)
        return function(other, mine) if reflected else function(mine, other)

    method.__name__ = f"__{'r' if reflected else ''}{op}__"
    return method


_DATA = (int, float, complex, str, bytes, bool, list, tuple, dict, set, frozenset)


class Remote:
    """One of the tested code's objects, held in its process."""

    __slots__ = ("_boundary", "_number", "_ref", "_kind", "_name", "__weakref__")

    def __init__(self, boundary, number, kind, name):
        set_ = object.__setattr__
        set_(self, "_boundary", boundary)
        set_(self, "_number", number)
        set_(self, "_ref", ["r", number])
        set_(self, "_kind", kind)
        set_(self, "_name", name)

    def _ask(self, op, *rest):
        return object.__getattribute__(self, "_boundary").request(
            op, object.__getattribute__(self, "_ref"), *rest)

    def __getattr__(self, name):
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        self._ask("setattr", name, pack(value, object.__getattribute__(self, "_boundary").refer))

    def __delattr__(self, name):
        self._ask("delattr", name)

    def __call__(self, *args, **kwargs):
        boundary = object.__getattribute__(self, "_boundary")
        return boundary.call(object.__getattribute__(self, "_ref"), args, kwargs)

    def __repr__(self):
        return self._ask("repr")

    def __str__(self):
        return self._ask("str")

    def __bool__(self):
        value = object.__getattribute__(self, "_boundary").convert(self, "bool")
        if value is _NOT:
            raise TypeError(f"the tested code's {object.__getattribute__(self, '_name')} has "
                            "no truth value")
        return value

    def __int__(self):
        return self._had("int")

    def __float__(self):
        return self._had("float")

    def __complex__(self):
        return self._had("complex")

    def __index__(self):
        return self._ask("index")

    def _had(self, kind):
        value = object.__getattribute__(self, "_boundary").convert(self, kind)
        if value is _NOT:
            raise TypeError(f"the tested code's {object.__getattribute__(self, '_name')} "
                            f"cannot be had as {kind}")
        return value

    def __len__(self):
        return self._ask("len")

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __reversed__(self):
        return self._ask("reversed")

    def __hash__(self):
        return self._ask("hash")

    def __contains__(self, item):
        """``item in handle``: with a data ``item``, the handle is had as data first (a str
        for a str, else a list of its items) and ``in`` runs here, so the tested code's object
        never answers for a value it was shown; between handles, the solver answers."""
        boundary = object.__getattribute__(self, "_boundary")
        if type(item) is Remote or type(item) is RemoteModule:
            return bool(self._ask("contains", pack(item, boundary.refer)))
        mine = boundary.convert(self, "str" if type(item) is str else "list")
        if mine is _NOT:
            raise TypeError(f"the tested code's {object.__getattribute__(self, '_name')} "
                            "cannot be had as data to look in")
        return item in mine

    def __getitem__(self, key):
        return self._ask("getitem", pack(key, object.__getattribute__(self, "_boundary").refer))

    def __setitem__(self, key, value):
        refer = object.__getattribute__(self, "_boundary").refer
        self._ask("setitem", pack(key, refer), pack(value, refer))

    def __delitem__(self, key):
        self._ask("delitem", pack(key, object.__getattribute__(self, "_boundary").refer))

    def __enter__(self):
        return self._ask("enter")

    def __exit__(self, *exc):
        return self._ask("exit")

    def __round__(self, *ndigits):
        return self._ask("round", pack(list(ndigits), lambda v: None))

    def __format__(self, spec):
        return self._ask("format", spec)

    def __trunc__(self):
        return int(self)

    def __floor__(self):
        import math

        return math.floor(self._had("float"))

    def __ceil__(self):
        import math

        return math.ceil(self._had("float"))

    def __neg__(self):
        return self._ask("neg")

    def __pos__(self):
        return self._ask("pos")

    def __abs__(self):
        return self._ask("abs")

    def __invert__(self):
        return self._ask("invert")

    def __dir__(self):
        return self._ask("dir")

    def __instancecheck__(self, value):
        return bool(self._ask("instance", pack(
            value, object.__getattribute__(self, "_boundary").refer)))

    def __subclasscheck__(self, value):
        return bool(self._ask("subclass", pack(
            value, object.__getattribute__(self, "_boundary").refer)))


for _op in BINARY:
    setattr(Remote, f"__{_op}__", _binary(_op))
    if _op not in ("eq", "ne", "lt", "le", "gt", "ge"):
        setattr(Remote, f"__r{_op}__", _binary(_op, reflected=True))
del _op

# What a handle can do when only data crosses: be called, and have its attributes read (a
# class's constants, a function's name). Everything else would ask the tested code what its
# object is worth, which it could answer one way, then another; the solver's word that the
# object is a function is no more than its word.
_CALLABLE_ONLY = {"__getattr__", "__setattr__", "__delattr__", "__call__", "__dir__",
                  "__init__", "__repr__", "__str__"}


def _only_called(name, method):
    def gate(self, *args):
        if object.__getattribute__(self, "_boundary").only_data:
            raise TypeError(f"the tested code's {object.__getattribute__(self, '_kind')} "
                            f"{object.__getattribute__(self, '_name')} can only be called "
                            "(grading.isolation = 'data')")
        return method(self, *args)

    gate.__name__ = name
    return gate


def _told(kind):
    def text(self):
        if object.__getattribute__(self, "_boundary").only_data:
            return (f"<the tested code's {object.__getattribute__(self, '_kind')} "
                    f"{object.__getattribute__(self, '_name')}>")
        return self._ask(kind)

    text.__name__ = f"__{kind}__"
    return text


for _name, _method in list(vars(Remote).items()):
    if callable(_method) and _name.startswith("__") and _name not in _CALLABLE_ONLY:
        setattr(Remote, _name, _only_called(_name, _method))
Remote.__repr__, Remote.__str__ = _told("repr"), _told("str")
del _name, _method


class RemoteModule(type(sys)):
    """A module of the workspace, held in the tested code's process."""

    def __init__(self, boundary, number, name):
        super().__init__(name)
        object.__setattr__(self, "_boundary", boundary)
        object.__setattr__(self, "_number", number)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in ("__all__",
                                                                            "__version__"):
            raise AttributeError(name)
        boundary = object.__getattribute__(self, "_boundary")
        ref = ["r", object.__getattribute__(self, "_number")]
        if name == "__all__":
            return boundary.request("public", ref)
        try:
            return boundary.request("getattr", ref, name)
        except AttributeError:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from None

    def __setattr__(self, name, value):
        if name.startswith("__") or type(value) is RemoteModule:  # the import system's
            object.__setattr__(self, name, value)
            return
        boundary = object.__getattribute__(self, "_boundary")
        boundary.request("setattr", ["r", object.__getattribute__(self, "_number")], name,
                         pack(value, boundary.refer))

    def __dir__(self):
        boundary = object.__getattribute__(self, "_boundary")
        return boundary.request("dir", ["r", object.__getattribute__(self, "_number")])


INSTALLED = []  # the launcher's Boundary, once installed


class BoundaryFinder:
    """Imports of the workspace's modules, as modules of the solver's (``RemoteModule``): last
    on ``sys.meta_path``, for the names nothing else (the standard library, pytest, the hidden
    tests' helpers) provides and the workspace does."""

    def __init__(self, boundary, workspace):
        self.boundary, self.workspace = boundary, workspace.rstrip("/")

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        base = f"{self.workspace}/{top}"
        if not (os.path.isfile(base + ".py") or os.path.isdir(base) or _compiled(base)):
            return None
        # A package, whatever it is there: its submodules are found here too.
        return type(sys.__spec__)(fullname, self, origin=f"tempering-solver:{fullname}",
                                  is_package=True)

    def create_module(self, spec):
        module = self.boundary.request("import", spec.name)
        if type(module) is not RemoteModule:
            raise ImportError(f"the tested code's import of {spec.name} gave no module")
        return module

    def exec_module(self, module):
        return None  # it ran in the solver


class WorkspaceGate:
    """First on ``sys.meta_path``: a module that the path finder would load from the workspace
    is the solver's, whatever put the workspace on ``sys.path`` (a test's
    ``sys.path.insert(0, ...)``, a common opening, would otherwise have loaded the tested code
    into this process, where nothing watches it: round thirty). What it cannot serve (a
    workspace module below a directory the test put on the path) loads here, and the guard
    says so (``Guard.ran_here``): the host then grades in one process."""

    def __init__(self, finder, workspace, hidden):
        self.finder = finder
        self.workspace = os.path.realpath(workspace) + "/"
        self.hidden = frozenset(os.path.realpath(path) for path in hidden)

    def find_spec(self, fullname, path=None, target=None):
        try:
            spec = _frozen_importlib_external.PathFinder.find_spec(fullname, path)
        except Exception:  # a path of the solver's package: the boundary's finder has it
            return None
        if spec is None:
            return None
        places = [spec.origin, *(spec.submodule_search_locations or ())]
        for place in places:
            if type(place) is str and place:
                real = os.path.realpath(place)
                if real in self.hidden:  # the hidden tests' own (the hidden finder's)
                    return None
                if real.startswith(self.workspace):  # the tests directory's others too
                    return self.finder.find_spec(fullname, path, target)
        return None


def _compiled(base):
    directory, _, name = base.rpartition("/")
    try:
        return any(n.startswith(name + ".") and n.endswith((".so", ".pyd", ".pyc"))
                   for n in os.listdir(directory))
    except OSError:
        return False


def install(sock, workspace, tests, only_data=False, hidden=()):
    """The launcher's side: the finder for the workspace's modules, then the solver's start.
    ``only_data``: no handle of the tested code's objects but its modules, functions and
    classes, which can only be called (``grading.isolation = "data"``). ``hidden``: the
    hidden Python files' paths, which are the launcher's to load."""
    boundary = Boundary(sock)
    boundary.only_data = only_data
    boundary.tests = tests.rstrip("/") + "/"
    INSTALLED.append(boundary)
    finder = BoundaryFinder(boundary, workspace)
    sys.meta_path.append(finder)
    sys.meta_path.insert(0, WorkspaceGate(finder, workspace, hidden))
    boundary.start()
    return boundary
