"""What a Python module names: its imports, calls, reflection, always-equal classes.

``Names`` reads one module's syntax tree (``ast``, never importing it) for the static screen
(``static.py``). It is stdlib only, so that a file too big to parse safely in the grader's
process is parsed by this module run as a script (``python3 -I -S names.py``) in a process of
its own, under a memory and a CPU-time limit: a flat list literal of a few MB costs ~500 bytes
of syntax tree per byte of source (red team, round 38).
"""

from __future__ import annotations

import ast
import json
import resource
import sys
from collections.abc import Callable
from typing import Any

INTROSPECTION_CALLS = frozenset({
    "sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.settrace",
    "sys.setprofile", "sys.monitoring.register_callback",
    "inspect.currentframe", "inspect.stack", "inspect.getouterframes", "inspect.getframeinfo",
    "inspect.getinnerframes", "inspect.trace", "traceback.extract_stack",
    "traceback.walk_stack", "traceback.format_stack", "traceback.print_stack",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
})
FRAME_ATTRIBUTES = frozenset({"f_back", "f_locals", "f_globals", "tb_frame", "gi_frame",
                              "cr_frame"})
# Imports made by a call, and code run from a string: what they import is read from their
# literal argument; anything else imports what no reading can name (``DYNAMIC``), which a
# task's ``forbidden_imports`` rule counts as forbidden (red team, round thirty-six).
IMPORTING_CALLS = frozenset({"__import__", "builtins.__import__", "importlib.import_module",
                             "importlib.__import__"})
EXECUTING_CALLS = frozenset({"exec", "eval", "compile", "builtins.exec", "builtins.eval",
                             "builtins.compile"})
# Names through which an import can be made without an import statement: any use of them
# but a call read above (``f = __import__``, ``getattr(builtins, name)``) is dynamic.
HANDLE_ATTRIBUTES = frozenset({"__import__", "import_module", "__builtins__", "__loader__",
                               "__spec__", "spec_from_file_location", "spec_from_loader",
                               "exec_module", "load_module", "run_path", "run_module"})
HANDLE_NAMES = HANDLE_ATTRIBUTES | {"exec", "eval", "compile", "builtins", "importlib"}
# Reflection: names reached through a namespace or a computed string, which no reading of the
# text can follow (``sys.modules["builtins"].__dict__["ex" + "ec"]``: red team, round 38).
# Any of these makes a module's imports and calls DYNAMIC for the rules, and the module
# unreadable to lint.
NAMESPACE_ATTRIBUTES = frozenset({"__dict__", "__globals__", "__builtins__", "__subclasses__",
                                  "__getattribute__", "__code__", "f_builtins"})
NAMESPACE_CALLS = frozenset({"vars", "globals", "locals", "sys.modules", "sys.modules.get",
                             "operator.attrgetter", "operator.methodcaller"})
BY_NAME_CALLS = frozenset({"getattr", "setattr", "delattr", "builtins.getattr",
                           "builtins.setattr", "builtins.delattr"})
DYNAMIC = "<dynamic import>"
DYNAMIC_CALL = "<dynamic call>"
MAX_NESTED_CODE = 4  # code strings within code strings read; deeper is DYNAMIC


