"""Compiling the hidden tests for the launcher (``inside_launcher.py``): stdlib (and pytest) only.

Every hidden Python file is compiled before any tested code exists: each asserted comparison
probed (``instrument``; the launcher binds its probes in each hidden module under the names
below), each test function marked where it begins and ends, and, under pytest, rewritten by
pytest's assertion rewriting. The grader runs the
same code on the host when the grading interpreter reads the host's bytecode (the zygote's,
``zygote.py``): the launcher then only loads the code, and a task's hidden files are
compiled once, not once per grading.
"""

EQUALITY_CALLS = frozenset({
    "assertEqual", "assertEquals", "assertListEqual", "assertTupleEqual", "assertDictEqual",
    "assertSetEqual", "assertSequenceEqual", "assertMultiLineEqual", "assertCountEqual",
    "assertIn", "assert_equal", "assert_array_equal", "assertAlmostEqual", "assertAlmostEquals",
    "assertNotAlmostEqual", "assertNotAlmostEquals", "assert_allclose", "assert_almost_equal",
    "assertNotEqual", "assertNotEquals", "assertNotIn", "failUnlessEqual", "failIfEqual",
    "failUnlessAlmostEqual", "failIfAlmostEqual", "assert_array_almost_equal",
    "assert_approx_equal"})
COMPARE_OPS = {"Eq": "eq", "In": "eq", "Lt": "order", "LtE": "order", "Gt": "order",
               "GtE": "order"}
PROBE = "__tempering_probe__"
DONE = "__tempering_done__"
ENTER = "__tempering_enter__"
PROBE_EQUAL, CLAIM, HELD = "__tempering_probe_equal__", "__tempering_claim__", "__tempering_held__"
COMMIT, NUMBER = "__tempering_commit__", "__tempering_number__"
STAR, WITHIN, BOUND = "__tempering_star__", "__tempering_within__", "__tempering_bound__"
PAIR, EQUAL, MEMBER = "__tempering_pair__", "__tempering_equal__", "__tempering_member__"
OPERATOR_EQUAL, COMPARE_CHAIN = "__tempering_operator_equal__", "__tempering_compare_chain__"
ORDER, ORDER_PAIR = "__tempering_order__", "__tempering_order_pair__"
MATCHED = "__tempering_matched__"
ORDER_CALLS = frozenset({"assertGreater", "assertGreaterEqual", "assertLess",
                         "assertLessEqual"})
STARRED_PAIR, KEYWORD_PAIR = "__tempering_starred_pair__", "__tempering_keyword_pair__"
MEMBER_CALLS = frozenset({"assertIn", "assertNotIn"})
OPERATOR_CALLS = frozenset({"eq", "ne", "__eq__", "__ne__"})
PAIRED_KEYWORDS = (("first", "second"), ("actual", "desired"), ("a", "b"), ("x", "y"))
CALLED = EQUALITY_CALLS | OPERATOR_CALLS | ORDER_CALLS  # none named: no call to rewrite
NEAR_CALLS = frozenset({"assertAlmostEqual", "assertAlmostEquals", "assertNotAlmostEqual",
                        "assertNotAlmostEquals", "assert_allclose", "assert_almost_equal",
                        "failUnlessAlmostEqual", "failIfAlmostEqual",
                        "assert_array_almost_equal", "assert_approx_equal"})
MATCHERS = frozenset({"ANY", "approx"})


