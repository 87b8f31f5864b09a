"""Prepare once, fork per sample: a task's setup step runs once, its tree is the pristine one
(samples start from it, gradings are taken against it and hold it), and a group's samples fork
one prepared sandbox instead of each starting and writing its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tempering.errors import ConfigError
from tempering.reward import Grader
from tempering.reward.validate import validate_task
from tempering.sandbox import open_sandbox
from tempering.tasks import load_task
from tempering.tasks.setup import PreparedRoot, prepared

# The setup compiles a program the tests run; the agent must fix its source's output, and the
# grading rebuilds nothing: the binary is in the prepared tree the grading sandbox holds.
SETUP = ('mkdir -p build && cc -O1 -o build/greet src/greet.c && date +%s%N > build/stamp && '
         'echo "$RANDOM" > build/nonce')
TESTS = """import subprocess


def test_built_once():
    assert open("build/stamp").read().strip().isdigit()


def test_greeting():
    assert open("greeting.txt").read() == "hello\\n"


def test_binary_runs():
    out = subprocess.run(["build/greet"], capture_output=True, text=True).stdout
    assert out == "greet\\n"
"""


def setup_task(root: Path, command: str = SETUP) -> Path:
    files = {
        "task.toml": f'[task]\nid = "setup-demo"\n\n[sandbox]\nbackend = "local"\n\n'
                     f'[setup]\ncommand = {command!r}\n\n[grading]\nexpected_tests = 3\n',
        "instruction.md": "Write greeting.txt saying hello.\n",
        "workspace/src/greet.c": '#include <stdio.h>\nint main(void){puts("greet");return 0;}\n',
        "tests/test_it.py": TESTS,
        "solution/greeting.txt": "hello\n",
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


async def test_the_setup_tree_is_pristine_and_graded(tmp_path: Path) -> None:
    task = load_task(setup_task(tmp_path / "t"))
    ready = await prepared(task)
    assert ready is await prepared(task)  # once per process
    assert {"build/greet", "build/stamp", "build/nonce", "src/greet.c"} <= set(ready.workspace)
    assert ready.workspace.mode("build/greet") == 0o755 and not ready.config.setup.command
    async with Grader() as grader:
        validation = await validate_task(task, grader)
        assert validation.ok, validation.problems
        assert validation.untouched is not None and validation.solution is not None
        assert validation.untouched.changed_files == []  # the build is not the agent's
        assert validation.solution.changed_files == ["greeting.txt"]
        async with open_sandbox(task.sandbox) as sb:  # an episode's sandbox: the same tree
            await task.prepare(sb)
            assert await sb.read_file("build/stamp") == ready.workspace["build/stamp"]
            await sb.write_file("greeting.txt", "hello\n")
            assert (await grader.grade(task, sb)).reward == 1.0


@pytest.mark.parametrize(("command", "error"), [
    ("echo compiling; exit 3", "exited with 3: compiling"),
    ("ln -s /etc/passwd leak", "leak (symbolic link)"),
])
async def test_a_setup_that_fails_says_why(tmp_path: Path, command: str, error: str) -> None:
    task = load_task(setup_task(tmp_path / "t", command))
    with pytest.raises(ConfigError, match=re.escape(error)):
        await prepared(task)
    async with Grader() as grader:
        validation = await validate_task(task, grader)
    assert not validation.ok and error in validation.problems[0]


@pytest.mark.parametrize("cpus", [None, 1])
async def test_the_setup_has_every_cpu_unless_it_says_less(tmp_path: Path, cpus: int | None
                                                           ) -> None:
    """It runs once, not per sample: a build may use the machine (the task's sandbox, and each
    sample's, keeps its own quota)."""
    from tempering.sandbox.spec import host_cpus

    root = setup_task(tmp_path / "t", "nproc > build.cpus")
    if cpus is not None:
        toml = (root / "task.toml").read_text()
        (root / "task.toml").write_text(toml.replace("[setup]\n", f"[setup]\ncpus = {cpus}\n"))
    task = load_task(root)
    ready = await prepared(task)
    assert ready.workspace["build.cpus"] == f"{cpus or host_cpus()}\n".encode()
    assert task.sandbox.cpus == 1.0


async def test_a_group_forks_one_prepared_sandbox(tmp_path: Path) -> None:
    """The setup ran once (one stamp, one nonce for all), each fork starts as prepared, and
    what one sample does is not in another's."""
    task = load_task(setup_task(tmp_path / "t"))
    async with PreparedRoot(task) as root:
        forks = [await root.sandbox() for _ in range(3)]
        try:
            await forks[0].write_file("greeting.txt", "hello\n")
            nonces = {await f.read_file("build/nonce") for f in forks}
            assert len(nonces) == 1
            assert (await forks[1].exec("cat greeting.txt")).exit_code != 0
            assert (await forks[2].exec("build/greet")).stdout == "greet\n"
        finally:
            for f in forks:
                await f.close()


async def test_rollouts_of_a_group_start_from_forks(tmp_path: Path) -> None:
    from tempering.agent.groups import run_rollouts
    from tempering.policy.scripted import ScriptedPolicy
    from tempering.scheduler import Resources, Scheduler

    task = load_task(setup_task(tmp_path / "t"))
    policy = ScriptedPolicy([("write_file", {"path": "greeting.txt", "content": "hello\n"}),
                             ("submit", {})])
    async with Grader() as grader, Scheduler(Resources.of(sandbox=4, inference=4)) as sched:
        done = await run_rollouts([task], policy, scheduler=sched, samples=4, grader=grader)
    assert len(done) == 4
    assert all(t.reward is not None and t.reward.reward == 1.0 for t in done), [
        (t.status, t.error) for t in done]
