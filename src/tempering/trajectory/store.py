"""The trajectory store: append-only Parquet under a run directory, with a crash journal.

    run_dir/trajectories/part-<time_ns>-<pid>-<seq>.parquet   one row per trajectory
    run_dir/journal/<trajectory_id>.jsonl                     one per episode in flight
    run_dir/journal/appended-<pid>-<seq>.jsonl                appended, not yet in a part

``TrajectoryStore`` only orchestrates: ``parquet.py`` owns the schema and writes parts durably
(temporary name, fsync, rename: never a partial part), ``journal.py`` owns the journal lines,
their owners' liveness and what a dead owner's journal recovers to. Names are unique per
process and call, so any number of processes append to one run.

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
owners' journals are never touched (``journal.py`` says when an owner counts as dead), and one
recovery runs at a time per run directory, under ``journal/.lock``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from pydantic import BaseModel

from tempering.errors import ConfigError, StorageError
from tempering.trajectory import journal
from tempering.trajectory.journal import JOURNAL_DIR, RECOVERED_ERROR
from tempering.trajectory.parquet import (
    PART_GLOB,
    PARTS_DIR,
    REWARD_COLUMNS,
    SCHEMA,
    STEP_TYPE,
    VERSION_KEY,
    check_version,
    from_table,
    read_part,
    to_table,
    write_part,
)
from tempering.trajectory.schema import EpisodeHeader, Step, Trajectory

# Re-exported: callers import these from here, where they lived before the split.
__all__ = ["JOURNAL_DIR", "PARTS_DIR", "PART_GLOB", "RECOVERED_ERROR", "REWARD_COLUMNS", "SCHEMA",
           "STEP_TYPE", "VERSION_KEY", "EpisodeHeader", "TrajectoryStore", "check_version",
           "from_table", "read_part", "to_table"]


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
        # an interpreter that exits normally (a Ray worker told to stop, a script that forgot
        # close()) writes its buffer as a part; a killed one leaves the journal to recovery
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)
        if recover:
            self.recover()

    # ---- writing ----

    def begin(self, trajectory_id: str,
              header: EpisodeHeader | Mapping[str, Any] | BaseModel) -> None:
        """Start journaling an episode; ``header`` is a mapping or any model with its fields."""
        head = EpisodeHeader.model_validate(header, from_attributes=True)
        line = journal.begin_line(trajectory_id, head)
        with self._lock:
            self._check_open()
            journal.create(self._journal(trajectory_id), line, sync=False)
            self._begun.add(trajectory_id)
            self._maybe_flush()

    def record_step(self, trajectory_id: str, step: Step) -> None:
        """Journal one step of a begun episode (to the OS; not fsynced, see the module doc)."""
        line = journal.step_line(step)
        with self._lock:
            self._check_open()
            if trajectory_id not in self._begun:
                raise StorageError(f"record_step({trajectory_id!r}): no episode begun under "
                                   "that id in this store; call begin() first")
            journal.write(self._journal(trajectory_id), line, sync=False)
            self._maybe_flush()

    def append(self, trajectory: Trajectory) -> None:
        """Store a finished trajectory; once this returns, it survives any crash."""
        self.append_many([trajectory])

    def append_many(self, trajectories: Iterable[Trajectory]) -> None:
        """Store several finished trajectories (a group that ended together) with one fsync."""
        items = list(trajectories)
        batch = {t.trajectory_id: t for t in items}
        lines = journal.end_lines(batch.values())
        with self._lock:
            self._check_open()
            again = [tid for tid in batch if tid in self._buffer]
            if again or len(batch) < len(items):
                raise StorageError(f"trajectory {(again or ['in this batch'])[0]} was already "
                                   "appended to this store (ids must be unique: new_id())")
            if not batch:
                return
            if self._appended is None:  # fsynced either way: the acknowledgement
                self._appended = journal.create_appended(self.journal_dir, lines)
            else:
                journal.write(self._appended, lines, sync=True)
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
            write_part(self.parts_dir, to_table(self._buffer.values()))
            self._buffer.clear()
            if self._appended is not None:
                self._appended.unlink(missing_ok=True)
                self._appended = None

    def close(self) -> None:
        """Flush and stop; episodes begun and not appended stay journaled (recovered later).

        Also run at interpreter exit for a store that was never closed."""
        with self._lock:
            if not self._closed:
                self.flush()
                self._closed = True
                atexit.unregister(self._at_exit)

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
            found, done = journal.recovered(self.journal_dir)
            if not done:
                return 0
            stored = set(self._stored_ids())
            new = [t for tid, t in found.items() if tid not in stored]
            if new:
                write_part(self.parts_dir, to_table(new))
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
        return journal.episode_path(self.journal_dir, tid)

    def _maybe_flush(self) -> None:
        if self._buffer and (len(self._buffer) >= self.flush_every
                             or time.monotonic() - self._oldest >= self.flush_interval_s):
            self.flush()

    def _remove_dead_temporaries(self) -> None:
        """Drop what writers killed mid-write left: ``.part-<ns>-<pid>-<seq>.parquet.tmp``
        and ``journal/.<pid>-<seq>.tmp``."""
        temps = [(p, p.name.split("-")[2]) for p in self.parts_dir.glob(".part-*.tmp")]
        temps += [(p, p.name[1:].split("-")[0]) for p in self.journal_dir.glob(".*.tmp")]
        for path, pid in temps:
            with contextlib.suppress(OSError, ValueError):
                if journal.pid_stale(int(pid), path.stat().st_mtime):
                    path.unlink()

    def _stored_ids(self) -> list[str]:
        return [tid for path in self.parts()
                for tid in read_part(path, ["trajectory_id"]).column(0).to_pylist()]


def _close_at_exit(ref: weakref.ref[TrajectoryStore]) -> None:
    store = ref()
    if store is not None and store._pid == os.getpid():  # noqa: SLF001 - not a forked copy
        with contextlib.suppress(Exception):
            store.close()
