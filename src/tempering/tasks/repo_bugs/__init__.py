"""``repo-bugs``: small Python repositories with one seeded bug each, graded like SWE-bench.

Each task is a package of a few modules with a real test suite (pytest, a few dozen tests, a
couple of them doing seconds of honest work), into which one bug of a common kind was seeded:
an off-by-one, a wrong default, swapped arguments, a missed edge case, a wrong exception. The
agent is given an issue report that describes the symptom, as a user would file it, and the
repository with the tests that pass today (``tests/``, runnable with ``python3 -m pytest``).
Grading runs the whole suite, including the tests that expose the bug, which the agent never
sees: ``grading.fail_to_pass`` names those, ``grading.pass_to_pass`` the rest, and the tests
score 1 only when all of both pass. The reference solution is the file as it was before the
bug.

The repositories are generated here from the source below, so nothing is downloaded; each
bug is a replacement of one snippet that occurs exactly once in its module (checked when the
task is built). ``repo_bugs()`` lists every task in a fixed order and ``repo-bugs:N`` (the task
registry's spelling) takes the first N.
"""

from __future__ import annotations

import re

from tempering.sandbox import SandboxSpec
from tempering.tasks.files import FileTree
from tempering.tasks.repo_bugs import intervals, ledger
from tempering.tasks.repo_bugs.model import Bug, Repo
from tempering.tasks.task import GradingConfig, Task, TaskConfig, TaskInfo

SANDBOX = SandboxSpec(memory_mb=512, pids=64, disk_mb=64, timeout_s=120)
TEST_TIMEOUT_S = 120.0


REPOS = (ledger.REPO, intervals.REPO)


def _test_file(units: dict[str, str], names: list[str]) -> str:
    """The test file of ``names``: its preamble's imports cut to what those tests use (a
    visible file importing ``random`` for nothing would hint at the hidden tests)."""
    bodies = [units[n].rstrip("\n") + "\n" for n in names]
    used = set(re.findall(r"\w+", "".join(bodies)))
    preamble = []
    for line in units[""].splitlines():
        if line.startswith("import "):
            line = line if line.split()[1] in used else ""
        elif line.startswith("from ") and " import " in line:
            module, _, imported = line.partition(" import ")
            kept = [n for n in imported.split(", ") if n in used]
            line = f"{module} import {', '.join(kept)}" if kept else ""
        preamble.append(line)
    head = re.sub(r"\n{3,}", "\n\n", "\n".join(preamble)).strip("\n")
    return "\n\n".join([head + "\n", *bodies]) if head else "\n\n".join(bodies)


def _test_ids(repo: Repo) -> list[str]:
    return [f"{path}::{name}" for path, units in repo.tests.items() for name in units if name]


def _build(repo: Repo, bug: Bug) -> Task:
    source = repo.sources[bug.path]
    if source.count(bug.good) != 1:
        raise ValueError(f"{bug.name}: {bug.good!r} occurs {source.count(bug.good)} times in "
                         f"{bug.path}, not once")
    ids = _test_ids(repo)
    unknown = sorted(set(bug.fail_to_pass) - set(ids))
    if unknown:
        raise ValueError(f"{bug.name}: fail_to_pass names no test of {repo.name}: {unknown}")
    hidden = {path: _test_file(units, [n for n in units if n]) for path, units in
              repo.tests.items()}
    visible = {path: _test_file(units, [n for n in units if n and f"{path}::{n}"
                                        not in bug.fail_to_pass])
               for path, units in repo.tests.items()}
    readme = (f"# {repo.name}\n\n{repo.summary[0].upper()}{repo.summary[1:]}.\n\n"
              "Run the tests with `python3 -m pytest tests`.\n")
    pyproject = (f'[project]\nname = "{repo.name}"\nversion = "0.1.0"\n'
                 'requires-python = ">=3.9"\n')
    workspace = {**repo.sources, bug.path: source.replace(bug.good, bug.bad), **visible,
                 "README.md": readme, "pyproject.toml": pyproject}
    fail_to_pass = list(bug.fail_to_pass)
    config = TaskConfig(
        task=TaskInfo(id=f"repo-bugs/{bug.name}", family="repo-bugs",
                      description=f"{repo.name}: {bug.kind}"),
        sandbox=SANDBOX,
        grading=GradingConfig(command="python3 -m pytest tests", timeout_s=TEST_TIMEOUT_S,
                              scoring="all", fail_to_pass=fail_to_pass,
                              pass_to_pass=[t for t in ids if t not in fail_to_pass]),
    )
    instruction = (f"An issue was filed against the `{repo.name}` package in the working "
                   f"directory ({repo.summary}):\n\n> {bug.issue}\n\nFix the package so that "
                   "the issue is resolved. Its tests are in tests/ and run with "
                   "`python3 -m pytest tests`; they pass today, and they will be run again "
                   "with more tests when you submit. Do not change the tests.")
    return Task(config=config, instruction=instruction, workspace=FileTree.of(workspace),
                tests=FileTree.of({p.removeprefix("tests/"): t for p, t in hidden.items()}),
                solution=FileTree.of({bug.path: source}))


def repo_bugs(count: int | None = None) -> list[Task]:
    """The repo-bugs tasks in a fixed order (each repository's bugs in turn); the first
    ``count`` if given."""
    bugs = [(repo, bug) for i in range(max(len(r.bugs) for r in REPOS)) for repo in REPOS
            if i < len(repo.bugs) for bug in (repo.bugs[i],)]
    if count is not None and not 1 <= count <= len(bugs):
        raise ValueError(f"repo-bugs:{count}: there are {len(bugs)} repo-bugs tasks; ask for "
                         f"1 to {len(bugs)}")
    return [_build(repo, bug) for repo, bug in bugs[:count]]


def repo_bug_from_id(task_id: str) -> Task:
    """The task whose id is ``task_id`` (``repo-bugs/ledger-fraction``)."""
    name = task_id.removeprefix("repo-bugs/")
    for repo in REPOS:
        for bug in repo.bugs:
            if bug.name == name:
                return _build(repo, bug)
    names = ", ".join(b.name for r in REPOS for b in r.bugs)
    raise ValueError(f"{task_id!r} is not a repo-bugs task; the tasks are repo-bugs/NAME for "
                     f"NAME in {names}")
