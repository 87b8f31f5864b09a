"""The trajectory store: append-only Parquet under a run directory, with a crash journal.

    run_dir/trajectories/part-<time_ns>-<pid>-<seq>.parquet   one row per trajectory
    run_dir/journal/<trajectory_id>.jsonl                     one per episode in flight
    run_dir/journal/appended-<pid>-<seq>.jsonl                appended, not yet in a part

Parts are immutable. A part is written under a dot-prefixed temporary name, fsynced, renamed
into place and its directory fsynced; readers only ever glob ``part-*.parquet``, so a writer
killed mid-part leaves a temporary file nobody reads (``recover`` removes it), never a partial
part. Names are unique per process and call, so any number of processes append to one run.

Trajectories are buffered and written ``flush_every`` at a time (Parquet wants big row groups),
so the journal is what makes ``append`` safe. ``begin`` creates ``<id>.jsonl`` with a header
naming its owner (pid, process start time, boot id) and what the episode is; ``record_step``
appends one line per step, written to the OS but not fsynced (an fsync per step would cost more
than the step budget; a killed process loses nothing the OS has, only a machine crash can lose
those lines). ``append`` writes an ``end`` line holding the whole trajectory to this store's
``appended-*`` journal and fsyncs it: that fsync is the acknowledgement, one per append, and
once ``append`` returns the trajectory survives a crash of the process or of the machine. The
episode's own journal is then dropped, and the ``appended-*`` one once its part is durable.

``recover`` (run by the constructor) turns journals of dead owners into a part: ``end`` lines
give trajectories as appended; an episode journal without one gives an ``infra_error``
trajectory with the steps recorded so far. Ids already in a part are skipped (the owner may have
died between writing its part and deleting its journal), so nothing is counted twice. Live
owners' journals are never touched; an owner is dead when its pid is gone, reused by a younger
process, or from an earlier boot (so writers sharing a run directory share a pid namespace).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import math
import os
import threading
import time
import typing
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pydantic_core
from pydantic import BaseModel, ConfigDict, ValidationError

from tempering.errors import ConfigError, StorageError
from tempering.reward.result import RewardResult
from tempering.trajectory.schema import SCHEMA_VERSION, Status, Step, Trajectory

PARTS_DIR = "trajectories"
JOURNAL_DIR = "journal"
PART_GLOB = "part-*.parquet"
VERSION_KEY = b"tempering.schema_version"
RECOVERED_ERROR = "harness died mid-episode (recovered from its journal)"

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


class EpisodeHeader(BaseModel):
    """What ``begin`` journals about an episode: enough to rebuild it if the harness dies."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    run_id: str = ""
    group_id: str = ""
    sample_index: int = 0
    parent_id: str | None = None
    branch_step: int | None = None
    policy: str = ""
    system_prompt: str = ""
    instruction: str = ""
    tools: str = ""
    started_at: float = 0.0


# ---- Arrow: one row per trajectory ----

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
        "reward_json": grade(lambda g: _model_json(g).decode()),
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
    try:
        part = pq.ParquetFile(path)
        check_version(path, part.schema_arrow.metadata)
        return part.read(columns=columns)
    except (OSError, pa.ArrowException) as exc:
        raise StorageError(f"{path}: unreadable part: {exc}") from exc


# ---- journal lines ----

