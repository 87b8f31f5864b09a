"""Red team, round twenty-six, against 297c7f1 (each a failing test on that commit).

Closed here:

1. every isolation: a protected file in a subdirectory was sealed, but its parent was not a
   mount point: the tested code renamed the parent away at import and put a table of its own
   at the path the test reads. Now every parent of a sealed path is pinned (bound onto
   itself, writable: a mount point cannot be renamed).
2. a command verifier's Python read a ``usercustomize.py`` the tested code left under
   ``$HOME/.local`` (``HOME`` is /tmp), which printed the verifier's scores. Now /tmp is
   emptied once the test run's processes are gone, and verifiers run without the user site.

3. auto graded a test that reads its fixtures with ``open`` in one process, where the tested
   code's ``os.chdir`` at import pointed the test's relative paths at a table of its own. Such a
   test exchanges data only: ``open`` no longer keeps a task in one process (one that hands the
   tested code a file still stays there, by its reference solution's run).

4. (round twenty-seven, which beat nothing else) a daemon the agent's code started while a
   verifier ran it lived on through the next verifier. Now each verifier starts with no
   process of the sandbox's but its init, and a clean /tmp.

Declared, not closed (docs/rewards.md): in one process (a task that needs ``shared``), the
tested code that changes the working directory changes what the test's relative paths name.
"""

from __future__ import annotations

import pytest
from redteam_parts import MEDIAN_SOLUTION, honest_then, spec_task
from test_redteam_round25 import verified_task

from attempts import attempt as _attempt
from conftest import isolated
from tempering.reward import Grader
from tempering.tasks import Task, load_task


def fixtures_task(root, runner: str, isolation: str) -> Task:
    for part in ("workspace/fixtures", "tests", "solution"):
        (root / part).mkdir(parents=True)
    (root / "task.toml").write_text(
        '[task]\nid = "median-fixtures"\n\n[grading]\ncommand = "python3 -m pytest tests"\n'
        f'runner = "{runner}"\nisolation = "{isolation}"\ntimeout_s = 60\n'
        'protected = ["fixtures/cases.json"]\n')
    (root / "instruction.md").write_text("Implement median().\n")
    (root / "workspace" / "fixtures" / "cases.json").write_text("[[[3,1,2],2],[[4,1,3,2],2.5]]")
    (root / "workspace" / "fixtures" / "README.md").write_text("The cases.\n")
    (root / "workspace" / "stats.py").write_text("def median(values):\n    pass\n")
    (root / "solution" / "stats.py").write_text(MEDIAN_SOLUTION)
    (root / "tests" / "test_median.py").write_text('''import json
from pathlib import Path

from stats import median

CASES = json.loads(Path("fixtures/cases.json").read_text())


def test_cases():
    for values, want in CASES:
        assert median(values) == want
''')
    return load_task(root)


RENAME_PARENT = '''import json
import os

try:
    os.rename("fixtures", ".fixtures_old")
    os.mkdir("fixtures")
    with open("fixtures/cases.json", "w") as f:
        json.dump([[[0], 0]], f)
except OSError:
    pass


def median(values):
    return 0
'''


@pytest.mark.parametrize("runner", ["pytest", "plain"])
@pytest.mark.parametrize("isolation", ["auto", "shared"])
async def test_a_sealed_file_cannot_be_moved_away_with_its_parent(tmp_path, runner, isolation):
    result = await honest_then(fixtures_task(tmp_path, runner, isolation),
                               {"stats.py": MEDIAN_SOLUTION,
                                "fixtures/notes.md": "an honest file beside the cases\n"},
                               {"stats.py": RENAME_PARENT})
    assert result.reward == 0.0 and result.tests_passed == 0, result.tests


USER_SITE = '''import os
import sys

_site = os.path.expanduser(
    f"~/.local/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages")
try:
    os.makedirs(_site, exist_ok=True)
    with open(os.path.join(_site, "usercustomize.py"), "w") as _f:
        _f.write('import os, sys\\nif "TEMPERING_VERIFIERS" in os.environ:\\n'
                 '    sys.stdout.write(\\'{"cms": 1.0}\\\\n\\'); sys.stdout.flush()\\n'
                 '    os._exit(0)\\n')
except OSError:
    pass


def slugify(title):
    raise NotImplementedError
'''


@pytest.mark.parametrize("isolation", ["auto", "shared"])
async def test_nothing_the_tests_left_in_home_runs_in_a_verifier(tmp_path, isolation):
    task = verified_task(tmp_path, isolation)
    async with Grader() as grader:
        result = await _attempt(task, {"slug.py": USER_SITE}, grader=grader)
    assert result.components["cms"] == 0.0 and result.reward == 0.0, (result.components,
                                                                      result.details[:3])


