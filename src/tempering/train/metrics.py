"""A run's metrics: one JSON line per learner step in ``metrics.jsonl``, mirrored to TensorBoard.

``metrics.jsonl`` is the record the report, the benchmarks and any later analysis read: each
line is written whole, flushed and fsynced before the step is checkpointed, so a line exists for
every checkpointed step. A run resumed from step k first cuts the file back to steps <= k (the
killed run may have logged steps its checkpoint never saw; they are trained again), and opens
TensorBoard with ``purge_step=k + 1`` so the curves do not double back either.

``Interval`` measures what happened between two learner steps: the rewards of every group that
finished (before the buffer's filters: the policy's performance, not the trained batch's,
which drops groups of all-equal reward), episodes per second, and the time-weighted use of
sandbox and inference slots from the scheduler's exact utilisation integrals.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tempering.scheduler.metrics import SchedulerMetrics
from tempering.train.report import METRICS_FILE, load_metrics
from tempering.trajectory.schema import Status, Trajectory

if TYPE_CHECKING:
    from tempering.train.learner import StepStats

TENSORBOARD_DIR = "tensorboard"


class Interval:
    """Counters between two learner steps (reset by ``take``)."""

    def __init__(self) -> None:
        self._busy: dict[str, float] = {}  # the scheduler's integrals when the interval began
        self._offered: dict[str, float] = {}
        self._reset()

    def _reset(self) -> None:
        self.rewards: list[float] = []
        self.by_task: dict[str, list[float]] = {}
        self.ok = 0
        self.episodes = 0
        self.groups = 0
        self.equal_groups = 0
        self.actions = 0
        self.invalid = 0

    def add_group(self, group: list[Trajectory]) -> None:
        rewards = []
        for traj in group:
            self.episodes += 1
            self.ok += traj.status is Status.OK
            rewards.append(traj.reward_value or 0.0)
            self.by_task.setdefault(traj.task_id, []).append(rewards[-1])
            for step in traj.steps:
                if not step.inherited:
                    self.actions += 1
                    self.invalid += step.action == "invalid"
        self.rewards += rewards
        self.groups += 1
        self.equal_groups += len(rewards) > 1 and len(set(rewards)) == 1

    def take(self, scheduler: SchedulerMetrics, seconds: float) -> dict[str, float]:
        """The interval's figures; ``seconds`` is its wall length. Starts the next one."""
        # the scheduler keeps slot-second integrals of what was reserved and what was offered;
        # the interval's utilisation is the ratio of their growth (exact when capacity changes,
        # as it does while Ray workers join)
        busy, offered = scheduler.busy_s, scheduler.offered_s

        def util(resource: str) -> float:
            used = busy.get(resource, 0.0) - self._busy.get(resource, 0.0)
            span = offered.get(resource, 0.0) - self._offered.get(resource, 0.0)
            return used / span if span > 0 else math.nan

        out = {
            "reward_mean": statistics.fmean(self.rewards) if self.rewards else math.nan,
            "reward_std": statistics.pstdev(self.rewards) if self.rewards else math.nan,
            "ok_frac": self.ok / self.episodes if self.episodes else math.nan,
            "episodes": float(self.episodes),
            "episodes_per_s": self.episodes / seconds if seconds > 0 else 0.0,
            "sandbox_util": util("sandbox"),
            "inference_util": util("inference"),
            # a malformed tool call: the format the warm-up taught, breaking down
            "invalid_action_frac": self.invalid / self.actions if self.actions else math.nan,
            # groups of all equal rewards: no signal, so the filters drop them (unless a
            # format penalty finds a failed call in one)
            "equal_reward_group_frac": (self.equal_groups / self.groups if self.groups
                                        else math.nan),
        }
        self._reset()
        self._busy, self._offered = busy, offered
        return out

    def task_rewards(self) -> dict[str, float]:
        """Mean reward by task over the interval (call before ``take``)."""
        return {task: round(statistics.fmean(r), 4) for task, r in sorted(self.by_task.items())}


class MetricsLog:
    """``metrics.jsonl`` plus TensorBoard scalars, for one process working on a run."""

    def __init__(self, run_dir: Path, *, resume_after: int = 0, tensorboard: bool = True) -> None:
        self.path = run_dir / METRICS_FILE
        self.lines = [m for m in load_metrics(run_dir) if m["step"] <= resume_after] \
            if self.path.exists() else []
        tmp = self.path.with_suffix(".jsonl.tmp")  # rewrite without the steps to be redone
        tmp.write_text("".join(json.dumps(m) + "\n" for m in self.lines))
        os.replace(tmp, self.path)
        self._tb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=resume_after + 1)

    def write(self, metrics: dict[str, Any]) -> None:
        line = json.dumps(metrics, allow_nan=True) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.lines.append(metrics)
        if self._tb is not None:
            step = int(metrics["step"])
            for key, value in metrics.items():
                if key != "step" and isinstance(value, int | float) and not isinstance(
                        value, bool) and math.isfinite(value):
                    self._tb.add_scalar(_tb_tag(key), value, step,
                                        walltime=None)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


_GROUPS = {"reward": "rollout", "ok_frac": "rollout", "episodes": "rollout",
           "invalid": "rollout", "equal": "rollout", "entropy": "policy", "behav": "policy",
           "collapse": "run", "rollback": "run",
           "staleness": "staleness", "learner": "learner", "wait": "learner", "loss": "loss",
           "pg_loss": "loss", "kl": "loss", "clip": "loss", "grad": "loss", "is_": "loss",
           "approx": "loss", "step_": "loss", "ratio": "loss", "sandbox": "utilisation",
           "inference": "utilisation", "samples": "throughput", "tokens": "throughput",
           "buffered": "buffer", "dropped": "buffer"}


def _tb_tag(key: str) -> str:
    """``reward_mean`` -> ``rollout/reward_mean``: TensorBoard groups charts by prefix."""
    for prefix, group in _GROUPS.items():
        if key.startswith(prefix):
            return f"{group}/{key}"
    return f"run/{key}"


def learner_figures(stats: StepStats) -> dict[str, float]:
    """What one learner step reports in its metrics line: the loss and its parts, the
    importance weights, the KL figures and entropy (those also per staleness, as
    ``KEY_sAGE``), the learning rate."""
    by_age = {f"{key}_s{age}": rounded(value) for age, row in stats.by_staleness.items()
              for key, value in row.items() if key not in ("samples", "tokens")}
    return {
        "loss": rounded(stats.loss), "pg_loss": rounded(stats.pg_loss),
        "kl": rounded(stats.kl), "clip_frac": rounded(stats.clip_frac),
        "grad_norm": rounded(stats.grad_norm), "is_weight_mean": rounded(stats.is_weight_mean),
        "is_weight_max": rounded(stats.is_weight_max),
        "is_truncated_frac": rounded(stats.is_truncated_frac),
        "approx_kl": rounded(stats.approx_kl), "approx_kl_max": rounded(stats.approx_kl_max),
        **({} if stats.step_kl is None else {"step_kl": rounded(stats.step_kl),
                                             "step_scale": rounded(stats.step_scale)}),
        "passes": stats.passes, "ratio_mean": rounded(stats.ratio_mean),
        "behav_kl": rounded(stats.behav_kl), "entropy": rounded(stats.entropy), **by_age,
        "lr": rounded(stats.lr),
    }


def rounded(value: float) -> float:
    """``value`` to 6 places for a metrics line (NaN and infinities as they are)."""
    return round(value, 6) if math.isfinite(value) else value
