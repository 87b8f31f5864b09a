"""Composable filters over trajectories: keep what teaches, drop what misleads, count both.

A filter is anything with a ``name`` and ``apply(trajs) -> trajs`` (the ``Filter`` protocol), so
a user's own rule is a two-line class. The built-in ones go one step further: they *judge* each
trajectory (``JudgingFilter.judge``) and return one ``Verdict`` per input, naming why it was
dropped or which mark it was given. ``Pipeline.run`` applies filters in order and returns the
kept trajectories with a frozen ``FilterReport``: per filter, how many it saw, kept, dropped and
marked, and the reason names behind the drops. For a plain ``Filter`` the counts are derived from
what it returned (reason ``dropped``); they add up either way (``seen == kept + dropped``, and
each filter sees what the previous one kept).

Trajectories are frozen: marking one is ``model_copy`` with a longer ``marks`` list, so a filter
never changes the objects a caller still holds. Filters look at a whole batch, not one
trajectory at a time, because some rules need the batch: zero variance is a property of a
group, a duplicate is one relative to an earlier trajectory.

``default_pipeline()`` is the order a user wants: failures of the environment first (they say
nothing about the model), then tampering, duplicates, length limits, groups without signal, and
last the ``recovered`` mark on error-correction episodes, which are kept, never dropped.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from tempering.errors import ConfigError
from tempering.trajectory.schema import Status, Step, Trajectory


@runtime_checkable
class Filter(Protocol):
    """Anything that keeps some of a batch of trajectories (and may mark them)."""

    @property
    def name(self) -> str: ...

    def apply(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """The trajectories kept, in input order, possibly marked (``model_copy``)."""
        ...


@dataclass(frozen=True)
class Verdict:
    """One trajectory's fate under one filter."""

    trajectory: Trajectory
    """The trajectory as it leaves the filter (a marked copy when ``mark`` is set)."""
    drop: str | None = None
    """Why it was dropped (a reason name such as ``infra_error``); None when kept."""
    mark: str | None = None
    """The mark this filter gave it, if any."""


class JudgingFilter(ABC):
    """A filter that says why: one ``Verdict`` per input, in order."""

    name = "filter"

    @abstractmethod
    def judge(self, trajs: list[Trajectory]) -> list[Verdict]: ...

    def apply(self, trajs: list[Trajectory]) -> list[Trajectory]:
        return [v.trajectory for v in self.judge(trajs) if v.drop is None]


class FilterStats(BaseModel):
    """What one filter did to the batch it saw."""

    model_config = ConfigDict(frozen=True)

    name: str
    seen: int
    kept: int
    dropped: int
    marked: int
    reasons: dict[str, int] = {}
    """Drop reason -> how many trajectories were dropped for it (sums to ``dropped``)."""
    marks: dict[str, int] = {}
    """Mark -> how many kept trajectories this filter gave it (sums to ``marked``)."""


class FilterReport(BaseModel):
    """What a pipeline did: the counts of each filter in the order they ran."""

    model_config = ConfigDict(frozen=True)

    seen: int
    """Trajectories that went in."""
    kept: int
    """Trajectories that came out."""
    filters: list[FilterStats]

    @property
    def dropped(self) -> int:
        return self.seen - self.kept


class Pipeline:
    """Filters applied in order; itself a ``Filter``, so pipelines nest."""

    name = "pipeline"

    def __init__(self, filters: Sequence[Filter]) -> None:
        for f in filters:
            if not isinstance(f, Filter):
                raise ConfigError(f"{f!r} is not a filter: it needs a `name` and "
                                  "`apply(trajs) -> trajs`")
        self.filters: tuple[Filter, ...] = tuple(filters)

    def __repr__(self) -> str:
        return f"Pipeline([{', '.join(f.name for f in self.filters)}])"

    def run(self, trajs: Iterable[Trajectory]) -> tuple[list[Trajectory], FilterReport]:
        """The trajectories every filter kept, and what each filter did."""
        batch = list(trajs)
        seen = len(batch)
        stats: list[FilterStats] = []
        for f in self.filters:
            batch, one = _run_one(f, batch)
            stats.append(one)
        return batch, FilterReport(seen=seen, kept=len(batch), filters=stats)

    def apply(self, trajs: list[Trajectory]) -> list[Trajectory]:
        return self.run(trajs)[0]