def instrument(tree, calls=True, text=None, probes=True):
    """Probe each asserted equality in the test's own frame (``equality``), wrap the operands
    of every other comparison in the file (``Compares``: in an ``and``, an ``all(...)``, an
    assignment) in ``PROBE``, and with ``calls`` the compared arguments of unittest's and
    numpy's equality assertions too; mark each ``test*`` function's start (``ENTER``) and
    normal exits (``DONE``). Each new node is placed where the node it stands in for is. With
    the file's ``text``, an operand is looked into for a matcher only if the text names one.
    Without ``probes`` (the tested code
    in a process of its own, where every operand is data or a proxy of ours), the assertions
    are left as they are: only the marks and star imports are rewritten."""
    import ast

    literals = {}

    def literal(node):
        known = literals.get(id(node))
        if known is not None:
            return known
        try:
            ast.literal_eval(node)
            known = True
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            known = False
        literals[id(node)] = known  # the tree holds every node: no id is reused meanwhile
        return known

    named = text is None or any(name in text for name in MATCHERS)

    def matcher(node):
        """An operand that builds on a matcher meant to equal many values (``mock.ANY``,
        ``pytest.approx``): the test's own expectation, never the tested code's result."""
        return named and any(isinstance(n, ast.Name | ast.Attribute)
                             and getattr(n, "id", getattr(n, "attr", None)) in MATCHERS
                             for n in ast.walk(node))

    def at(node, like):
        """``node`` placed where ``like`` is (``ast.copy_location``, without its checks)."""
        try:
            node.lineno, node.col_offset = like.lineno, like.col_offset
            node.end_lineno, node.end_col_offset = like.end_lineno, like.end_col_offset
        except AttributeError:  # a context (Load, Store): no place of its own
            pass
        return node

    def copy(node):
        if isinstance(node, list):
            return [copy(item) for item in node]
        if not isinstance(node, ast.AST):
            return node
        return at(type(node)(**{f: copy(getattr(node, f)) for f in node._fields
                                if hasattr(node, f)}), node)

    def wrap(node, kind, expected=None):
        if literal(node) or matcher(node):
            return node
        args = [node, at(ast.Constant(kind), node)]
        if expected is not None and literal(expected):
            args.append(copy(expected))
        return helper(PROBE, node, *args)

    sites = iter(range(1 << 30))

    def numeric(node):
        return (isinstance(node, ast.Constant) and type(node.value) in (int, float, complex)) \
            or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd)
                and numeric(node.operand))

    def arithmetic(test):
        """In an asserted expression, each operand of arithmetic with a number literal
        (``abs(f(x) - 0.33) < 1e-6``) had as a number of the literal's kind first
        (``NUMBER``): the tested code's own ``__sub__`` never says how near it is."""
        for node in list(ast.walk(test)):
            if isinstance(node, ast.BinOp):
                if numeric(node.right) and not literal(node.left):
                    node.left = helper(NUMBER, node.left, node.left, copy(node.right))
                elif numeric(node.left) and not literal(node.right):
                    node.right = helper(NUMBER, node.right, node.right, copy(node.left))
            elif isinstance(node, ast.Compare):  # ``f(x) <= 2``, ``2.49 < f(x) < 2.51``
                ordered(node)

    def ordered(node):
        """Each operand of an order comparison with a number literal in an asserted
        expression, had as a number first (``NUMBER``), as for arithmetic: an object whose
        ``__lt__`` and ``__ge__`` say True to every number passed ``f(x) <= 2`` and
        ``f(x) >= 2`` both, since the probe's fresh objects are no numbers (red team, round
        forty-two)."""
        operands, done = [node.left, *node.comparators], set()
        for i, op in enumerate(node.ops):
            if not isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE):
                continue
            for mine, other in ((i, i + 1), (i + 1, i)):
                if mine not in done and numeric(operands[other]) and \
                        not literal(operands[mine]):
                    operands[mine] = helper(NUMBER, operands[mine], operands[mine],
                                            copy(operands[other]))
                    done.add(mine)
        node.left, node.comparators = operands[0], operands[1:]

    handled = set()  # the comparisons an assertion's own rewriting made or took (by id)

    def assertion(node):
        """The statements an ``assert`` becomes."""
        arithmetic(node.test)
        test = node.test
        if not isinstance(test, ast.Compare) or len(test.ops) != 1:
            return [node]
        kind = COMPARE_OPS.get(type(test.ops[0]).__name__)
        if kind is None:
            return [node]
        handled.add(id(test))
        left, right = test.left, test.comparators[0]
        equal = type(test.ops[0]).__name__ == "Eq"
        if equal and not (literal(left) and literal(right)):
            return equality(node, left, right)
        test.left = wrap(left, kind)
        if kind != "eq":  # "in": what is looked for is probed, not where
            test.comparators = [wrap(right, kind)]
        elif not equal:  # "in": where it is looked for is had as data first (WITHIN)
            node.test = at(helper(WITHIN, test, test.left, right), test)
        return [node]

    def name(text, like, store=False):
        return at(ast.Name(text, ast.Store() if store else ast.Load()), like)

    def assign(text, value, like):
        return at(ast.Assign(targets=[name(text, like, True)], value=value), like)

    def helper(func, like, *args):
        return at(ast.Call(func=name(func, like), args=list(args), keywords=[]), like)

    def equality(node, left, right):
        """``assert a == b`` as: both operands in locals of the test's own; each (not a
        literal, not a matcher) made to hand over a value of the other's kind (``COMMIT``)
        before anything is compared with it, then compared, in this frame, with what
        ``PROBE_EQUAL`` gives (fresh objects, values like the other operand, a copy of it),
        each true answer judged by ``CLAIM``; the assertion on the locals; ``HELD`` then
        checks the probed sides said equal to the copy when probed, and that what they handed
        over equals the other side (a side not probed says None)."""
        n = next(sites)
        a, b, said_a, said_b, given_a, given_b = (
            f"_tempering_{x}{n}" for x in ("a", "b", "sa", "sb", "ga", "gb"))
        out = [assign(a, left, node), assign(b, right, node)]
        sides = ((a, b, said_a, given_a, left), (b, a, said_b, given_b, right))
        for mine, theirs, _, given, operand in sides:  # before the object hears any question
            probed = not (literal(operand) or matcher(operand))
            out.append(assign(given, helper(COMMIT, node, name(mine, node), name(theirs, node))
                              if probed else at(ast.Constant(None), node), node))
        for mine, theirs, said, given, operand in sides:
            probed = not (literal(operand) or matcher(operand))
            out.append(assign(said, at(ast.Constant(0 if probed else None), node), node))
            if not probed:
                continue
            asked = f"_tempering_o{n}"
            compared = at(ast.Compare(left=name(mine, node), ops=[ast.Eq()],
                                      comparators=[name(asked, node)]), node)
            handled.add(id(compared))
            found = at(ast.If(
                test=compared,
                body=[assign(said, helper(CLAIM, node, name(mine, node), name(asked, node),
                                          name(theirs, node), name(said, node)), node)],
                orelse=[]), node)
            out.append(at(ast.For(target=name(asked, node, True),
                                  iter=helper(PROBE_EQUAL, node, name(mine, node),
                                              name(theirs, node), name(given, node)),
                                  body=[found], orelse=[]), node))
        node.test = at(ast.Compare(left=name(a, node), ops=[ast.Eq()],
                                   comparators=[name(b, node)]), node.test)
        handled.add(id(node.test))
        out.append(node)
        out.append(at(ast.Expr(helper(HELD, node, name(a, node), name(b, node),
                                      name(said_a, node), name(said_b, node),
                                      name(given_a, node), name(given_b, node))), node))
        return out

    def bodies(stmt):
        """Where ``stmt`` holds statement lists (bodies, else and finally clauses, except
        clauses, match cases), as (node, field)."""
        for field in ("body", "orelse", "finalbody"):
            if type(getattr(stmt, field, None)) is list:
                yield stmt, field
        for part in getattr(stmt, "handlers", ()) or getattr(stmt, "cases", ()):
            yield part, "body"

    def nested(stmt, transform):
        """Each statement list inside ``stmt`` replaced by ``transform`` of it."""
        for node, field in bodies(stmt):
            setattr(node, field, transform(getattr(node, field)))

    def statements(body):
        out = []
        for stmt in body:
            nested(stmt, statements)
            out += assertion(stmt) if probes and isinstance(stmt, ast.Assert) else [star(stmt)]
        return out

    wanted = []  # what a star import may bind here (``wanted_names``), worked out once

    def star(stmt):
        """``from m import *`` as ``STAR("m", level, names)``: the launcher's import of the
        names ``m`` exports that this module reads and binds nowhere itself, and that are no
        builtin's (``wanted_names``): what the test binds or imports itself stays its own, and
        a ``sorted`` or ``abs`` of the tested code's never stands in for the builtin."""
        if not (isinstance(stmt, ast.ImportFrom) and [a.name for a in stmt.names] == ["*"]):
            return stmt
        if not wanted:
            wanted.append(tuple(sorted(wanted_names(tree))))
        call = at(ast.Call(at(ast.Name(STAR, ast.Load()), stmt),
                           [at(ast.Constant(stmt.module or ""), stmt),
                            at(ast.Constant(stmt.level), stmt),
                            at(ast.Constant(wanted[0]), stmt)], []), stmt)
        return at(ast.Expr(call), stmt)

    class Compares(ast.NodeTransformer):
        """Every other comparison in the hidden code (inside ``and``, ``all(...)``, a
        comprehension, an assignment a later ``assert`` reads, an ``if``): each operand (not
        a literal, not a matcher) probed (``PROBE``), and ``x in obj`` had as data first
        (``WITHIN``): an object's ``__eq__`` or ``__contains__`` that says yes to anything is
        asked by the probe before its answer counts, wherever the comparison is."""

        def visit_Compare(self, node):
            self.generic_visit(node)
            if id(node) in handled:
                return node
            if len(node.ops) > 1:  # ``2.49 < f(x) < 2.51``: each operand, as its ops ask
                return chained(node)
            op = type(node.ops[0]).__name__
            left, right = node.left, node.comparators[0]
            if op in ("Eq", "NotEq") and not any(literal(n) or matcher(n)
                                                  for n in (left, right)):
                # both values known only at run time: compared by ``EQUAL``, which has the
                # tested code's value as one of the other's kind first
                return helper(EQUAL, node, left, right, at(ast.Constant(op == "NotEq"), node))
            if op in ("Eq", "NotEq"):
                node.left, node.comparators = wrap(left, "eq", right), [wrap(right, "eq", left)]
            elif op in ("Lt", "LtE", "Gt", "GtE") and not any(literal(n) or matcher(n)
                                                               for n in (left, right)):
                # both known only at run time: ``ORDER`` has the tested value as a number
                return helper(ORDER, node, left, right, at(ast.Constant(op), node))
            elif op in ("Lt", "LtE", "Gt", "GtE"):
                node.left, node.comparators = wrap(left, "order"), [wrap(right, "order")]
            elif op in ("In", "NotIn"):
                found = helper(WITHIN, node, wrap(left, "eq"), right)
                return found if op == "In" else at(ast.UnaryOp(ast.Not(), found), node)
            return node

    def chained(node):
        ops = [type(op).__name__ for op in node.ops]
        operands = [node.left, *node.comparators]
        if set(ops) <= {"Eq", "NotEq", "Lt", "LtE", "Gt", "GtE"} and \
                not any(matcher(n) for n in operands) and id(node) not in class_scoped and \
                not any(isinstance(n, ast.Await | ast.Yield | ast.YieldFrom | ast.NamedExpr)
                        for operand in operands[1:] for n in ast.walk(operand)):
            # ``f(x) == f(y) == expected``, ``lo <= f(x) < hi``: each link ``equal`` or
            # ``order`` (``COMPARE_CHAIN``), each operand after the first worked out (a lambda)
            # only while the links before it hold, as the chain itself does
            later = [at(ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], vararg=None,
                                                      kwonlyargs=[], kw_defaults=[],
                                                      kwarg=None, defaults=[]),
                                   body=operand), operand) for operand in operands[1:]]
            return helper(COMPARE_CHAIN, node, operands[0],
                          at(ast.Tuple(later, ast.Load()), node),
                          at(ast.Constant(tuple(ops)), node))
        wrapped = []
        for i, operand in enumerate(operands):
            near = ops[max(i - 1, 0):i + 1]
            kind = "eq" if {"Eq", "NotEq"} & set(near) else \
                "order" if {"Lt", "LtE", "Gt", "GtE"} & set(near) else None
            wrapped.append(wrap(operand, kind) if kind else operand)
        node.left, node.comparators = wrapped[0], wrapped[1:]
        return node

    def values_of(pattern, found):
        """The literal values ``pattern`` compares its subject with (``case 2 | 2.5:``), or
        None where it does anything else to it (a class, a sequence, a mapping pattern)."""
        if isinstance(pattern, ast.MatchValue):
            if not literal(pattern.value):
                return None
            found.append(copy(pattern.value))
            return found
        if isinstance(pattern, ast.MatchSingleton):
            return found
        if isinstance(pattern, ast.MatchAs):
            return found if pattern.pattern is None else values_of(pattern.pattern, found)
        if isinstance(pattern, ast.MatchOr):
            for one in pattern.patterns:
                if values_of(one, found) is None:
                    return None
            return found
        return None

    class Matches(ast.NodeVisitor):
        """``match f(x): case 2.5: ...``: a subject compared with literal values only is had
        as one of their kinds first (``MATCHED``), as ``in`` has an item."""

        def visit_Match(self, node):
            self.generic_visit(node)
            found = []
            for case in node.cases:
                if values_of(case.pattern, found) is None:
                    return
            if found:
                node.subject = helper(MATCHED, node.subject, node.subject,
                                      at(ast.Tuple(found, ast.Load()), node.subject))

    class Calls(ast.NodeVisitor):
        def visit_Call(self, node):
            self.generic_visit(node)
            called = getattr(node.func, "attr", getattr(node.func, "id", None))
            if called in OPERATOR_CALLS and len(node.args) == 2 and not node.keywords and \
                    not any(isinstance(n, ast.Starred) for n in node.args):
                # ``operator.eq(f(x), expected)``: ``equal`` if it is the operator module's
                node.args = [node.func, *node.args]
                node.func = name(OPERATOR_EQUAL, node)
                return
            if (called not in EQUALITY_CALLS and called not in ORDER_CALLS) or (
                    called in own and isinstance(node.func, ast.Name)):
                return  # a helper of the tests' own of that name: its body is probed itself
            near = at(ast.Constant(called in NEAR_CALLS), node)
            # ``unittest.TestCase.assertEqual(self, f(x), expected)``: the compared ones follow
            # the test case (round forty-four: ``self`` was had as a float)
            skip = int(isinstance(node.func, ast.Attribute) and bool(node.args)
                       and isinstance(node.args[0], ast.Name)
                       and node.args[0].id in ("self", "cls")
                       and not (isinstance(node.func.value, ast.Name)
                                and node.func.value.id in ("self", "cls")))
            if called in ORDER_CALLS and len(node.args) < 2 + skip:
                return  # ``assertGreater(*args)``: its operands are asked fresh objects only
            if len(node.args) == 1 + skip and isinstance(node.args[skip], ast.Starred):
                # ``assertEqual(*(f(x), expected))``: its first two, probed as ``PAIR`` does
                node.args[skip].value = helper(STARRED_PAIR, node, node.args[skip].value, near)
                return
            if len(node.args) == skip and node.keywords:
                given = [k.arg for k in node.keywords]
                if None in given or any({one, other} <= set(given)
                                        for one, other in PAIRED_KEYWORDS):
                    # ``assertEqual(first=..., second=...)``, ``**kwargs``: as a dict, in order
                    table = at(ast.Dict(keys=[None if k.arg is None else at(ast.Constant(k.arg), k)
                                              for k in node.keywords],
                                        values=[k.value for k in node.keywords]), node)
                    node.keywords = [at(ast.keyword(arg=None, value=helper(
                        KEYWORD_PAIR, node, table, near)), node)]
                return
            if len(node.args) >= 2 + skip:
                first, second = node.args[skip:skip + 2]
                if any(isinstance(n, ast.Starred) for n in (first, second)):
                    return
                if called in ORDER_CALLS:
                    # ``assertGreaterEqual(f(x), lo)``: the tested value had as a number
                    both = helper(ORDER_PAIR, node, first, second)
                    node.args[skip:skip + 2] = [at(ast.Starred(both, ast.Load()), node)]
                    return
                if called in MEMBER_CALLS:
                    # ``assertIn(f(x), items)``: the member had as one of the items' kinds
                    both = helper(MEMBER, node, first, second)
                    node.args[skip:skip + 2] = [at(ast.Starred(both, ast.Load()), node)]
                    return
                if not any(literal(n) or matcher(n) for n in (first, second)):
                    # both known only at run time: ``PAIR`` probes each against the other's
                    # value, evaluated once, in order, and hands both on
                    both = helper(PAIR, node, first, second, near)
                    node.args[skip:skip + 2] = [at(ast.Starred(both, ast.Load()), node)]
                    return
                node.args[skip:skip + 2] = [wrap(first, "eq", second),
                                            wrap(second, "eq", first)]

    def mark(func, like):
        return at(ast.Expr(helper(func, like)), like)

    def finish(body):
        """``body`` with ``DONE()`` before each ``return`` of its own (not of a nested
        function's)."""
        out = []
        for stmt in body:
            if isinstance(stmt, ast.Return):
                out.append(mark(DONE, stmt))
            elif not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                nested(stmt, finish)
            out.append(stmt)
        return out

    def functions(body, found):
        """Every function defined in ``body``, however nested (a definition is a statement:
        no expression holds one)."""
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append(stmt)
            for node, field in bodies(stmt):
                functions(getattr(node, field), found)
        return found

    # comparisons in a class body (outside its functions): a lambda there would not see the
    # class's names, so a chain there is not made of lambdas
    class_scoped = set()
    for klass in ast.walk(tree):
        if isinstance(klass, ast.ClassDef):
            stack = list(klass.body)
            while stack:
                one = stack.pop()
                if isinstance(one, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda |
                              ast.ClassDef):
                    continue
                class_scoped.add(id(one))
                stack.extend(ast.iter_child_nodes(one))
    tree.body = statements(tree.body)
    if probes:
        Compares().visit(tree)
        Matches().visit(tree)
        tree.body = bind_checked(tree.body, mark)
    if calls and probes:
        own = {f.name for f in functions(tree.body, [])}  # helpers named like assertions
        Calls().visit(tree)
    for node in functions(tree.body, []):  # a runner collects test*: each says it began and
        if node.name.startswith("test"):  # got to its end
            body = finish(node.body) + [mark(DONE, node.body[-1])]
            docstring = (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                         and isinstance(body[0].value.value, str))
            node.body = body[:docstring] + [mark(ENTER, body[0])] + body[docstring:]
    return tree


