"""SQL over a run's trajectories (DuckDB), and the run's summary statistics.

``connect(run_dir)`` opens an in-memory DuckDB with two views over the parts present at that
moment (a part is immutable, so the snapshot is consistent; connect again to see newer ones):

- ``trajectories``: one row per trajectory, the Parquet columns as stored (``store.SCHEMA``);
- ``steps``: one row per step: ``trajectory_id, run_id, task_id, group_id, status, reward``
  (the episode's) followed by every ``Step`` field.

DuckDB reads only the columns a query names, straight from Parquet, in parallel; nothing is
loaded into Python. An empty run gives the same views with no rows. Parts written by a newer
schema than this code knows are refused before any query runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
from pydantic import BaseModel, ConfigDict

from tempering.errors import StorageError
from tempering.trajectory.schema import SCHEMA_VERSION
from tempering.trajectory.store import PART_GLOB, PARTS_DIR, RECOVERED_ERROR, SCHEMA, VERSION_KEY

_EPISODE_COLUMNS = "trajectory_id, run_id, task_id, group_id, status, reward"
# max_depth 2 unnests the list of steps and then each step's struct into columns, but not the
# token lists inside it.
_STEPS_VIEW = (f"CREATE TEMP VIEW steps AS SELECT {_EPISODE_COLUMNS}, "
               "UNNEST(steps, max_depth := 2) FROM trajectories")


def connect(run_dir: str | os.PathLike[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the ``trajectories`` and ``steps`` views."""
    run = Path(run_dir)
    if not run.is_dir():
        raise StorageError(f"{run}: no such run directory")
    parts = [str(p) for p in sorted((run / PARTS_DIR).glob(PART_GLOB))]
    con = duckdb.connect()
    try:
        if parts:
            versions = con.execute(
                "SELECT file_name, max(CAST(decode(value) AS INTEGER)) FROM "
                "parquet_kv_metadata(?) WHERE decode(key) = ? GROUP BY file_name",
                [parts, VERSION_KEY.decode()]).fetchall()
            newer = [(name, v) for name, v in versions if v > SCHEMA_VERSION]
            if newer:
                raise StorageError(f"{newer[0][0]}: trajectory schema_version {newer[0][1]} is "
                                   f"newer than the {SCHEMA_VERSION} this tempering knows; "
                                   "upgrade tempering to read it")
            # union_by_name: parts of older schema versions lack later columns (NULL there).
            con.read_parquet(parts, union_by_name=True).create_view("trajectories")
        else:
            con.from_arrow(SCHEMA.empty_table()).create_view("trajectories")
        con.execute(_STEPS_VIEW)
    except duckdb.Error as exc:
        con.close()
        raise StorageError(f"cannot open the trajectories of {run}: {exc}") from exc
    return con