@cache
def _float_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of a model whose values can hold a float, however deep."""
    def may(tp: Any) -> bool:
        return tp is float or (isinstance(tp, type) and issubclass(tp, BaseModel)) or any(
            may(arg) for arg in typing.get_args(tp))
    return tuple(name for name, f in cls.model_fields.items() if may(f.annotation))


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, BaseModel):
        return all(_finite(getattr(value, name)) for name in _float_fields(type(value)))
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list) and value:
        if isinstance(value[0], float):  # list[float]: one C-speed sum is non-finite iff any is
            return math.isfinite(sum(value))  # (or it overflows: then the slow path, still right)
        return all(_finite(v) for v in value)
    return True


def _model_json(model: BaseModel) -> bytes:
    # pydantic writes inf and nan as null, which would not validate back; -inf log-probs are
    # real data. The fast path is taken when every float is finite.
    if _finite(model):
        return model.model_dump_json().encode()
    return pydantic_core.to_json(model.model_dump(), inf_nan_mode="constants")


def _line(kind: str, **fields: Any) -> bytes:
    return pydantic_core.to_json({"kind": kind, **fields}) + b"\n"


def _read_dead_journal(path: Path) -> tuple[dict[str, Any], list[Step],
                                            list[Trajectory]] | None:
    """(header, steps, ended trajectories) of a dead owner's journal; None for a live owner's
    (only its header is read) or one whose header is unreadable."""
    with open(path, "rb") as f:
        try:  # journals are linked into place whole: only a machine crash tears a header
            head = pydantic_core.from_json(f.readline())
        except ValueError:
            return None
        if (not isinstance(head, dict) or not {"kind", "id", "owner"} <= head.keys()
                or _owner_alive(head["owner"])):
            return None
        body = f.read()
    steps, ends = [], []
    for raw in body.split(b"\n"):
        with contextlib.suppress(ValueError, KeyError, TypeError):  # ValidationError too
            rec = pydantic_core.from_json(raw, allow_inf_nan=True)  # a torn line raises
            if rec["kind"] == "step":
                steps.append(Step.model_validate(rec["step"]))
            elif rec["kind"] == "end":
                ends.append(Trajectory.model_validate(rec["trajectory"]))
    return head, steps, ends


def _rebuilt(head: dict[str, Any], steps: list[Step], mtime: float) -> Trajectory:
    """The trajectory of an episode whose harness died: what its journal recorded."""
    header = EpisodeHeader.model_validate(head["header"])
    return Trajectory(trajectory_id=head["id"], **header.model_dump(), steps=steps,
                      status=Status.INFRA_ERROR, finish_reason="error", error=RECOVERED_ERROR,
                      duration_s=max(0.0, mtime - header.started_at) if header.started_at
                      else 0.0)


# ---- owners: which process wrote a file, and is it still alive ----

@cache
def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


@cache
def _boot_time() -> float:
    with open("/proc/stat") as f:
        return float(next(line for line in f if line.startswith("btime")).split()[1])


def _start_ticks(pid: int) -> int | None:
    """Start time of a live process (clock ticks since boot); None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _owner() -> dict[str, Any]:
    pid = os.getpid()  # per call: a forked child is another owner
    return {"pid": pid, "start": _start_ticks(pid), "boot_id": _boot_id()}


def _owner_alive(owner: Any) -> bool:
    try:
        if owner.get("boot_id") != _boot_id():
            return False
        start = _start_ticks(int(owner["pid"]))
    except (AttributeError, KeyError, TypeError, ValueError):
        return True  # an owner we cannot read is not ours to judge: leave its file alone
    return start is not None and owner.get("start") in (None, start)


def _pid_stale(pid: int, mtime: float) -> bool:
    """True if no live process with this pid can have written a file modified at ``mtime``."""
    start = _start_ticks(pid)
    return start is None or mtime < _boot_time() + start / os.sysconf("SC_CLK_TCK")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by close
        yield
    finally:
        os.close(fd)


