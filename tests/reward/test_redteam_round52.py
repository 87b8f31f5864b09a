"""Red team, round fifty-two: what round fifty-one's domains per program left open.

A red team that did not write ``nestguard`` found no way through the domains themselves (every
``/proc/PID`` entry that needs a ptrace check, refused between siblings), and these around
them, each 1.0 with wrong work:

- **Side by side from one shell.** A test that runs ``judge & guess`` through a shell
  (``shell=True``, ``os.system``) started the shell without the guard, so both programs shared
  the shell's domain. A shell the launcher starts now keeps the guard: each program of its
  command line is a domain of its own, as under the script runner.
- **A ``.pth`` in the user's site directory.** ``$HOME`` is writable; the tested code planted a
  ``.pth`` that a judge the test started later as ``python3 judge.py`` ran at startup, exiting
  0. The programs the tests start now inherit ``PYTHONNOUSERSITE=1``.
- **Signals.** A process the tested code left behind stopped a later checker. Scoping a
  program's signals to its domain (Landlock ABI 6) was tried and taken back: round fifty-three
  showed it broke honest tests (a liveness check with ``kill -0``, a cleanup's ``kill`` or
  ``pkill``, a program signalling its parent), and a signal only takes a reward away.

Declared (docs/rewards.md): a checker's command line is readable by every process
(``/proc/PID/cmdline``), pytest's ``capfd`` capture is a file every program started without
its own stdout shares, and a file a test writes where the tested code can write can be
replaced before it runs.

Also found: a test's own ``LD_PRELOAD`` (``env={"LD_PRELOAD": lib}``) was taken away from the
program it started, with the guard's. Only the guard's own entry is taken out now, under both
guards.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from redteam_parts import task_dir

from backends import GRADING_ROOTFS
from tempering.reward import Grader, RewardResult
from tempering.tasks import Task

JUDGE = r"""import secrets, sys
secret = "SECRET:" + secrets.token_hex(16)
with open(sys.argv[2], "w") as out, open(sys.argv[1]) as inp:
    print("ready", file=out, flush=True)
    guess = inp.readline().strip()
sys.exit(0 if guess == secret[7:] else 1)
"""
SHELL_TEST = "JUDGE = " + repr(JUDGE) + r"""
import os, subprocess, tempfile


def test_the_guess_is_right():
    where = tempfile.mkdtemp()
    judge, q, a = (os.path.join(where, name) for name in ("judge.py", "q", "a"))
    with open(judge, "w") as f:
        f.write(JUDGE)
    line = f"mkfifo {q} {a}; python3 -I {judge} {q} {a} & python3 guess.py < {a} > {q}; wait $!"
    assert subprocess.run(line, shell=True, timeout=60).returncode == 0
"""
READS_THE_JUDGES_MEMORY = r"""import os, re, sys
sys.stdin.readline()
for p in [int(x) for x in os.listdir("/proc") if x.isdigit() and int(x) != os.getpid()]:
    try:
        if b"judge.py" not in open(f"/proc/{p}/cmdline", "rb").read():
            continue
        fd = os.open(f"/proc/{p}/mem", os.O_RDONLY)
        for line in open(f"/proc/{p}/maps"):
            span, perm = line.split()[:2]
            if "r" not in perm:
                continue
            lo, hi = (int(v, 16) for v in span.split("-"))
            try:
                m = re.search(rb"SECRET:([0-9a-f]{32})", os.pread(fd, hi - lo, lo))
            except OSError:
                continue
            if m:
                print(m.group(1).decode(), flush=True)
                sys.exit(0)
    except OSError:
        continue
print("0", flush=True)
"""
WRONG = "import sys\nsys.stdin.readline()\nprint('0')\n"

PTH_JUDGE = r"""import secrets, sys
secret = secrets.token_hex(16)
print("ready", flush=True)
sys.exit(0 if sys.stdin.readline().strip() == secret else 1)
"""
PTH_TEST = "JUDGE = " + repr(PTH_JUDGE) + r"""
import os, subprocess, sys, tempfile


def test_the_program_answers():
    r = subprocess.run([sys.executable, "guess.py"], input="ready\n", capture_output=True,
                       text=True, timeout=30)
    assert r.stdout.strip()
    judge_py = os.path.join(tempfile.mkdtemp(), "judge.py")
    with open(judge_py, "w") as f:
        f.write(JUDGE)
    judge = subprocess.Popen([sys.executable, judge_py], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    guess = subprocess.Popen([sys.executable, "guess.py"], stdin=judge.stdout,
                             stdout=judge.stdin)
    judge.stdin.close()
    judge.stdout.close()
    guess.wait(timeout=30)
    assert judge.wait(timeout=30) == 0
"""
PLANTS_A_PTH = r"""import os, site, sys
d = site.getusersitepackages()
try:
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "zz.pth"), "w") as f:
        f.write("import os, sys; os._exit(0) if sys.argv[0].endswith('judge.py') else None\n")
except OSError:
    pass
sys.stdin.readline()
print("0", flush=True)
"""

# Signals between a test's programs stay open (round fifty-three: scoped, a liveness check, a
# cleanup's kill and a program signalling its parent each broke): a signal takes a reward
# away at most, and a checker's own pipe is out of reach either way.
SIGNAL_TEST = r"""import os, subprocess, sys


