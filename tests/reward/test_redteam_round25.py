"""Red team, round twenty-five, against b0bf1ce (each a failing test on that commit).

Closed here:

1. across the boundary (auto chose ``data``; both runners): a stub that raises
   ``StopIteration`` passed ``all(map(is_prime, PRIMES))`` and every ``for`` over
   ``zip(map(f, xs), want)``: the builtin exception was raised in the tests' process, where
   ``map`` took it for the end of the iteration. Now a StopIteration (or StopAsyncIteration)
   out of anything but an iterator's ``__next__`` arrives as a RuntimeError, as PEP 479 has
   it for a generator.
2. every isolation: the tested code rewrote, at import, a protected workspace file that the
   test reads after importing it (``examples.json``): protection held the agent's edits
   only. Now the task's protected files are read-only mounts in the grading sandbox.
3. across the boundary: the tested code rewrote the task's verifiers in the launcher's
   directory before they ran (``cms`` at 1 with a stub). Now the launcher's directory is
   read-only before any tested code runs (and every process of the test run is killed before
   a verifier runs: ``tests/sandbox/test_security.py``).
4. honest (plain runner): an exception of the tested code's named ``Skipped`` made its test
   "skipped", and the canary's failure a tampered runner (reward 0). Now pytest's own
   ``Skipped`` and ``XFailed`` classes decide, not the name.

Declared, not closed (docs/rewards.md): in one process (``shared``), a StopIteration of the
tested code's still ends a ``map`` in the test's frame; a verifier that runs the agent's code
shows that code its own files (the expected values in them).
"""

from __future__ import annotations

import pytest
from redteam_parts import MEDIAN_SOLUTION, attack_case, honest_then, spec_task

from attempts import attempt as _attempt
from conftest import isolated
from tempering.reward import Grader
from tempering.tasks import Task, load_task

# ---------------------------------------------------------------------------------------------
# 1. StopIteration across the boundary.

PRIMES_TESTS = '''from primes import is_prime

PRIMES = [2, 3, 5, 7, 11, 13, 97, 7919]
COMPOSITES = [0, 1, 4, 6, 9, 15, 100, 7917]


def test_primes():
    assert all(map(is_prime, PRIMES))


def test_composites():
    assert not any(map(is_prime, COMPOSITES))


def test_pairs():
    for got, want in zip(map(is_prime, [2, 4]), [True, False]):
        assert got == want
'''

PRIMES_SOLUTION = '''def is_prime(n):
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True
'''

STOP = '''def is_prime(n):
    raise StopIteration
'''

STOP_SUBCLASS = '''class Done(StopIteration):
    pass


def is_prime(n):
    raise Done
'''


@pytest.mark.parametrize("runner", ["pytest", "plain"])
@pytest.mark.parametrize("isolation", ["auto", "data"])
@pytest.mark.parametrize("attack", [STOP, pytest.param(STOP_SUBCLASS, marks=pytest.mark.slow)],
                         ids=["builtin", "subclass"])
async def test_stop_iteration_ends_no_iteration_of_the_tests(tmp_path, runner, isolation,
                                                            attack):
    result = await attack_case(tmp_path, runner, isolation, "primes", PRIMES_TESTS,
                               PRIMES_SOLUTION, attack)
    assert result.reward == 0.0 and result.tests_passed == 0, result.tests


async def test_an_iterator_still_ends_with_stop_iteration(tmp_path):
    """The iteration protocol itself is untouched: a handle's ``__next__`` that raises
    StopIteration ends the ``for`` over it (process isolation: iterators come back as
    handles)."""
    tests = '''from counting import upto


def test_counts():
    assert list(upto(3)) == [0, 1, 2]
    assert sum(1 for _ in upto(5)) == 5
'''
    solution = '''class upto:
    def __init__(self, n):
        self.i, self.n = 0, n

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1
'''
    task = spec_task(tmp_path, "plain", "process", "counting", tests, solution)
    result = await _attempt(task, {"counting.py": solution})
    assert result.reward == 1.0 and not result.flags, (result.flags, result.details[:3])


# ---------------------------------------------------------------------------------------------
# 2. A protected file the tests read, rewritten by the tested code at import.

def examples_task(root, runner: str, isolation: str) -> Task:
    for part in ("workspace", "tests", "solution"):
        (root / part).mkdir(parents=True)
    (root / "task.toml").write_text(
        '[task]\nid = "median-examples"\n\n[grading]\ncommand = "python3 -m pytest tests"\n'
        f'runner = "{runner}"\nisolation = "{isolation}"\ntimeout_s = 60\n'
        'protected = ["examples.json", "data/"]\n')
    (root / "instruction.md").write_text("Implement median(); the examples must hold.\n")
    (root / "workspace" / "examples.json").write_text(
        "[[[3,1,2],2],[[4,1,3,2],2.5],[[7],7],[[5,1,5,2,5],5],[[10,-3,8,1],4.5]]")
    (root / "workspace" / "data").mkdir()
    (root / "workspace" / "data" / "more.json").write_text("[[[1,2,3],2]]")
    (root / "workspace" / "stats.py").write_text("def median(values):\n    pass\n")
    (root / "solution" / "stats.py").write_text(MEDIAN_SOLUTION)
    (root / "tests" / "test_median.py").write_text('''import json
from pathlib import Path

from stats import median

EXAMPLES = json.loads(Path("examples.json").read_text())
MORE = json.loads(Path("data/more.json").read_text())


def test_examples():
    for values, want in EXAMPLES:
        assert median(values) == want


def test_more():
    for values, want in MORE:
        assert median(values) == want
''')
    return load_task(root)