class TrajectoryStore:
    """Append-only trajectory storage for one run directory (see the module docstring).

    Thread-safe and synchronous: ``begin`` and ``record_step`` cost tens of microseconds,
    ``append`` one fsync, and every ``flush_every``-th call (or the first after
    ``flush_interval_s``) a part write; call it through ``asyncio.to_thread`` if that pause
    matters to an event loop. Reads (``read``, ``count``, ``ids``) flush this store's buffer
    first, then see every part on disk, whoever wrote it.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, flush_every: int = 256,
                 flush_interval_s: float = 5.0, recover: bool = True) -> None:
        if flush_every < 1:
            raise ConfigError(f"flush_every={flush_every}: must be at least 1")
        if not flush_interval_s > 0:
            raise ConfigError(f"flush_interval_s={flush_interval_s}: must be positive")
        self.run_dir = Path(run_dir)
        self.parts_dir = self.run_dir / PARTS_DIR
        self.journal_dir = self.run_dir / JOURNAL_DIR
        try:
            self.parts_dir.mkdir(parents=True, exist_ok=True)
            self.journal_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the run directory {self.run_dir}: {exc}") from exc
        self.flush_every, self.flush_interval_s = flush_every, flush_interval_s
        self._lock = threading.RLock()
        self._buffer: dict[str, Trajectory] = {}
        self._oldest = 0.0  # monotonic time the oldest buffered trajectory arrived
        self._appended: Path | None = None  # journal of the buffered trajectories
        self._begun: set[str] = set()
        self._closed = False
        self._pid = os.getpid()
        if recover:
            self.recover()

    # ---- writing ----

    def begin(self, trajectory_id: str,
              header: EpisodeHeader | Mapping[str, Any] | BaseModel) -> None:
        """Start journaling an episode; ``header`` is a mapping or any model with its fields."""
        head = EpisodeHeader.model_validate(header, from_attributes=True)
        line = _line("begin", id=trajectory_id, owner=_owner(), header=head.model_dump())
        with self._lock:
            self._check_open()
            self._create(self._journal(trajectory_id), line, sync=False)
            self._begun.add(trajectory_id)
            self._maybe_flush()

    def record_step(self, trajectory_id: str, step: Step) -> None:
        """Journal one step of a begun episode (to the OS; not fsynced, see the module doc)."""
        line = b'{"kind":"step","step":' + _model_json(step) + b"}\n"
        with self._lock:
            self._check_open()
            if trajectory_id not in self._begun:
                raise StorageError(f"record_step({trajectory_id!r}): no episode begun under "
                                   "that id in this store; call begin() first")
            self._write(self._journal(trajectory_id), line, sync=False)
            self._maybe_flush()

    def append(self, trajectory: Trajectory) -> None:
        """Store a finished trajectory; once this returns, it survives any crash."""
        self.append_many([trajectory])

    def append_many(self, trajectories: Iterable[Trajectory]) -> None:
        """Store several finished trajectories (a group that ended together) with one fsync."""
        items = list(trajectories)
        batch = {t.trajectory_id: t for t in items}
        lines = b"".join(b'{"kind":"end","trajectory":' + _model_json(t) + b"}\n"
                         for t in batch.values())
        with self._lock:
            self._check_open()
            again = [tid for tid in batch if tid in self._buffer]
            if again or len(batch) < len(items):
                raise StorageError(f"trajectory {(again or ['in this batch'])[0]} was already "
                                   "appended to this store (ids must be unique: new_id())")
            if not batch:
                return
            if self._appended is None:
                name = f"appended-{os.getpid()}-{next(_seq):06d}"
                path = self.journal_dir / f"{name}.jsonl"
                self._create(path, _line("appended", id=name, owner=_owner()) + lines, sync=True)
                self._appended = path
            else:
                self._write(self._appended, lines, sync=True)  # the acknowledgement
            for tid in batch.keys() & self._begun:  # their end lines now stand for them
                self._begun.discard(tid)
                self._journal(tid).unlink(missing_ok=True)
            if not self._buffer:
                self._oldest = time.monotonic()
            self._buffer.update(batch)
            self._maybe_flush()

    def flush(self) -> None:
        """Write the buffered trajectories as one durable part, then drop their journal."""
        with self._lock:
            if not self._buffer:
                return
            self._check_open()
            self._write_part(to_table(self._buffer.values()))
            self._buffer.clear()
            if self._appended is not None:
                self._appended.unlink(missing_ok=True)
                self._appended = None

    def close(self) -> None:
        """Flush and stop; episodes begun and not appended stay journaled (recovered later)."""
        with self._lock:
            if not self._closed:
                self.flush()
                self._closed = True

    def __enter__(self) -> TrajectoryStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---- reading ----

    def parts(self) -> list[Path]:
        """The complete parts on disk, oldest first."""
        return sorted(self.parts_dir.glob(PART_GLOB))

    def read(self, *, where: str | None = None) -> Iterator[Trajectory]:
        """Every stored trajectory, part by part; ``where`` is a DuckDB SQL condition on the
        ``trajectories`` view's columns, e.g. ``"status = 'ok' AND reward > 0.5"``."""
        self.flush()
        if where is None:
            return (t for path in self.parts() for t in from_table(read_part(path)))
        from tempering.trajectory.query import select_batches

        return (t for batch in select_batches(self.run_dir, where) for t in from_table(batch))

    def count(self) -> int:
        """How many trajectories are stored (from the parts' footers: no data is read)."""
        self.flush()
        total = 0
        for path in self.parts():
            try:
                meta = pq.read_metadata(path)
            except (OSError, pa.ArrowException) as exc:
                raise StorageError(f"{path}: unreadable part: {exc}") from exc
            check_version(path, meta.metadata)
            total += meta.num_rows
        return total

    def ids(self) -> list[str]:
        """The stored trajectory ids, part by part (a duplicate would show twice)."""
        self.flush()
        return self._stored_ids()

    # ---- recovery ----

    def recover(self) -> int:
        """Store what dead writers left in their journals; returns how many were recovered."""
        with self._lock, _exclusive(self.journal_dir / ".lock"):
            self._remove_dead_temporaries()
            ended: dict[str, Trajectory] = {}
            rebuilt: dict[str, Trajectory] = {}
            done: list[Path] = []
            for path in sorted(self.journal_dir.glob("*.jsonl")):
                try:
                    entry, mtime = _read_dead_journal(path), path.stat().st_mtime
                except FileNotFoundError:
                    continue  # its live owner just dropped it
                if entry is None:
                    continue  # a live owner's (not ours to touch), or unreadable
                head, steps, ends = entry
                if head["kind"] == "begin":
                    try:
                        rebuilt[head["id"]] = _rebuilt(head, steps, mtime)
                    except (KeyError, ValidationError):
                        continue  # a header we cannot read: keep the file for a person
                ended.update((t.trajectory_id, t) for t in ends)
                done.append(path)
            if not done:
                return 0
            found = {**rebuilt, **ended}  # an end line beats a rebuilt episode
            stored = set(self._stored_ids())
            new = [t for tid, t in found.items() if tid not in stored]
            if new:
                self._write_part(to_table(new))
            for path in done:
                path.unlink(missing_ok=True)
            return len(new)

    # ---- internals ----

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"the trajectory store of {self.run_dir} is closed")
        if os.getpid() != self._pid:  # a forked copy would store its parent's buffer again
            raise StorageError("this TrajectoryStore was opened by process "
                               f"{self._pid}; open a new one in process {os.getpid()}")

    def _journal(self, tid: str) -> Path:
        if not tid or "/" in tid or tid.startswith((".", "appended-")):
            raise StorageError(f"trajectory id {tid!r} cannot name a journal file; use new_id()")
        return self.journal_dir / f"{tid}.jsonl"

    def _create(self, path: Path, data: bytes, *, sync: bool) -> None:
        # Written aside and linked into place, so a journal always starts with a whole header
        # (a begin header carries the prompts and tools: a kill mid-write could tear it).
        # link(), unlike rename(), refuses to replace: two episodes cannot share an id.
        temp = self.journal_dir / f".{os.getpid()}-{next(_seq)}.tmp"
        try:
            with open(temp, "wb") as f:
                f.write(data)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
            try:
                os.link(temp, path)
            except FileExistsError:
                raise StorageError(f"{path} exists: trajectory id {path.stem} is already in "
                                   "use (by another episode or store)") from None
            finally:
                temp.unlink(missing_ok=True)
            if sync:
                _fsync_dir(self.journal_dir)  # a new name is durable once its directory is
        except OSError as exc:
            raise StorageError(f"cannot write the journal {path}: {exc}") from exc

    def _write(self, path: Path, data: bytes, *, sync: bool) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(f"cannot write the journal {path}: {exc}") from exc

    def _maybe_flush(self) -> None:
        if self._buffer and (len(self._buffer) >= self.flush_every
                             or time.monotonic() - self._oldest >= self.flush_interval_s):
            self.flush()

    def _write_part(self, table: pa.Table) -> None:
        name = f"part-{time.time_ns()}-{os.getpid()}-{next(_seq):06d}.parquet"
        final, temp = self.parts_dir / name, self.parts_dir / f".{name}.tmp"
        try:
            with open(temp, "wb") as f:
                pq.write_table(table, f, compression="zstd")
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, final)
            _fsync_dir(self.parts_dir)
        except (OSError, pa.ArrowException) as exc:
            temp.unlink(missing_ok=True)
            raise StorageError(f"cannot write the part {final}: {exc}") from exc

    def _remove_dead_temporaries(self) -> None:
        """Drop what writers killed mid-write left: ``.part-<ns>-<pid>-<seq>.parquet.tmp``
        and ``journal/.<pid>-<seq>.tmp``."""
        temps = [(p, p.name.split("-")[2]) for p in self.parts_dir.glob(".part-*.tmp")]
        temps += [(p, p.name[1:].split("-")[0]) for p in self.journal_dir.glob(".*.tmp")]
        for path, pid in temps:
            with contextlib.suppress(OSError, ValueError):
                if _pid_stale(int(pid), path.stat().st_mtime):
                    path.unlink()

    def _stored_ids(self) -> list[str]:
        return [tid for path in self.parts()
                for tid in read_part(path, ["trajectory_id"]).column(0).to_pylist()]
