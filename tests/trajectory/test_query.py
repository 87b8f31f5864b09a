"""DuckDB over a real store on disk: the views, the statistics against numbers computed here in
Python, and ``tempering traj query`` / ``tempering traj stats`` through ``tempering.cli.main``."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

import pytest

from tempering.cli import main
from tempering.errors import StorageError
from tempering.reward.result import RewardResult
from tempering.trajectory.query import connect, query, stats
from tempering.trajectory.schema import Status, Step, Trajectory
from tempering.trajectory.store import RECOVERED_ERROR, TrajectoryStore

N = 300


def make(i: int) -> Trajectory:
    """Episode i: task a/b/c (150/100/50), a known status, reward, length and duration."""
    task = "a" if i < 150 else "b" if i < 250 else "c"
    status = (Status.INFRA_ERROR if i % 15 == 0 else Status.TAMPERED if i % 15 == 7
              else Status.OK)
    reward = None if status == Status.INFRA_ERROR else (
        0.0 if status == Status.TAMPERED else (i % 5) / 4)
    steps = [Step(index=j, action="bash" if j else "submit", exit_code=j % 2,
                  prompt_reused=2 * j, prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5],
                  logprobs=[-0.5, -0.5], weights_version=i % 3) for j in range(i % 4 + 1)]
    grade = None if reward is None else RewardResult(
        reward=reward, components={"tests": reward}, tests_passed=0, tests_total=1, flags=[])
    return Trajectory(task_id=task, run_id="r", group_id=f"g{i // 8}", status=status,
                      reward=grade, steps=steps, duration_s=float(i),
                      error=RECOVERED_ERROR if i in (15, 30) else None,
                      marks=["recovered"] if i % 10 == 3 else [])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Trajectory]]:
    path = tmp_path_factory.mktemp("query") / "run"
    trajectories = [make(i) for i in range(N)]
    with TrajectoryStore(path, flush_every=64) as store:  # several parts
        for t in trajectories:
            store.append(t)
    return path, trajectories


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (DuckDB's quantile_cont)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


def test_views_have_one_row_per_trajectory_and_per_step(run: tuple[Path, list[Trajectory]],
                                                        ) -> None:
    path, trajectories = run
    con = connect(path)
    columns = [row[0] for row in con.execute("DESCRIBE steps").fetchall()]
    assert columns == ["trajectory_id", "run_id", "task_id", "group_id", "status", "reward",
                       *Step.model_fields]
    assert con.execute("SELECT count(*) FROM trajectories").fetchone() == (N,)
    assert con.execute("SELECT count(*) FROM steps").fetchone() == (
        sum(len(t.steps) for t in trajectories),)
    t = trajectories[42]
    rows = con.execute("SELECT index, action, exit_code, prompt_reused, completion_token_ids "
                       "FROM steps WHERE trajectory_id = ? ORDER BY index",
                       [t.trajectory_id]).fetchall()
    assert rows == [(s.index, s.action, s.exit_code, s.prompt_reused, s.completion_token_ids)
                    for s in t.steps]


def test_an_aggregate_over_steps_matches_python(run: tuple[Path, list[Trajectory]]) -> None:
    path, trajectories = run
    columns, rows = query(path, "SELECT status, count(*) AS steps, avg(reward) AS reward "
                                "FROM steps GROUP BY status ORDER BY status")
    assert columns == ["status", "steps", "reward"]
    expected = []
    for status in sorted({t.status.value for t in trajectories}):
        mine = [t for t in trajectories if t.status == status]
        rewards = [t.reward_value for t in mine for _ in t.steps if t.reward_value is not None]
        expected.append((status, sum(len(t.steps) for t in mine),
                         statistics.fmean(rewards) if rewards else None))
    assert [r[:2] for r in rows] == [e[:2] for e in expected]
    for got, want in zip(rows, expected, strict=True):
        assert got[2] == pytest.approx(want[2])
    assert query(path, "SELECT trajectory_id FROM trajectories", limit=7)[1].__len__() == 7


def test_stats_match_python(run: tuple[Path, list[Trajectory]]) -> None:
    path, trajectories = run
    s = stats(path, top=2)
    graded = [t.reward_value for t in trajectories if t.reward_value is not None]
    lengths = [float(len(t.steps)) for t in trajectories]
    durations = [t.duration_s for t in trajectories]
    assert s.episodes == N and s.graded == len(graded) and s.tasks == 3
    assert s.by_status == {"ok": 260, "infra_error": 20, "tampered": 20}
    assert s.reward_mean == pytest.approx(statistics.fmean(graded))
    assert s.reward_std == pytest.approx(statistics.pstdev(graded))
    assert [(t.task_id, t.episodes) for t in s.per_task] == [("a", 150), ("b", 100)]
    a = [t.reward_value for t in trajectories[:150] if t.reward_value is not None]
    assert s.per_task[0].reward_mean == pytest.approx(statistics.fmean(a))
    assert s.per_task[0].reward_std == pytest.approx(statistics.pstdev(a))
    assert s.steps_mean == pytest.approx(statistics.fmean(lengths))
    assert s.steps_p50 == pytest.approx(quantile(lengths, 0.5))
    assert s.steps_p95 == pytest.approx(quantile(lengths, 0.95))
    assert s.duration_p50_s == pytest.approx(quantile(durations, 0.5))
    assert s.duration_p95_s == pytest.approx(quantile(durations, 0.95))
    n_steps = sum(len(t.steps) for t in trajectories)
    assert (s.prompt_tokens, s.completion_tokens) == (3 * n_steps, 2 * n_steps)
    assert s.prompt_tokens_reused == sum(st.prompt_reused for t in trajectories
                                         for st in t.steps)
    assert s.weights_versions == [0, 1, 2]
    assert s.journal_recovered == 2 and s.marks == {"recovered": N // 10}


def test_an_empty_store_has_the_views_and_no_rows(tmp_path: Path) -> None:
    TrajectoryStore(tmp_path).close()
    assert query(tmp_path, "SELECT count(*), avg(reward) FROM steps") == (
        ["count_star()", "avg(reward)"], [(0, None)])
    s = stats(tmp_path)
    assert (s.episodes, s.reward_mean, s.steps_p50, s.by_status, s.weights_versions) == (
        0, None, None, {}, [])


def test_read_where_selects_with_sql(run: tuple[Path, list[Trajectory]]) -> None:
    path, trajectories = run
    store = TrajectoryStore(path)
    got = list(store.read(where="task_id = 'c' AND reward >= 0.5"))
    assert got == [t for t in trajectories if t.task_id == "c" and (t.reward_value or 0) >= 0.5]
    with pytest.raises(StorageError, match="no_such_column"):
        list(store.read(where="no_such_column = 1"))


def test_bad_sql_and_a_missing_run_raise_storage_errors(tmp_path: Path,
                                                        run: tuple[Path, list[Trajectory]],
                                                        ) -> None:
    with pytest.raises(StorageError, match=r"query failed: .*(syntax|Parser)"):
        query(run[0], "SELEC status FROM steps")
    with pytest.raises(StorageError, match="query failed: .*nope"):
        query(run[0], "SELECT * FROM nope")
    with pytest.raises(StorageError, match="no such run directory"):
        connect(tmp_path / "absent")


# ---- the command line ----

def rounded(value: object) -> object:
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return [rounded(v) for v in value] if isinstance(value, list) else value


def test_cli_query_formats(run: tuple[Path, list[Trajectory]],
                           capsys: pytest.CaptureFixture[str]) -> None:
    path = str(run[0])
    sql = "SELECT task_id, count(*) AS n FROM trajectories GROUP BY task_id ORDER BY task_id"
    assert main(["traj", "query", path, sql, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"task_id": "a", "n": 150},
                                                   {"task_id": "b", "n": 100},
                                                   {"task_id": "c", "n": 50}]
    assert main(["traj", "query", path, sql, "--format", "csv"]) == 0
    assert list(csv.reader(io.StringIO(capsys.readouterr().out))) == [
        ["task_id", "n"], ["a", "150"], ["b", "100"], ["c", "50"]]
    assert main(["traj", "query", path, sql]) == 0
    table = capsys.readouterr().out
    assert "task_id" in table and "150" in table and "│ c" in table
    assert main(["traj", "query", path, "SELECT completion_token_ids, observation FROM steps",
                 "--format", "csv", "--limit", "2"]) == 0
    out, err = capsys.readouterr()
    assert list(csv.reader(io.StringIO(out)))[1:] == [["[4, 5]", ""], ["[4, 5]", ""]]
    assert "first 2 rows" in err


def test_cli_stats(run: tuple[Path, list[Trajectory]], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traj", "stats", str(run[0]), "--json"]) == 0
    # DuckDB sums floats in parallel: the same up to rounding, not bit for bit
    assert rounded(json.loads(capsys.readouterr().out)) == rounded(
        stats(run[0]).model_dump(mode="json"))
    assert main(["traj", "stats", str(run[0])]) == 0
    out = capsys.readouterr().out
    for text in ("episodes", "300 (ok 260, infra_error 20, tampered 20)", "weights versions",
                 "2 from a dead harness's journal", "recovered 30", "tasks by episodes"):
        assert text in out


def test_cli_errors_are_one_line(tmp_path: Path, run: tuple[Path, list[Trajectory]],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-run"
    for command in (["traj", "query", str(missing), "SELECT 1"], ["traj", "stats", str(missing)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"run directory {missing} does not exist" in err
    (tmp_path / "plain").mkdir()
    assert main(["traj", "stats", str(tmp_path / "plain")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["traj", "query", str(run[0]), "SELECT FROM WHERE"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tempering: error: query failed:") and "syntax" in err.lower()
