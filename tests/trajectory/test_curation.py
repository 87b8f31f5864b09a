"""`tempering traj filter` and `tempering traj export` end to end: a real store on disk in, a
new store, a report and export files out, all through ``tempering.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tempering.cli import main
from tempering.reward.result import RewardResult
from tempering.trajectory.schema import Status, Step, Trajectory
from tempering.trajectory.store import TrajectoryStore


def make(group: str, reward: float | None, *, status: Status = Status.OK,
         commands: tuple[str, ...] = ("ls",), failing: bool = False) -> Trajectory:
    steps = [Step(index=i, action="bash", tool_call_id=f"call_{i}",
                  arguments=json.dumps({"command": c}), observation=f"ran {c}",
                  exit_code=1 if failing and i == 0 else 0,
                  prompt_token_ids=[1, 2] if i == 0 else [3],
                  prompt_reused=0 if i == 0 else 1 + 2 * i,
                  completion_token_ids=[7], logprobs=[-0.5])
             for i, c in enumerate(commands)]
    steps.append(Step(index=len(steps), action="submit", tool_call_id="call_s", arguments="{}"))
    grade = None if reward is None else RewardResult(
        reward=reward, components={"tests": reward}, tests_passed=0, tests_total=1, flags=[])
    return Trajectory(task_id="median", group_id=group, instruction="Fix median().",
                      status=status, reward=grade, steps=steps, policy="scripted")


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, list[Trajectory]]:
    batch = [
        make("g1", None, status=Status.ENV_TIMEOUT),                  # infra: dropped
        make("g1", 1.0, commands=("pytest", "fix"), failing=True),    # recovered: marked
        make("g1", 0.0, commands=("cat",)),
        make("g1", 0.0, commands=("cat",)),                           # duplicate
        make("g2", 0.0, status=Status.TAMPERED),                      # tampered
        make("g2", 1.0, commands=("a",)),                             # alone in g2: flat
        make("g3", 0.0, status=Status.MODEL_ERROR, commands=("b",)),  # model failure: kept
        make("g3", 1.0, commands=("c",)),
    ]
    with TrajectoryStore(tmp_path / "run") as store:
        for t in batch:
            store.append(t)
    return tmp_path / "run", batch


def test_filter_writes_a_new_store_and_its_report(
        run: tuple[Path, list[Trajectory]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, batch = run
    out = tmp_path / "clean"
    assert main(["traj", "filter", str(run_dir), str(out)]) == 0
    table = capsys.readouterr().out
    for name in ("drop_infra", "drop_tampered", "dedup", "zero_variance", "mark_recovered",
                 "env_timeout 1", "duplicate 1", "+recovered 1"):
        assert name in table
    kept = {t.trajectory_id: t for t in TrajectoryStore(out).read()}
    expected = [batch[1], batch[2], batch[6], batch[7]]
    assert set(kept) == {t.trajectory_id for t in expected}
    assert kept[batch[1].trajectory_id].marks == ["recovered"]
    assert kept[batch[6].trajectory_id].status is Status.MODEL_ERROR
    saved = json.loads((out / "filter-report.json").read_text())
    assert saved["report"]["seen"] == 8 and saved["report"]["kept"] == 4
    assert [f["dropped"] for f in saved["report"]["filters"]] == [1, 1, 1, 1, 0]
    assert saved["options"]["only_recovered"] is False
    assert TrajectoryStore(run_dir).count() == 8  # the source is untouched

    # OUT must be new; RUN must be a run
    assert main(["traj", "filter", str(run_dir), str(out)]) == 2
    assert "already holds trajectories" in capsys.readouterr().err
    assert main(["traj", "filter", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()
    assert main(["traj", "filter", str(run_dir), str(tmp_path / "y"), "--max-steps", "-1"]) == 2
    assert "max_steps=-1" in capsys.readouterr().err


def test_filter_flags_change_the_pipeline(run: tuple[Path, list[Trajectory]], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, batch = run
    out = tmp_path / "fixes"
    assert main(["traj", "filter", str(run_dir), str(out), "--only-recovered", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kept"] == 1
    assert [t.trajectory_id for t in TrajectoryStore(out).read()] == [batch[1].trajectory_id]

    out = tmp_path / "everything"
    assert main(["traj", "filter", str(run_dir), str(out), "--keep-infra", "--keep-tampered",
                 "--keep-duplicates", "--keep-zero-variance", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kept"] == 8 and [f["name"] for f in report["filters"]] == ["mark_recovered"]

    # --where starts from a slice of the run (DuckDB over the store's columns)
    out = tmp_path / "graded"
    assert main(["traj", "filter", str(run_dir), str(out), "--where", "reward >= 1",
                 "--keep-zero-variance", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["seen"] == 3 and report["kept"] == 3


def test_export_each_format(run: tuple[Path, list[Trajectory]], tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, batch = run
    sft = tmp_path / "sft.jsonl"
    assert main(["traj", "export", str(run_dir), "--format", "sft", "--out", str(sft),
                 "--only-successful"]) == 0
    rows = [json.loads(line) for line in sft.read_text().splitlines()]
    assert sorted(r["metadata"]["trajectory_id"] for r in rows) == sorted(
        t.trajectory_id for t in batch if t.status is Status.OK and t.reward_value == 1.0)
    assert "wrote 3 trajectories" in capsys.readouterr().err

    atif = tmp_path / "atif"
    assert main(["traj", "export", str(run_dir), "--format", "atif", "--out", str(atif),
                 "--min-reward", "0.5"]) == 0
    docs = [json.loads(p.read_text()) for p in sorted(atif.glob("*.json"))]
    assert len(docs) == 3  # graded at 1.0; the tampered one scored 0
    assert all(d["schema_version"] == "ATIF-v1.4" for d in docs)

    datasets = pytest.importorskip("datasets")
    hf = tmp_path / "hf"
    assert main(["traj", "export", str(run_dir), "--format", "hf", "--out", str(hf)]) == 0
    ds = datasets.load_from_disk(str(hf))
    assert ds.num_rows == 8
    assert main(["traj", "export", str(run_dir), "--format", "hf", "--out", str(tmp_path / "e"),
                 "--min-reward", "2"]) == 2
    assert "none passed the selection" in capsys.readouterr().err
