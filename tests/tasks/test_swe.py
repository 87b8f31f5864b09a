"""SWE-bench-style instances imported as tasks, from git repositories this test builds: the gold
patch scores 1, the untouched repository 0, a patch that edits the tests 0 and flagged; the
workspace's history holds the base commit and nothing of what came after it; instances the
format cannot carry are refused with the reason, the others still imported."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tempering.cli import main
from tempering.errors import ConfigError
from tempering.reward import Grader
from tempering.reward.validate import validate_task
from tempering.tasks import FileTree, Task, load_task
from tempering.tasks.swe import import_instances

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.org",
           "GIT_COMMITTER_NAME": "dev", "GIT_COMMITTER_EMAIL": "dev@example.org",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

OPS = '''"""Small numeric helpers."""


def clamp(value, low, high):
    """value, kept within [low, high]."""
    return max(low, min(value, high))


def mean(values):
    """The arithmetic mean; ValueError for no values."""
    return sum(values) / len(values)
'''
FIXED = OPS.replace("    return sum(values) / len(values)\n",
                    "    if not values:\n        raise ValueError(\"mean of no values\")\n"
                    "    return sum(values) / len(values)\n")
TESTS = '''import pytest

from calc.ops import clamp, mean


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


@pytest.mark.parametrize("value,expected", [(-3, 0), (30, 10)])
def test_clamp_outside(value, expected):
    assert clamp(value, 0, 10) == expected


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_network_needed():  # fails before and after: no list names it
    raise OSError("no network in the sandbox")


@pytest.mark.skip(reason="slow on CI")
def test_skipped_upstream():
    pass
'''
NEW_TEST = '''

def test_mean_of_nothing():
    with pytest.raises(ValueError):
        mean([])
'''
SECRET = "# later work: streaming statistics, kept out of every task\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True,
                          capture_output=True, text=True).stdout


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture
def upstream(tmp_path: Path) -> dict[str, object]:
    """A repository with a base commit, the fix after it, and later history: a branch, a tag,
    a stash and a dangling commit; and the instance line of the fix."""
    repo = tmp_path / "repos" / "acme__calc"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    base = commit(repo, {"calc/__init__.py": "", "calc/ops.py": OPS, "tests/test_ops.py": TESTS,
                         "README.md": "calc\n"}, "calc: clamp and mean")
    fix = commit(repo, {"calc/ops.py": FIXED, "tests/test_ops.py": TESTS + NEW_TEST},
                 "mean: refuse no values")
    later = commit(repo, {"calc/stream.py": SECRET}, "streaming statistics")
    git(repo, "tag", "v2")
    (repo / "calc" / "stream.py").write_text(SECRET + "# stashed\n")
    git(repo, "stash", "-q")
    instance = {
        "instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base,
        "problem_statement": "mean([]) raises ZeroDivisionError\n\nIt should say ValueError.",
        "patch": git(repo, "diff", base, fix, "--", "calc"),
        "test_patch": git(repo, "diff", base, fix, "--", "tests"),
        "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_mean_of_nothing"]),
        "PASS_TO_PASS": ["tests/test_ops.py::test_clamp_inside",
                         "tests/test_ops.py::test_clamp_outside", "tests/test_ops.py::test_mean"],
        "hints_text": "ignored",
    }
    return {"repos": tmp_path / "repos", "repo": repo, "instance": instance,
            "commits": {"base": base, "fix": fix, "later": later}}


def write_lines(path: Path, *instances: object) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in instances))
    return path


async def test_an_instance_grades_gold_1_untouched_0_and_a_test_edit_0(
        upstream: dict[str, object], tmp_path: Path) -> None:
    lines = write_lines(tmp_path / "instances.jsonl", upstream["instance"])
    (imported,) = import_instances(lines, upstream["repos"], tmp_path / "tasks")  # type: ignore
    assert imported.error == "" and imported.task_dir == tmp_path / "tasks" / "acme__calc-1"
    task = load_task(imported.task_dir)
    grading = task.config.grading
    assert (grading.tests_dir, grading.scoring) == ("tests", "listed")
    assert grading.command == "python3 -m pytest tests/test_ops.py"
    assert b"test_mean_of_nothing" not in task.workspace["tests/test_ops.py"]
    assert b"test_mean_of_nothing" in task.tests["test_ops.py"]
    assert task.solution is not None and set(task.solution) == {"calc/ops.py"}
    assert "mean([]) raises ZeroDivisionError" in task.instruction
    assert task.sandbox.backend == "local"
    await grades_as_swe_bench_would(task)


@pytest.mark.docker
@pytest.mark.slow  # CI's slow half: an image build and a dozen containers
async def test_an_instance_with_a_recipe_grades_on_the_docker_backend(
        upstream: dict[str, object], tmp_path: Path, docker_ready: None) -> None:
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "Dockerfile").write_text("FROM tempering/python:latest\n")
    lines = write_lines(tmp_path / "instances.jsonl",
                        {**upstream["instance"], "recipe": "env"})  # type: ignore[dict-item]
    (imported,) = import_instances(lines, upstream["repos"], tmp_path / "tasks")  # type: ignore
    task = load_task(imported.task_dir)  # type: ignore[arg-type]
    assert task.sandbox.backend == "docker"
    assert (task.sandbox.recipe or "").endswith("acme__calc-1/environment")
    await grades_as_swe_bench_would(task)


async def grades_as_swe_bench_would(task: Task) -> None:
    """Gold 1, untouched 0 (its fail-to-pass test failing), a weakened test 0 and flagged, and
    the task valid; the unlisted failing and skipped tests count for nothing."""
    assert task.solution is not None
    fixed = task.workspace.overlay(dict(task.solution.files))
    weakened = fixed.overlay({"tests/test_ops.py": TESTS.replace("== 3", "== 3 or True")})
    async with Grader() as grader:
        gold = await grader.grade_files(task, fixed)
        untouched = await grader.grade_files(task, task.workspace)
        edited = await grader.grade_files(task, weakened)
        validation = await validate_task(task, grader)
    outcomes = {t.id: t.outcome for t in gold.tests}
    assert outcomes["tests/test_ops.py::test_network_needed"] == "failed"
    assert outcomes["tests/test_ops.py::test_skipped_upstream"] == "skipped"
    assert (gold.reward, gold.flags) == (1.0, []), gold.log
    assert gold.components["fail_to_pass"] == gold.components["pass_to_pass"] == 1.0
    assert untouched.reward == 0.0 and untouched.components["fail_to_pass"] == 0.0
    assert untouched.components["pass_to_pass"] == 1.0
    assert edited.reward == 0.0 and "protected_edit" in edited.flags
    assert validation.ok, validation.problems


def test_the_workspace_history_holds_the_base_and_nothing_after_it(
        upstream: dict[str, object], tmp_path: Path) -> None:
    lines = write_lines(tmp_path / "instances.jsonl", upstream["instance"])
    (imported,) = import_instances(lines, upstream["repos"], tmp_path / "tasks")  # type: ignore
    workspace = imported.task_dir / "workspace"  # type: ignore[operator]
    commits: dict[str, str] = upstream["commits"]  # type: ignore[assignment]
    assert git(workspace, "log", "--all", "--format=%P|%s").splitlines() == [
        f"|acme/calc at {commits['base'][:12]}"]
    assert git(workspace, "status", "--porcelain") == ""  # the tree is the commit's
    assert git(workspace, "for-each-ref", "--format=%(refname)").split() == ["refs/heads/main"]
    assert git(workspace, "stash", "list") == "" and git(workspace, "reflog").count("\n") == 1
    # Every object the repository holds, packed or loose, reachable or not.
    objects = git(workspace, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
    contents = subprocess.run(["git", "cat-file", "--batch"], cwd=workspace, env=GIT_ENV,
                              input=objects.encode(), capture_output=True, check=True).stdout
    assert objects.count("\n") == 8  # the commit, 3 trees, 4 blobs
    assert b"raise ValueError" not in contents and b"streaming statistics" not in contents
    assert b"test_mean_of_nothing" not in contents
    assert not {*commits.values()} & set(objects.split())
    # Nor anywhere else in the task's visible files.
    for path in workspace.rglob("*"):
        if path.is_file():
            assert b"streaming" not in path.read_bytes(), path


def test_instances_it_cannot_carry_are_refused_and_the_rest_imported(
        upstream: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo: Path = upstream["repo"]  # type: ignore[assignment]
    good: dict[str, object] = upstream["instance"]  # type: ignore[assignment]
    commits: dict[str, str] = upstream["commits"]  # type: ignore[assignment]
    git(repo, "checkout", "-q", commits["base"])
    (repo / "calc" / "alias.py").symlink_to("ops.py")
    linked = commit(repo, {}, "an alias")
    bad = [
        {**good, "instance_id": "django-style", "FAIL_TO_PASS": ["test_x (calc.tests.T)"]},
        {**good, "instance_id": "gold-edits-tests", "patch": good["test_patch"]},
        {**good, "instance_id": "elsewhere", "repo": "acme/nowhere"},
        {**good, "instance_id": "no-such-commit", "base_commit": "0" * 40},
        {**good, "instance_id": "linked", "base_commit": linked},
        {**good, "instance_id": "stale-patch", "test_patch": good["test_patch"].replace(  # type: ignore[union-attr]
            "def test_skipped_upstream", "def test_skipped_later")},
        {**good, "instance_id": "acme__calc-1"},  # the same id twice
        ["not", "an", "object"],
    ]
    lines = write_lines(tmp_path / "instances.jsonl", good, *bad)
    with open(lines, "a") as f:
        f.write("{broken\n\n")
    out = tmp_path / "tasks"
    assert main(["tasks", "import", "swe", str(lines), "--repos", str(upstream["repos"]),
                 "--out", str(out)]) == 1
    said = " ".join(capsys.readouterr().err.split())
    for text in [
        "imported acme__calc-1",
        "django-style: FAIL_TO_PASS id 'test_x (calc.tests.T)' is not a pytest id",
        "gold-edits-tests: the gold patch changes tests/test_ops.py, in the tests directory",
        "repository 'acme/nowhere' is not under",
        f"no-such-commit: base_commit {'0' * 40} is not a commit of",
        "linked: the tree holds what a task cannot carry: calc/alias.py (symbolic link)",
        "stale-patch: test_patch does not apply to base_commit",
        "acme__calc-1 appears twice",
        "an instance is a JSON object, not list",
        "line 10 is not JSON",
        "1 of 10 instance(s) imported",
    ]:
        assert text in said, text
    assert sorted(p.name for p in out.iterdir()) == ["acme__calc-1"]  # no partial directory
    # Run again, it replaces the task whole.
    (out / "acme__calc-1" / "stray.txt").write_text("left from before")
    assert import_instances(write_lines(lines, good), upstream["repos"], out)[0].task_dir  # type: ignore[arg-type]
    assert not (out / "acme__calc-1" / "stray.txt").exists()
    with pytest.raises(ConfigError, match="no instance in it"):
        import_instances(write_lines(lines), upstream["repos"], out)  # type: ignore[arg-type]
    assert FileTree.read(out / "acme__calc-1" / "solution")["calc/ops.py"] == FIXED.encode()
