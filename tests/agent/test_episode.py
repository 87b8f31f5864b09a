"""Episodes end to end: a scripted policy acting in real sandboxes, graded by the real grader.

Faults are injected for real: a sandbox's processes are killed or frozen from the host, a
command loops forever. Each episode must still come back as a trajectory with the status that
names the boundary that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tempering.agent import EpisodeConfig, run_branches, run_episode
from tempering.agent.tools import truncate
from tempering.policy.base import GenerateRequest, Generation
from tempering.policy.scripted import ScriptedPolicy
from tempering.reward import Grader
from tempering.sandbox import Sandbox, open_sandbox
from tempering.tasks import load_task
from tempering.trajectory.schema import Status, Trajectory
from tempering.trajectory.store import TrajectoryStore

MEDIAN = Path(__file__).parents[2] / "examples" / "tasks" / "median"
SOLUTION = (MEDIAN / "solution" / "stats.py").read_text()


@pytest.fixture(scope="module")
def task():  # type: ignore[no-untyped-def]
    return load_task(MEDIAN)


@pytest.fixture
async def grader():  # type: ignore[no-untyped-def]
    async with Grader() as g:
        yield g


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    with TrajectoryStore(tmp_path / "run") as s:
        yield s


def assert_stored(store: TrajectoryStore, trajectory: Trajectory) -> None:
    """The episode was acknowledged: a fresh reader of the run finds it, once, unchanged."""
    store.flush()
    found = [t for t in TrajectoryStore(store.run_dir).read()
             if t.trajectory_id == trajectory.trajectory_id]
    assert found == [trajectory]


def _pids(sb: Sandbox) -> list[int]:
    paths = sb._cgroup.paths  # type: ignore[attr-defined]
    procs = next(iter(paths.values())) / "cgroup.procs"
    return [int(p) for p in procs.read_text().split()]


class Faulty:
    """Wraps a policy; before turn ``at`` it runs ``fault`` on the sandbox (from the host)."""

    def __init__(self, inner: ScriptedPolicy, at: int, fault: Any) -> None:
        self.inner, self.at, self.fault, self.name = inner, at, fault, "faulty"
        self.sandbox: Sandbox | None = None

    async def generate(self, request: GenerateRequest) -> Generation:
        turn = sum(1 for m in request.messages if m.role == "assistant")
        if turn == self.at and self.sandbox is not None:
            self.fault(self.sandbox)
        return await self.inner.generate(request)


async def test_solving_episode_is_graded_and_recorded_step_by_step(task, grader) -> None:
    policy = ScriptedPolicy([
        ("read_file", {"path": "stats.py"}),
        ("write_file", {"path": "stats.py", "content": SOLUTION}),
        ("bash", {"command": "python3 -c 'import stats; print(stats.median([3, 1, 2]))'"}),
        ("submit", {}),
    ])
    traj = await run_episode(task, policy, grader=grader, run_id="r1", group_id="g1")
    assert traj.status == Status.OK and traj.finish_reason == "submit"
    assert traj.reward is not None and traj.reward.reward == 1.0
    assert [s.action for s in traj.steps] == ["read_file", "write_file", "bash", "submit"]
    assert "raise NotImplementedError" in traj.steps[0].observation
    assert traj.steps[2].observation.strip() == "2" and traj.steps[2].exit_code == 0
    assert json.loads(traj.steps[1].arguments)["path"] == "stats.py"
    assert traj.task_id == "median" and traj.run_id == "r1" and traj.group_id == "g1"
    assert {t["function"]["name"] for t in json.loads(traj.tools)} >= {"bash", "submit"}


async def test_shell_state_persists_across_bash_calls(task, grader) -> None:
    policy = ScriptedPolicy([
        ("bash", {"command": "mkdir -p sub && cd sub && export GREETING=hello"}),
        ("bash", {"command": "pwd; echo $GREETING"}),
    ])
    traj = await run_episode(task, policy, grader=grader)
    cwd, greeting = traj.steps[1].observation.split()
    assert cwd.endswith("/sub") and greeting == "hello"


async def test_malformed_calls_are_observations_and_the_model_can_recover(task, grader) -> None:
    policy = ScriptedPolicy([
        "I will call <tool_call>{not json</tool_call>",
        "no tool call at all",
        ("frobnicate", {}),
        ("read_file", {}),
        ("str_replace", {"path": "stats.py", "old": "nothing like this", "new": "x"}),
        ("read_file", {"path": "missing.py"}),
        ("write_file", {"path": "stats.py", "content": SOLUTION}),
        ("submit", {}),
    ])
    traj = await run_episode(task, policy, grader=grader,
                             config=EpisodeConfig(max_consecutive_errors=10))
    assert traj.status == Status.OK and traj.reward is not None and traj.reward.reward == 1.0
    actions = [s.action for s in traj.steps]
    assert actions[:4] == ["invalid", "message", "frobnicate", "read_file"]
    errors = [s.error for s in traj.steps[:6]]
    assert all(errors), errors
    assert "not valid JSON" in traj.steps[0].observation
    assert "unknown tool 'frobnicate'" in traj.steps[2].observation
    assert "needs string argument(s) path" in traj.steps[3].observation
    assert "it was not found" in traj.steps[4].observation
    assert "missing.py" in traj.steps[5].observation


async def test_a_call_nested_past_the_recursion_limit_is_the_models_error(task, grader) -> None:
    """Markup the parser cannot descend (``RecursionError`` in ``json``) is an invalid action
    the model sees, not an episode lost to the system."""
    policy = ScriptedPolicy([
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
        '<tool_call>{"name": "bash", "arguments": ' + '{"a": ' * 5000 + "1" + "}" * 5001
        + "</tool_call>",
        ("write_file", {"path": "stats.py", "content": SOLUTION}),
        ("submit", {}),
    ])
    traj = await run_episode(task, policy, grader=grader)
    assert traj.status == Status.OK and traj.reward is not None and traj.reward.reward == 1.0
    assert [s.action for s in traj.steps[:2]] == ["invalid", "invalid"]
    assert all("nested too deeply" in s.observation for s in traj.steps[:2])


async def test_reading_a_huge_sparse_file_is_an_observation(task, grader) -> None:
    """The model's read_file of a 2 GiB sparse file is refused with the reason, before the
    host loads any of it; the episode goes on."""
    policy = ScriptedPolicy([
        ("bash", {"command": "truncate -s 2G big"}),
        ("read_file", {"path": "big"}),
        ("write_file", {"path": "stats.py", "content": SOLUTION}),
        ("submit", {}),
    ])
    traj = await run_episode(task, policy, grader=grader)
    assert traj.status == Status.OK and traj.reward is not None and traj.reward.reward == 1.0
    step = traj.steps[1]
    assert step.error and "'big'" in step.observation and "2147483648 bytes" in step.observation


async def test_too_many_errors_in_a_row_is_a_model_error_and_still_graded(task, grader) -> None:
    policy = ScriptedPolicy(["garbage"] * 5)
    traj = await run_episode(task, policy, grader=grader,
                             config=EpisodeConfig(max_consecutive_errors=3))
    assert traj.status == Status.MODEL_ERROR and traj.finish_reason == "errors"
    assert len(traj.steps) == 3 and traj.reward is not None and traj.reward.reward == 0.0


async def test_long_observations_keep_head_and_tail(task, grader) -> None:
    policy = ScriptedPolicy([("bash", {"command": "echo START; seq 1 20000; echo END"})])
    traj = await run_episode(task, policy, grader=grader,
                             config=EpisodeConfig(observation_limit=500, max_turns=1))
    obs = traj.steps[0].observation
    assert obs.startswith("START") and obs.rstrip().endswith("END")
    assert "characters omitted" in obs and len(obs) <= 520
    assert traj.finish_reason == "max_turns" and traj.status == Status.OK
    assert truncate("abc", 10) == "abc"


async def test_give_up_has_its_own_reward_and_tampering_is_zeroed(task, grader, store) -> None:
    gave_up = await run_episode(task, ScriptedPolicy([("give_up", {})]), grader=grader,
                                config=EpisodeConfig(give_up_reward=0.05), recorder=store)
    assert gave_up.status == Status.OK and gave_up.finish_reason == "give_up"
    assert gave_up.reward is not None and gave_up.reward.reward == 0.05
    assert "gave_up" in gave_up.reward.flags
    cheat = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\n"
             "def pytest_runtest_makereport(item, call):\n"
             "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    tampered = await run_episode(task, ScriptedPolicy([
        ("write_file", {"path": "conftest.py", "content": cheat}), ("submit", {})]),
        grader=grader, recorder=store)
    assert tampered.status == Status.TAMPERED
    assert tampered.reward is not None and tampered.reward.reward == 0.0
    assert gave_up.reward.reward > tampered.reward.reward
    assert_stored(store, gave_up)
    assert_stored(store, tampered)


async def test_command_that_loops_forever_is_a_model_timeout(task, grader, store) -> None:
    policy = ScriptedPolicy([("bash", {"command": "while :; do :; done"}),
                             ("submit", {})])
    traj = await run_episode(task, policy, grader=grader, config=EpisodeConfig(
        wall_time_s=2.0, command_timeout_s=30.0), recorder=store)
    assert traj.status == Status.MODEL_TIMEOUT and traj.finish_reason == "wall_time"
    assert traj.steps[0].timed_out and "timed out" in traj.steps[0].observation
    assert traj.reward is not None  # the model's failure is graded: it is learning signal
    assert traj.duration_s - traj.grade_s < 15  # the wall time cut it, not the command's 30 s
    assert_stored(store, traj)


async def test_command_timeout_alone_is_an_observation(task, grader) -> None:
    policy = ScriptedPolicy([("bash", {"command": "sleep 30"}),
                             ("bash", {"command": "echo still here"})])
    traj = await run_episode(task, policy, grader=grader, config=EpisodeConfig(
        command_timeout_s=0.5, max_turns=2))
    assert traj.status == Status.OK and traj.steps[0].timed_out
    assert traj.steps[1].observation.strip() == "still here"


async def test_sandbox_killed_mid_episode_is_an_infra_error(task, grader, store) -> None:
    def kill(sb: Sandbox) -> None:
        for pid in _pids(sb):
            with contextlib.suppress(ProcessLookupError):  # it may exit on its own first
                os.kill(pid, signal.SIGKILL)

    policy = Faulty(ScriptedPolicy([("bash", {"command": "echo one"}),
                                    ("bash", {"command": "echo two"})]), at=1, fault=kill)
    async with open_sandbox(task.sandbox) as sb:
        await task.prepare(sb)
        policy.sandbox = sb
        traj = await asyncio.wait_for(run_episode(task, policy, grader=grader, sandbox=sb,
                                                  recorder=store), 60)
    assert traj.status == Status.INFRA_ERROR, traj.error
    assert traj.reward is None and traj.error and "Sandbox" in traj.error
    assert traj.steps[0].observation.strip() == "one"
    assert_stored(store, traj)


async def test_frozen_sandbox_is_an_env_timeout(task, grader, store) -> None:
    frozen: list[int] = []

    def freeze(sb: Sandbox) -> None:
        for pid in _pids(sb):
            with contextlib.suppress(ProcessLookupError):  # it may exit on its own first
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)

    policy = Faulty(ScriptedPolicy([("bash", {"command": "echo one"}),
                                    ("bash", {"command": "echo two"})]), at=1, fault=freeze)
    async with open_sandbox(task.sandbox) as sb:
        await task.prepare(sb)
        policy.sandbox = sb
        try:
            traj = await asyncio.wait_for(run_episode(
                task, policy, grader=grader, sandbox=sb,
                config=EpisodeConfig(command_timeout_s=1.0, env_grace_s=1.0), recorder=store), 60)
        finally:
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
    assert traj.status == Status.ENV_TIMEOUT, (traj.status, traj.error)
    assert traj.reward is None and "did not answer" in (traj.error or "")
    assert_stored(store, traj)


async def test_sandbox_that_cannot_start_is_still_a_trajectory(task, grader, store) -> None:
    broken = task.sandbox.model_copy(update={"rootfs": "/nonexistent/rootfs"})
    bad_task = type(task)(config=task.config.model_copy(update={"sandbox": broken}),
                          instruction=task.instruction, workspace=task.workspace,
                          tests=task.tests, root=task.root)
    traj = await run_episode(bad_task, ScriptedPolicy([]), grader=grader, recorder=store)
    assert traj.status == Status.INFRA_ERROR and traj.steps == []
    assert traj.error and traj.error.startswith("sandbox:")
    assert_stored(store, traj)


class PerEpisode:
    """Each new episode id gets the next script: siblings of a branch act differently."""

    def __init__(self, prefix: list[Any], scripts: list[list[Any]]) -> None:
        self.prefix, self.scripts, self.name = prefix, scripts, "per-episode"
        self.assigned: dict[str, int] = {}

    async def generate(self, request: GenerateRequest) -> Generation:
        turn = sum(1 for m in request.messages if m.role == "assistant")
        if turn < len(self.prefix):
            return await ScriptedPolicy(self.prefix).generate(request)
        index = self.assigned.setdefault(request.episode_id, len(self.assigned))
        script = self.prefix + self.scripts[index]
        return await ScriptedPolicy(script).generate(request)


async def test_branches_continue_from_one_prefix_in_forked_sandboxes(task, grader,
                                                                    store) -> None:
    prefix = [("write_file", {"path": "notes.txt", "content": "from the prefix"}),
              ("bash", {"command": "mkdir -p deep && cd deep && export MARK=prefix"})]
    good = [("bash", {"command": "pwd; echo $MARK; cat ../notes.txt"}),
            ("write_file", {"path": "stats.py", "content": SOLUTION}), ("submit", {})]
    bad = [("bash", {"command": "pwd; echo $MARK; cat ../notes.txt"}), ("submit", {})]
    policy = PerEpisode(prefix, [good, bad, bad])
    trajs = await run_branches(task, policy, at=2, n=3, grader=grader, recorder=store)
    assert len(trajs) == 3 and len({t.trajectory_id for t in trajs}) == 3
    assert len({t.parent_id for t in trajs}) == 1 and trajs[0].parent_id
    assert all(t.branch_step == 2 and t.group_id == trajs[0].group_id for t in trajs)
    for t in trajs:
        assert [s.inherited for s in t.steps[:2]] == [True, True]
        assert not any(s.inherited for s in t.steps[2:])
        words = t.steps[2].observation.split()
        assert words[0].endswith("/deep") and words[1:] == ["prefix", "from", "the", "prefix"]
    rewards = sorted(t.reward.reward for t in trajs if t.reward is not None)
    assert rewards == [0.0, 0.0, 1.0]  # the siblings' sandboxes are independent
    for t in trajs:
        assert_stored(store, t)  # the inherited prefix was journaled with each sibling


async def test_harness_out_of_memory_is_an_infra_error(task, grader, store) -> None:
    def exhaust(sb: Sandbox) -> None:
        bytearray(1 << 46)  # 64 TiB: the harness's allocator fails for real

    policy = Faulty(ScriptedPolicy([("bash", {"command": "echo one"}),
                                    ("bash", {"command": "echo two"})]), at=1, fault=exhaust)
    async with open_sandbox(task.sandbox) as sb:
        await task.prepare(sb)
        policy.sandbox = sb
        traj = await run_episode(task, policy, grader=grader, sandbox=sb, recorder=store)
    assert traj.status == Status.INFRA_ERROR and traj.error
    assert traj.error.startswith("MemoryError") and len(traj.steps) == 1
    assert_stored(store, traj)


async def test_a_smaller_tool_set_is_all_the_model_is_offered(task, grader) -> None:
    config = EpisodeConfig(tools=["read_file", "submit"])
    traj = await run_episode(task, ScriptedPolicy([("bash", {"command": "ls"}),
                                                   ("read_file", {"path": "stats.py"})]),
                             grader=grader, config=config)
    assert [t["function"]["name"] for t in json.loads(traj.tools)] == ["read_file", "submit"]
    assert "unknown tool 'bash'" in traj.steps[0].observation
    assert "def median" in traj.steps[1].observation
    with pytest.raises(ValueError, match="must include submit"):
        EpisodeConfig(tools=["bash"])
    with pytest.raises(ValueError, match="unknown tool"):
        EpisodeConfig(tools=["submit", "teleport"])


WRONG = "echo 'def median(xs): return 0' > stats.py"


@pytest.mark.parametrize("actions", [
    [("bash", {"command": f"{WRONG}; chmod 000 stats.py"}), ("read_file", {"path": "stats.py"})],
    [("bash", {"command": WRONG}), ("read_file", {"path": "x" * 300})],
    [("bash", {"command": f"{WRONG}; mkdir -p d; chmod 555 d"}),
     ("write_file", {"path": "d/a.py", "content": "x"})],
    [("bash", {"command": f"{WRONG}; head -c 300M /dev/zero > /tmp/fill; true"}),
     ("write_file", {"path": "a.py", "content": "x" * 100_000})],
    [("bash", {"command": f"{WRONG}; chmod 000 stats.py"}),
     ("str_replace", {"path": "stats.py", "old": "0", "new": "1"})],
], ids=["unreadable", "name-too-long", "read-only-dir", "disk-full", "unreadable-edit"])
async def test_what_the_model_did_to_its_files_is_its_error_not_the_sandboxs(task, grader,
                                                                             actions) -> None:
    """A file tool that fails because of what the model made of its own files (permissions,
    a name too long, a full disk) is an observation, and the episode is graded: never an
    infra error the filters would drop (red team, round twenty-five)."""
    traj = await run_episode(task, ScriptedPolicy([*actions, ("submit", {})]), grader=grader)
    assert traj.status == Status.OK, traj.error
    assert traj.reward is not None and traj.reward.reward == 0.0
    assert traj.steps[1].error


async def test_a_shell_killed_by_its_own_job_is_replaced(task, grader) -> None:
    """A background job that kills the session's shell between two commands: the next
    command runs in a new shell, and the episode is the model's (round twenty-five)."""
    policy = ScriptedPolicy([
        ("bash", {"command": "ls"}),
        ("bash", {"command": "(sleep 0.3; kill -9 $$) >/dev/null 2>&1 &"}),
        ("bash", {"command": "sleep 1; echo still here"}),
        ("bash", {"command": "kill -9 $$"}),
        ("bash", {"command": "echo and here"}),
        ("submit", {}),
    ])
    traj = await run_episode(task, policy, grader=grader)
    assert traj.status == Status.OK, traj.error
    assert traj.reward is not None and traj.reward.reward == 0.0
    assert any("and here" in step.observation for step in traj.steps)


