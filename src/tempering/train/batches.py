"""What the replay buffer hands out: frozen, typed results that cross the buffer's boundary.

``Batch`` is what the learner trains on (whole groups, each sample with its weights version and
age); ``BufferStats`` is a snapshot of the buffer's counters for logs and dashboards. Both are
frozen pydantic models built only by ``ReplayBuffer`` (``tempering.train.buffer``, which
re-exports them); they hold data and no buffer logic, so a learner or a metrics sink can depend
on them without the buffer's admission and staleness machinery.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tempering.trajectory.schema import Trajectory


class Batch(BaseModel):
    """What the learner trains on: whole groups, each sample with its version and age."""

    model_config = ConfigDict(frozen=True)

    version: int
    """The learner's version when the batch was taken; ages are relative to it."""
    groups: list[list[Trajectory]]
    versions: list[list[int]]
    """Per group, per trajectory: the sample's version (``buffer.sample_version``)."""
    ages: list[list[int]]
    """Per group, per trajectory: ``version`` minus the sample's version (never negative)."""
    staleness_mean: float
    staleness_max: int

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g]

    @property
    def samples(self) -> int:
        return sum(len(g) for g in self.groups)


class BufferStats(BaseModel):
    """A snapshot of the buffer's counters (``ReplayBuffer.stats``)."""

    model_config = ConfigDict(frozen=True)

    version: int
    max_staleness: int
    batch_groups: int
    admission_limit: int
    """``(version + max_staleness + 1) * batch_groups``: ``started_groups`` stays below it."""
    started_groups: int
    """In flight + buffered + consumed: what the admission limit counts."""
    in_flight_groups: int
    """Admitted and not yet put or cancelled."""
    buffered_groups: int
    buffered_samples: int
    admitted_groups: int
    """Admissions ever granted (including those given back)."""
    consumed_groups: int
    consumed_samples: int
    dropped: dict[str, int]
    """Groups by reason: ``filtered`` (the filters kept nothing), ``stale`` (older than
    ``max_staleness`` at put or before consumption), ``cancelled`` (admission given back),
    ``rolled_back`` (sampled by weights a collapse rolled back: ``discard_before``)."""
    filtered_samples: dict[str, int]
    """Trajectories the filters dropped, by the filter's reason (also from groups that kept
    some members)."""
    staleness_histogram: dict[int, int]
    """Age in versions -> consumed samples of that age."""
    staleness_max_consumed: int | None
    """The oldest sample ever handed to the learner (None before the first batch); never above
    ``max_staleness``."""

    @property
    def stale_dropped(self) -> int:
        return self.dropped["stale"]


__all__ = ["Batch", "BufferStats"]