class Names:
    """Dotted names of the calls and imports in a module, through import aliases. Walked
    iteratively (``ast.walk``), never by recursion: a file of deeply nested expressions is
    screened like any other, not a crash of the grader."""

    def __init__(self, tree: ast.Module, depth: int = 0,
                 parse: Callable[[str], ast.Module] = ast.parse) -> None:
        self.depth = depth
        self._parse = parse
        """Parses the code a string runs: in the grader's process ``tempering.syntax.parse``
        (one tree at a time there), in this module's own process ``ast.parse``."""
        self.aliases: dict[str, str] = {}
        self.imports: set[str] = set()
        self.calls: list[tuple[str, int]] = []
        self.attributes: list[tuple[str, int]] = []
        self.always_equal: list[tuple[str, int]] = []
        self.unreadable: list[tuple[str, int]] = []
        """Where the module reaches code by a computed name or runs text it does not hold:
        no reading of the file says what runs there (lint cannot vouch for it)."""
        nodes = list(ast.walk(tree))
        for node in nodes:  # every import first: a call may come before the import it uses
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.imports.add(alias.name)
                    self.aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                self.imports.add(node.module)
                for alias in node.names:
                    self.imports.add(f"{node.module}.{alias.name}")
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        self._parents = {id(child): node for node in nodes
                         for child in ast.iter_child_nodes(node)}
        called = {id(node.func) for node in nodes if isinstance(node, ast.Call)}
        for node in nodes:
            if isinstance(node, ast.Call):
                self._call(node)
            elif isinstance(node, ast.Attribute):
                if node.attr in FRAME_ATTRIBUTES:
                    self.attributes.append((node.attr, node.lineno))
                if node.attr in NAMESPACE_ATTRIBUTES or self.dotted(node) == "sys.modules":
                    self._namespace(node, node.attr if node.attr != "modules" else "sys.modules")
            elif isinstance(node, ast.Name):
                if node.id == "__builtins__" or self.aliases.get(node.id) == "sys.modules":
                    self._namespace(node, node.id)
                elif node.id in BY_NAME_CALLS | NAMESPACE_CALLS and id(node) not in called:
                    self._reflective(f"{node.id} handed on", node.lineno, unreadable=True)
            elif isinstance(node, ast.ClassDef):
                self._class(node)
        del self._parents
        read = {id(n) for call in nodes if isinstance(call, ast.Call)
                and self.dotted(call.func) in IMPORTING_CALLS | EXECUTING_CALLS
                for n in _chain(call.func)}
        for node in nodes:  # ``f = __import__``, ``getattr(builtins, name)``: unread
            if id(node) not in read and (
                    isinstance(node, ast.Name) and node.id in HANDLE_NAMES
                    or isinstance(node, ast.Attribute) and node.attr in HANDLE_ATTRIBUTES):
                self.imports.add(DYNAMIC)
                handle = node.id if isinstance(node, ast.Name) else node.attr
                self.unreadable.append((f"{handle} handed on", node.lineno))

    def _reflective(self, what: str, line: int, *, unreadable: bool) -> None:
        """A name reached by reflection: the rules cannot say what it imports or calls
        (``DYNAMIC``); ``unreadable`` where no reading can say what runs there."""
        self.imports.add(DYNAMIC)
        self.calls.append((DYNAMIC_CALL, line))
        if unreadable:
            self.unreadable.append((what, line))

    def _namespace(self, node: ast.expr, what: str) -> None:
        """A namespace (``__dict__``, ``sys.modules``, ``vars()``): unreadable where it is
        indexed or looked up by a computed key, or handed on to anything but a literal
        index or lookup."""
        parent = self._parents.get(id(node))
        if isinstance(parent, ast.Subscript) and parent.value is node:
            unreadable = not _literal(parent.slice)
        elif isinstance(parent, ast.Attribute) and parent.value is node:
            call = self._parents.get(id(parent))
            unreadable = not (parent.attr in ("get", "__getitem__", "__contains__", "keys")
                              and isinstance(call, ast.Call) and call.func is parent
                              and all(_literal(a) for a in call.args))
        else:
            unreadable = not isinstance(parent, ast.Compare | ast.Expr)
        self._reflective(what, node.lineno, unreadable=unreadable)

    def dotted(self, node: ast.expr) -> str | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            base: str | None = self.aliases.get(node.id, node.id)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "__import__" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            base = node.args[0].value
        else:
            return None
        return ".".join([base, *reversed(parts)]) if base else None

    def _call(self, node: ast.Call) -> None:
        name = self.dotted(node.func)
        if name is not None:
            self.calls.append((name, node.lineno))
        if name in IMPORTING_CALLS or name in EXECUTING_CALLS:
            self._dynamic(name, node)
        if name in NAMESPACE_CALLS:
            self._namespace(node, f"{name}()")
        if name in BY_NAME_CALLS and len(node.args) >= 2:
            key, target = node.args[1], node.args[0]
            if not _literal(key):
                mine = isinstance(target, ast.Name) and target.id in ("self", "cls")
                self._reflective(f"{name}() with a computed name", node.lineno,
                                 unreadable=not mine)
            elif name.endswith("getattr") and (base := self.dotted(target)) is not None:
                self.calls.append((f"{base}.{_constant_value(key)}", node.lineno))

    def _dynamic(self, name: str, node: ast.Call) -> None:
        """What an import by call (``__import__("x")``) or code run from a string imports:
        the module named, the imports of the code (parsed, never run), or ``DYNAMIC`` where
        the argument is not a literal and no reading can say what it loads."""
        first = node.args[0] if node.args else None
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            self.imports.add(DYNAMIC)
            if name in EXECUTING_CALLS:  # text the file does not hold
                self.calls.append((DYNAMIC_CALL, node.lineno))
                self.unreadable.append((f"{name}() of computed text", node.lineno))
            else:
                self.unreadable.append((f"{name}() of a computed name", node.lineno))
        elif name in IMPORTING_CALLS:
            self.imports.add(first.value)
        elif self.depth < MAX_NESTED_CODE:
            try:
                inner = Names(self._parse(first.value), self.depth + 1, self._parse)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return  # no code: running it raises
            self.imports |= inner.imports
            self.calls += [(call, node.lineno) for call, _ in inner.calls]
            self.unreadable += [(what, node.lineno) for what, _ in inner.unreadable]
        else:
            self.imports.add(DYNAMIC)
            self.unreadable.append((f"{name}() nested too deep", node.lineno))

    def _class(self, node: ast.ClassDef) -> None:
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name in ("__eq__", "__ne__"):
                body = [s for s in item.body if not _is_docstring(s)]
                if len(body) == 1 and _returns_constant(body[0], item.name == "__eq__"):
                    self.always_equal.append((f"{node.name}.{item.name}", item.lineno))
            elif isinstance(item, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in ("__eq__", "__ne__") for t in item.targets):
                value = item.value
                want = any(isinstance(t, ast.Name) and t.id == "__eq__" for t in item.targets)
                if isinstance(value, ast.Lambda) and _constant(value.body) is want:
                    self.always_equal.append((f"{node.name}.__eq__/__ne__", item.lineno))


