"""Tasks graded by their own test scripts (``grading.runner = "script"``), modelled on
Terminal-Bench's: a CLI a bash script checks, a failing C build to fix, a service whose config
needs repair, a pytest suite with a JUnit report. Each is graded for real (bash, cc, python3 in
a fresh grading sandbox); the reference scores 1, the untouched workspace 0. Then the tested
code attacks the verdict in every way a program the script runs could: it writes the reward
files, replaces them, leaves a writer behind, traces or signals the script's shell, rewrites
the guard, forges the JUnit report, edits the hidden script; none of it earns anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from redteam_parts import BINARY_SEARCH, JUDGE_GAME, READS_THE_JUDGES_MEMORY

from backends import GRADING_ROOTFS, unavailable
from tempering.errors import ConfigError
from tempering.reward import Grader, RewardResult
from tempering.reward.validate import validate_task
from tempering.sandbox import SandboxSpec
from tempering.tasks import Task, load_task
from tempering.tasks.task import GradingConfig

CLI_TEST = """#!/bin/bash
# Terminal-Bench style: run the CLI, compare, write the reward on every path.
printf 'a b c\\nd  e\\n' > /tmp/in.txt
out=$(python3 count.py /tmp/in.txt 2>/dev/null)
if [ "$out" = "5" ]; then
  echo 1 > "$VERIFIER_DIR/reward.txt"
else
  echo 0 > "$VERIFIER_DIR/reward.txt"
fi
"""
COUNT = "import sys\n\nprint(len(open(sys.argv[1]).read().split()))\n"

C_TEST = """#!/bin/bash
builds=0; runs=0
if cc -O0 -o /tmp/hello main.c greet.c 2>/tmp/cc.log; then
  builds=1
  [ "$(/tmp/hello Ada)" = "Hello, Ada!" ] && runs=1
fi
printf '{"reward": %s, "builds": %s}\\n' "$runs" "$builds" > "$VERIFIER_DIR/reward.json"
"""
GREET_H = "#pragma once\nvoid greet(const char *name);\n"
MAIN_C = """#include "greet.h"

int main(int argc, char **argv) {
    greet(argv[1])
    return 0;
}
"""
GREET_C = """#include <stdio.h>
#include "greet.h"

void greet(const char *name) {
    printf("Hello, %s!\\n", name);
}
"""

SERVICE = """import configparser
import http.server

config = configparser.ConfigParser()
config.read("service.ini")
port = config.getint("server", "port")
greeting = config.get("server", "greeting")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(greeting.encode())

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""
SERVICE_TEST = """#!/bin/bash
# The service must answer on port 8080 with "ready".
python3 server.py > /tmp/server.log 2>&1 &
get='import urllib.request as u; print(u.urlopen("http://127.0.0.1:8080").read().decode())'
for i in $(seq 50); do
  got=$(python3 -c "$get" 2>/dev/null) && break
  sleep 0.1
done
kill $! 2>/dev/null
if [ "$got" = "ready" ]; then echo 1 > "$VERIFIER_DIR/reward.txt"
else echo 0 > "$VERIFIER_DIR/reward.txt"; fi
"""

PYTEST_TEST = """#!/bin/bash
python3 -m pytest -q -p no:cacheprovider tests/test_outputs.py \\
  --junitxml="$VERIFIER_DIR/junit.xml"
if [ $? -eq 0 ]; then echo 1 > "$VERIFIER_DIR/reward.txt"
else echo 0 > "$VERIFIER_DIR/reward.txt"; fi
"""
OUTPUTS = """import subprocess


def run(*args):
    return subprocess.run(["python3", "count.py", *args], capture_output=True, text=True)


def test_counts(tmp_path):
    (tmp_path / "f").write_text("one two three")
    assert run(str(tmp_path / "f")).stdout.strip() == "3"


def test_empty(tmp_path):
    (tmp_path / "f").write_text("")
    assert run(str(tmp_path / "f")).stdout.strip() == "0"
"""


def write_task(root: Path, toml: str, tests: dict[str, str], workspace: dict[str, str],
               solution: dict[str, str]) -> Task:
    for name, files in (("tests", tests), ("workspace", workspace), ("solution", solution)):
        for path, text in files.items():
            (root / name / path).parent.mkdir(parents=True, exist_ok=True)
            (root / name / path).write_text(text)
    (root / "instruction.md").write_text("Make the test script pass.\n")
    (root / "task.toml").write_text(toml)
    return load_task(root)


def script_toml(name: str, extra: str = "", backend: str = "local") -> str:
    return (f'[task]\nid = "{name}"\n\n[sandbox]\nbackend = "{backend}"\nmemory_mb = 512\n\n'
            f'[grading]\nrunner = "script"\ncommand = "bash tests/test.sh"\ntimeout_s = 30\n'
            f"{extra}")


@pytest.fixture
def cli(tmp_path: Path) -> Task:
    return write_task(tmp_path / "cli", script_toml("wordcount-cli"), {"test.sh": CLI_TEST},
                      {"README.md": "Write count.py: print the number of words in a file.\n"},
                      {"count.py": COUNT})


async def graded(task: Task, changes: dict[str, str]) -> RewardResult:
    async with Grader() as grader:
        return await grader.grade_files(task, task.workspace.overlay(
            {p: t.encode() for p, t in changes.items()}))


async def honest_and_attacked(task: Task, path: str, honest: str, attack: str
                              ) -> tuple[RewardResult, RewardResult]:
    """``task`` graded with ``path`` holding ``honest``, then ``attack``, by one grader."""
    async with Grader() as grader:
        first = await grader.grade_files(task, task.workspace.overlay({path: honest.encode()}))
        return first, await grader.grade_files(task, task.workspace.overlay(
            {path: attack.encode()}))


