"""Learned duration estimates per task family: online quantiles over a sliding window.

Each family keeps its last ``window`` durations in sorted order (``bisect``: insert and evict in
O(window) memory moves, microseconds at 256). A family with fewer than ``min_samples``
observations borrows the pooled estimate of every family, and with none at all the caller's
prior; estimates therefore exist from the first task and sharpen as tasks end. A window, not all
history, because durations drift as the policy learns (episodes get shorter or longer).

Jobs that never finish still say something: one cancelled after 40 s (over-sampled away, cut at
a deadline) lasted *at least* 40 s. Counting only finished jobs would bias every quantile low,
since the slow ones are exactly those cut short, and deadlines built on it would then cut
ordinary jobs. Such right-censored observations are kept, and quantiles come from the
Kaplan-Meier estimate of the distribution (one pass over the window, cached until the next
observation); with nothing censored that is the plain empirical quantile.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Estimate:
    family: str
    samples: int
    p50: float
    p90: float
    p99: float
    pooled: bool
    """True when the family had too few samples and the pooled estimate stands in."""


class _Window:
    def __init__(self, size: int) -> None:
        self.order: deque[tuple[float, bool]] = deque()
        self.sorted: list[tuple[float, bool]] = []  # (duration, censored): events sort first
        self.size = size
        self.censored = 0
        self._cache: dict[float, float] = {}

    def add(self, value: float, censored: bool = False) -> None:
        item = (value, censored)
        self.order.append(item)
        bisect.insort(self.sorted, item)
        self.censored += censored
        if len(self.order) > self.size:
            old = self.order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]
            self.censored -= old[1]
        self._cache.clear()

    def quantile(self, q: float) -> float:
        if not self.censored:
            return self.sorted[min(int(q * len(self.sorted)), len(self.sorted) - 1)][0]
        if q not in self._cache:
            self._cache[q] = self._kaplan_meier(q)
        return self._cache[q]

    def _kaplan_meier(self, q: float) -> float:
        survival, at_risk = 1.0, len(self.sorted)
        for value, censored in self.sorted:
            if not censored:
                survival *= 1.0 - 1.0 / at_risk
                if 1.0 - survival >= q:
                    return value
            at_risk -= 1
        return self.sorted[-1][0]  # beyond everything seen: the longest is a lower bound


class DurationEstimator:
    """Quantiles of task durations per family, learned online."""

    def __init__(self, *, window: int = 256, min_samples: int = 5, prior_s: float = 60.0) -> None:
        self.window, self.min_samples, self.prior_s = window, min_samples, prior_s
        self._families: dict[str, _Window] = {}
        self._pooled = _Window(window * 4)

    def observe(self, family: str, duration_s: float, *, censored: bool = False) -> None:
        """Record how long one task of ``family`` took; ``censored``: it was stopped after
        ``duration_s`` without finishing (it would have taken at least that long)."""
        self._families.setdefault(family, _Window(self.window)).add(duration_s, censored)
        self._pooled.add(duration_s, censored)

    def quantile(self, family: str, q: float) -> float:
        """The ``q`` quantile of ``family``'s durations (pooled or prior while it is young)."""
        window = self._families.get(family)
        if window is not None and len(window.sorted) >= self.min_samples:
            return window.quantile(q)
        if len(self._pooled.sorted) >= self.min_samples:
            return self._pooled.quantile(q)
        return self.prior_s

    def estimate(self, family: str) -> Estimate:
        window = self._families.get(family)
        n = 0 if window is None else len(window.sorted)
        return Estimate(family, n, self.quantile(family, 0.5), self.quantile(family, 0.9),
                        self.quantile(family, 0.99), pooled=n < self.min_samples)

    def families(self) -> list[str]:
        return sorted(self._families)