@pytest.mark.parametrize("raw", [
    '{"name": "bash", "arguments": {"command": "echo \\ud800"}}',
    '{"name": "write_file", "arguments": {"path": "x.py", "content": "# \\udc00"}}',
    '{"name": "read_file", "arguments": {"path": "\\ud83d"}}',
    '{"name": "str_replace", "arguments": {"path": "stats.py", "old": "a", "new": "\\ud800"}}',
], ids=["bash", "write", "read", "edit"])
async def test_a_lone_surrogate_in_the_arguments_is_the_models_error(task, grader, raw) -> None:
    """JSON's ``\\ud800`` escapes decode to strings no file, path or shell takes: an
    observation, never an infra error (red team, round twenty-eight)."""
    traj = await run_episode(task, ScriptedPolicy([f"<tool_call>{raw}</tool_call>",
                                                   ("submit", {})]), grader=grader)
    assert traj.status == Status.OK, traj.error
    assert "not valid Unicode" in (traj.steps[0].error or ""), traj.steps[0].observation


@pytest.mark.slow
async def test_a_stopped_shell_times_out_even_a_long_command(task, grader) -> None:
    """A background job stops the session's shell; the next command is longer than a pipe
    holds, so writing it would wait forever: it times out as any command does, and the next
    command runs in a new shell (round twenty-eight: it was an env_timeout, not graded)."""
    policy = ScriptedPolicy([
        ("bash", {"command": "(sleep 0.3; kill -STOP $$) >/dev/null 2>&1 &"}),
        ("bash", {"command": "true # " + "A" * 200_000}),
        ("bash", {"command": "echo new shell"}),
        ("submit", {}),
    ], delay_s=1.0)  # the model thinks: the shell is stopped by the time the command comes
    traj = await run_episode(task, policy, grader=grader,
                             config=EpisodeConfig(command_timeout_s=3, env_grace_s=3))
    assert traj.status == Status.OK, traj.error
    assert traj.steps[1].timed_out
    assert "new shell" in traj.steps[2].observation