async def test_terminal_bench_style_tasks_grade_solution_1_untouched_0(
        tmp_path: Path, cli: Task) -> None:
    build = write_task(tmp_path / "build", script_toml("c-build", 'components = ["builds"]\n'
                                                       "\n[reward]\ntests = 3.0\nbuilds = 1.0\n"),
                       {"test.sh": C_TEST}, {"main.c": MAIN_C, "greet.c": GREET_C,
                                             "greet.h": GREET_H},
                       {"main.c": MAIN_C.replace("argv[1])", "argv[1]);")})
    service = write_task(tmp_path / "service", script_toml("service-config"),
                         {"test.sh": SERVICE_TEST},
                         {"server.py": SERVICE,
                          "service.ini": "[server]\nport = 8000\ngreeting = ready\n"},
                         {"service.ini": "[server]\nport = 8080\ngreeting = ready\n"})
    suite = write_task(tmp_path / "suite", script_toml("pytest-suite"),
                       {"test.sh": PYTEST_TEST, "test_outputs.py": OUTPUTS}, {},
                       {"count.py": COUNT})
    # A grading root of another distribution (CI's Python roots) may have no C compiler.
    compiles = not GRADING_ROOTFS or os.path.exists(f"{GRADING_ROOTFS}/usr/bin/cc")
    async with Grader() as grader:
        for task in (cli, build, service, suite) if compiles else (cli, service, suite):
            validation = await validate_task(task, grader)
            assert validation.ok, (task.id, validation.problems,
                                   validation.solution and validation.solution.log)
            assert validation.solution is not None and validation.solution.flags == []
        half = await grader.grade_files(build, build.workspace.overlay(  # builds, prints wrong
            {"main.c": MAIN_C.replace("argv[1])", "\"Bob\");").encode()}))
    if compiles:
        assert (half.components["tests"], half.components["builds"], half.reward) == (
            0.0, 1.0, 0.25)
    solved = validation.solution  # the pytest suite: per-test outcomes from its JUnit report
    assert solved is not None
    assert [(t.id.rsplit("::", 1)[1], t.outcome) for t in solved.tests] == [
        ("test_counts", "passed"), ("test_empty", "passed")]
    assert validation.untouched is not None
    assert {t.outcome for t in validation.untouched.tests} == {"failed"}


WRITES_REWARD = COUNT.replace("print(", """import json, os
d = os.environ["VERIFIER_DIR"]
for name, text in (("reward.txt", "1"), ("reward.json", json.dumps({"reward": 1}))):
    try:
        open(os.path.join(d, name), "w").write(text)
    except OSError:
        pass
try:
    open("/logs/.tempering/reward.txt", "w").write("1")
except OSError:
    pass
print(-1 + """)

REPLACES_LINK = COUNT.replace("print(", """import os
d = os.environ["VERIFIER_DIR"]
os.remove(os.path.join(d, "reward.txt"))
open(os.path.join(d, "reward.txt"), "w").write("1")
print(-1 + """)

LEAVES_A_WRITER = COUNT.replace("print(", """import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(1)
        names = ["/logs/.tempering/reward.txt", os.environ["VERIFIER_DIR"] + "/reward.txt"]
        end = time.monotonic() + 10
        while time.monotonic() < end:  # the shell writes 0: put 1 back at once, by any name
            for path in names:
                try:
                    if open(path).read() != "1":
                        open(path, "w").write("1")
                except OSError:
                    pass
    os._exit(0)
print(-1 + """)

ATTACKS_THE_SHELL = COUNT.replace("print(", """import ctypes, os, signal
shell = os.getppid()
while True:  # up to the script's shell (the command substitution is a fork of it)
    stat = open(f"/proc/{shell}/stat").read()
    if "bash" in open(f"/proc/{shell}/cmdline").read() and "test.sh" in open(
            f"/proc/{shell}/cmdline").read():
        break
    shell = int(stat.rsplit(")", 1)[1].split()[1])
libc = ctypes.CDLL(None, use_errno=True)
attached = libc.ptrace(16, shell, None, None)  # PTRACE_ATTACH
try:
    mem = open(f"/proc/{shell}/mem", "wb")
    opened_mem = True
except OSError:
    opened_mem = False
for fd in os.listdir(f"/proc/{shell}/fd"):
    try:
        open(f"/proc/{shell}/fd/{fd}", "w").write("1")
    except OSError:
        pass
try:
    os.kill(shell, signal.SIGSTOP)
    stopped = True
except OSError:
    stopped = False
try:
    open("/logs/.tempering/execguard.so", "wb").write(b"")
    guard_rewritten = True
except OSError:
    guard_rewritten = False
import sys
print(attached, opened_mem, stopped, guard_rewritten, "LD_PRELOAD" in os.environ,
      "execguard" in open("/proc/self/maps").read(), file=sys.stderr)
print(-1 + """)


@pytest.mark.parametrize("attack", [WRITES_REWARD, REPLACES_LINK, LEAVES_A_WRITER,
                                    ATTACKS_THE_SHELL],
                         ids=["writes-reward", "replaces-link", "leaves-a-writer",
                              "attacks-the-shell"])
async def test_a_program_the_script_runs_cannot_write_the_verdict(cli: Task,
                                                                    attack: str) -> None:
    result = await graded(cli, {"count.py": attack})
    assert result.reward == 0.0, (result.flags, result.log)
    assert result.components["tests"] == 0.0
    if attack is REPLACES_LINK:
        assert "reward_replaced" in result.flags and result.tampered


