"""Red team, round thirty-three: what the tested code did in the grading sandbox reached the
task's verifiers.

1. A stub that, imported by the hidden tests, wrote ``json.py`` (or ``pytest.py``) into the
   workdir after the screen had passed the agent's files: the command verifier that ran next,
   in the same sandbox, was a ``python3 -c "import json, subprocess ..."`` (the agent's code
   only in a child process, as docs/rewards.md advises), which imported the planted module
   from its working directory; it printed ``{"acc": 1}`` and exited 0. Half the reward, no
   flag.
2. A stub that read ``/tmp/.tempering/verifiers`` from its own process (the solver, across the
   process boundary, where no guard watches file reads) found the function verifier's table
   of cases and answered from it, for the verifier's component.

Fixed by structure: each verifier runs in a fresh sandbox of its own holding the screened
workspace, the launcher and the verifier files (``Grader._verify``), never the test run's
sandbox; the tests' run never holds the verifier files, and a function verifier's own file is
an empty placeholder there (its text goes to the launcher as hidden code). Both attacks fail
on the commit before this round (the honest solution keeps its reward on both).

3. The example task ``slugify``'s CMS verifier accepted a constant slug (``"x"``), which obeys
   every rule of the CMS, and lint and rules scored any clean change: a constant stub took 0.4
   of the example's reward. The example's check now also asks that a slug say what its title
   says, and lint and rules are scaled by the tests' score.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from redteam_parts import MEDIAN_SOLUTION, honest_then, task_dir

from tempering.reward import Grader
from tempering.tasks import load_task

TESTS = """from stats import median


def test_odd():
    assert median([3, 1, 2]) == 2


def test_even():
    assert median([4, 1, 3, 2]) == 2.5
"""

# The verifier's own process never imports the agent's code: a child process does.
COMMAND = ('python3 -c "import json, subprocess, sys; r = subprocess.run([sys.executable, '
           "'$TEMPERING_VERIFIERS/child.py'], capture_output=True, text=True); "
           "print(json.dumps({'acc': float(r.stdout.strip() == '50')}))\"")
CHILD = ('import sys\nsys.path.insert(0, "/workspace")\nfrom stats import median\n'
         "print(median(list(range(101))))\n")

# What the stub writes into the workdir: a ``json`` that prints full marks and exits 0.
PLANTED = ('import os\nimport sys\nsys.stdout.write(\'{"acc": 1}\\n\')\nsys.stdout.flush()\n'
           'os._exit(0)\n')
PLANTS = f"""import os

try:
    with open(os.path.join(os.getcwd(), "js" + "on.py"), "w") as f:
        f.write({PLANTED!r})
except OSError:
    pass


def median(values):
    raise NotImplementedError