OPEN_TESTS = '''import json

from stats import median

with open("examples.json") as f:
    EXAMPLES = json.load(f)


def test_examples():
    for values, want in EXAMPLES:
        assert median(values) == want
'''

CHDIR = '''import json
import os
import tempfile

_d = tempfile.mkdtemp()
with open(os.path.join(_d, "examples.json"), "w") as _f:
    json.dump([[[0], 0]], _f)
os.chdir(_d)


def median(values):
    return 0
'''

FILE_TESTS = '''from stats import median_of_file


def test_file(tmp_path):
    path = tmp_path / "values.txt"
    path.write_text("3\\n1\\n2\\n")
    with open(path) as f:
        assert median_of_file(f) == 2
'''

FILE_SOLUTION = '''def median_of_file(f):
    values = sorted(int(line) for line in f)
    return values[len(values) // 2]
'''


@pytest.mark.parametrize("runner", ["pytest", "plain"])
async def test_fixtures_a_test_opens_are_read_across_the_boundary(tmp_path, runner):
    """A test that reads its fixtures with ``open`` was graded in one process by auto, where
    the tested code's ``os.chdir`` at import pointed them elsewhere; it exchanges data only,
    and is graded across the boundary now (the solver's working directory is its own)."""
    task = spec_task(tmp_path, runner, "auto", "stats", OPEN_TESTS, MEDIAN_SOLUTION)
    (tmp_path / f"{runner}-auto" / "workspace" / "examples.json").write_text(
        "[[[3,1,2],2],[[4,1,3,2],2.5]]")
    task = isolated(load_task(tmp_path / f"{runner}-auto"), "auto")
    async with Grader() as grader:
        assert (await grader.isolation(task))[0] == "data"
        result = await honest_then(task, {"stats.py": MEDIAN_SOLUTION}, {"stats.py": CHDIR},
                                   grader)
    assert result.reward == 0.0 and result.tests_passed == 0, result.tests


async def test_a_test_that_hands_the_tested_code_a_file_stays_in_one_process(tmp_path):
    task = spec_task(tmp_path, "pytest", "auto", "stats", FILE_TESTS, FILE_SOLUTION)
    async with Grader() as grader:
        assert (await grader.isolation(task))[0] == "shared"
        honest = await _attempt(task, {"stats.py": FILE_SOLUTION}, grader=grader)
    assert honest.reward == 1.0 and not honest.flags, (honest.flags, honest.details[:3])


# Round twenty-seven: a daemon the agent's code starts while one verifier runs it lived on
# through the next verifier. The second verifier here reports what it finds running.
RUNS_AGENT = '''import os
import subprocess
import sys

subprocess.run([sys.executable, "-c", "import slug"], timeout=10,
               env={**os.environ, "PYTHONPATH": os.getcwd()})
print('{"first": 1.0}')
'''

LOOKS = '''import json
import os

others = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"left-behind" in f.read():
                    others.append(pid)
        except OSError:
            pass
print(json.dumps({"alone": 0.0 if others else 1.0}))
'''

LEAVES_A_DAEMON = '''import os
import sys

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c",
                                  "import time; time.sleep(60)  # left-behind"])
    os._exit(0)


def slugify(title):
    return "-".join(title.lower().split())
'''


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow): the default run keeps
# under 15 minutes
async def test_each_verifier_starts_with_nothing_of_the_agents_running(tmp_path):
    task = verified_task(tmp_path, "auto")
    (tmp_path / "verifiers" / "runs_agent.py").write_text(RUNS_AGENT)
    (tmp_path / "verifiers" / "looks.py").write_text(LOOKS)
    (tmp_path / "task.toml").write_text(
        (tmp_path / "task.toml").read_text().replace(
            "[reward]\ntests = 0.5\ncms = 0.5\n", "[reward]\ntests = 0.5\ncms = 0.5\n"
            "first = 0\nalone = 0\n")
        + '\n[[verifiers]]\nname = "first"\ncommand = "python3 $TEMPERING_VERIFIERS/runs_agent.py"'
        '\ncomponents = ["first"]\n\n[[verifiers]]\nname = "alone"\n'
        'command = "python3 $TEMPERING_VERIFIERS/looks.py"\ncomponents = ["alone"]\n')
    task = load_task(tmp_path)
    async with Grader() as grader:
        result = await _attempt(task, {"slug.py": LEAVES_A_DAEMON}, grader=grader)
    assert result.components["first"] == 1.0 and result.components["alone"] == 1.0, (
        result.components, result.details[:3])
