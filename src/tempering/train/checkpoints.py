"""A run's durable state: checkpoints, and the log of groups handed to the replay buffer.

    runs/<name>/checkpoints/step-000012/model/      Learner.save: weights, optimizer, version
    runs/<name>/checkpoints/step-000012/state.json  step, wall time, buffer, counters
    runs/<name>/checkpoints/good/                   Learner.save of the last good weights
    runs/<name>/groups.jsonl                        one fsynced line per group put

A checkpoint is written to a hidden temporary directory, fsynced and renamed into place, so a
``step-*`` directory is always complete; the newest one is what a run resumes from.

What "no acknowledged sample is lost" means here: a group is acknowledged when its line is in
``groups.jsonl`` (fsynced before the buffer sees it; its trajectories were acknowledged by the
store before that). A checkpoint records how many lines the log had when it was taken, and the
buffer's contents then. On resume, every group logged after that line is read back from the
trajectory store and handed to the buffer again: whatever the killed run had buffered, or even
trained on in a step whose checkpoint never completed, is trained on by the resumed run (unless
the staleness bound now refuses it, which is counted like any other stale drop).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from tempering.errors import StorageError

CHECKPOINTS_DIR = "checkpoints"
GROUPS_LOG = "groups.jsonl"
STATE_FILE = "state.json"
MODEL_DIR = "model"
GOOD_DIR = "good"
"""The last good weights (the best mean reward so far), which a rollback returns to; not a
``step-*`` checkpoint, so never resumed from nor pruned."""


class RunState(BaseModel):
    """The trainer's counters at a checkpoint (the learner and buffer save their own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int
    version: int
    wall_s: float
    """Run time so far, summed over every process that worked on the run."""
    groups_logged: int
    """Lines in ``groups.jsonl`` when the checkpoint was taken."""
    idle_s: float
    """Learner wait summed since its first batch (for the cumulative idle fraction)."""
    busy_from_s: float
    """``wall_s`` when the learner got its first batch."""
    tasks_drawn: int
    """Groups started so far: the task sampler is reseeded from it."""
    buffer: dict[str, Any]
    rollbacks: int = 0
    """Rollbacks after a collapse so far."""
    lr_scale: float = 1.0
    """What the rollbacks have multiplied the learning rate by."""
    kl_lr_scale: float = 1.0
    """What ``learner.target_kl`` has multiplied it by."""
    best_reward: float | None = None
    """The best mean reward the collapse detector has seen (``collapse.py``)."""
    entropy_base: float | None = None
    reward_base: float | None = None
    good_step: int | None = None
    """The step at which the good checkpoint was judged good (0: the starting model)."""
    good_reward: float | None = None
    """The mean reward it was judged good at (``CollapseDetector.good``)."""
    good_version: int | None = None
    """The version of the weights the good checkpoint holds: those that sampled its steps."""


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of the run, or None."""
    found = sorted(p for p in (run_dir / CHECKPOINTS_DIR).glob("step-*")
                   if (p / STATE_FILE).is_file())
    return found[-1] if found else None


def write(run_dir: Path, state: RunState, save_model: Any, *, keep: int) -> Path:
    """Write checkpoint ``state.step``: ``save_model(dir)`` saves the learner into ``dir``.
    Older checkpoints beyond the newest ``keep`` are deleted."""
    root = run_dir / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".step-*"):  # left by a checkpoint that was killed midway
        shutil.rmtree(stale, ignore_errors=True)
    out = root / step_name(state.step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=root))
    try:
        save_model(tmp / MODEL_DIR)
        with open(tmp / STATE_FILE, "w") as f:
            f.write(state.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        if out.exists():  # the same step checkpointed again by a resumed run
            shutil.rmtree(out)
        os.rename(tmp, out)
        _fsync_dir(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    complete = sorted(p for p in root.glob("step-*") if (p / STATE_FILE).is_file())
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return out


def read_state(checkpoint: Path) -> RunState:
    try:
        return RunState.model_validate_json((checkpoint / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise StorageError(f"checkpoint {checkpoint} is unreadable: {exc}") from exc


class GroupLog:
    """``groups.jsonl``: the acknowledgement of every group handed to the buffer."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / GROUPS_LOG
        self._at_open: list[dict[str, Any]] = []  # every complete line when opened, in order
        if self.path.exists():
            data = self.path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end != len(data):  # a line cut short by a kill: it was never acknowledged
                with open(self.path, "r+b") as f:
                    f.truncate(end)
            self._at_open = [json.loads(line) for line in data[:end].splitlines() if line]
        self.lines = len(self._at_open)

    def take_after(self, logged: int) -> list[dict[str, Any]]:
        """The entries the log held when opened after its first ``logged`` (what a resume
        hands back); read once: later calls get none."""
        entries, self._at_open = self._at_open[logged:], []
        return entries

    def append(self, group_id: str, trajectory_ids: list[str], version_started: int) -> None:
        line = json.dumps({"group": group_id, "trajectories": trajectory_ids,
                           "version_started": version_started}) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.lines += 1


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