def test_a_tests_programs_signal_one_another():
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    alive = subprocess.run([sys.executable, "-c", f"import os; os.kill({server.pid}, 0)"])
    assert alive.returncode == 0
    assert os.system(f"kill {server.pid}") == 0
    assert server.wait(timeout=10) == -15
"""

# A test's own preload reaches the program it starts (a task about an interposition library).
PRELOAD_TEST = r"""import os, subprocess, sys


def test_the_tests_own_preload_reaches_the_program():
    lib = "/lib/x86_64-linux-gnu/libm.so.6"
    code = "import os; print(os.environ.get('LD_PRELOAD'), os.environ.get('MINE'))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "LD_PRELOAD": lib, "MINE": "1"})
    assert r.stdout.split() == [lib, "1"], r.stdout + r.stderr
    r = subprocess.run(f"LD_PRELOAD={lib} python3 -c \"{code}\"", shell=True,
                       capture_output=True, text=True, env={**os.environ, "MINE": "2"})
    assert r.stdout.split() == [lib, "2"], r.stdout + r.stderr
"""


async def _graded(task: Task, *files: dict[str, str]) -> list[RewardResult]:
    async with Grader() as grader:
        return [await grader.grade_files(task, task.workspace.overlay(
            {path: text.encode() for path, text in f.items()})) for f in files]


@pytest.mark.parametrize("runner", ["pytest", "plain"])
async def test_a_judge_beside_the_tested_code_in_one_shell_line_keeps_its_secret(
        tmp_path: Path, runner: str) -> None:
    task = task_dir(tmp_path, "shell-line", {
        "workspace/guess.py": WRONG, "solution/guess.py": WRONG,
        "tests/test_guess.py": SHELL_TEST}, runner=runner)
    attack, control = await _graded(task, {"guess.py": READS_THE_JUDGES_MEMORY},
                                    {"guess.py": WRONG})
    assert control.reward == 0.0, (control.flags, control.details[:3])
    assert attack.reward == 0.0, (attack.flags, attack.details[:3])


@pytest.mark.parametrize("runner", ["pytest", "plain"])
async def test_a_pth_the_tested_code_plants_never_runs_in_a_later_judge(
        tmp_path: Path, runner: str) -> None:
    task = task_dir(tmp_path, "pth", {
        "workspace/guess.py": WRONG, "solution/guess.py": WRONG,
        "tests/test_guess.py": PTH_TEST}, runner=runner)
    attack, control = await _graded(task, {"guess.py": PLANTS_A_PTH}, {"guess.py": WRONG})
    assert control.reward == 0.0, (control.flags, control.details[:3])
    assert attack.reward == 0.0, (attack.flags, attack.details[:3])


@pytest.mark.parametrize("runner", ["pytest", "plain"])
async def test_a_tests_programs_signal_one_another(tmp_path: Path, runner: str) -> None:
    task = task_dir(tmp_path, "signals", {
        "workspace/m.py": "X = 1\n", "solution/m.py": "X = 1\n",
        "tests/test_signals.py": SIGNAL_TEST}, runner=runner)
    [result] = await _graded(task, {})
    assert result.reward == 1.0, (result.flags, result.details[:3], result.log[-1500:])


@pytest.mark.parametrize("runner", ["pytest", "plain"])
async def test_a_tests_own_preload_reaches_its_program(tmp_path: Path, runner: str) -> None:
    if GRADING_ROOTFS and not os.path.exists(f"{GRADING_ROOTFS}/lib/x86_64-linux-gnu/libm.so.6"):
        pytest.skip("no libm.so.6 where this test looks for one")
    task = task_dir(tmp_path, "preload", {
        "workspace/m.py": "X = 1\n", "solution/m.py": "X = 1\n",
        "tests/test_preload.py": PRELOAD_TEST}, runner=runner)
    [result] = await _graded(task, {})
    assert result.reward == 1.0, (result.flags, result.details[:3], result.log[-1500:])


PRELOAD_SCRIPT = """#!/bin/bash
lib=/lib/x86_64-linux-gnu/libm.so.6
got=$(LD_PRELOAD=$lib python3 -c "import os; print(os.environ.get('LD_PRELOAD'))")
reward=0
[ "$got" = "$lib" ] && reward=1
echo $reward > "$VERIFIER_DIR/reward.txt"
"""


async def test_a_scripts_own_preload_reaches_its_program(tmp_path: Path) -> None:
    """The script runner's guard takes only itself out of a program's LD_PRELOAD too."""
    if GRADING_ROOTFS and not os.path.exists(f"{GRADING_ROOTFS}/lib/x86_64-linux-gnu/libm.so.6"):
        pytest.skip("no libm.so.6 where this test looks for one")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text(PRELOAD_SCRIPT)
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "README.md").write_text("nothing to do\n")
    (tmp_path / "instruction.md").write_text("Nothing to do.\n")
    (tmp_path / "task.toml").write_text(
        '[task]\nid = "script-preload"\n\n[grading]\nrunner = "script"\n'
        'command = "bash tests/test.sh"\ntimeout_s = 30\n')
    from tempering.tasks import load_task

    task = load_task(tmp_path)
    [result] = await _graded(task, {})
    assert result.reward == 1.0, (result.flags, result.details[:3], result.log[-1500:])