"""

FUNCTION = '''import sys

CASES = [([9, 2, 7, 4, 100], 7), ([1, 2, 3, 4, 5, 6], 3.5), ([10, -3, 8], 8)]


def score(workdir):
    sys.path.append(workdir)
    from stats import median
    ok = 0
    for xs, want in CASES:
        try:
            ok += median(list(xs)) == want
        except Exception:
            pass
    return {"acc": ok / len(CASES)}
'''

# Every table of (list, answer) pairs in any Python file it can list where the launcher keeps
# its files, the verifiers' among them.
READS_TABLE = '''import ast
import os

_TABLE = None


def _load():
    found = {}
    for root in ("/tmp/.tempering/verifiers", "/tmp/.tempering", "/tmp"):
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(root, name)) as f:
                    tree = ast.parse(f.read())
            except Exception:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.List):
                    try:
                        value = ast.literal_eval(node)
                    except Exception:
                        continue
                    for item in value:
                        if isinstance(item, tuple) and len(item) == 2:
                            found[repr(item[0])] = item[1]
    return found


def median(values):
    global _TABLE
    if _TABLE is None:
        _TABLE = _load()
    if repr(list(values)) in _TABLE:
        return _TABLE[repr(list(values))]
    raise NotImplementedError
'''

VERIFIER_TOML = '\n[reward]\ntests = 0.5\nacc = 0.5\n\n[[verifiers]]\nname = "acc"\n'


def command_task(root, runner: str):  # type: ignore[no-untyped-def]
    return task_dir(root, "median-cacc", {
        "workspace/stats.py": "def median(values):\n    raise NotImplementedError\n",
        "solution/stats.py": MEDIAN_SOLUTION, "tests/test_median.py": TESTS,
        "verifiers/child.py": CHILD}, runner=runner,
        more_toml=VERIFIER_TOML + "command = '''" + COMMAND + "'''\n"
                                  'components = ["acc"]\ntimeout_s = 30\n')


def function_task(root, runner: str):  # type: ignore[no-untyped-def]
    return task_dir(root, "median-facc", {
        "workspace/stats.py": "def median(values):\n    raise NotImplementedError\n",
        "solution/stats.py": MEDIAN_SOLUTION, "tests/test_median.py": TESTS,
        "verifiers/acc_check.py": FUNCTION}, runner=runner,
        more_toml=VERIFIER_TOML + 'function = "acc_check.py:score"\ntimeout_s = 30\n')


@pytest.mark.parametrize("runner", ["plain", pytest.param("pytest", marks=pytest.mark.slow)])
async def test_a_module_planted_in_the_workdir_never_reaches_a_command_verifier(
        tmp_path, runner: str) -> None:
    task = command_task(tmp_path / "task", runner)
    result = await honest_then(task, {"stats.py": MEDIAN_SOLUTION}, {"stats.py": PLANTS})
    assert result.components["acc"] == 0.0, (result.components, result.flags, result.details)
    assert result.reward == 0.0


@pytest.mark.parametrize("runner", ["plain", pytest.param("pytest", marks=pytest.mark.slow)])
async def test_the_verifier_files_are_out_of_the_tested_codes_reach(tmp_path,
                                                                    runner: str) -> None:
    task = function_task(tmp_path / "task", runner)
    result = await honest_then(task, {"stats.py": MEDIAN_SOLUTION}, {"stats.py": READS_TABLE})
    assert result.components["acc"] == 0.0, (result.components, result.flags, result.details)
    assert result.reward == 0.0


async def test_the_slugify_examples_verifier_gives_a_constant_slug_nothing() -> None:
    """The example's CMS check took ``"x"`` for every title (it obeys every rule): a constant
    stub won the verifier's whole component. A slug must now say what its title says."""
    task = load_task(Path(__file__).parents[2] / "examples" / "tasks" / "slugify")
    async with Grader() as grader:
        honest = await grader.grade_files(task, task.workspace.overlay(dict(task.solution.files)))
        stub = await grader.grade_files(task, task.workspace.overlay(
            {"slug.py": b"def slugify(title):\n    return 'x'\n"}))
    assert honest.components["cms"] == 1.0 and honest.reward == 1.0
    assert stub.components["cms"] == 0.0, stub.components
    # nor lint and rules, which judge working code: a clean change that passes no test
    assert stub.components["lint"] == stub.components["rules"] == 0.0 and stub.reward == 0.0


THRESHOLD_VERIFIER = '''import json
import sys
from pathlib import Path


def score(workdir):
    sys.path.append(workdir)
    from stats import median  # the agent's code runs first
    need = json.loads(Path(workdir, "threshold.json").read_text())["need"]
    ok = 0
    for xs, want in (([9, 2, 7], 7), ([1, 2, 3, 4], 2.5), ([5], 5)):
        try:
            ok += median(list(xs)) == want
        except Exception:
            pass
    return {"acc": float(ok >= need)}
'''

LOWERS_THRESHOLD = '''try:
    with open("/workspace/threshold.json", "w") as f:
        f.write('{"need": 0}')
except OSError:
    pass


def median(values):
    raise NotImplementedError
'''


async def test_a_verifiers_sandbox_keeps_the_protected_files_read_only(tmp_path) -> None:
    """In the verifier's own sandbox too, the task's protected files are sealed before any of
    the agent's code runs: a stub that lowered the verifier's bar in ``threshold.json``, when
    the verifier had imported it, took the component."""
    task = task_dir(tmp_path / "task", "median-bar", {
        "workspace/stats.py": "def median(values):\n    raise NotImplementedError\n",
        "workspace/threshold.json": '{"need": 3}', "solution/stats.py": MEDIAN_SOLUTION,
        "tests/test_median.py": TESTS, "verifiers/bar.py": THRESHOLD_VERIFIER},
        runner="plain", more_toml='protected = ["threshold.json"]\n' + VERIFIER_TOML
        + 'function = "bar.py:score"\ntimeout_s = 30\n')
    result = await honest_then(task, {"stats.py": MEDIAN_SOLUTION},
                               {"stats.py": LOWERS_THRESHOLD})
    assert result.components["acc"] == 0.0, (result.components, result.flags, result.details)
