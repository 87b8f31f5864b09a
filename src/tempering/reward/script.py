"""The script runner (``grading.runner = "script"``): a task's own test script decides the grade.

The script (``grading.command``, e.g. ``bash tests/test.sh``; any language its shell can start)
runs as the sandbox's unprivileged user, in the workdir of a fresh grading sandbox that holds
the pristine workspace with the screened edits and the hidden tests (read-only, at
``grading.tests_dir``). No process of the agent's ever runs there. As harbor's verifiers do,
it writes its verdict to ``$VERIFIER_DIR`` (``/logs/verifier``):

- ``reward.txt``: one number in [0, 1], the ``tests`` component; or
- ``reward.json``: ``{"reward": number, NAME: number...}``; ``reward`` is ``tests`` (unless
  reward.txt gave it), the names ``grading.components`` declares are components of their own;
- ``junit.xml``, when the script leaves one (``pytest --junitxml=$VERIFIER_DIR/junit.xml``):
  per-test outcomes for the report; the reward is still the files' above.

Only the script's shell can write the verdict. The command runs as ``bash -c COMMAND`` with
``execguard`` loaded (``sandbox/execguard.c``): the shell, the script it execs in its own place
(``bash tests/test.sh``) and their subshells keep every right, and every program they start
(the tested code, and the tools that run it) is exec'd under a Landlock domain that cannot
write below ``/logs/.tempering``, trace the shell or signal it, which the kernel keeps for
everything that program starts. ``reward.txt`` and ``reward.json`` in ``$VERIFIER_DIR`` are
links into that directory: the shell's ``echo 1 > $VERIFIER_DIR/reward.txt`` writes there, a
program's open of the same name is refused, and a program that replaces the link only
redirects the shell's later write away from the verdict (``reward_replaced``, a tamper
flag). The rest of ``$VERIFIER_DIR`` stays writable to every program (reports, logs). So a
script writes its reward with its own redirections; a helper program that opens the reward
file itself is refused (``python3 grade.py > $VERIFIER_DIR/reward.json`` works).

The verdict is read once every process in the sandbox is dead, through the file API (no link
followed, size-limited while reading). The script's exit status is no evidence. A missing,
unreadable or out-of-range reward counts 0 with the ``no_reward`` note; a timeout or an OOM is
noted as for the tests. A sandbox whose shell cannot load the guard (no /bin/bash, another
libc, no Landlock) is not graded: ``VerifierError``, an infrastructure failure.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

from tempering.errors import SandboxError, VerifierError
from tempering.reward.result import TestOutcome, TestResult
from tempering.sandbox import Sandbox
from tempering.sandbox.native import native_library
from tempering.tasks.task import GradingConfig

VERIFIER_DIR = "/logs/verifier"
KEPT_DIR = "/logs/.tempering"  # what no program the script starts can write
GUARD = f"{KEPT_DIR}/execguard.so"
REWARD_FILES = ("reward.txt", "reward.json")
REWARD_FILE_LIMIT = 64 << 10
RECORD_LIMIT = 1 << 20
JUNIT_LIMIT = 8 << 20
PROBE_LOADED = 97


@dataclass
class ScriptRun:
    """What a test script left: scores by component, per-test outcomes, and what went wrong."""

    scores: dict[str, float] = field(default_factory=dict)
    tests: list[TestResult] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (flag, detail)
    log: str = ""
    timed_out: bool = False
    oom: bool = False


async def run_script(sb: Sandbox, grading: GradingConfig, output_limit: int) -> ScriptRun:
    """Run the test script in ``sb`` (the tests already in place) and read its verdict."""
    links = await _prepare(sb)
    keep = ":".join(f"{VERIFIER_DIR}/{name}={KEPT_DIR}/{name}" for name in REWARD_FILES)
    result = await sb.exec(["/bin/bash", "-c", grading.command], timeout=grading.timeout_s,
                           env={**grading.env, "VERIFIER_DIR": VERIFIER_DIR,
                                "LD_PRELOAD": GUARD, "TEMPERING_GUARDED": KEPT_DIR,
                                "TEMPERING_GUARD_KEEP": keep, "PYTHONNOUSERSITE": "1",
                                "PYTHONDONTWRITEBYTECODE": "1",
                                # Python 3.13's subprocess starts programs by posix_spawn,
                                # which execs where the guard cannot see: fork and exec instead
                                "_PYTHON_SUBPROCESS_USE_POSIX_SPAWN": "0"})
    await sb.stop_processes()  # nothing left running reads or writes after this
    usage = await sb.usage()
    run = ScriptRun(timed_out=result.timed_out, oom=result.oom_killed)
    tail = result.stdout[-4000:] + result.stderr[-4000:]
    run.log = f"[test script exited with {result.exit_code}]\n{tail}"[-8000:]
    if result.truncated:
        run.log += f"\n[output over {output_limit} bytes: the middle was dropped]"
    if await _links(sb) != links:  # replaced, by a file, a link, a fifo; a mode changed
        run.notes.append(("reward_replaced", "$VERIFIER_DIR/reward.txt or reward.json, or the "
                                             "file it leads to, is not as the grader made it: "
                                             "a program the script ran replaced it or changed "
                                             "its mode"))
    shell = await _read(sb, f"{KEPT_DIR}/shell", REWARD_FILE_LIMIT)
    if shell == b"pending":  # the program the command became did not load the guard
        return _void(run, grading, "the program the command runs in the shell's place did not "
                                   "load the grader's guard (a static binary?): its programs "
                                   "ran unwatched, so it gives no verdict")
    kept_record = await _read(sb, f"{KEPT_DIR}/refused", RECORD_LIMIT)
    record = (kept_record or b"").decode(errors="replace").splitlines()
    refused = sorted({line.split(" ", 1)[1] for line in record if line.startswith("refused ")})
    failed = sorted({line.split(" ", 1)[1] for line in record if line.startswith("failed ")})
    if refused:  # the guard's record: the shell led to a kept file by another name
        run.notes.append(("reward_redirected", "the script's shell was led to its verdict by "
                                               f"another way ({', '.join(refused)[:300]}): "
                                               "refused"))
    void = ""
    if kept_record is None:  # the shell makes it when it starts: gone, or past its size
        void = "the guard's record of the run is missing or too large to read"
    elif failed:  # the shell could not write its verdict by its link: what it holds is stale
        void = (f"the shell's write of its verdict failed, or its resource limits were "
                f"lowered under it ({', '.join(failed)[:300]})")
    elif usage.pids_peak is not None and usage.pids_peak >= sb.spec.pids:
        void = ("the sandbox's processes reached its pids limit while the script ran: a fork "
                "of the script's may have failed, and its later verdict with it")
    elif result.timed_out or (result.exit_code or 0) < 0:
        void = ("the test script did not end by itself (timed out, or killed by a signal): "
                "a verdict it wrote before that is not its last word")
    if void:
        return _void(run, grading, void)
    text = await _read(sb, f"{KEPT_DIR}/reward.txt", REWARD_FILE_LIMIT) or None
    data = await _read(sb, f"{KEPT_DIR}/reward.json", REWARD_FILE_LIMIT) or None
    named = _reward_json(data, grading.components, run) if data is not None else {}
    if text is not None:
        value = _number(text.decode(errors="replace").strip())
        if value is None:
            run.notes.append(("no_reward", f"reward.txt holds {text[:40]!r}, not a number "
                                           "in [0, 1]"))
        else:
            named["tests"] = value
    if "tests" not in named and not any(flag == "no_reward" for flag, _ in run.notes):
        why = "the test script timed out" if run.timed_out else (
            "the test script wrote neither reward.txt nor reward.json in $VERIFIER_DIR (the "
            "shell the command runs in writes it, with its own redirection; a program it "
            "starts cannot)")
        run.notes.append(("no_reward", why))
    run.scores = {"tests": named.get("tests", 0.0),
                  **{name: named.get(name, 0.0) for name in grading.components}}
    junit = await _read(sb, f"{VERIFIER_DIR}/junit.xml", JUNIT_LIMIT)
    if junit is not None:
        run.tests = junit_outcomes(junit, run)
    return run


def _void(run: ScriptRun, grading: GradingConfig, why: str) -> ScriptRun:
    """``run`` without a verdict: every component 0, and why (``no_reward``)."""
    run.notes.append(("no_reward", why))
    run.scores = {"tests": 0.0, **{name: 0.0 for name in grading.components}}
    return run


async def _prepare(sb: Sandbox) -> str:
    """The guard in place, the kept files (empty) and their links made, and the guard shown
    to load in this sandbox's shell, before anything of the agent's runs: the links as
    they are (``_links``)."""
    await sb.write_file(GUARD, native_library("execguard").read_bytes(), 0o755)
    # Read-only for everything inside from now on: the shell maps it, and a program that got
    # the shell to open it for appending rewrote the shell's code (round forty-five).
    await sb.make_readonly(GUARD)
    for name in REWARD_FILES:
        await sb.write_file(f"{KEPT_DIR}/{name}", b"", 0o644)
    links = " && ".join(f"ln -s {KEPT_DIR}/{name} {VERIFIER_DIR}/{name}"
                        for name in REWARD_FILES)
    made = await sb.exec(["/bin/sh", "-c", f"mkdir -p {VERIFIER_DIR} && {links}"], timeout=30)
    probe = await sb.exec(["/bin/bash", "-c", "exit 0"], timeout=30,
                          env={"LD_PRELOAD": GUARD, "TEMPERING_GUARD_PROBE": "1"})
    if made.exit_code != 0 or probe.exit_code != PROBE_LOADED:
        why = (made.stderr.strip() or f"exit {made.exit_code}") if made.exit_code != 0 else (
            "no /bin/bash" if probe.exit_code == 127 else
            "Landlock is not available" if probe.exit_code == PROBE_LOADED + 1 else
            f"its shell did not load the guard (exit {probe.exit_code}: "
            f"{probe.stderr.strip()[-200:]})")
        raise VerifierError(f"the grading sandbox cannot run a test script under its guard: "
                            f"{why}")
    return await _links(sb)


async def _links(sb: Sandbox) -> str:
    """Each reward link's inode, type and target, and each kept file's inode, mode and owner
    (run when nothing of the agent's runs): a program can change a mode where it cannot
    write (Landlock has no right for chmod), and a kept file made read-only keeps whatever
    it held (round forty-five)."""
    links = " ".join(f"{VERIFIER_DIR}/{name}" for name in REWARD_FILES)
    kept = " ".join(f"{KEPT_DIR}/{name}" for name in REWARD_FILES)
    found = await sb.exec(["/bin/sh", "-c", f"stat -c '%i %F %N' {links} 2>&1; "
                                            f"stat -c '%i %f %u %g' {kept} 2>&1"],
                          timeout=30)
    return found.stdout


async def _read(sb: Sandbox, path: str, limit: int) -> bytes | None:
    try:
        return await sb.read_file(path, limit=limit)
    except (SandboxError, OSError):
        return None  # missing, a link, a directory, past the limit: not a verdict


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def _reward_json(data: bytes, components: list[str], run: ScriptRun) -> dict[str, float]:
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        run.notes.append(("no_reward", "reward.json is not JSON"))
        return {}
    if not isinstance(raw, dict):
        run.notes.append(("no_reward", "reward.json is not an object of numbers"))
        return {}
    named: dict[str, float] = {}
    for key, value in raw.items():
        name = "tests" if key == "reward" else key
        number = _number(str(value)) if isinstance(value, int | float) and not isinstance(
            value, bool) else None
        if name != "tests" and name not in components:
            continue  # a component the task does not weigh: harbor's files carry such
        if number is None:
            run.notes.append(("no_reward", f"reward.json {key}: {str(value)[:40]!r} is not a "
                                           "number in [0, 1]"))
            continue
        named[name] = number
    return named


def junit_outcomes(data: bytes, run: ScriptRun) -> list[TestResult]:
    """Per-test outcomes of a JUnit XML report (pytest's, or any tool's)."""
    if re.search(rb"<!(DOCTYPE|ENTITY)", data, re.IGNORECASE):
        run.notes.append(("junit_ignored", "junit.xml declares a DOCTYPE or entities"))
        return []
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as exc:
        run.notes.append(("junit_ignored", f"junit.xml does not parse: {exc}"))
        return []
    tests = []
    for case in root.iter("testcase"):
        name, group = case.get("name", "?"), case.get("classname", "")
        outcome: TestOutcome = ("failed" if case.find("failure") is not None else
                   "error" if case.find("error") is not None else
                   "skipped" if case.find("skipped") is not None else "passed")
        problem = next((c.get("message", "") or (c.text or "") for c in case
                        if c.tag in ("failure", "error", "skipped")), "")
        tests.append(TestResult(id=f"{group}::{name}" if group else name,
                                outcome=outcome, message=problem[-1000:]))
    return tests
