"""A harness killed mid-episode loses nothing: its journal becomes an infra_error trajectory.

The harness is a real process in a real memory cgroup; at its third turn it leaks memory until
the kernel's OOM killer ends it with SIGKILL, as happens to rollout workers in production. The
next store opened on the run directory finds the dead owner's journal and recovers the episode
with every step it took.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tempering.trajectory.schema import Status
from tempering.trajectory.store import TrajectoryStore

MEDIAN = Path(__file__).parents[2] / "examples" / "tasks" / "median"

HARNESS = textwrap.dedent("""
    import asyncio, sys
    from tempering.sandbox.cgroup import enter_guard
    from tempering.agent import run_episode
    from tempering.policy.scripted import ScriptedPolicy
    from tempering.tasks import load_task
    from tempering.trajectory.store import TrajectoryStore

    class Leaky(ScriptedPolicy):
        async def generate(self, request):
            if sum(m.role == "assistant" for m in request.messages) == 2:
                hog = []
                while True:  # a leak in the harness: the kernel ends it
                    hog.append(b"x" * (32 << 20))
            return await super().generate(request)

    assert enter_guard(pids=400, memory_mb=int(sys.argv[3])) is not None
    store = TrajectoryStore(sys.argv[2])
    policy = Leaky([("bash", {"command": "echo one"}), ("bash", {"command": "echo two"})])
    asyncio.run(run_episode(load_task(sys.argv[1]), policy, recorder=store, run_id="crash"))
    print("the harness survived", flush=True)
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a memory cgroup")
def test_harness_killed_by_the_oom_killer_leaves_its_episode(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", HARNESS, str(MEDIAN), str(run), "400"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert "survived" not in proc.stdout
    store = TrajectoryStore(run)
    [trajectory] = list(store.read())
    assert trajectory.status == Status.INFRA_ERROR and trajectory.run_id == "crash"
    assert trajectory.error and "journal" in trajectory.error
    assert [s.observation.strip() for s in trajectory.steps] == ["one", "two"]
    assert trajectory.task_id == "median" and trajectory.reward is None
    assert TrajectoryStore(run).count() == 1  # recovered once, never twice
