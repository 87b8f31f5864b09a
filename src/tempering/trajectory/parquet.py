"""The trajectory store's Parquet side: the Arrow schema, conversion, and durable part files.

    trajectories/part-<time_ns>-<pid>-<seq>.parquet     one row per trajectory, immutable

One row per trajectory, its steps a list of structs (``STEP_TYPE``), so DuckDB and any Parquet
reader see the whole episode without joins. The grade is stored twice: flat columns for SQL
(``reward``, ``tests_passed`` ...) and ``reward_json``, the whole ``RewardResult`` in the
journal's exact JSON, which is what ``from_table`` reads back. ``schema_version`` is also the
file's key-value metadata, so ``check_version`` refuses a part from a newer schema before
reading a row.

``write_part`` writes under a dot-prefixed temporary name, fsyncs, renames into place and
fsyncs the directory; readers only ever glob ``part-*.parquet``, so a writer killed mid-part
leaves a temporary file nobody reads, never a partial part. Names are unique per process and
call, so any number of processes write parts into one run directory.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from tempering.errors import StorageError
from tempering.reward.result import RewardResult
from tempering.trajectory.journal import fsync_dir, model_json
from tempering.trajectory.schema import SCHEMA_VERSION, Step, Trajectory

PARTS_DIR = "trajectories"
PART_GLOB = "part-*.parquet"
VERSION_KEY = b"tempering.schema_version"

_ids = pa.list_(pa.int64())
STEP_TYPE = pa.struct([
    ("index", pa.int64()), ("text", pa.string()), ("action", pa.string()),
    ("tool_call_id", pa.string()), ("arguments", pa.string()), ("observation", pa.string()),
    ("exit_code", pa.int64()), ("timed_out", pa.bool_()), ("error", pa.string()),
    ("policy_s", pa.float64()), ("action_s", pa.float64()), ("prompt_reused", pa.int64()),
    ("prompt_token_ids", _ids), ("completion_token_ids", _ids),
    ("logprobs", pa.list_(pa.float64())), ("loss_mask", _ids),
    ("weights_version", pa.int64()), ("inherited", pa.bool_()),
])
# The grade as flat columns for SQL, plus reward_json: the whole RewardResult, read back exactly.
REWARD_COLUMNS = ("reward", "tests_passed", "tests_total", "flags", "components", "reward_json")
SCHEMA = pa.schema([
    ("schema_version", pa.int32()), ("trajectory_id", pa.string()), ("run_id", pa.string()),
    ("task_id", pa.string()), ("group_id", pa.string()), ("sample_index", pa.int64()),
    ("parent_id", pa.string()), ("branch_step", pa.int64()), ("policy", pa.string()),
    ("system_prompt", pa.string()), ("instruction", pa.string()), ("tools", pa.string()),
    ("steps", pa.list_(STEP_TYPE)), ("status", pa.string()), ("finish_reason", pa.string()),
    ("error", pa.string()), ("reward", pa.float64()), ("tests_passed", pa.int64()),
    ("tests_total", pa.int64()), ("flags", pa.list_(pa.string())),
    ("components", pa.map_(pa.string(), pa.float64())), ("reward_json", pa.string()),
    ("marks", pa.list_(pa.string())), ("started_at", pa.float64()),
    ("duration_s", pa.float64()), ("grade_s", pa.float64()),
], metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()})

_seq = itertools.count()  # per process: two stores in one process never pick the same name


def to_table(trajectories: Iterable[Trajectory]) -> pa.Table:
    """Trajectories as an Arrow table of the store's schema (built column by column)."""
    ts = list(trajectories)
    steps = [s.__dict__ for t in ts for s in t.steps]
    offsets = pa.array(list(itertools.accumulate((len(t.steps) for t in ts), initial=0)),
                       pa.int32())
    grades = [t.reward for t in ts]

    def grade(get: Any) -> list[Any]:
        return [None if g is None else get(g) for g in grades]

    columns: dict[str, Any] = {
        "steps": pa.ListArray.from_arrays(offsets, pa.StructArray.from_arrays(
            [pa.array([s[f.name] for s in steps], f.type) for f in STEP_TYPE],
            fields=list(STEP_TYPE))),
        "status": [t.status.value for t in ts],
        "reward": grade(lambda g: g.reward),
        "tests_passed": grade(lambda g: g.tests_passed),
        "tests_total": grade(lambda g: g.tests_total),
        "flags": grade(lambda g: g.flags),
        "components": grade(lambda g: list(g.components.items())),
        "reward_json": grade(lambda g: model_json(g).decode()),
    }
    try:
        return pa.Table.from_arrays(
            [columns[f.name] if f.name == "steps" else pa.array(
                columns[f.name] if f.name in columns else [t.__dict__[f.name] for t in ts],
                f.type) for f in SCHEMA], schema=SCHEMA)
    except (pa.ArrowException, OverflowError) as exc:
        raise StorageError(f"cannot convert trajectories to Arrow: {exc}") from exc


def from_table(table: pa.Table | pa.RecordBatch) -> Iterator[Trajectory]:
    """Trajectories back from rows of the store's schema (the grade from ``reward_json``)."""
    for row in table.to_pylist():
        grade = row.get("reward_json")
        for name in REWARD_COLUMNS:
            row.pop(name, None)
        row["reward"] = None if grade is None else RewardResult.model_validate_json(grade)
        # Typed by the Parquet schema already: constructing skips re-validating every token.
        row["steps"] = [Step.model_construct(**s) for s in row["steps"]]
        yield Trajectory.model_validate(row)


def check_version(where: object, metadata: Mapping[bytes, bytes] | None) -> None:
    """Refuse a part written by a newer schema than this code knows."""
    raw = (metadata or {}).get(VERSION_KEY)
    if raw is None:
        raise StorageError(f"{where}: no {VERSION_KEY.decode()} metadata; not a part written "
                           "by tempering's trajectory store")
    if int(raw) > SCHEMA_VERSION:
        raise StorageError(f"{where}: trajectory schema_version {int(raw)} is newer than the "
                           f"{SCHEMA_VERSION} this tempering knows; upgrade tempering to read it")


def read_part(path: Path, columns: list[str] | None = None) -> pa.Table:
    """One part's rows (only ``columns``, if given), after checking its schema version."""
    try:
        part = pq.ParquetFile(path)
        check_version(path, part.schema_arrow.metadata)
        return part.read(columns=columns)
    except (OSError, pa.ArrowException) as exc:
        raise StorageError(f"{path}: unreadable part: {exc}") from exc


def write_part(parts_dir: Path, table: pa.Table) -> Path:
    """``table`` as a new part in ``parts_dir``, durable once this returns; its path."""
    name = f"part-{time.time_ns()}-{os.getpid()}-{next(_seq):06d}.parquet"
    final, temp = parts_dir / name, parts_dir / f".{name}.tmp"
    try:
        with open(temp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
        fsync_dir(parts_dir)
    except (OSError, pa.ArrowException) as exc:
        temp.unlink(missing_ok=True)
        raise StorageError(f"cannot write the part {final}: {exc}") from exc
    return final
