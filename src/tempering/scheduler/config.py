"""The scheduler's switches: back-pressure, deadlines, straggler handling, group priority,
leases. Each long-tail control can be turned on or off on its own and is measured in
``benchmarks/scheduler.py``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_queued: int = Field(default=100_000, ge=1)
    """Jobs waiting at most; ``submit`` waits past it (back-pressure on the producer)."""
    deadlines: bool = False
    """Give every job without its own deadline one from its family's duration estimate."""
    deadline_quantile: float = Field(default=0.9, gt=0, lt=1)
    deadline_factor: float = Field(default=3.0, gt=0)
    """A job may run this many times its family's ``deadline_quantile`` duration."""
    min_deadline_s: float = Field(default=1.0, ge=0)
    prior_s: float = Field(default=60.0, gt=0)
    """Expected duration of a family never seen before."""
    stragglers: Literal["cancel", "pause"] = "cancel"
    """What a deadline does: cancel the job (timed_out), or pause it to resume later."""
    pause_grace_s: float = Field(default=30.0, ge=0)
    """How long a job asked to pause may take to reach a safe point before it is cancelled."""
    resume_penalty: int = 1
    """Priority a paused job loses when it is queued again, so waiting work goes first."""
    group_boost: int = 10
    """Priority added to the queued jobs of a group once it is ``group_boost_at`` done."""
    group_boost_at: float = Field(default=0.5, ge=0, le=1)
    lease_s: float | None = Field(default=None, gt=0)
    """Reclaim a running job that has not called ``ctx.heartbeat()`` for this long."""