def _run_one(f: Filter, batch: list[Trajectory]) -> tuple[list[Trajectory], FilterStats]:
    if isinstance(f, JudgingFilter):
        verdicts = f.judge(batch)
        if len(verdicts) != len(batch):
            raise ValueError(f"filter {f.name!r} judged {len(verdicts)} of {len(batch)} "
                             "trajectories: judge() must return one verdict per input")
        kept = [v.trajectory for v in verdicts if v.drop is None]
        reasons = Counter(v.drop for v in verdicts if v.drop is not None)
        marks = Counter(v.mark for v in verdicts if v.drop is None and v.mark is not None)
        marked = sum(marks.values())
    else:  # a plain Filter: infer what it did from what it returned
        kept = f.apply(batch)
        before = {t.trajectory_id: set(t.marks) for t in batch}
        added = [set(t.marks) - before.get(t.trajectory_id, set()) for t in kept]
        reasons = Counter({"dropped": len(batch) - len(kept)} if len(kept) < len(batch) else {})
        marks = Counter(m for new in added for m in new)
        marked = sum(bool(new) for new in added)
    return kept, FilterStats(name=f.name, seen=len(batch), kept=len(kept),
                             dropped=len(batch) - len(kept), marked=marked,
                             reasons=dict(sorted(reasons.items())),
                             marks=dict(sorted(marks.items())))


# ---- the built-in filters ----

@dataclass(frozen=True)
class DropInfra(JudgingFilter):
    """Drops failures of the environment (``env_timeout``, ``infra_error``): they say nothing
    about the model. Model failures (``model_error``, ``model_timeout``) stay: they teach."""

    name = "drop_infra"

    def judge(self, trajs: list[Trajectory]) -> list[Verdict]:
        return [Verdict(t, drop=t.status.value if t.status.infra else None) for t in trajs]


@dataclass(frozen=True)
class DropTampered(JudgingFilter):
    """Drops episodes that tried to change how they are graded: status ``tampered`` (reason
    ``tampered``), or a reward carrying a tamper flag (reason ``flag:<name>``, the first one)."""

    name = "drop_tampered"

    def judge(self, trajs: list[Trajectory]) -> list[Verdict]:
        from tempering.reward.result import TAMPER

        out = []
        for t in trajs:
            reason = None
            if t.status is Status.TAMPERED:
                reason = "tampered"
            elif t.reward is not None and t.reward.tampered:
                reason = "flag:" + next(f for f in t.reward.flags if f in TAMPER)
            out.append(Verdict(t, drop=reason))
        return out


@dataclass(frozen=True)
class DropZeroVariance(JudgingFilter):
    """Drops groups whose rewards are all equal: their group-relative advantages are all zero,
    so they cost a training step and teach nothing.

    A group is the trajectories sharing a ``group_id``. Ungraded members (reward None) do not
    count towards the variance (they have no reward) and share their group's verdict; a group
    with fewer than two graded members has no variance and is dropped. Run ``DropInfra`` first
    (the default pipeline does) so that ungraded episodes are gone before this decides.
    """

    name = "zero_variance"

    eps: float = 1e-6
    """Rewards closer than this count as equal."""
    keep_ungrouped: bool = True
    """Keep trajectories with an empty ``group_id`` (each would be a group of one, always zero
    variance); False drops them (reason ``ungrouped``)."""
    keep_failed_calls: bool = False
    """Keep a group of equal rewards when one of its graded episodes has a turn without a
    well-formed tool call (``Trajectory.failed_calls``): a learner with a format penalty
    (``learner.format_penalty``) trains on that turn whatever the rewards."""

    def __post_init__(self) -> None:
        if not self.eps >= 0:
            raise ConfigError(f"eps={self.eps}: must be a number >= 0")

    def judge(self, trajs: list[Trajectory]) -> list[Verdict]:
        rewards: dict[str, list[float]] = {}
        teaching: set[str] = set()  # groups with a failed call to penalise
        for t in trajs:
            if t.group_id and t.reward_value is not None:
                rewards.setdefault(t.group_id, []).append(t.reward_value)
                if self.keep_failed_calls and t.failed_calls:
                    teaching.add(t.group_id)
        flat = {g for g, rs in rewards.items() if g not in teaching and (
            len(rs) < 2 or max(rs) - min(rs) <= self.eps)}
        out = []
        for t in trajs:
            if not t.group_id:
                out.append(Verdict(t, drop=None if self.keep_ungrouped else "ungrouped"))
            elif t.group_id in flat or t.group_id not in rewards:
                out.append(Verdict(t, drop="zero_variance"))
            else:
                out.append(Verdict(t))
        return out


