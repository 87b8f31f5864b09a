"""Which isolation a task's grading gets (``grading.isolation``), read from its hidden tests.

``process`` runs the tested code in a process of its own (``inside_boundary.py``): it answers
calls with data and reaches nothing of the tests. That holds for tests that call the tested
code and look at what it returns, raises or prints, which is most of them; it cannot hold for
tests that reach into the tested code's process (patch its modules, read its log records or
warnings, compare identities of what it returned, pass it objects of their own, drive its
coroutines). ``auto`` picks ``process`` where the task shows it holds: the hidden tests'
syntax reaches into none of that (``by_syntax``), and the task's reference solution, graded
across the boundary once, passes every test with nothing but data crossing
(``exchanges_data``). Both are read on the host from what the task author wrote, never from
what the agent did, so nothing an agent does moves the choice.
"""

from __future__ import annotations

import ast

from tempering import syntax
from tempering.reward.inside_guard import RAN_HERE
from tempering.reward.kept import Kept
from tempering.reward.runner import TestRun
from tempering.tasks.task import Task

__all__ = ["by_syntax", "exchanges_data", "reaches_in"]

# Names (variables, attributes, parameters, imports) of what reaches into the tested code's
# process: fixtures and helpers that patch it or read its logs and warnings, introspection.
REACHING = frozenset({
    "monkeypatch", "mocker", "caplog", "recwarn", "mock", "patch", "MagicMock", "Mock",
    "setattr", "delattr", "vars", "globals", "locals", "id", "inspect", "importlib", "reload",
    "gc", "pickle", "weakref", "warns", "catch_warnings", "deprecated_call", "asyncio",
    "threading", "multiprocessing", "modules", "getsource",
    # objects of the test's own whose behaviour a copy would lose: buffers, collections (not
    # ``open``: a test that reads its fixtures passes data, and one that passes the tested
    # code a file is kept in one process by its reference solution's run, where the file is
    # refused; in one process, the tested code's ``os.chdir`` at import redirected the
    # fixtures a test opened after importing it: round twenty-six)
    "StringIO", "BytesIO", "defaultdict", "deque", "OrderedDict", "Counter",
    "namedtuple", "dataclass", "Enum",
    "__dict__", "__code__", "__globals__", "__class__", "__module__", "__file__", "__path__"})
_IDENTITY_OK = (type(None), bool, type(...))

_chosen: Kept[str, tuple[str, str]] = Kept(4096)  # by task digest: (isolation, why)


def by_syntax(task: Task, *, hides_tests: bool = True) -> tuple[str, str]:
    """(``process`` or ``shared``, why), as far as ``task``'s configuration and the hidden
    tests' syntax tell. ``hides_tests``: whether the grading path can give the tested code's
    process a view without the tests directory (the zygote's can; a sandbox of its own cannot,
    and there the hidden tests' data files would be readable by it, as they are to a
    subprocess: ``auto`` keeps such tasks in one process, where the guard sees the tested code
    read them). ``data`` here is a candidate: ``Grader.isolation`` also asks the reference
    solution (``exchanges_data``)."""
    wanted = task.config.grading.isolation
    if wanted != "auto":
        return wanted, f"grading.isolation = {wanted!r}"
    if not hides_tests and any(not path.endswith(".py") for path in task.tests):
        return "shared", "the hidden tests have data files, which a sandbox of its own shows"
    return _chosen.get(task.digest, lambda: _auto(task))


def ran_here(run: TestRun) -> str:
    """What of the workspace's code the tests compiled or ran in their own process, across
    the boundary ('' if nothing): a test that put the workspace on ``sys.path`` under a
    directory the boundary cannot serve, ran one of its files or ``exec``-ed its text. Such a
    run is graded again in one process, where the guard watches it (round thirty)."""
    return "; ".join(f"the tests ran the tested code in their own process ({detail})"
                     for flag, detail, _ in run.audit if flag == RAN_HERE)


def exchanges_data(run: TestRun, expected: int) -> str:
    """Why the reference solution's run across the boundary (``run``) shows that the tests
    need more than data from the tested code ('' if it does not): every test must pass, and
    nothing but data may have crossed (no instance held as a handle, no value refused, none of
    a builtin kind's subclasses flattened; a callable of the test's called back with data is
    data both ways)."""
    here = ran_here(run)
    if here:
        return here
    passed = sum(outcome == "passed" for outcome, _ in run.outcomes.values())
    if passed != expected or len(run.outcomes) != expected:
        failing = [i for i, (outcome, _) in run.outcomes.items() if outcome != "passed"]
        return f"{passed} of {expected} tests passed ({', '.join(failing[:3])})"
    crossed = run.crossed
    if crossed is None:
        return "it reported nothing of what crossed"
    # a callable of the test's called back takes and gives data here (the key function a test
    # hands to the tested code): across the boundary the tested code holds a stand-in, not the
    # function, whose ``__globals__`` (no audit event reads it) would be the hidden module's
    # namespace and its tables of expected values in one process (round forty-four)
    more = {name: count for name, count in crossed.items() if count and name != "callbacks"}
    if more:
        return "more than data crossed: " + ", ".join(f"{n} {k}" for k, n in sorted(more.items()))
    return ""


def _auto(task: Task) -> tuple[str, str]:
    for path in task.tests:
        if not path.endswith(".py"):
            continue
        try:
            tree = syntax.parse(task.tests[path])
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return "shared", f"{path} does not parse"
        why = reaches_in(tree)
        if why:
            return "shared", f"{path}: {why}"
    return "data", "the hidden tests only call the tested code and look at what it gives"


def reaches_in(tree: ast.AST) -> str:
    """What in ``tree`` reaches into the tested code's process ('' if nothing)."""
    for node in ast.walk(tree):
        name = _name(node)
        if name in REACHING:
            return f"line {getattr(node, 'lineno', '?')} uses {name}"
        if isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncFor | ast.AsyncWith):
            return f"line {node.lineno} is asynchronous"
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete) and any(
                _inside_an_attribute(t) for t in _targets(node)):
            return f"line {node.lineno} writes into what an attribute holds"
        if isinstance(node, ast.ClassDef) and not node.name.startswith("Test"):
            return f"line {node.lineno} defines a class of its own ({node.name})"
        if isinstance(node, ast.Compare) and any(
                isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
            sides = [node.left, *node.comparators]
            if not any(isinstance(s, ast.Constant) and isinstance(s.value, _IDENTITY_OK)
                       for s in sides):
                return f"line {node.lineno} compares identities"
    return ""


def _targets(node: ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete) -> list[ast.expr]:
    if isinstance(node, ast.Assign | ast.Delete):
        return list(node.targets)
    return [node.target]


def _inside_an_attribute(target: ast.expr) -> bool:
    """Whether ``target`` writes into a value reached through an attribute (``b.grid[0][0]``,
    ``obj.a.b``): across the boundary that value is a copy. ``obj.attr = v`` itself is not:
    it goes to the tested code's object."""
    node = target.value if isinstance(target, ast.Subscript | ast.Attribute) else None
    while isinstance(node, ast.Subscript | ast.Attribute):
        if isinstance(node, ast.Attribute):
            return True
        node = node.value
    return False


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):  # a test's own __file__ or __name__ is its own
        return "" if node.id.startswith("__") else node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.arg):
        return node.arg
    if isinstance(node, ast.alias):
        return node.name.partition(".")[0] if node.asname is None else node.name
    return ""
