"""Red team, round twenty-eight, against 971af09 (a failing test on that commit).

Closed here: before each verifier, /tmp is emptied of what the test run left (round
twenty-six), as the sandbox user; the tested code that left a directory without its write
bit there (or took /tmp's own) made that cleaning fail, and ``grade()`` raised: a failing
episode became ``infra_error``, dropped by the default filters instead of trained on as a 0,
under every runner and isolation. Everything in /tmp is the sandbox user's own, so the
cleaning gives it its modes back and goes on; what still cannot be emptied (more files than
the time allows) is the tested code's doing and zeroes the verifiers, never raises.
"""

from __future__ import annotations

import pytest
from test_redteam_round25 import verified_task

from attempts import attempt as _attempt
from tempering.reward import Grader

LOCK_TMP = '''import os

try:
    os.makedirs("/tmp/locked/sub/deeper", exist_ok=True)
    open("/tmp/locked/sub/deeper/f", "w").close()
    os.symlink(os.getcwd(), "/tmp/workdir")  # the cleaning must not follow it
    for path in ("/tmp/locked/sub/deeper", "/tmp/locked/sub", "/tmp/locked"):
        os.chmod(path, 0o500)
    os.chmod("/tmp/locked/sub/deeper", 0)
    os.chmod("/tmp", 0o500)
except OSError:
    pass

'''


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["auto", "process", "shared"])
async def test_what_the_tests_left_unwritable_in_tmp_is_no_infra_error(tmp_path, isolation):
    task = verified_task(tmp_path, isolation)
    solution = task.solution.files["slug.py"].decode()
    async with Grader() as grader:
        honest = await _attempt(task, {"slug.py": LOCK_TMP + solution}, grader=grader)
        wrong = await _attempt(task, {"slug.py": LOCK_TMP + "def slugify(title):\n"
                                      "    return 'x'\n"}, grader=grader)
    assert honest.reward == 1.0 and not honest.flags, (honest.flags, honest.details[:3])
    assert wrong.reward == 0.0 and wrong.components["cms"] == 0.0, wrong.details[:3]