def is_error_observation(step: Step) -> bool:
    """The step showed the model a failure: an error, a non-zero exit code or a timeout."""
    return step.error is not None or step.timed_out or step.exit_code not in (None, 0)


@dataclass(frozen=True)
class MarkRecovered(JudgingFilter):
    """Marks error-correction episodes ``recovered``: an error observation (see
    ``is_error_observation``) on some step before the last, and a final reward at or above the
    threshold. Never drops anything unless ``keep_only`` asks for it."""

    name = "mark_recovered"

    threshold: float | None = 1.0
    """Reward that counts as success; None: the best reward any trajectory of the same task has
    in the batch (if above 0), for tasks whose maximum is below 1."""
    keep_only: bool = False
    """Keep only recovered episodes (reason ``not_recovered`` for the rest)."""
    mark: str = "recovered"

    def __post_init__(self) -> None:
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"threshold={self.threshold}: rewards lie in [0, 1], so the "
                              "success threshold must too (or None for the task's best)")

    def judge(self, trajs: list[Trajectory]) -> list[Verdict]:
        best: dict[str, float] = {}
        for t in trajs:
            if t.reward_value is not None:
                best[t.task_id] = max(best.get(t.task_id, 0.0), t.reward_value)
        out = []
        for t in trajs:
            bar = self.threshold if self.threshold is not None else best.get(t.task_id, 0.0)
            success = t.reward_value is not None and t.reward_value > 0 and \
                t.reward_value >= bar - 1e-9
            recovered = success and any(is_error_observation(s) for s in t.steps[:-1])
            if recovered:
                marked = t if self.mark in t.marks else t.model_copy(
                    update={"marks": [*t.marks, self.mark]})
                out.append(Verdict(marked, mark=self.mark))
            else:
                out.append(Verdict(t, drop="not_recovered" if self.keep_only else None))
        return out