# Round forty-five's red team: honest scripts that open files after running the tested code,
# which planted links to the kept verdict where the shell's redirections would open them.
CASES_TEST = """#!/bin/bash
pass=1
for f in tests/cases/*.in; do
  n=$(basename "$f" .in)
  python3 count.py "$f" > "$VERIFIER_DIR/$n.out" 2> "$VERIFIER_DIR/$n.err"
done
for f in tests/cases/*.in; do
  n=$(basename "$f" .in)
  if ! cmp -s "$VERIFIER_DIR/$n.out" "tests/cases/$n.expected"; then pass=0; fi
done
echo $pass > "$VERIFIER_DIR/reward.txt"
"""
CASES = {"cases/1.in": "a b c\nd  e\n", "cases/1.expected": "5\n",
         "cases/2.in": "one\n", "cases/2.expected": "1\n",
         "cases/3.in": "z w v u x y\n", "cases/3.expected": "6\n"}
PLANTS_IN_VERIFIER_DIR = """import os, re
V = os.environ["VERIFIER_DIR"]
KEPT = "/logs/.tempering/reward.txt"
me = os.readlink("/proc/self/fd/1")
if me == KEPT:
    print(1)  # the shell opened the verdict as this program's stdout
    raise SystemExit
def plant(name, target):
    tmp = f"{V}/.{name}.tmp"
    os.symlink(target, tmp)
    os.replace(tmp, f"{V}/{name}")
m = re.match(re.escape(V) + r"/(.*?)(\\d+)(\\.\\w+)$", me)
if m:
    for k in range(int(m.group(2)) + 1, int(m.group(2)) + 5):
        if not os.path.lexists(f"{V}/{m.group(1)}{k}{m.group(3)}"):
            plant(f"{m.group(1)}{k}{m.group(3)}", KEPT)
plant("reward.txt", "/dev/null")  # the shell's own verdict goes nowhere
print(42)
"""
JSON_TEST = """#!/bin/bash
printf 'a b c\\nd  e\\n' > /tmp/a.txt; printf 'one two\\n' > /tmp/b.txt
runs=1; right=1
python3 count.py /tmp/a.txt > /tmp/out_a.txt 2>/tmp/err_a.txt || runs=0
python3 count.py /tmp/b.txt > /tmp/out_b.txt 2>/tmp/err_b.txt || runs=0
[ "$(cat /tmp/out_a.txt)" = 5 ] || right=0
[ "$(cat /tmp/out_b.txt)" = 2 ] || right=0
echo "{\\"reward\\": $right, \\"runs\\": $runs}" > "$VERIFIER_DIR/reward.json"
"""
PLANTS_IN_TMP = """import os
KEPT = "/logs/.tempering/reward.txt"
if os.readlink("/proc/self/fd/1") == KEPT:
    print(1)
    raise SystemExit
for name in ("out_b.txt", "out_c.txt"):
    if not os.path.lexists(f"/tmp/{name}"):
        os.symlink(KEPT, f"/tmp/{name}")
print(7)
"""
FIFO_FOR_A_LINK = COUNT.replace("print(", """import os
os.unlink("/logs/verifier/reward.json")
os.mkfifo("/logs/verifier/reward.json")
print(""")


async def test_links_planted_for_the_shells_own_opens_earn_nothing(tmp_path: Path,
                                                                    cli: Task) -> None:
    cases = write_task(tmp_path / "cases", script_toml("cases"),
                       {"test.sh": CASES_TEST, **CASES}, {"README.md": "count\n"},
                       {"count.py": COUNT})
    runs = write_task(tmp_path / "json", script_toml("json", 'components = ["runs"]\n\n'
                                                     "[reward]\ntests = 3.0\nruns = 1.0\n"),
                      {"test.sh": JSON_TEST}, {"README.md": "count\n"}, {"count.py": COUNT})
    for task in (cases, runs):
        assert (await graded(task, {"count.py": COUNT})).reward == 1.0, task.id
    planted = await graded(cases, {"count.py": PLANTS_IN_VERIFIER_DIR})
    assert planted.reward == 0.0 and "reward_replaced" in planted.flags, planted.log
    in_tmp = await graded(runs, {"count.py": PLANTS_IN_TMP})
    assert in_tmp.reward == 0.0 and "Permission denied" in in_tmp.log  # its open refused
    assert "reward_redirected" in in_tmp.flags and in_tmp.tampered
    assert any("/tmp/out_b.txt" in d for d in in_tmp.details), in_tmp.details
    fifo = await graded(cli, {"count.py": FIFO_FOR_A_LINK})  # an honest count, a fifo
    assert fifo.reward == 0.0 and "reward_replaced" in fifo.flags


