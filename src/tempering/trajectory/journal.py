"""The trajectory store's crash journal: JSON lines that outlive the process that wrote them.

    journal/<trajectory_id>.jsonl           one per episode in flight: begin header, step lines
    journal/appended-<pid>-<seq>.jsonl      appended header, then one end line per trajectory

Every file opens with a header line naming its owner (pid, process start time, boot id) and is
linked into place whole, so only a machine crash can tear a header. Later lines are appended:
``step`` lines go to the OS unsynced (a killed process loses none of them; an fsync per step
would cost more than the step), ``end`` lines hold a whole trajectory and are fsynced, which is
what acknowledges an append. A line torn by a crash fails to parse and is skipped.

Lines are JSON that keeps inf and nan (``model_json``): -inf log-probs are real data, and
pydantic's default would write them as null, which does not validate back.

An owner is dead when its pid is gone, reused by a younger process, or from an earlier boot (so
writers sharing a run directory share a pid namespace); an owner that cannot be read counts as
alive, so its file is left for a person. ``recovered`` reads only dead owners' journals and
turns them into trajectories: ``end`` lines as appended, an episode journal without one as an
``infra_error`` trajectory holding the steps recorded so far. No pyarrow here: the Parquet side
is ``parquet.py``, and ``store.py`` decides when each runs.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import typing
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pydantic_core
from pydantic import BaseModel, ValidationError

from tempering.errors import StorageError
from tempering.trajectory.schema import EpisodeHeader, Status, Step, Trajectory

JOURNAL_DIR = "journal"
RECOVERED_ERROR = "harness died mid-episode (recovered from its journal)"

_seq = itertools.count()  # per process: two stores in one process never pick the same name


# ---- lines ----

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


def model_json(model: BaseModel) -> bytes:
    """``model`` as JSON that validates back exactly, inf and nan included."""
    # pydantic writes inf and nan as null, which would not validate back; -inf log-probs are
    # real data. The fast path is taken when every float is finite.
    try:
        if _finite(model):
            return model.model_dump_json().encode()
        return pydantic_core.to_json(model.model_dump(), inf_nan_mode="constants")
    except pydantic_core.PydanticSerializationError:  # a lone surrogate: bytes of a name
        return pydantic_core.to_json(_text(model.model_dump()),  # that was not UTF-8
                                     inf_nan_mode="constants")


def _text(value: Any) -> Any:
    """``value`` with every string made UTF-8: a lone surrogate written as ``\\udcNN``."""
    if isinstance(value, str):
        return value.encode(errors="backslashreplace").decode()
    if isinstance(value, dict):
        return {_text(k): _text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_text(v) for v in value]
    return value


def _line(kind: str, **fields: Any) -> bytes:
    return pydantic_core.to_json({"kind": kind, **fields}) + b"\n"


def begin_line(trajectory_id: str, header: EpisodeHeader) -> bytes:
    """The header of an episode's journal, owned by the calling process."""
    return _line("begin", id=trajectory_id, owner=owner(), header=header.model_dump())


def step_line(step: Step) -> bytes:
    return b'{"kind":"step","step":' + model_json(step) + b"}\n"


def end_lines(trajectories: Iterable[Trajectory]) -> bytes:
    return b"".join(b'{"kind":"end","trajectory":' + model_json(t) + b"}\n"
                    for t in trajectories)


# ---- files ----

def episode_path(journal_dir: Path, trajectory_id: str) -> Path:
    """The journal of one episode; refuses ids that would name another file."""
    tid = trajectory_id
    if not tid or "/" in tid or tid.startswith((".", "appended-")):
        raise StorageError(f"trajectory id {tid!r} cannot name a journal file; use new_id()")
    return journal_dir / f"{tid}.jsonl"


def create_appended(journal_dir: Path, lines: bytes) -> Path:
    """A new, fsynced ``appended-<pid>-<seq>.jsonl`` holding its header and ``lines``."""
    name = f"appended-{os.getpid()}-{next(_seq):06d}"
    path = journal_dir / f"{name}.jsonl"
    create(path, _line("appended", id=name, owner=owner()) + lines, sync=True)
    return path


def create(path: Path, data: bytes, *, sync: bool) -> None:
    """A new journal holding ``data``; ``StorageError`` if ``path`` exists."""
    # Written aside and linked into place, so a journal always starts with a whole header
    # (a begin header carries the prompts and tools: a kill mid-write could tear it).
    # link(), unlike rename(), refuses to replace: two episodes cannot share an id.
    temp = path.parent / f".{os.getpid()}-{next(_seq)}.tmp"
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
            fsync_dir(path.parent)  # a new name is durable once its directory is
    except OSError as exc:
        raise StorageError(f"cannot write the journal {path}: {exc}") from exc


def write(path: Path, data: bytes, *, sync: bool) -> None:
    """Append ``data`` to an existing journal; with ``sync``, durable once this returns."""
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


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def owner() -> dict[str, Any]:
    """The calling process, as a journal header names it."""
    pid = os.getpid()  # per call: a forked child is another owner
    return {"pid": pid, "start": _start_ticks(pid), "boot_id": _boot_id()}


def owner_alive(record: Any) -> bool:
    """Whether the process an ``owner()`` record names (as read back from a header) lives."""
    try:
        if record.get("boot_id") != _boot_id():
            return False
        start = _start_ticks(int(record["pid"]))
    except (AttributeError, KeyError, TypeError, ValueError):
        return True  # an owner we cannot read is not ours to judge: leave its file alone
    return start is not None and record.get("start") in (None, start)


def pid_stale(pid: int, mtime: float) -> bool:
    """True if no live process with this pid can have written a file modified at ``mtime``."""
    start = _start_ticks(pid)
    return start is None or mtime < _boot_time() + start / os.sysconf("SC_CLK_TCK")


# ---- recovery ----

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
                or owner_alive(head["owner"])):
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


def recovered(journal_dir: Path) -> tuple[dict[str, Trajectory], list[Path]]:
    """What dead owners' journals hold, by id, and those journals (to drop once it is stored).

    Live owners' journals, and episode journals whose header cannot be read, are not listed:
    the first are not ours to touch, the second are kept for a person.
    """
    ended: dict[str, Trajectory] = {}
    rebuilt: dict[str, Trajectory] = {}
    done: list[Path] = []
    for path in sorted(journal_dir.glob("*.jsonl")):
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
    return {**rebuilt, **ended}, done  # an end line beats a rebuilt episode