def _arguments_key(arguments: str) -> str:
    """Arguments compared by meaning: key order and whitespace do not make a new action."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except json.JSONDecodeError:
        return arguments


@dataclass(frozen=True)
class Dedup(JudgingFilter):
    """Keeps the first of trajectories with the same task, the same actions (tool and
    arguments, step by step) and the same outcome (status and reward); drops the rest
    (reason ``duplicate``)."""

    name = "dedup"

    def judge(self, trajs: list[Trajectory]) -> list[Verdict]:
        seen: set[tuple[object, ...]] = set()
        out = []
        for t in trajs:
            key = (t.task_id, tuple((s.action, _arguments_key(s.arguments)) for s in t.steps),
                   t.status.value, t.reward_value)
            out.append(Verdict(t, drop="duplicate" if key in seen else None))
            seen.add(key)
        return out


def token_count(t: Trajectory) -> int:
    """Prompt + completion tokens the trajectory stores: the length of its training sequence
    when turns extend each other; 0 when no tokens were recorded (a scripted policy)."""
    return sum(len(s.prompt_token_ids) + len(s.completion_token_ids) for s in t.steps)


@dataclass(frozen=True)
class LengthLimit(JudgingFilter):
    """Drops episodes outside the step and token limits (None: no limit). Reasons:
    ``too_few_steps``, ``too_many_steps``, ``too_many_tokens``."""

    name = "length_limit"

    max_steps: int | None = None
    max_tokens: int | None = None
    """Limit on ``token_count``: prompt + completion tokens over all steps."""
    min_steps: int | None = None

    def __post_init__(self) -> None:
        for field in ("max_steps", "max_tokens", "min_steps"):
            value = getattr(self, field)
            if value is not None and value < 0:
                raise ConfigError(f"{field}={value}: must be >= 0 (or None for no limit)")
        if (self.min_steps is not None and self.max_steps is not None
                and self.min_steps > self.max_steps):
            raise ConfigError(f"min_steps={self.min_steps} is above max_steps="
                              f"{self.max_steps}: no trajectory could pass")

    def judge(self, trajs: list[Trajectory]) -> list[Verdict]:
        out = []
        for t in trajs:
            reason = None
            if self.min_steps is not None and len(t.steps) < self.min_steps:
                reason = "too_few_steps"
            elif self.max_steps is not None and len(t.steps) > self.max_steps:
                reason = "too_many_steps"
            elif self.max_tokens is not None and token_count(t) > self.max_tokens:
                reason = "too_many_tokens"
            out.append(Verdict(t, drop=reason))
        return out


# ---- pipelines from options ----

class FilterOptions(BaseModel):
    """What the default pipeline does; each field is also a ``tempering traj filter`` flag."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    keep_infra: bool = False
    """Keep env_timeout and infra_error episodes (dropped by default)."""
    keep_tampered: bool = False
    """Keep tampered episodes (dropped by default)."""
    keep_duplicates: bool = False
    """Keep repeated trajectories (same task, actions and outcome; dropped by default)."""
    min_steps: int | None = None
    """Drop episodes with fewer steps."""
    max_steps: int | None = None
    """Drop episodes with more steps."""
    max_tokens: int | None = None
    """Drop episodes with more prompt + completion tokens."""
    keep_zero_variance: bool = False
    """Keep groups whose rewards are all equal (dropped by default)."""
    drop_ungrouped: bool = False
    """Drop trajectories without a group_id (kept by default)."""
    variance_eps: float = 1e-6
    """Rewards closer than this count as equal."""
    keep_failed_calls: bool = False
    """Keep a group of equal rewards if one of its episodes made a malformed tool call or
    none in some turn (what a trainer with learner.format_penalty does)."""
    success_threshold: float | None = 1.0
    """Reward at which an episode counts as a success for the recovered mark."""
    only_recovered: bool = False
    """Keep only recovered episodes (an error observation followed by success)."""


def build_pipeline(options: FilterOptions | None = None) -> Pipeline:
    """The default order, with the filters ``options`` switches off left out."""
    o = options or FilterOptions()
    filters: list[Filter] = []
    if not o.keep_infra:
        filters.append(DropInfra())
    if not o.keep_tampered:
        filters.append(DropTampered())
    if not o.keep_duplicates:
        filters.append(Dedup())
    if (o.min_steps, o.max_steps, o.max_tokens) != (None, None, None):
        filters.append(LengthLimit(max_steps=o.max_steps, max_tokens=o.max_tokens,
                                   min_steps=o.min_steps))
    if not o.keep_zero_variance:
        filters.append(DropZeroVariance(eps=o.variance_eps, keep_ungrouped=not o.drop_ungrouped,
                                        keep_failed_calls=o.keep_failed_calls))
    filters.append(MarkRecovered(threshold=o.success_threshold, keep_only=o.only_recovered))
    return Pipeline(filters)


def default_pipeline() -> Pipeline:
    """Drop infra failures, tampering, duplicates and zero-variance groups; mark recovered."""
    return build_pipeline()


__all__ = ["Dedup", "DropInfra", "DropTampered", "DropZeroVariance", "Filter", "FilterOptions",
           "FilterReport", "FilterStats", "JudgingFilter", "LengthLimit", "MarkRecovered",
           "Pipeline", "Verdict", "build_pipeline", "default_pipeline", "is_error_observation",
           "token_count"]