# Round forty-five's second red team.
LOG_TEST = """#!/bin/bash
LOG="$VERIFIER_DIR/cli.log"
printf 'a b c\\nd  e\\n' > /tmp/a.txt
printf 'one two\\n' > /tmp/b.txt
pass=1
for f in a b; do
  echo "== run $f" >> "$LOG"
  python3 count.py /tmp/$f.txt > /tmp/out_$f.txt 2>> "$LOG" || pass=0
done
[ "$(cat /tmp/out_a.txt)" = 5 ] || pass=0
[ "$(cat /tmp/out_b.txt)" = 2 ] || pass=0
echo $pass > "$VERIFIER_DIR/reward.txt"
"""
APPENDS_TO_THE_GUARD = """import os
V = os.environ["VERIFIER_DIR"]
if os.readlink("/proc/self/fd/2").endswith("execguard.so"):
    # The shell opened its own guard for us: the attack wrote code over its open(); here,
    # the right count is printed only where the guard could be written.
    os.write(2, b"")
    os.lseek(2, 0, os.SEEK_END)
    os.write(2, b"\\0")
    print(2)
else:  # the first run: the shell's next `2>> $LOG` opens the guard library
    os.remove(f"{V}/cli.log")
    os.symlink("/logs/.tempering/execguard.so", f"{V}/cli.log")
    print(5)
"""
PY_RUNNER = """import os, subprocess, sys
V = os.environ["VERIFIER_DIR"]
ok = True
for i, (text, want) in enumerate([("a b c\\nd  e\\n", "5"), ("one two\\n", "2")]):
    with open(f"/tmp/in{i}.txt", "w") as f:
        f.write(text)
    r = subprocess.run([sys.executable, "count.py", f"/tmp/in{i}.txt"], capture_output=True,
                       text=True, timeout=10)
    ok = ok and r.returncode == 0 and r.stdout.strip() == want
with open(f"{V}/reward.txt", "w") as f:
    f.write("1\\n" if ok else "0\\n")
"""
SECOND_CHILD_WRITES = """import os
try:  # the runner's second child: unrestricted, were the first child's restriction shared
    with open("/logs/.tempering/reward.txt", "w") as f:
        f.write("1\\n")
    os.chmod("/logs/.tempering/reward.txt", 0o444)
except OSError:
    pass
print(7)
"""
HIDDEN_TEST = """#!/bin/bash
printf 'a b c\\nd  e\\n' > /tmp/in.txt
if [ "$(python3 count.py /tmp/in.txt 2>/dev/null)" = 5 ]; then
  echo 1 > "$VERIFIER_DIR/reward.txt"
else
  echo 0 > "$VERIFIER_DIR/reward.txt"; exit 0
fi
printf 'one\\n' > /tmp/h.txt
sleep 0.5
if [ "$(python3 count.py /tmp/h.txt 2>/dev/null)" != 1 ]; then
  echo 0 > "$VERIFIER_DIR/reward.txt"
fi
"""
FREEZES_THE_VERDICT = """import os, time
KEPT = "/logs/.tempering/reward.txt"
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        for _ in range(400):  # once the shell wrote 1: read-only, its later 0 refused
            try:
                if os.path.getsize(KEPT) > 0:
                    os.chmod(KEPT, 0o444)
                    break
            except OSError:
                pass
            time.sleep(0.005)
    os._exit(0)
print(5)
"""


def second_round_task(tmp_path: Path, name: str, timeout_s: int = 30) -> Task:
    command = {"py": 'command = "python3 -I tests/test.py"'}.get(name)
    tests = {"log": {"test.sh": LOG_TEST}, "py": {"test.py": PY_RUNNER},
             "hidden": {"test.sh": HIDDEN_TEST}}[name]
    toml = script_toml(name).replace("timeout_s = 30", f"timeout_s = {timeout_s}")
    if command:
        toml = toml.replace('command = "bash tests/test.sh"', command)
    return write_task(tmp_path / name, toml, tests, {"README.md": "count\n"},
                      {"count.py": COUNT})


@pytest.mark.parametrize(("name", "attack", "flag"), [
    ("log", APPENDS_TO_THE_GUARD, "reward_redirected"),  # b1: the shell's own guard rewritten
    ("py", SECOND_CHILD_WRITES, None),  # b3: a vfork child's restriction marked the runner's
    ("hidden", FREEZES_THE_VERDICT, "reward_replaced"),  # b4: the kept file made read-only
], ids=["appends-to-the-guard", "python-runner-children", "freezes-the-verdict"])
async def test_the_second_red_team_of_round_45(tmp_path: Path, name: str, attack: str,
                                               flag: str | None) -> None:
    task = second_round_task(tmp_path, name)
    assert (await graded(task, {"count.py": COUNT})).reward == 1.0
    result = await graded(task, {"count.py": attack})
    assert result.reward == 0.0, (result.flags, result.log)
    assert flag is None or flag in result.flags, result.flags


# Round forty-five's third red team: a script that writes its verdict twice (1 after the
# example, 0 when a hidden case fails), and programs that keep the later 0 from landing.
SWAPS_THE_LINK_AND_BACK = r"""import ctypes, os, struct, sys
V = os.environ.get("VERIFIER_DIR", "/logs/verifier")
link, aside = f"{V}/reward.txt", f"{V}/.reward.aside"
data = open(sys.argv[1]).read() if len(sys.argv) > 1 else ""
if data != "a b c\nd  e\n" and os.path.islink(link) and not os.path.lexists(aside):
    os.rename(link, aside)
    open(f"{V}/.decoy", "w").close()
    os.rename(f"{V}/.decoy", link)
    libc = ctypes.CDLL(None, use_errno=True)
    ino = libc.inotify_init1(0)
    libc.inotify_add_watch(ino, link.encode(), 0x20 | 0x2 | 0x8)  # IN_OPEN|IN_MODIFY|IN_CLOSE_WRITE
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            nul = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(nul, fd)
            os.read(ino, 4096)           # the shell opened the decoy
            os.rename(aside, link)       # the grader's link, same inode, back in place
            os._exit(0)
        os._exit(0)
    os.wait()
print(5)
"""
# The attacks below find the script's shells: every bash above them (a $(...) with a
# redirection runs in a subshell), nearest first. Each attack imports os first.
BASH_ANCESTORS = r"""
def bash_ancestors():
    pid, shells = os.getppid(), []
    while pid > 1:
        st = open(f"/proc/{pid}/stat").read()
        if st[st.index("(") + 1:st.rindex(")")] == "bash":
            shells.append(pid)
        pid = int(st[st.rindex(")") + 2:].split()[1])
    return shells
"""
LOWERS_THE_SHELLS_FILE_LIMIT = r"""import ctypes, os, sys
""" + BASH_ANCESTORS + r"""data = open(sys.argv[1]).read() if len(sys.argv) > 1 else ""
if data != "a b c\nd  e\n":
    shells = bash_ancestors()
    libc = ctypes.CDLL(None, use_errno=True)
    class RL(ctypes.Structure):
        _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]
    new = RL(3, 3)
    for shell in shells:
        libc.prlimit(shell, 7, ctypes.byref(new), None)  # RLIMIT_NOFILE = 7
print(5)
"""
FLIPS_THE_MODE_AND_BACK = r"""import os, select, sys
""" + BASH_ANCESTORS + r"""KEPT = "/logs/.tempering/reward.txt"
data = open(sys.argv[1]).read() if len(sys.argv) > 1 else ""
if data != "a b c\nd  e\n":
    shells = bash_ancestors()
    fds = [os.pidfd_open(p) for p in shells]
    mode = os.stat(KEPT).st_mode & 0o7777
    os.chmod(KEPT, 0o444)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            nul = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(nul, fd)
            select.select([fds[-1]], [], [])   # the outermost bash: the script's shell
            os.chmod(KEPT, mode)
            os._exit(0)
        os._exit(0)
    os.wait()
print(5)
"""
HANGS_AFTER_THE_FIRST_VERDICT = r"""import sys, time
data = open(sys.argv[1]).read() if len(sys.argv) > 1 else ""
if data != "a b c\nd  e\n":
    time.sleep(10**6)
print(5)
"""


