"""``tempering rollout`` end to end: the tiny model plays real episodes into a run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tempering.cli import main
from tempering.trajectory.store import TrajectoryStore

MEDIAN = Path(__file__).parents[2] / "examples" / "tasks" / "median"


def test_rollout_stores_a_group_per_task_and_reports(tmp_path: Path, tiny_model_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    code = main(["rollout", str(MEDIAN), "--policy", f"local:{tiny_model_dir}", "--samples", "3",
                 "--oversample", "1", "--max-turns", "2", "--max-tokens", "16", "--seed", "3",
                 "--run-dir", str(run)])
    out = capsys.readouterr().out
    assert code == 0
    assert "3 episodes" in out and f"tempering traj stats {run}" in out
    stored = list(TrajectoryStore(run).read())
    assert len(stored) in (3, 4) and len({t.group_id for t in stored}) == 1
    trajectories = [t for t in stored if t.error != "cancelled by the scheduler"]
    # the fourth, over-sampled, was cancelled, never began, or had already finished in the
    # same moment as the third (then it is stored like any finished episode); 3 are kept
    assert len(trajectories) in (3, 4) and len(stored) - len(trajectories) in (0, 1)
    assert all(t.reward is not None and t.steps and t.run_id == "run" for t in trajectories)
    assert all(s.completion_token_ids for t in trajectories for s in t.steps)
    config = json.loads((run / "rollout.json").read_text())
    assert config["samples"] == 3 and config["oversample"] == 1
    assert config["episode"]["max_turns"] == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["rollout", "no/such/task"], "neither a task directory, humaneval"),
    (["rollout", "switchboard:x"], "number of table layouts"),
    (["rollout", "humaneval:zero"], "must be a whole number"),
    (["rollout", str(MEDIAN), "--policy", "openai:http://127.0.0.1:9/v1"], "needs --model"),
    (["rollout", str(MEDIAN), "--policy", "gpt"], "unknown policy 'gpt'"),
    (["rollout", str(MEDIAN), "--samples", "0"], "must be at least 1"),
])
def test_rollout_rejects_bad_input_in_one_line(argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
