"""Red team, round thirty-four: the verifiers' own sandboxes (round thirty-three), attacked.

1. A command verifier that ran pytest over its own checks (``python3 -m pytest
   $TEMPERING_VERIFIERS/test_perf.py && echo '{"perf": 1}'``) never meant to import the
   agent's code, but ``-m`` put its working directory, the workdir, first on ``sys.path``: the
   agent's ``attr.py`` (a dependency pytest imports at start-up, no name the screen knows)
   exited 0 there and the ``echo`` gave full marks. Command verifiers now run with
   ``PYTHONSAFEPATH=1``: no Python they start puts the workdir on its path by itself.
2. A function verifier in one process (``isolation = "shared"``) that found its helper with
   ``sys.path.append(<its directory>)`` imported the agent's ``cases.py`` instead (the
   workspace was on the path before it): the agent chose the expected values. The verifier's
   directory is now first on its path.

Both fail on the commit before this round; the honest solution keeps its reward.
"""

from __future__ import annotations

import pytest
from redteam_parts import honest_then, task_dir

TESTS = "from m import f\n\n\ndef test_a():\n    assert f(3) == 9\n"
SOLUTION = "def f(x):\n    return x * x\n"
STUB = "def f(x):\n    raise NotImplementedError\n"

# The verifier's pytest check runs the agent's code in a child, told where it is.
TEST_PERF = '''import os
import subprocess
import sys


def test_perf():
    r = subprocess.run([sys.executable, "-c", "from m import f; print(f(4))"],
                       capture_output=True, text=True, cwd="/workspace",
                       env={**os.environ, "PYTHONPATH": "/workspace"})
    assert r.stdout.strip() == "16"
'''
PYTEST_VERIFIER = ('\n[reward]\ntests = 0.5\nperf = 0.5\n\n[[verifiers]]\nname = "perf"\n'
                   "command = '''python3 -m pytest -q -p no:cacheprovider "
                   "$TEMPERING_VERIFIERS/test_perf.py && echo '{\"perf\": 1}' '''\n"
                   'components = ["perf"]\ntimeout_s = 60\n')

HELPED = '''import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from cases import CASES  # noqa: E402


def score(workdir):
    sys.path.append(workdir)
    from m import f
    return {"fn": sum(f(x) == y for x, y in CASES) / len(CASES)}
'''


@pytest.mark.parametrize("runner", ["plain", pytest.param("pytest", marks=pytest.mark.slow)])
async def test_a_command_verifiers_python_never_imports_from_the_workdir(tmp_path,
                                                                         runner: str) -> None:
    task = task_dir(tmp_path / "task", "pyshadow", {
        "workspace/m.py": STUB, "solution/m.py": SOLUTION, "tests/test_a.py": TESTS,
        "verifiers/test_perf.py": TEST_PERF}, runner=runner, more_toml=PYTEST_VERIFIER)
    result = await honest_then(task, {"m.py": SOLUTION}, {"attr.py": "import os\nos._exit(0)\n"})
    assert result.components["perf"] == 0.0, (result.components, result.flags, result.details)
    assert result.reward == 0.0


@pytest.mark.parametrize("isolation", ["shared", pytest.param("data", marks=pytest.mark.slow)])
async def test_a_function_verifiers_own_helpers_come_first(tmp_path, isolation: str) -> None:
    task = task_dir(tmp_path / "task", "helped", {
        "workspace/m.py": STUB, "solution/m.py": SOLUTION, "tests/test_a.py": TESTS,
        "verifiers/fv.py": HELPED, "verifiers/cases.py": "CASES = [(2, 4), (3, 9), (5, 25)]\n"},
        runner="plain", more_toml='\n[reward]\ntests = 0.5\nfn = 0.5\n\n[[verifiers]]\n'
        f'name = "fn"\nfunction = "fv.py:score"\nisolation = "{isolation}"\ntimeout_s = 30\n')
    result = await honest_then(task, {"m.py": SOLUTION}, {
        "m.py": "def f(x):\n    return 0\n", "cases.py": "CASES = [(1, 0), (2, 0)]\n"})
    assert result.components["fn"] == 0.0, (result.components, result.flags, result.details)