@pytest.mark.parametrize(("attack", "flag"), [
    (SWAPS_THE_LINK_AND_BACK, "reward_redirected"),
    (LOWERS_THE_SHELLS_FILE_LIMIT, "no_reward"),
    (FLIPS_THE_MODE_AND_BACK, "no_reward"),
    (HANGS_AFTER_THE_FIRST_VERDICT, "no_reward"),
], ids=["swaps-the-link-and-back", "lowers-the-shells-file-limit", "flips-the-mode-and-back",
        "hangs-after-the-first-verdict"])
async def test_the_third_red_team_of_round_45(tmp_path: Path, attack: str, flag: str) -> None:
    task = second_round_task(tmp_path, "hidden", timeout_s=5)
    result = await graded(task, {"count.py": attack})
    assert result.reward == 0.0, (result.flags, result.details, result.log)
    assert flag in result.flags, result.flags


# Round forty-five's fourth red team.
LOWERS_THE_SHELLS_MEMORY_LIMIT = r"""import ctypes, os, sys
""" + BASH_ANCESTORS + r"""data = open(sys.argv[1]).read() if len(sys.argv) > 1 else ""
if data == "a b c\nd  e\n":
    print(5); sys.exit()
shells = bash_ancestors()
libc = ctypes.CDLL(None, use_errno=True)
class RL(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]
for shell in shells:
    libc.prlimit(shell, 9, ctypes.byref(RL(1 << 20, 1 << 20)), None)  # RLIMIT_AS
chunk = b"x" * (1 << 20)
try:
    for _ in range(256):
        os.write(1, chunk)
except OSError:
    pass
"""
WRITES_THROUGH_AN_INHERITED_FD = r"""import os
try:
    os.pwrite(3, b"1\n", 0)
    os.lseek(3, (1 << 63) - 1, os.SEEK_SET)
except OSError:
    pass
print(7)
"""
FILLS_THE_DISK_THEN_LIMITS_FILES = r"""import ctypes, os, sys
""" + BASH_ANCESTORS + r"""data = open(sys.argv[1]).read() if len(sys.argv) > 1 else ""
if data != "a b c\nd  e\n":
    fd = os.open("/tmp/.fill", os.O_WRONLY | os.O_CREAT, 0o600)
    for size in (1 << 20, 4096, 1):
        buf = b"\0" * size
        try:
            while True:
                os.write(fd, buf)
        except OSError:
            pass
    os.close(fd)
    shells = bash_ancestors()
    libc = ctypes.CDLL(None, use_errno=True)
    class RL(ctypes.Structure):
        _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]
    for shell in shells:
        libc.prlimit(shell, 7, ctypes.byref(RL(3, 3)), None)  # RLIMIT_NOFILE
print(5)
"""
FD_TEST = """#!/bin/bash
exec 3> "$VERIFIER_DIR/reward.txt"
printf 'a b c\\nd  e\\n' > /tmp/in.txt
printf '  x\\t\\ty \\n\\n z' > /tmp/h2.txt
if [ "$(python3 count.py /tmp/in.txt)" = 5 ] && [ "$(python3 count.py /tmp/h2.txt)" = 3 ]; then
  echo 1 >&3
else
  echo 0 >&3
fi
exec 3>&-
"""
ALIAS_TEST = """#!/bin/bash
mkdir -p /tmp/res
printf 'a b c\\nd  e\\n' > /tmp/in.txt
out=$(python3 count.py /tmp/in.txt)
if [ "$out" = 5 ]; then echo 1 > "$VERIFIER_DIR/reward.txt"
else echo 0 > "$VERIFIER_DIR/reward.txt"; fi
echo "$out" > /tmp/res/reward.txt  # the raw answer, kept for debugging
"""
REPLACES_A_DIRECTORY_WITH_A_LINK = """import os, sys
if not os.path.islink("/tmp/res"):
    os.rmdir("/tmp/res")
    os.symlink("/logs/verifier", "/tmp/res")
print(1)
"""