def _literal(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str | int)


def _constant_value(node: ast.expr) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _chain(node: ast.expr) -> list[ast.expr]:
    """The nodes of a dotted name, ``a.b.c`` down to ``a``."""
    chain = [node]
    while isinstance(node, ast.Attribute):
        node = node.value
        chain.append(node)
    return chain


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def _constant(node: ast.expr) -> object:
    negate = False
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        negate, node = not negate, node.operand
    if isinstance(node, ast.Constant):
        return bool(node.value) != negate
    return None


def _returns_constant(stmt: ast.stmt, value: bool) -> bool:
    return (isinstance(stmt, ast.Return) and stmt.value is not None
            and _constant(stmt.value) is value)


FIELDS = ("imports", "calls", "attributes", "always_equal", "unreadable")


def to_json(names: Names) -> str:
    return json.dumps({key: sorted(getattr(names, key)) if key == "imports"
                       else getattr(names, key) for key in FIELDS})


def from_json(text: str) -> Names:
    """A ``Names`` as ``to_json`` wrote it (from the child process)."""
    data: dict[str, Any] = json.loads(text)
    names = Names.__new__(Names)
    names.depth, names.aliases = 0, {}
    names.imports = set(data["imports"])
    for key in FIELDS[1:]:
        setattr(names, key, [(str(what), int(line)) for what, line in data[key]])
    return names


def unscreened(why: str) -> Names:
    """What a module that could not be parsed here counts as: reflection throughout (the
    rules cannot vouch for it, lint cannot read it)."""
    names = Names.__new__(Names)
    names.depth, names.aliases = 0, {}
    names.imports = {DYNAMIC}
    names.calls, names.attributes, names.always_equal = [(DYNAMIC_CALL, 1)], [], []
    names.unreadable = [(f"not screened: {why}", 1)]
    return names


def _child(memory_bytes: int, cpu_s: int) -> int:
    """The script: limits first, then the source on stdin (UTF-8, surrogates passed), its
    ``Names`` as JSON on stdout; exit 3 where Python would not parse it."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    text = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return 3
    sys.stdout.write(to_json(Names(tree)))
    return 0


if __name__ == "__main__":
    sys.exit(_child(int(sys.argv[1]), int(sys.argv[2])))