def query(run_dir: str | os.PathLike[str], sql: str, *,
          limit: int | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one SQL statement; returns (column names, rows), at most ``limit`` rows."""
    con = connect(run_dir)
    try:
        cursor = con.execute(sql)
        columns = [d[0] for d in cursor.description or []]
        rows = cursor.fetchall() if limit is None else cursor.fetchmany(limit)
        return columns, rows
    except duckdb.Error as exc:
        raise StorageError(f"query failed: {exc}") from exc
    finally:
        con.close()


def select_batches(run_dir: str | os.PathLike[str], where: str) -> Iterator[Any]:
    """Arrow record batches of the ``trajectories`` rows where the SQL condition holds."""
    con = connect(run_dir)
    try:
        relation = con.sql(f"SELECT * FROM trajectories WHERE {where}")
        # DuckDB 2 renamed fetch_arrow_reader to to_arrow_reader.
        reader = getattr(relation, "to_arrow_reader", None) or relation.fetch_arrow_reader
        yield from reader()
    except duckdb.Error as exc:
        raise StorageError(f"where={where!r}: {exc}") from exc
    finally:
        con.close()


class TaskStats(BaseModel):
    model_config = ConfigDict(frozen=True)

    task_id: str
    episodes: int
    graded: int
    reward_mean: float | None
    reward_std: float | None


class TrajectoryStats(BaseModel):
    """A run at a glance. Standard deviations are population ones; None where undefined."""

    model_config = ConfigDict(frozen=True)

    episodes: int
    by_status: dict[str, int]
    """Episodes per status, most frequent first."""
    graded: int
    """Episodes with a reward."""
    reward_mean: float | None
    reward_std: float | None
    tasks: int
    per_task: list[TaskStats]
    """The tasks with the most episodes (``top`` of them)."""
    steps_mean: float | None
    steps_p50: float | None
    steps_p95: float | None
    prompt_tokens: int
    """New prompt tokens stored (a turn's prompt after the prefix it reuses)."""
    prompt_tokens_reused: int
    """Prompt tokens reused from the previous turn (prefix-cache hits, not stored again)."""
    completion_tokens: int
    weights_versions: list[int]
    """Every weights version that sampled a step."""
    duration_p50_s: float | None
    duration_p95_s: float | None
    journal_recovered: int
    """Episodes rebuilt from the journal of a harness that died (status infra_error)."""
    marks: dict[str, int]
    """Episodes per mark added by filters."""


def stats(run_dir: str | os.PathLike[str], *, top: int = 10) -> TrajectoryStats:
    """The summary of a run's stored trajectories (what ``tempering traj stats`` prints)."""
    con = connect(run_dir)
    try:
        def one(sql: str, *params: Any) -> tuple[Any, ...]:
            row = con.execute(sql, list(params)).fetchone()
            assert row is not None  # aggregates without GROUP BY always give one row
            return row

        def rows(sql: str, *params: Any) -> list[tuple[Any, ...]]:
            return con.execute(sql, list(params)).fetchall()

        episodes, graded, mean, std, s_mean, s50, s95, d50, d95, recovered, tasks = one(
            "SELECT count(*), count(reward), avg(reward), stddev_pop(reward), avg(len(steps)), "
            "quantile_cont(len(steps), 0.5), quantile_cont(len(steps), 0.95), "
            "quantile_cont(duration_s, 0.5), quantile_cont(duration_s, 0.95), "
            "count(*) FILTER (WHERE error = ?), count(DISTINCT task_id) FROM trajectories",
            RECOVERED_ERROR)
        prompt, reused, completion = one(
            "SELECT coalesce(sum(len(prompt_token_ids)), 0), coalesce(sum(prompt_reused), 0), "
            "coalesce(sum(len(completion_token_ids)), 0) FROM steps")
        return TrajectoryStats(
            episodes=episodes, graded=graded, reward_mean=mean, reward_std=std, tasks=tasks,
            by_status=dict(rows("SELECT status, count(*) AS n FROM trajectories "
                                "GROUP BY status ORDER BY n DESC, status")),
            per_task=[TaskStats(task_id=t, episodes=n, graded=g, reward_mean=m, reward_std=s)
                      for t, n, g, m, s in rows(
                          "SELECT task_id, count(*) AS n, count(reward), avg(reward), "
                          "stddev_pop(reward) FROM trajectories GROUP BY task_id "
                          "ORDER BY n DESC, task_id LIMIT ?", top)],
            steps_mean=s_mean, steps_p50=s50, steps_p95=s95,
            prompt_tokens=prompt, prompt_tokens_reused=reused, completion_tokens=completion,
            weights_versions=[v for (v,) in rows(
                "SELECT DISTINCT weights_version FROM steps ORDER BY 1")],
            duration_p50_s=d50, duration_p95_s=d95, journal_recovered=recovered,
            marks=dict(rows("SELECT mark, count(*) AS n FROM (SELECT UNNEST(list_distinct("
                            "marks)) AS mark FROM trajectories) GROUP BY mark "
                            "ORDER BY n DESC, mark")))
    except duckdb.Error as exc:
        raise StorageError(f"cannot compute the statistics of {run_dir}: {exc}") from exc
    finally:
        con.close()