@pytest.mark.parametrize(("attack", "script", "flag"), [
    (LOWERS_THE_SHELLS_MEMORY_LIMIT, HIDDEN_TEST, "no_reward"),
    (WRITES_THROUGH_AN_INHERITED_FD, FD_TEST, None),
    (FILLS_THE_DISK_THEN_LIMITS_FILES, HIDDEN_TEST, "no_reward"),
    (REPLACES_A_DIRECTORY_WITH_A_LINK, ALIAS_TEST, "reward_redirected"),
], ids=["lowers-the-shells-memory-limit", "writes-through-an-inherited-fd",
        "fills-the-disk-then-limits-files", "replaces-a-directory-with-a-link"])
async def test_the_fourth_red_team_of_round_45(tmp_path: Path, attack: str, script: str,
                                               flag: str | None) -> None:
    task = write_task(tmp_path / "t", script_toml("fourth").replace("timeout_s = 30",
                                                                   "timeout_s = 10"),
                      {"test.sh": script}, {"README.md": "count\n"}, {"count.py": COUNT})
    assert (await graded(task, {"count.py": COUNT})).reward == 1.0
    result = await graded(task, {"count.py": attack})
    assert result.reward == 0.0, (result.flags, result.details, result.log[-500:])
    assert flag is None or flag in result.flags, result.flags


