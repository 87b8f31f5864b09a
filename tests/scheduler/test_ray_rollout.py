"""``tempering rollout --executor ray``: a Ray instance started for the run, episodes played on
its rollout worker, every trajectory in the run's Parquet store when the command returns."""

from __future__ import annotations

from pathlib import Path

import pytest

from tempering.cli import main
from tempering.trajectory.store import TrajectoryStore

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # slow: in CI's second run
MEDIAN = Path(__file__).parents[2] / "examples" / "tasks" / "median"


def test_rollout_on_a_ray_cluster_of_its_own(tmp_path: Path, tiny_model_dir: Path) -> None:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    run = tmp_path / "run"
    code = main(["rollout", str(MEDIAN), "--executor", "ray", "--policy",
                 f"local:{tiny_model_dir}", "--samples", "2", "--max-turns", "2",
                 "--max-tokens", "12", "--run-dir", str(run)])
    assert code == 0 and not ray.is_initialized()
    trajectories = list(TrajectoryStore(run, recover=False).read())  # flushed, not recovered
    assert len(trajectories) == 2 and all(t.reward is not None for t in trajectories)
    assert list((run / "journal").glob("*.jsonl")) == []
