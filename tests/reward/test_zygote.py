"""The grading zygote: each grading it forks is a fresh, locked-down sandbox.

These run real forks of a real zygote sandbox and look at them from inside (a hidden test that
reports what it sees) and from outside (limits, timeouts, the zygote's restart)."""

from __future__ import annotations

import ast
import secrets

from tempering.reward import Grader
from tempering.reward.grader import grading_spec
from tempering.reward.runner import zygote_program
from tempering.sandbox import SandboxSpec
from tempering.sandbox.local.zygote import Zygote
from tempering.tasks.humaneval import load_humaneval
from zygote_runs import run_in_zygote

PROBE = '''import os

REACH = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
parent = os.getppid()
try:
    os.close(os.open(f"/proc/{parent}/mem", os.O_RDWR))
    mem = 0
except OSError as e:
    mem = e.errno
attach = libc.ptrace(16, parent, None, None)
print(mem, attach, ctypes.get_errno())
"""


def test_probe():
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    facts = {k: status[k].strip() for k in ("CapEff", "CapBnd", "NoNewPrivs", "Seccomp", "Uid")}
    facts["pid"] = os.getpid()
    facts["pids"] = sorted(p for p in os.listdir("/proc") if p.isdigit())
    facts["workspace"] = sorted(os.listdir("/workspace"))
    facts["tmp"] = sorted(os.listdir("/tmp"))
    facts["unshare"] = os.system("unshare -U true 2>/dev/null") != 0
    # A child reaching into this process (its runner): as in every grading sandbox, refused.
    with open("/tmp/reach.py", "w") as f:
        f.write(REACH)
    facts["reach"] = os.popen("python3 /tmp/reach.py").read().split()
    os.remove("/tmp/reach.py")
    open("/tmp/left-by-an-earlier-grading", "w").write("x")
    assert False, repr(facts)
'''


async def test_each_grading_is_fresh_unprivileged_and_filtered() -> None:
    zygote = Zygote(grading_spec(load_humaneval()[0]), zygote_program())
    await zygote.start()
    try:
        seen = []
        for _ in range(2):
            run, timed_out, oom, code = await run_in_zygote(zygote, {"tests/test_probe.py": PROBE})
            message = run.outcomes["tests/test_probe.py::test_probe"][1]
            seen.append(ast.literal_eval(message.strip().splitlines()[-1].split(": ", 1)[1]))
            assert run.finished and run.canaries == {"pass": "passed", "fail": "failed"}
            assert code == 0 and not timed_out and not oom
    finally:
        await zygote.close()
    for facts in seen:
        assert facts["CapEff"] == facts["CapBnd"] == "0000000000000000"
        assert facts["NoNewPrivs"] == "1" and facts["Seccomp"] == "2"
        assert facts["Uid"].split() == ["1000"] * 4
        assert facts["pid"] == 1 and facts["pids"][0] == "1"  # its own pid namespace
        assert facts["workspace"] == ["tests"] and facts["unshare"] is True
        assert facts["reach"] == ["13", "-1", "1"], facts["reach"]  # EACCES; EPERM
    assert seen[0]["tmp"] == seen[1]["tmp"] == []  # nothing of the first grading is left


async def test_limits_hold_and_a_timeout_kills_the_grading() -> None:
    spec = SandboxSpec(memory_mb=128, pids=32, disk_mb=16, storage="memory")
    zygote = Zygote(spec, zygote_program())
    await zygote.start()
    try:
        bomb = "def test_memory():\n    b = bytearray(512 << 20)\n    assert b\n"
        run, timed_out, oom, code = await run_in_zygote(zygote, {"tests/test_m.py": bomb})
        assert oom and not run.finished and code != 0
        loop = "def test_loop():\n    while True:\n        pass\n"
        run, timed_out, oom, code = await run_in_zygote(zygote, {"tests/test_l.py": loop},
                                                        timeout=1.0)
        assert timed_out and not run.finished
        fill = ("def test_disk():\n    with open('/tmp/f', 'wb') as f:\n"
                "        f.write(bytes(64 << 20))\n")
        run, *_ = await run_in_zygote(zygote, {"tests/test_d.py": fill})
        outcome, message = run.outcomes["tests/test_d.py::test_disk"]
        assert outcome == "failed" and "No space left" in message
    finally:
        await zygote.close()


async def test_the_grader_restarts_a_dead_zygote() -> None:
    task = load_humaneval()[2]
    files = task.workspace.overlay(dict(task.solution.files))  # type: ignore[union-attr]
    async with Grader() as grader:
        assert (await grader.grade_files(task, files)).reward == 1.0
        for zygote in grader._zygotes.started():  # noqa: SLF001 - the fault being injected
            await zygote.close()
        assert (await grader.grade_files(task, files)).reward == 1.0


def test_seccomp_program_is_the_inits() -> None:
    """The zygote's gradings install the filter of a grading sandbox's init: the init's own,
    with the calls that reach into another process refused (``notrace``)."""
    import subprocess

    from tempering.sandbox.host import host

    def program(*args: str) -> bytes:
        return subprocess.run([host().init, "--seccomp-filter", *args], capture_output=True,
                              check=True).stdout

    plain, notrace = program(), program("notrace")
    assert len(plain) % 8 == 0 and len(plain) // 8 > 60
    assert len(notrace) // 8 == len(plain) // 8 + 12
    assert secrets.compare_digest(notrace, program("notrace"))
