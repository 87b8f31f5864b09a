"""A store its owner never closed is flushed when the interpreter exits normally."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tempering.trajectory.store import TrajectoryStore

SCRIPT = """
import sys
from tempering.trajectory.schema import Trajectory
from tempering.trajectory.store import TrajectoryStore
store = TrajectoryStore(sys.argv[1], flush_every=1000)
for i in range(3):
    store.append(Trajectory(task_id=f"t{i}"))
# no close(): a Ray worker told to exit, a script that forgot
"""


def test_an_unclosed_store_is_flushed_at_exit(tmp_path: Path) -> None:
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-c", SCRIPT, str(run)], check=True, timeout=60)
    assert len(list((run / "trajectories").glob("part-*.parquet"))) == 1
    assert list((run / "journal").glob("*.jsonl")) == []
    assert sorted(t.task_id for t in TrajectoryStore(run, recover=False).read()) == \
        ["t0", "t1", "t2"]
