"""Grading honest work: full marks for the reference and for honest extras, partial credit,
each dimension (tests, lint, rules, the task's verifiers), and workspaces that are hard to read.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tempering.reward import Grader, grade
from tempering.sandbox import open_sandbox
from tempering.tasks import Task, load_task

SOLUTION = (Path(__file__).resolve().parents[2] / "examples" / "tasks" / "median" / "solution"
            / "stats.py").read_text()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


async def test_reference_solution_scores_one_and_stub_zero(median: Task, attempt) -> None:
    solved = await attempt(median, {"stats.py": SOLUTION})
    assert (solved.reward, solved.tests_passed, solved.tests_total) == (1.0, 5, 5)
    assert solved.flags == [] and solved.changed_files == ["stats.py"]
    assert all(t.outcome == "passed" for t in solved.tests)
    stub = await attempt(median)
    assert (stub.reward, stub.tests_passed) == (0.0, 0)
    assert {t.outcome for t in stub.tests} == {"failed"}
    assert "NotImplementedError" in stub.tests[0].message


async def test_honest_extras_keep_full_reward(median: Task, attempt) -> None:
    """Helper modules, the agent's own tests (importing pytest) and the caches left by running
    them are honest work."""
    files = {
        "stats.py": "from helpers import middle\n\n\ndef median(values):\n"
                    "    if not values:\n        raise ValueError('empty')\n"
                    "    return middle(sorted(values))\n",
        "helpers.py": "def middle(ordered):\n    n = len(ordered)\n"
                      "    if n % 2:\n        return ordered[n // 2]\n"
                      "    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2\n",
        "test_mine.py": "import pytest\n\nfrom stats import median\n\n\n"
                        "def test_two():\n    assert median([1, 2]) == 1.5\n\n\n"
                        "def test_empty():\n    with pytest.raises(ValueError):\n"
                        "        median([])\n",
        "checks/test_more.py": "from stats import median\n\n\ndef test_one():\n"
                               "    assert median([4]) == 4\n",
    }
    result = await attempt(median, files, shell="python3 -m pytest -q test_mine.py checks")
    assert result.reward == 1.0, (result.flags, result.details)
    assert result.flags == []
    assert "test_mine.py" in result.changed_files


async def test_logging_dataclasses_and_deleting_files_are_not_tampering(attempt) -> None:
    """Code that calls sys._getframe through logging, or defines __eq__ through dataclasses,
    is not introspection or an always-equal object."""
    task = load_task(EXAMPLES / "median")
    code = ("import logging\nfrom dataclasses import dataclass\n\nlog = logging.getLogger()\n\n\n"
            "@dataclass\nclass Box:\n    value: float\n\n\n" + SOLUTION.replace(
                "    ordered = sorted(values)",
                "    log.warning('median of %d', len(values))\n    ordered = sorted(values)"))
    result = await attempt(task, {"stats.py": code})
    assert result.reward == 1.0, (result.flags, result.details)


async def test_partial_credit_and_all_or_nothing(median: Task, attempt) -> None:
    odd_only = ("def median(values):\n    ordered = sorted(values)\n"
                "    return ordered[len(ordered) // 2]\n")
    fraction = await attempt(median, {"stats.py": odd_only})
    assert fraction.tests_passed == 3 and fraction.reward == pytest.approx(3 / 5)
    strict = Task(median.config.model_copy(update={"grading": median.config.grading.model_copy(
        update={"scoring": "all"})}), median.instruction, median.workspace, median.tests)
    assert (await attempt(strict, {"stats.py": odd_only})).reward == 0.0


async def test_verifier_lint_and_rules_are_weighted(attempt) -> None:
    task = load_task(EXAMPLES / "slugify")
    assert task.solution is not None
    solution = task.solution["slug.py"].decode()
    perfect = await attempt(task, {"slug.py": solution})
    assert perfect.reward == 1.0
    assert perfect.components == {"tests": 1.0, "cms": 1.0, "lint": 1.0, "rules": 1.0}
    # A lint finding suppressed with noqa still counts; a forbidden import breaks a rule.
    sloppy = solution.replace("import json\n", "import json\nimport subprocess  # noqa\n")
    result = await attempt(task, {"slug.py": sloppy})
    assert result.components["lint"] == pytest.approx(0.75)  # F401, penalty 0.25
    assert result.components["rules"] == pytest.approx(2 / 3)  # 1 of 3 rules broken
    assert result.reward == pytest.approx(0.6 + 0.2 + 0.1 * 0.75 + 0.1 * 2 / 3)
    assert "rule_failed" in result.flags and not result.tampered
    assert any("forbidden_imports" in d and "subprocess" in d for d in result.details)
    # The CMS takes an empty slug only for a title with nothing to say (round thirty: the
    # example's check took "" for every title).
    empty = await attempt(task, {"slug.py": "def slugify(title):\n    return ''\n"})
    assert empty.components["cms"] == pytest.approx(1 / 6) and empty.components["tests"] == 0


async def test_custom_verifier_command_and_failure(tmp_path: Path, attempt) -> None:
    root = tmp_path / "task"
    (root / "workspace").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "verifiers").mkdir()
    (root / "workspace" / "answer.txt").write_text("?\n")
    (root / "tests" / "test_answer.py").write_text(
        "def test_exists():\n    assert open('answer.txt').read()\n")
    (root / "instruction.md").write_text("Write 42 into answer.txt.\n")
    (root / "verifiers" / "check.sh").write_text(
        'v=$(cat answer.txt); [ "$v" = 42 ] && echo \'{"exact": 1, "short": 1}\' '
        '|| echo \'{"exact": 0, "short": 0.5}\'\n')
    (root / "task.toml").write_text(  # "broken" has no weight: reported, not counted
        '[task]\nid = "answer"\n[reward]\ntests = 1\nexact = 2\nshort = 1\n'
        '[[verifiers]]\nname = "judge"\ncommand = "sh $TEMPERING_VERIFIERS/check.sh"\n'
        'components = ["exact", "short"]\n'
        '[[verifiers]]\nname = "broken"\ncommand = "exit 3"\n'
        # scores printed, then a crash: a checker that failed vouches for nothing it printed
        '[[verifiers]]\nname = "crashed"\ncommand = "echo 1; exit 1"\n')
    task = load_task(root)
    right = await attempt(task, {"answer.txt": "42"})
    assert right.components["exact"] == 1.0 and right.reward == 1.0
    assert right.components["broken"] == 0.0 and "verifier_error" in right.flags
    assert right.components["crashed"] == 0.0
    assert any("crashed" in d and "exited with 1" in d for d in right.details), right.details
    wrong = await attempt(task, {"answer.txt": "41"})
    assert wrong.reward == pytest.approx((1 + 0 + 0.5) / 4)


async def test_hard_workspaces_give_a_result_not_a_crash(median: Task) -> None:
    """Huge, many and non-UTF-8 files: a grade comes back, the solution still counts."""
    async with open_sandbox(median.sandbox.model_copy(update={"disk_mb": 256})) as sb:
        await median.prepare(sb)
        await sb.write_file("stats.py", SOLUTION)
        await sb.write_file("binary.bin", os.urandom(4096))
        await sb.write_file("latin1.py", "# caf\xe9\n".encode("latin-1"))
        r = await sb.exec("head -c 40M /dev/zero > huge.dat && mkdir many && cd many && "
                          "seq 1 12000 | xargs touch && ln -s /etc/passwd ../link && "
                          "mkfifo ../pipe")
        assert r.exit_code == 0, r.stderr
        async with Grader() as grader:
            result = await grader.grade(median, sb)
    assert result.reward == 1.0, (result.flags, result.details[:5])
    assert "files_left_out" in result.flags and not result.tampered
    left_out = " ".join(result.details)
    assert "huge.dat" in left_out and "link" in left_out and "pipe" in left_out


async def test_grading_leaves_the_agent_sandbox_as_it_was(median: Task) -> None:
    async with open_sandbox(median.sandbox) as sb:
        await median.prepare(sb)
        await sb.write_file("stats.py", SOLUTION)
        before = await sb.exec("ls -la --time-style=+ . && md5sum stats.py")
        result = await grade(median, sb)
        after = await sb.exec("ls -la --time-style=+ . && md5sum stats.py")
    assert result.reward == 1.0 and before.stdout == after.stdout


async def test_warm_grader_grades_the_same(median: Task, attempt) -> None:
    async with Grader(warm=2) as grader:
        results = [await attempt(median, {"stats.py": SOLUTION}, grader=grader) for _ in range(3)]
    assert [r.reward for r in results] == [1.0, 1.0, 1.0]


async def test_plain_runner_collects_and_grades_without_pytest(tmp_path: Path, attempt) -> None:
    root = tmp_path / "plain"
    for sub in ("workspace", "tests", "solution"):
        (root / sub).mkdir(parents=True)
    (root / "workspace" / "calc.py").write_text("def add(a, b):\n    return 0\n")
    (root / "solution" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_small():\n    assert add(1, 2) == 3\n\n\n"
        "def test_zero():\n    assert add(0, 0) == 0\n\n\nclass TestMore:\n"
        "    def test_negative(self):\n        assert add(-1, -1) == -2\n")
    (root / "instruction.md").write_text("Implement add.\n")
    (root / "task.toml").write_text('[task]\nid = "plain"\n[grading]\nrunner = "plain"\n')
    task = load_task(root)
    stub = await attempt(task)
    assert (stub.tests_passed, stub.tests_total) == (1, 3)  # add(0, 0) == 0 holds already
    assert {t.id for t in stub.tests} == {"tests/test_calc.py::test_small",
                                          "tests/test_calc.py::test_zero",
                                          "tests/test_calc.py::TestMore::test_negative"}
    solved = await attempt(task, {"calc.py": "def add(a, b):\n    return a + b\n"})
    assert solved.reward == 1.0 and solved.flags == []