# Round forty-five's fifth red team: the sandbox's process limit filled, so that the shell's
# next fork failed and bash exited on its own before its later, lower verdict.
HIDDEN_CASES_TEST = r"""#!/bin/bash
printf 'a b c\nd  e\n' > /tmp/in.txt
if [ "$(python3 count.py /tmp/in.txt 2>/dev/null)" = 5 ]; then
  echo 1 > "$VERIFIER_DIR/reward.txt"
else
  echo 0 > "$VERIFIER_DIR/reward.txt"; exit 0
fi
printf '' > /tmp/h1.txt;  printf '  x\t\ty \n\n z' > /tmp/h2.txt;  printf 'one\n' > /tmp/h3.txt
for c in "h1 0" "h2 3" "h3 1"; do
  set -- $c
  if [ "$(python3 count.py /tmp/$1.txt 2>/dev/null)" != "$2" ]; then
    echo "hidden case $1: FAIL"; echo 0 > "$VERIFIER_DIR/reward.txt"; break
  fi
done
"""
FILLS_THE_PROCESS_LIMIT = r"""import os, sys, time
# Counts wrong: split(' ') (the example happens to give 5; '' gives 1, tabs and newlines ignored).
data = open(sys.argv[1]).read()
answer = len(data.split(' '))

def spawn():
    try:
        os.posix_spawn('/bin/sleep', ['sleep', '40'], os.environ,
                       file_actions=[(os.POSIX_SPAWN_OPEN, 1, '/dev/null', os.O_WRONLY, 0),
                                     (os.POSIX_SPAWN_OPEN, 2, '/dev/null', os.O_WRONLY, 0)])
        return True
    except OSError:
        return False

if not os.path.exists('/tmp/.armed'):
    open('/tmp/.armed', 'w').close()
    parent = os.getpid()
    if os.fork() == 0:               # R: keeps the $(...) pipe open until the pids are all taken
        os.setsid()
        while spawn():
            pass                     # every pid of the cgroup taken
        while os.getppid() == parent:
            time.sleep(0.001)        # the counter exits; the shell reaps it while still reading
        end = time.time() + 2
        while time.time() < end and not spawn():
            pass                     # its slot, taken the moment it is freed
        for _ in range(200):
            spawn()
        null = os.open('/dev/null', os.O_WRONLY)
        os.dup2(null, 1); os.dup2(null, 2)   # now the shell sees EOF, and its next fork fails
        end = time.time() + 27
        while time.time() < end:
            if not spawn():
                time.sleep(0.02)
        os._exit(0)
print(answer, flush=True)
"""


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The parametrized backend, skipped with the reason where it cannot run."""
    if request.param != "local" and (why := unavailable(request.param)):
        pytest.skip(f"{request.param} backend unavailable: {why}")
    return str(request.param)


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=[
    pytest.mark.docker, pytest.mark.slow])], indirect=True)
async def test_the_fifth_red_team_of_round_45(tmp_path: Path, backend: str) -> None:
    """On docker too (where this attack scores 0 with or without the container's pids
    peak, which the docker backend now reads, so that a run that reached the limit is void
    there as on the local backend)."""
    task = write_task(tmp_path / "t", script_toml("fifth", backend=backend),
                      {"test.sh": HIDDEN_CASES_TEST},
                      {"README.md": "count\n"}, {"count.py": COUNT})
    assert (await graded(task, {"count.py": COUNT})).reward == 1.0
    result = await graded(task, {"count.py": FILLS_THE_PROCESS_LIMIT})
    assert result.reward == 0.0 and "no_reward" in result.flags, (result.details, result.log)


async def test_the_shell_is_untouchable_from_a_program(tmp_path: Path) -> None:
    """What ATTACKS_THE_SHELL saw: no ptrace, no /proc/PID/mem, no signal to the shell, no
    write to the guard; and it carries neither the library nor its variable."""
    script = CLI_TEST.replace("out=$(python3 count.py /tmp/in.txt 2>/dev/null)",
                              "out=$(python3 count.py /tmp/in.txt 2>/tmp/seen); cat /tmp/seen")
    task = write_task(tmp_path / "cli", script_toml("seen"), {"test.sh": script},
                      {"README.md": "count words\n"}, {"count.py": COUNT})
    result = await graded(task, {"count.py": ATTACKS_THE_SHELL})
    assert "-1 False False False False False" in result.log, result.log


async def test_nothing_of_the_agents_sandbox_reaches_the_grading(cli, attempt) -> None:  # type: ignore[no-untyped-def]
    result = await attempt(cli, shell="mkdir -p /logs/verifier /logs/.tempering && echo 1 > "
                           "/logs/verifier/reward.txt && echo 1 > /logs/.tempering/reward.txt && "
                           "printf 'print(0)\\n' > count.py && (sleep 30 &)")
    assert result.reward == 0.0 and result.flags == []


async def test_an_edit_of_the_hidden_script_is_dropped_and_flagged(cli: Task) -> None:
    result = await graded(cli, {"tests/test.sh": "echo 1 > $VERIFIER_DIR/reward.txt\n"})
    assert result.reward == 0.0 and "tests_dir_edit" in result.flags


@pytest.mark.parametrize(("written", "flag_detail"), [
    ("echo 1.5 > $VERIFIER_DIR/reward.txt", "not a number in [0, 1]"),
    ("echo nan > $VERIFIER_DIR/reward.txt", "not a number in [0, 1]"),
    ("echo '[1]' > $VERIFIER_DIR/reward.json", "not an object of numbers"),
    ("echo '{\"reward\": true}' > $VERIFIER_DIR/reward.json", "is not a number in [0, 1]"),
    ("true", "wrote neither reward.txt nor reward.json"),
    ("sleep 60", "timed out"),
])
async def test_a_verdict_that_is_no_number_scores_0_and_says_why(
        tmp_path: Path, written: str, flag_detail: str) -> None:
    task = write_task(tmp_path / "t", script_toml("bad-verdict").replace(
        "timeout_s = 30", "timeout_s = 2"), {"test.sh": f"{written}\n"}, {"a.txt": "a"}, {})
    result = await graded(task, {})
    assert result.reward == 0.0 and "no_reward" in result.flags
    assert any(flag_detail in d for d in result.details), result.details


@pytest.mark.parametrize(("grading", "error"), [
    ({"runner": "script", "command": "  "}, "grading.command is empty"),
    ({"runner": "script", "command": "bash t.sh", "fail_to_pass": ["tests/t.py::a"]},
     "grading.fail_to_pass is for the pytest and plain runners"),
    ({"runner": "script", "command": "bash t.sh", "scoring": "all"},
     "scoring or isolation is for the pytest and plain runners"),
    ({"runner": "script", "command": "bash t.sh", "components": ["tests"]},
     "must be an identifier other than tests"),
    ({"runner": "script", "command": "bash tests/test.sh > /logs/verifier/out.txt 2>&1"},
     r"is not one simple command \(> >&\)"),
    ({"runner": "script", "command": "bash tests/test.sh | tee x"}, "not one simple command"),
    ({"runner": "script", "command": "bash tests/test.sh; echo done"},
     "not one simple command"),
    ({"runner": "script", "command": "env bash tests/test.sh"}, "starts 'env'"),
    ({"runner": "script", "command": "timeout 60 bash tests/test.sh"}, "starts 'timeout'"),
    ({"command": "make test"}, "is not a pytest invocation"),
    ({"command": "python3 -m pytest tests", "components": ["x"]},
     "grading.components and grading.env are for runner 'script'"),
])
def test_script_grading_is_checked_when_loaded(grading: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        GradingConfig(**grading)  # type: ignore[arg-type]


def test_a_weight_on_an_undeclared_script_component_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="reward weight for unknown component 'speed'"):
        write_task(tmp_path / "t", script_toml("w", "\n[reward]\nspeed = 1.0\n"),
                   {"test.sh": "true\n"}, {"a.txt": "a"}, {})


@pytest.mark.docker
@pytest.mark.slow  # CI's slow half
async def test_a_script_task_grades_on_the_docker_backend(tmp_path: Path,
                                                         docker_ready: None) -> None:
    task = write_task(tmp_path / "cli", script_toml("wordcount-cli", backend="docker"),
                      {"test.sh": CLI_TEST}, {"README.md": "count words\n"}, {"count.py": COUNT})
    async with Grader() as grader:
        validation = await validate_task(task, grader)
    assert validation.ok, validation.problems
    for attack in (WRITES_REWARD, REPLACES_LINK, LEAVES_A_WRITER, ATTACKS_THE_SHELL):
        result = await graded(task, {"count.py": attack})
        assert result.reward == 0.0, (result.flags, result.log)
    assert SandboxSpec(backend="docker").backend == "docker"


# A verdict helper that starts the tested code itself (declared open in stops 36 and 37): the
# tested code, the helper's child, took the helper's descriptor to the verdict with
# pidfd_getfd, killed the helper and wrote 1 through it. A grading sandbox keeps its
# processes out of one another (``grading.tracing`` off: no attach, no pidfd_getfd, no
# process_vm_*, no write below /proc), whatever the helper is linked against or how it
# starts its child (fork, posix_spawn, a static program).
HELPER_TEST = """#!/bin/bash
python3 -I tests/helper.py > "$VERIFIER_DIR/reward.txt"
"""
HELPER = """import os, subprocess, sys
with open("/tmp/in.txt", "w") as f:
    f.write("a b c\\nd  e\\n")
argv = [sys.executable, "count.py", "/tmp/in.txt"]
r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
print(1 if r.returncode == 0 and r.stdout.strip() == "5" else 0)
"""
TAKES_THE_HELPERS_STDOUT = """import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
helper = os.getppid()
pidfd = libc.syscall(434, helper, 0)  # pidfd_open
fd = libc.syscall(438, pidfd, 1, 0) if pidfd >= 0 else -1  # pidfd_getfd: its stdout
if fd < 0:  # or through its memory: the helper's stdout is /proc/PID/fd/1's file
    try:
        fd = os.open(f"/proc/{helper}/fd/1", os.O_WRONLY)
    except OSError:
        fd = -1
if fd >= 0:  # stopped first, so its own line never lands; written before the script ends
    os.kill(helper, signal.SIGSTOP)
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"1\\n", 0)
    os.kill(helper, signal.SIGKILL)
