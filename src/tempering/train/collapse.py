"""Telling a training run that is collapsing from one that is only noisy.

An RL run can learn and then fall apart: the reward it reached falls away, the action format
the warm-up taught breaks down (malformed tool calls), the policy locks into one output
(entropy falls), or every group ends with equal rewards (all 0) so that no batch can be trained
on and the learner waits for ever. ``CollapseDetector`` watches the metrics of each step
(``metrics.jsonl``), and the time since the last trainable batch, against ``CollapseConfig``
and returns a ``Collapse``: which check fired, at which step, and a one-line diagnosis with
the evidence (the figures that fired it, the best the run had, the learner's importance
weights and KL to the sampling policy over the same steps).

Each check averages the last ``window`` steps since the last rollback, so one bad batch is
not a collapse; the best reward the run reached is kept across rollbacks, so a run that falls
again after one is caught again. The detector also says when the run is *good*: no check
firing, malformed calls at most half of ``invalid_max`` (a format drifting towards the check is
no place to return to), and a mean reward above every earlier good window's. The trainer
keeps, as the last good checkpoint a rollback returns to, the weights that *sampled* that
window (``sampler_version``), which in an asynchronous run are some versions behind the
learner that reached it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tempering.train.config import CollapseConfig


@dataclass(frozen=True)
class Collapse:
    """A detected collapse: ``check`` (``reward``, ``format``, ``entropy``, ``stall``), the
    step it was detected at, and the one-line diagnosis."""

    check: str
    step: int
    line: str


class CollapseDetector:
    """See the module docstring. ``observe`` each step's metrics line, in order."""

    def __init__(self, config: CollapseConfig, *, best: float | None = None,
                 entropy_base: float | None = None, reward_base: float | None = None,
                 good: float | None = None) -> None:
        self.config = config
        self.best = best
        """The best mean reward over ``window`` steps the run reached (kept across
        rollbacks and, through the checkpoint, resumes)."""
        self.entropy_base = entropy_base
        """The mean entropy of the run's first ``window`` steps."""
        self.reward_base = reward_base
        """The mean reward of the run's first ``window`` steps: where it started."""
        self.good = good
        """The best mean reward over a window whose format was sound: what the last good
        point was judged at (``best`` may be higher, reached while the format drifted)."""
        self.lines: list[dict[str, Any]] = []  # since the start or the last rollback

    def observe(self, metrics: dict[str, Any]) -> tuple[Collapse | None, bool]:
        """This step's verdict: (a collapse or None, whether the step is a new good point: no
        collapse, the format sound, and a mean reward above every earlier good point's)."""
        cfg = self.config
        self.lines.append(metrics)
        recent = self.lines[-cfg.window:]
        if len(recent) < cfg.window:
            return None, False
        reward = _mean(recent, "reward_mean")
        entropy = _mean(recent, "entropy")
        if self.entropy_base is None and math.isfinite(entropy):
            self.entropy_base = entropy
        if self.reward_base is None and math.isfinite(reward):
            self.reward_base = reward
        step = int(metrics["step"])
        found = self._check(recent, reward, entropy, step)
        if found is not None:
            return found, False
        if not math.isfinite(reward):
            return None, False
        if self.best is None or reward > self.best:
            self.best = reward
        if (self.good is None or reward > self.good) and self._format_sound(recent):
            self.good = reward
            return None, True
        return None, False

    def _format_sound(self, recent: list[dict[str, Any]]) -> bool:
        """Whether the window's malformed-call share is at most half of ``invalid_max``: a
        best reached while the format drifts towards the check is no point to roll back to
        (a default run that did went on drifting from there)."""
        invalid = _mean(recent, "invalid_action_frac")
        limit = self.config.invalid_max
        return limit is None or not math.isfinite(invalid) or invalid <= limit / 2

    def _check(self, recent: list[dict[str, Any]], reward: float, entropy: float,
               step: int) -> Collapse | None:
        cfg = self.config
        first, last = int(recent[0]["step"]), step
        span = f"steps {first}-{last}" if first != last else f"step {last}"
        fall = self._reward_fall(reward, span, step, recent)
        if fall is not None:
            return fall
        invalid = _mean(recent, "invalid_action_frac")
        if cfg.invalid_max is not None and invalid > cfg.invalid_max:
            return self._found("format", step, recent, f"{invalid:.0%} of tool calls malformed "
                               f"over {span} (above {cfg.invalid_max:.0%}): the action format "
                               "is breaking down")
        if cfg.entropy_fall is not None and self.entropy_base and math.isfinite(entropy) and \
                entropy < (1 - cfg.entropy_fall) * self.entropy_base:
            return self._found("entropy", step, recent, f"entropy of the sampled tokens fell "
                               f"to {entropy:.3f} over {span}, from {self.entropy_base:.3f} "
                               "over the first steps: the policy is locking into one output")
        return None

    def _reward_fall(self, reward: float, span: str, step: int,
                     recent: list[dict[str, Any]]) -> Collapse | None:
        """The reward check. It measures the fall from the best window, once that best is
        ``reward_gain`` above the run's start; until then from the start, since a best that is
        the start plus noise protects nothing. Armed once that reference is ``reward_min``."""
        cfg = self.config
        if cfg.reward_fall is None or self.best is None:
            return None
        base = self.reward_base
        climbed = base is None or self.best >= base + cfg.reward_gain
        reference = self.best if climbed or base is None else base
        floor = (1 - cfg.reward_fall) * reference
        if reference < cfg.reward_min or reward >= floor:
            return None
        source = (f"a best of {reference:.2f}" if climbed else
                  f"its start of {reference:.2f} (its best, {self.best:.2f}, within "
                  f"{cfg.reward_gain:g} of it)")
        return self._found("reward", step, recent, f"reward fell to {reward:.2f} over {span}, "
                           f"from {source} (collapsed below {floor:.2f})")

    def stalled(self, step: int, waited_s: float, dropped_filtered: int,
                dropped_groups_reward: float | None) -> Collapse | None:
        """A collapse when no trainable batch has come for ``stall_s`` seconds while groups
        kept finishing and the filters dropped them: ``dropped_filtered`` groups since the
        last step, whose mean reward was ``dropped_groups_reward`` (below 0.5: groups that
        all fail; all passing is a solved task set, not a collapse)."""
        cfg = self.config
        if cfg.stall_s is None or waited_s < cfg.stall_s or dropped_filtered == 0:
            return None
        if dropped_groups_reward is not None and dropped_groups_reward >= 0.5:
            return None  # groups of all 1s: a policy that solves its tasks, not a collapse
        rewards = ("" if dropped_groups_reward is None
                   else f", their mean reward {dropped_groups_reward:.2f}")
        return Collapse("stall", step, f"collapse at step {step} (stall): no trainable batch "
                        f"for {waited_s:.0f} s, {dropped_filtered} groups finished and were all "
                        f"dropped for equal rewards{rewards}; best mean reward "
                        f"{_fmt(self.best)}")

    def _found(self, check: str, step: int, recent: Sequence[dict[str, Any]],
               what: str) -> Collapse:
        evidence = ", ".join(f"{label} {_fmt(_mean(recent, key), spec)}" for label, key, spec in (
            ("invalid calls", "invalid_action_frac", ".0%"), ("entropy", "entropy", ".3f"),
            ("behaviour KL", "behav_kl", ".3f"), ("IS weight max", "is_weight_max", ".2f"),
            ("clip frac", "clip_frac", ".2f"), ("staleness", "staleness_mean", ".2f"),
            ("lr", "lr", ".2e")))
        return Collapse(check, step, f"collapse at step {step} ({check}): {what}; {evidence}")

    def reset(self) -> None:
        """Forget the steps seen (after a rollback); the best reward is kept."""
        self.lines = []

    def sampler_version(self) -> int | None:
        """The version whose weights sampled the window's median step: that step's version,
        less 1 (the weights it trained), less its mean staleness. None before any step."""
        window = self.lines[-self.config.window:]
        if not window:
            return None
        middle = window[(len(window) - 1) // 2]
        return int(middle["version"]) - 1 - round(float(middle["staleness_mean"]))

    def unneeded(self, held: Iterable[int], next_version: int, max_staleness: int
                 ) -> list[int]:
        """Of the versions ``held`` (whose weights the trainer keeps), those
        ``sampler_version`` can never need again once the step that makes ``next_version``
        is observed (later windows have later medians): the oldest version it can still name
        is that window's median, less 1, less ``max_staleness``, and every held version older
        than the newest held at or before it."""
        window = [*self.lines, {"version": next_version}][-self.config.window:]
        oldest = int(window[(len(window) - 1) // 2]["version"]) - 1 - max_staleness
        versions = list(held)
        floor = max((v for v in versions if v <= oldest), default=oldest)
        return [v for v in versions if v < floor]


def _mean(lines: Sequence[dict[str, Any]], key: str) -> float:
    values = [float(m[key]) for m in lines if isinstance(m.get(key), int | float)
              and math.isfinite(m[key])]
    return statistics.fmean(values) if values else math.nan


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None or not math.isfinite(value) else format(value, spec)
