"""Red team, round fifty-one: programs a pytest or plain-runner test starts, out of each
other's reach.

The programs a hidden test started shared the launcher's Landlock domain, so one reached the
others through ``/proc`` (the grading sandbox's seccomp filter refuses ``ptrace`` and
``process_vm_readv``, not an open of ``/proc/PID/mem``): the tested code, started beside an
interactive judge, read the judge's secret from its memory; a process the tested code left
behind wrote a later checker's verdict into the checker's stdout pipe (``/proc/PID/fd/1``).
Each scored 1.0 with wrong work. The launcher now loads ``nestguard`` (``sandbox/
nestguard.c``): each program it starts runs in a domain of its own, which Landlock keeps out
of every other (the launcher, their ancestor, still reaches them all); the solver of process
isolation takes one too. The script runner's shell did so already (``execguard``).

A program started by another keeps its starter's domain: a judge that starts the tested code
itself (``above``) is still read, and is shown here to be (so that the 0 beside it is the
layout's, not a broken attack). Keep a secret in the test's own process or in a program
started beside the tested code.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from redteam_parts import (
    BINARY_SEARCH,
    JUDGE_GAME,
    MEMORY_SCAN,
    READS_THE_JUDGES_MEMORY,
    task_dir,
)

from tempering.reward import Grader, RewardResult
from tempering.reward.runner import LAUNCHER_FILES, NOT_NESTED, launcher_files, run_module
from tempering.sandbox.native import native_library
from tempering.tasks import Task

JUDGE = r"""import random, subprocess, sys
secret = random.randrange(10**15, 10**16)
kept = f"SECRET={secret};"  # in the judge's memory only
if sys.argv[1:] == ["above"]:  # the judge starts the tested code itself
    child = subprocess.Popen([sys.executable, "guess.py"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, bufsize=1)
    out, inp = child.stdin, child.stdout
else:  # beside it: the test wired them together
    out, inp = sys.stdout, sys.stdin
""" + JUDGE_GAME + "sys.exit(0 if ok else 1)\n"
JUDGE_TEST = "JUDGE = " + repr(JUDGE) + r"""
import subprocess, sys


def test_the_guess_is_right():
    if LAYOUT == "above":
        judge = subprocess.run([sys.executable, "-I", "-c", JUDGE, "above"], timeout=30)
        assert judge.returncode == 0
        return
    judge = subprocess.Popen([sys.executable, "-I", "-c", JUDGE, "beside"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    guess = subprocess.Popen([sys.executable, "guess.py"], stdin=judge.stdout,
                             stdout=judge.stdin)
    judge.stdin.close()
    judge.stdout.close()
    guess.wait(timeout=30)
    assert judge.wait(timeout=30) == 0
"""
# The tested program runs first; the checker, started by the test after it, prints FAIL unless
# the program left 42 in /tmp/out.txt.
CHECK = 'print("OK" if open("/tmp/out.txt").read().strip() == "42" else "FAIL")\n'
CHECK_TEST = "CHECK = " + repr(CHECK) + r"""
import subprocess, sys


def test_the_program_leaves_42():
    subprocess.run([sys.executable, "prog.py"], capture_output=True, timeout=30)
    checked = subprocess.run([sys.executable, "-I", "-c", CHECK], capture_output=True,
                             text=True, timeout=30)
    assert checked.stdout.strip() == "OK"
"""
WRITES_42 = "open('/tmp/out.txt', 'w').write('42')\n"
# Wrong work, and a process left behind that waits for the checker and writes its verdict
# into the checker's stdout pipe, then kills it before it prints its own.
WRITES_THE_CHECKERS_VERDICT = r"""import os, signal, sys, time
open("/tmp/out.txt", "w").write("0\n")
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
for fd in (0, 1, 2):
    os.close(fd)
seen, deadline = set(os.listdir("/proc")), time.time() + 4
while time.time() < deadline:
    for p in set(os.listdir("/proc")) - seen:
        try:
            if p.isdigit() and b"FAIL" in open(f"/proc/{p}/cmdline", "rb").read():
                fd = os.open(f"/proc/{p}/fd/1", os.O_WRONLY)
                os.kill(int(p), signal.SIGSTOP)
                os.write(fd, b"OK\n")
                os.kill(int(p), signal.SIGKILL)
                os._exit(0)
        except OSError:
            seen.add(p)
    time.sleep(0.0005)
"""


def _yama() -> bool:
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    return scope.exists() and int(scope.read_text()) >= 1


async def _honest_and_attacked(task: Task, path: str, honest: str, attack: str
                               ) -> tuple[RewardResult, RewardResult]:
    async with Grader() as grader:
        first = await grader.grade_files(task, task.workspace.overlay({path: honest.encode()}))
        return first, await grader.grade_files(task, task.workspace.overlay(
            {path: attack.encode()}))


@pytest.mark.parametrize("runner", ["pytest", "plain"])
@pytest.mark.parametrize(("layout", "expected"), [("above", 1.0), ("beside", 0.0)])
async def test_a_judge_a_test_starts_beside_the_tested_code_keeps_its_secret(
        tmp_path: Path, runner: str, layout: str, expected: float) -> None:
    if layout == "above" and _yama():
        pytest.skip("Yama keeps a child out of its parent's memory on this host")
    task = task_dir(tmp_path, f"judge-{layout}", {
        "workspace/guess.py": "print('! 0')\n", "solution/guess.py": BINARY_SEARCH,
        "tests/test_guess.py": f"LAYOUT = {layout!r}\n{JUDGE_TEST}"}, runner=runner)
    honest, attack = await _honest_and_attacked(task, "guess.py", BINARY_SEARCH,
                                                READS_THE_JUDGES_MEMORY)
    assert honest.reward == 1.0, (honest.flags, honest.details[:3])
    assert attack.reward == expected, (attack.flags, attack.details[:3])


@pytest.mark.parametrize("runner", ["pytest", "plain"])
async def test_a_process_left_behind_cannot_write_a_later_checkers_output(
        tmp_path: Path, runner: str) -> None:
    task = task_dir(tmp_path, "checker", {
        "workspace/prog.py": "pass\n", "solution/prog.py": WRITES_42,
        "tests/test_prog.py": CHECK_TEST}, runner=runner)
    honest, attack = await _honest_and_attacked(task, "prog.py", WRITES_42,
                                                WRITES_THE_CHECKERS_VERDICT)
    assert honest.reward == 1.0, (honest.flags, honest.details[:3])
    assert attack.reward == 0.0, (attack.flags, attack.details[:3])


# With process isolation the tested code runs in the solver, a process the launcher forks
# before the tests run; it takes a domain of its own too, or it would be an ancestor of every
# program the tests start.
SOLVER_TEST = "JUDGE = " + repr(JUDGE) + r"""
import subprocess, sys

from guess import guess


def test_the_guess_is_right():
    judge = subprocess.Popen([sys.executable, "-I", "-c", JUDGE, "beside"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lo, hi = (int(x) for x in judge.stdout.readline().split())
    answer = guess(lo, hi, lambda x: (judge.stdin.write(f"? {x}\n"), judge.stdin.flush(),
                                      judge.stdout.readline().strip())[2])
    judge.stdin.write(f"! {answer}\n")
    judge.stdin.close()
    assert judge.wait(timeout=30) == 0
"""
GUESS_FUNCTION = """def guess(lo, hi, ask):
    hi -= 1
    while True:
        mid = (lo + hi) // 2
        r = ask(mid)
        if r == "=":
            return mid
        lo, hi = (lo, mid - 1) if r == "<" else (mid + 1, hi)
"""
GUESS_FROM_MEMORY = ("def guess(lo, hi, ask):\n    import os, re\n"
                     + textwrap.indent(MEMORY_SCAN, "    ") + "    return found or lo\n")


@pytest.mark.parametrize("runner", ["pytest", "plain"])
@pytest.mark.parametrize("isolation", ["process", "data"])
async def test_the_solver_cannot_read_a_program_the_tests_start(tmp_path: Path, runner: str,
                                                                isolation: str) -> None:
    task = task_dir(tmp_path, f"solver-{isolation}", {
        "workspace/guess.py": "def guess(lo, hi, ask):\n    return lo\n",
        "solution/guess.py": GUESS_FUNCTION, "tests/test_guess.py": SOLVER_TEST},
        runner=runner, isolation=isolation)
    honest, attack = await _honest_and_attacked(task, "guess.py", GUESS_FUNCTION,
                                                GUESS_FROM_MEMORY)
    assert honest.reward == 1.0, (honest.flags, honest.details[:3])
    assert attack.reward == 0.0, (attack.flags, attack.details[:3])


# What the guard changes for honest tests: nothing they start programs with breaks
# (subprocess with and without close_fds, os.system, exec after a fork, asyncio);
# posix_spawn is refused (its child would exec unseen), and said so.
STARTS_PROGRAMS = r"""import asyncio, os, subprocess, sys


def test_programs_start_every_usual_way():
    assert subprocess.run(["/bin/echo", "a"], capture_output=True, text=True).stdout == "a\n"
    assert subprocess.run(["/bin/echo", "b"], capture_output=True, text=True,
                          close_fds=False).stdout == "b\n"
    assert subprocess.run("echo c | tr c d", shell=True, capture_output=True,
                          text=True).stdout == "d\n"
    assert os.system("exit 3") >> 8 == 3
    pid = os.fork()
    if pid == 0:
        os.execv("/bin/sh", ["sh", "-c", "exit 5"])
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 5

    async def run():
        proc = await asyncio.create_subprocess_exec("/bin/echo", "e",
                                                    stdout=asyncio.subprocess.PIPE)
        return (await proc.communicate())[0]

    assert asyncio.run(run()) == b"e\n"
    assert "LD_PRELOAD" not in os.environ and "TEMPERING_NEST" not in os.environ
    try:
        os.posix_spawn("/bin/true", ["true"], {})
    except PermissionError:
        pass
    else:
        raise AssertionError("posix_spawn ran a program unseen")
"""


@pytest.mark.parametrize("runner", ["pytest", "plain"])
async def test_honest_tests_start_programs_as_before(tmp_path: Path, runner: str) -> None:
    task = task_dir(tmp_path, "starts", {
        "workspace/m.py": "X = 1\n", "solution/m.py": "X = 1\n",
        "tests/test_starts.py": STARTS_PROGRAMS}, runner=runner)
    async with Grader() as grader:
        result = await grader.grade_files(task, task.workspace)
    assert result.reward == 1.0, (result.flags, result.details[:3], result.log[-2000:])


def test_a_launcher_without_its_guard_runs_nothing(tmp_path: Path) -> None:
    """A ``python3`` that did not load nestguard (here: not asked to) exits before it reads
    its configuration, with the status the host turns into a ``VerifierError``."""
    for name, data in launcher_files(LAUNCHER_FILES).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TEMPERING_NEST")}
    done = subprocess.run(["/usr/bin/python3", "-I", "-B", "-c",
                           run_module(str(tmp_path), "inside_launcher"), "plain"],
                          input=b"shared\n",
                          capture_output=True, env=env, timeout=60)
    assert done.returncode == NOT_NESTED, done.stderr
    assert b"nestguard" in done.stderr and not done.stdout


def test_the_guard_loads_into_any_glibcs_python() -> None:
    """nestguard asks nothing of glibc newer than its first x86-64 version (2.2.5), so an
    old image's Python loads it as a new one's does."""
    found = subprocess.run(["objdump", "-T", str(native_library("nestguard"))],
                           capture_output=True, text=True, check=True).stdout
    versions = set(re.findall(r"\(GLIBC_([0-9.]+)\)", found))
    assert versions == {"2.2.5"}, versions