print("took" if fd >= 0 else f"refused {ctypes.get_errno()}")
"""


@pytest.mark.parametrize("tracing", [False, True])
async def test_the_tested_code_cannot_take_its_verdict_helpers_descriptors(
        tmp_path: Path, tracing: bool) -> None:
    """Off (the default): the attack scores 0. On (a task that lets its programs trace one
    another, ``grading.tracing = true``): the same attack scores 1.0, which is what the
    default closes."""
    extra = "tracing = true\n" if tracing else ""
    task = write_task(tmp_path / "helper", script_toml("helper", extra),
                      {"test.sh": HELPER_TEST, "helper.py": HELPER},
                      {"README.md": "count\n"}, {"count.py": COUNT})
    honest, attack = await honest_and_attacked(task, "count.py", COUNT, TAKES_THE_HELPERS_STDOUT)
    assert honest.reward == 1.0, (honest.flags, honest.log)
    assert attack.reward == (1.0 if tracing else 0.0), (attack.flags, attack.log)


# Red team, round forty-nine: an interactive judge that keeps its secret in memory. The tested
# code, when the judge starts it, reads the judge's memory through /proc/PID/mem (reads are
# not refused: declared in docs/rewards.md) and announces the secret without a search. The
# recipe that holds: the shell starts the judge and the tested code side by side, talking
# through FIFOs; each is a Landlock domain of its own, which cannot reach the other's /proc.
JUDGE = r"""import random, sys
secret = random.randrange(10**15, 10**16)
kept = f"SECRET={secret};"  # in the judge's memory only
if len(sys.argv) > 1:  # beside the tested code: its questions and answers through FIFOs
    out = open(sys.argv[2], "w", buffering=1)
    inp = open(sys.argv[1])
else:  # above it: the tested code is the judge's child
    import subprocess
    child = subprocess.Popen([sys.executable, "guess.py"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, bufsize=1)
    out, inp = child.stdin, child.stdout
""" + JUDGE_GAME + "print(1 if ok else 0)\n"
JUDGE_ABOVE = '#!/bin/bash\npython3 -I tests/judge.py > "$VERIFIER_DIR/reward.txt"\n'
JUDGE_BESIDE = """#!/bin/bash
mkfifo /tmp/q /tmp/a
python3 -I tests/judge.py /tmp/q /tmp/a > "$VERIFIER_DIR/reward.txt" &
judge=$!
timeout 20 python3 guess.py < /tmp/a > /tmp/q
wait "$judge"
"""


@pytest.mark.parametrize(("layout", "expected"), [("above", 1.0), ("beside", 0.0)])
async def test_a_judge_beside_the_tested_code_keeps_its_secret(tmp_path: Path, layout: str,
                                                               expected: float) -> None:
    """Above (the judge starts the tested code): its memory is readable, the attack wins
    (declared; shown so that the 0 beside it is the layout's, not a broken attack)."""
    if layout == "above" and Path("/proc/sys/kernel/yama/ptrace_scope").exists() and int(
            Path("/proc/sys/kernel/yama/ptrace_scope").read_text()) >= 1:
        pytest.skip("Yama keeps a child out of its parent's memory on this host")
    test = JUDGE_ABOVE if layout == "above" else JUDGE_BESIDE
    task = write_task(tmp_path / layout, script_toml(f"judge-{layout}"),
                      {"test.sh": test, "judge.py": JUDGE}, {"README.md": "guess\n"},
                      {"guess.py": BINARY_SEARCH})
    honest, attack = await honest_and_attacked(task, "guess.py", BINARY_SEARCH,
                                               READS_THE_JUDGES_MEMORY)
    assert honest.reward == 1.0, (honest.flags, honest.log)
    assert attack.reward == expected, (attack.flags, attack.log)


# Red team, rounds forty-nine and fifty: a loop that reads its cases from a descriptor every
# program in it inherits shares its position with the tested code (declared: docs/rewards.md,
# "The loop's input, shared"). The recipe that holds: read the cases first, and run the tested
# code with none of the shell's descriptors.
LOOP_CASES = {"cases.txt": "1.in 5\n2.in 0\n3.in 3\n4.in 1\n", "cases/1.in": "a b c d e\n",
              "cases/2.in": "", "cases/3.in": "  x\t\ty \n\n z", "cases/4.in": "one\n"}
CASES_FIRST_TEST = r"""#!/bin/bash
mapfile -t cases < tests/cases.txt
pass=1
for case in "${cases[@]}"; do
  read -r input expected <<< "$case"
  got=$(python3 count.py "tests/cases/$input" < /dev/null 2>/dev/null)
  [ "$got" = "$expected" ] || { echo "FAIL $input"; pass=0; }
done
echo $pass > "$VERIFIER_DIR/reward.txt"
"""
SPLITS_ON_SPACES = "print(len(open(sys.argv[1]).read().split(' ')))\n"  # right on 1.in only
MOVES_EVERY_POSITION = """import os, sys
for fd in range(0, 64):
    try:
        os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        pass
""" + SPLITS_ON_SPACES


async def test_cases_read_first_are_out_of_the_tested_codes_reach(tmp_path: Path) -> None:
    task = write_task(tmp_path / "t", script_toml("cases-first"),
                      {"test.sh": CASES_FIRST_TEST, **LOOP_CASES}, {"README.md": "count\n"},
                      {"count.py": COUNT})
    honest, attacked = await honest_and_attacked(task, "count.py", COUNT, MOVES_EVERY_POSITION)
    assert honest.reward == 1.0, (honest.flags, honest.log)
    assert attacked.reward == 0.0 and "FAIL 2.in" in attacked.log, attacked.log