def bind_checked(body, mark):
    """``body`` (a module's statements) with ``BOUND(names, touched)`` after each: the guard
    then checks that the module's namespace changed only in the names that statement binds
    (its assignments, ``def``, ``class``, imports, a star import's names, ``global`` names of
    its functions), and what its data (lists, dicts, sets of builtin values) holds only where
    the statement reads it, or calls a function of the module's that does (``touched``): in
    one process, the tested code that the module imports could otherwise rebind what the
    module bound before (its ``math``, its expected values; round twenty-three) or change its
    table in place (round twenty-four) while it loads. The docstring and ``__future__``
    imports come first, unchecked."""
    import ast

    declared = {n for stmt in body for node in ast.walk(stmt) if isinstance(node, ast.Global)
                for n in node.names}
    # What each function or class of the module reads, for what a statement that calls it
    # may change in place (``add(1)`` appending to ``CASES``).
    reads = {stmt.name: _loads(stmt) for stmt in body
             if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    out, pending = [], set()
    for index, stmt in enumerate(body):
        out.append(stmt)
        pending |= bound_by(stmt)
        if isinstance(stmt, ast.Expr) and index == 0 and isinstance(stmt.value, ast.Constant):
            pending.add("__doc__")
            continue
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            continue
        # A statement that writes the namespace by other means (``globals()[name] = ...``,
        # ``setattr(sys.modules[__name__], ...)``, ``exec``) may bind any name: "*".
        names = ("*",) if dynamic(stmt) else tuple(sorted(pending | declared))
        touched, more = set(), _loads(stmt)
        while more:  # the names it reads, and those the module's functions it reads read
            name = more.pop()
            if name not in touched:
                touched.add(name)
                more |= reads.get(name, set())
        call = mark(BOUND, stmt)
        call.value.args = [ast.Constant(names), ast.Constant(tuple(sorted(touched)))]
        for arg in call.value.args:
            ast.copy_location(arg, stmt)
        out.append(call)
        pending = set()
    return out


_DYNAMIC = frozenset({"globals", "vars", "exec", "eval", "setattr", "delattr", "__import__",
                      "modules", "__dict__", "update"})


def dynamic(stmt):
    """Whether a module-level statement may write the module's namespace without naming
    what it binds (a call of ``globals``, ``exec``, ``setattr``, ``sys.modules``...)."""
    import ast

    return any(getattr(node, "id", getattr(node, "attr", None)) in _DYNAMIC
               for node in ast.walk(stmt) if isinstance(node, ast.Name | ast.Attribute))


def _loads(node):
    """The names ``node`` reads, anywhere in it."""
    import ast

    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def bound_by(stmt):
    """The names a module-level statement binds in the module (not in the functions or
    classes it defines)."""
    import ast

    names, stack = set(), [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            stack += [*node.decorator_list, *getattr(node, "bases", ()),
                      *(k.value for k in getattr(node, "keywords", ()))]
            if not isinstance(node, ast.ClassDef):
                stack += [*node.args.defaults, *node.args.kw_defaults]
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names
                         if a.name != "*")
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == STAR and \
                len(node.args) == 3 and isinstance(node.args[2], ast.Constant):
            names.update(node.args[2].value)
        stack += [child for child in ast.iter_child_nodes(node) if child is not None]
    return names


def wanted_names(tree):
    """The names a star import may bind in the module ``tree``: those it reads (anywhere)
    that no statement of its binds at module level (an assignment, a ``def`` or ``class``, an
    import, a ``global`` in a function) and that are no builtin's."""
    import ast
    import builtins

    read, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.Global):
            bound.update(node.names)
    for stmt in tree.body:
        bound |= bound_by(stmt)
    return read - bound - set(vars(builtins))


def compile_hidden(sources: dict[str, bytes], rewrite: bool,
                   probes: bool = True) -> dict[str, object]:
    """Every hidden Python file, compiled now, before any tested code exists: instrumented
    with the probe and, under pytest, with pytest's assertion rewriting. Nothing of the hidden
    tests is parsed or transformed once the tested code runs (it could patch the parser or the
    transformer and watch the source go by). A file that does not compile keeps its error,
    raised when it is imported, as the interpreter would."""
    import ast

    if rewrite:
        from _pytest.assertion.rewrite import rewrite_asserts
    from importlib.util import decode_source

    codes = {}
    for path, source in sources.items():
        try:
            text = decode_source(source)  # as the interpreter reads it, coding cookie and all
            tree = instrument(ast.parse(text, filename=path),
                              calls=any(name in text for name in CALLED), text=text,
                              probes=probes)
            if rewrite:
                rewrite_asserts(tree, source, path, None)
            codes[path] = compile(tree, path, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            codes[path] = exc
    return codes