REWRITE = '''import json
import os

for name in ("examples.json", "data/more.json"):
    try:
        with open(name, "w") as f:
            json.dump([[[0], 0]], f)
    except OSError:
        pass
    try:  # or put another file in its place
        os.replace(name, name + ".old")
        with open(name, "w") as f:
            json.dump([[[0], 0]], f)
    except OSError:
        pass
try:
    with open("data/extra.json", "w") as f:
        f.write("[]")
except OSError:
    pass


def median(values):
    return 0
'''


@pytest.mark.parametrize("runner", ["pytest", "plain"])
@pytest.mark.parametrize("isolation", ["auto", "shared"])
async def test_protected_files_cannot_be_rewritten_at_run_time(tmp_path, runner, isolation):
    result = await honest_then(examples_task(tmp_path, runner, isolation),
                               {"stats.py": MEDIAN_SOLUTION}, {"stats.py": REWRITE})
    assert result.reward == 0.0 and result.tests_passed == 0, result.tests


# ---------------------------------------------------------------------------------------------
# 3. The verifiers: rewritten by the tested code, or answered for by what it left running.

VERIFIED_TESTS = '''from slug import slugify


def test_admin():
    assert slugify("Admin") == "admin"
'''

BENCH = '''"""Runs the agent's slugify in a subprocess and scores it (never imports it here); the
workdir (its working directory) on the child's path said outright (PYTHONSAFEPATH)."""
import json
import os
import subprocess
import sys

code = "import json; from slug import slugify; print(json.dumps(slugify('Hello World')))"
try:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()},
                         timeout=10).stdout.strip().splitlines()[-1]
    ok = json.loads(out) == "hello-world"
except Exception:
    ok = False
print(json.dumps({"cms": 1.0 if ok else 0.0}))
'''


def verified_task(root, isolation: str) -> Task:
    for part in ("workspace", "tests", "solution", "verifiers"):
        (root / part).mkdir(parents=True)
    (root / "task.toml").write_text(
        '[task]\nid = "slug-verified"\n\n[grading]\ncommand = "python3 -m pytest tests"\n'
        f'isolation = "{isolation}"\ntimeout_s = 60\n\n[reward]\ntests = 0.5\ncms = 0.5\n\n'
        '[[verifiers]]\nname = "cms"\ncommand = "python3 $TEMPERING_VERIFIERS/bench.py"\n'
        'components = ["cms"]\ntimeout_s = 30\n')
    (root / "instruction.md").write_text("Implement slugify.\n")
    (root / "workspace" / "slug.py").write_text("def slugify(title):\n    pass\n")
    (root / "solution" / "slug.py").write_text(
        "def slugify(title):\n    return '-'.join(title.lower().split())\n")
    (root / "tests" / "test_slug.py").write_text(VERIFIED_TESTS)
    (root / "verifiers" / "bench.py").write_text(BENCH)
    return load_task(root)


REWRITE_VERIFIER = '''import os

_DIR = "/tmp/.tempering/verifiers"
try:
    for _name in os.listdir(_DIR):
        with open(os.path.join(_DIR, _name), "w") as _f:
            _f.write('import json\\nprint(json.dumps({"cms": 1.0}))\\n')
except OSError:
    pass


def slugify(title):
    raise NotImplementedError
'''

@pytest.mark.parametrize("isolation", ["auto", "shared"])
async def test_verifiers_run_as_the_task_wrote_them(tmp_path, isolation):
    task = verified_task(tmp_path, isolation)
    async with Grader() as grader:
        honest = await _attempt(task, {"slug.py": task.solution.files["slug.py"]}, grader=grader)
        assert honest.reward == 1.0 and honest.components["cms"] == 1.0, honest.details[:3]
        result = await _attempt(task, {"slug.py": REWRITE_VERIFIER}, grader=grader)
    assert result.components["cms"] == 0.0 and result.reward == 0.0, (result.components,
                                                                      result.details[:3])


# ---------------------------------------------------------------------------------------------
# 4. Honest: the tested code's own exception called ``Skipped``.

SKIPPED_NAME = '''class Skipped(Exception):
    """Raised for an empty input (a domain exception that happens to share pytest's name)."""


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        raise Skipped("empty")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
'''


@pytest.mark.parametrize("isolation", ["data", "shared"])
async def test_an_exception_named_skipped_is_a_failure_not_a_skip(task, isolation):
    if isolation == "data" and task.config.grading.runner == "pytest":
        pytest.skip("the pytest runner already told them apart")
    result = await _attempt(isolated(task, isolation), {"stats.py": SKIPPED_NAME})
    assert not result.flags, (result.flags, result.details[:3])
    assert 0 < result.reward < 1 and result.tests_passed == result.tests_total - 1