HOG = """python3 -c '
import os, threading, time
if os.fork(): os._exit(0)
os.setsid()
while True:
    try: threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
    except RuntimeError: time.sleep(0.005)
' >/dev/null 2>&1 & sleep 2; kill -9 $$"""


async def test_no_shell_for_want_of_processes_is_an_observation(task, grader) -> None:
    """What the commands left holds every process the sandbox may have, and the shell is
    gone: no new shell can start, which the model sees (round twenty-eight: infra_error)."""
    policy = ScriptedPolicy([("bash", {"command": HOG}), ("bash", {"command": "echo hi"}),
                             ("submit", {})])
    traj = await run_episode(task, policy, grader=grader,
                             config=EpisodeConfig(command_timeout_s=20, env_grace_s=5))
    assert traj.status == Status.OK, traj.error
    # no shell could start, or one did in a pid freed for a moment and could not fork, or the
    # command's own process could not start: each the model's to see
    seen = traj.steps[1].observation
    assert any(said in seen for said in ("no shell could start", "fork",
                                         "cannot start process")), seen


async def test_an_episode_cancelled_while_its_task_prepares_gives_its_sandbox_back(
        tmp_path: Path) -> None:
    """Cancelled during the task's setup step (here one that never ends), the episode never
    reaches the point where its caller would release its sandbox: it releases it itself."""
    from polling import until
    from tempering.sandbox import SandboxPool

    root = tmp_path / "slow-setup"
    (root / "workspace").mkdir(parents=True)
    (root / "workspace" / "m.py").write_text("X = 1\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_m.py").write_text("from m import X\n\ndef test_x():\n    assert X\n")
    (root / "instruction.md").write_text("Keep X.\n")
    (root / "task.toml").write_text('[task]\nid = "slow-setup"\n\n[setup]\ncommand = "sleep 60"\n')
    task = load_task(root)
    async with SandboxPool(max_instances=2) as pool:
        playing = asyncio.create_task(run_episode(
            task, ScriptedPolicy([("submit", {})]), pool=pool))
        await until(lambda: pool.stats().active == 1, timeout=60)
        await asyncio.sleep(0.5)  # the setup step is running now
        playing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await playing
        assert pool.stats().active == 0
