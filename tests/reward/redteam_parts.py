"""Pieces the red teams' attacks share (spliced into their sources), and the task directories
of their own that later rounds wrote, in the layout of examples/tasks/median."""

from pathlib import Path

from attempts import attempt as _attempt
from conftest import isolated
from tempering.reward import Grader, RewardResult
from tempering.tasks import Task, load_task

MEDIAN_SOLUTION = '''def median(values):
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        raise ValueError("empty")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
'''

# What the red teams' oracles share: the mutant canary told from the hidden test it is made from
# by its file name beside that file's (``test_x_word.py`` beside ``test_x.py``), a declared gap
# (docs/rewards.md), so that an attack which reads the expected values fails the canary on
# purpose. Spliced into the attacks' sources (which import ``os``).
CANARY_BY_NAME = '''def _canary(filename):
    folder, base = os.path.split(filename)
    stem = base[:-3]
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any(n.endswith(".py") and n[:-3] != stem and stem.startswith(n[:-3] + "_")
               for n in names)
'''


def task_dir(root: Path, name: str, files: dict[str, str], *, more_toml: str = "",
             **grading: str) -> Task:
    """A task directory at ``root``, loaded: ``files`` by path below it (``workspace/m.py``,
    ``tests/test_m.py``, ``solution/m.py``, ``verifiers/...``), its ``[grading]`` the pytest
    command with a 60 s timeout and ``grading`` (``runner``, ``isolation``), then
    ``more_toml`` (other sections)."""
    lines = [f'{key} = "{value}"\n' for key, value in grading.items()]
    (root / "task.toml").parent.mkdir(parents=True, exist_ok=True)
    (root / "task.toml").write_text(
        f'[task]\nid = "{name}"\ndescription = "the red team\'s {name}"\n\n'
        '[grading]\ncommand = "python3 -m pytest tests"\ntimeout_s = 60\n'
        f'{"".join(lines)}{more_toml}')
    (root / "instruction.md").write_text(f"Make the tests of {name} pass.\n")
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return load_task(root)


def write_task(root: Path, name: str, spec: dict[str, str], runner: str,
               isolation: str = "shared") -> Task:
    """A task directory at ``root`` from ``spec`` (its module's name, the test file's name
    and text, the solution and the stub), graded by ``runner`` with ``isolation``; loaded."""
    module = spec["module"]
    return task_dir(root, name, {f"workspace/{module}.py": spec["stub"],
                                 f"solution/{module}.py": spec["solution"],
                                 f"tests/{spec['test_name']}": spec["tests"]},
                    runner=runner, isolation=isolation)


def show(label: str, result: RewardResult) -> None:
    """What a red team's test prints of a grading (``-s``)."""
    print(f"\n[{label}] reward={result.reward} flags={result.flags}")
    for t in result.tests:
        print(f"   {t.outcome:8} {t.id} {t.message[-300:]!r}" if t.outcome != "passed"
              else f"   {t.outcome:8} {t.id}")
    for d in result.details[:6]:
        print("   detail:", d[:300])


def spec_task(root: Path, runner: str, isolation: str, module: str, tests: str,
              solution: str, stub: str | None = None, test_name: str | None = None) -> Task:
    """A task of one module and one test file (``write_task``) under ``runner`` and
    ``isolation``, in a directory of its own below ``root``."""
    return isolated(write_task(root / f"{runner}-{isolation}", module, {
        "module": module, "test_name": test_name or f"test_{module}.py", "tests": tests,
        "solution": solution, "stub": stub or "def _():\n    pass\n"}, runner), isolation)


_HONEST_CHECKED: set[tuple[str, str, str, str]] = set()


async def attack_case(root: Path, runner: str, isolation: str, module: str, tests: str,
                      solution: str, attack: str, stub: str | None = None,
                      test_name: str | None = None, check_honest: bool = True
                      ) -> RewardResult:
    """``attack`` as the module of a ``spec_task``, graded; with ``check_honest``, the
    solution is graded too and must keep its full reward (once per suite, solution, runner
    and isolation: attacks on the same suite share it)."""
    task = spec_task(root, runner, isolation, module, tests, solution, stub, test_name)
    result = await _attempt(task, {f"{module}.py": attack})
    show(f"attack {runner}/{isolation}", result)
    key = (tests, solution, runner, isolation)
    if check_honest and key not in _HONEST_CHECKED:
        _HONEST_CHECKED.add(key)
        honest = await _attempt(task, {f"{module}.py": solution})
        show(f"honest {runner}/{isolation}", honest)
        assert honest.reward == 1.0 and not honest.flags, (honest.flags, honest.details[:3])
    return result


async def honest_then(task: Task, honest: dict[str, str], attack: dict[str, str],
                      grader: Grader | None = None) -> RewardResult:
    """``honest`` (the agent's files) graded on ``task`` must keep its full reward with no
    flag; then ``attack``'s grade, for the test to judge."""
    result = await _attempt(task, honest, grader=grader)
    assert result.reward == 1.0 and not result.flags, (result.flags, result.details[:3])
    return await _attempt(task, attack, grader=grader)


def humaneval_task(task_id: str, isolation: str = "data") -> Task:
    """One HumanEval problem's task (``HumanEval/32``) under ``isolation``."""
    from tempering.tasks.humaneval import load_humaneval

    return isolated(next(t for t in load_humaneval() if t.id == task_id), isolation)


# An interactive judge's game (tests/reward/test_script_runner.py, test_redteam_round51.py): the
# judge says the range, answers "?" questions with <, > or =, and takes "!" as the guess.
BINARY_SEARCH = """import sys
lo, hi = (int(x) - i for i, x in enumerate(sys.stdin.readline().split()))
while True:
    mid = (lo + hi) // 2
    print("?", mid, flush=True)
    r = sys.stdin.readline().strip()
    if r == "=":
        print("!", mid, flush=True)
        break
    lo, hi = (lo, mid - 1) if r == "<" else (mid + 1, hi)
"""
# The judge's side of it, once ``secret`` is drawn and ``out``/``inp`` are wired: ``ok`` says
# whether the guess was right.
JUDGE_GAME = r"""out.write("1000000000000000 10000000000000000\n"); out.flush()
ok = False
for _ in range(60):
    parts = inp.readline().split()
    if len(parts) != 2:
        break
    x = int(parts[1])
    if parts[0] == "!":
        ok = x == secret
        break
    out.write("<\n" if secret < x else ">\n" if secret > x else "=\n"); out.flush()
"""
# The attack on it: find the judge (its file's name, or its code, on its command line) and read
# the secret out of its memory; ``found`` is None where that was refused.
MEMORY_SCAN = r"""found = None
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        if b"judge.py" not in cmd and b"SECRET=" not in cmd:
            continue
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            for line in open(f"/proc/{pid}/maps"):
                f = line.split()
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                if "rw" not in f[1] or hi - lo > 256 << 20:
                    continue
                try:
                    mem.seek(lo)
                    m = re.search(rb"SECRET=(\d{16});", mem.read(hi - lo))
                except OSError:
                    continue
                if m:
                    found = int(m.group(1))
                    break
    except OSError:
        continue
"""
READS_THE_JUDGES_MEMORY = ("import os, re, sys\nsys.stdin.readline()\n" + MEMORY_SCAN
                           + 'print("!", found or 1000000000000000, flush=True)\n')
