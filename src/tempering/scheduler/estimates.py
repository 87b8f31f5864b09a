"""Learned duration estimates per task family: online quantiles over a sliding window.

Each family keeps its last ``window`` durations in sorted order (``bisect``: insert and evict in
O(window) memory moves, microseconds at 256), so any quantile is one index. A family with fewer
than ``min_samples`` observations borrows the pooled estimate of every family, and with none at
all the caller's prior; estimates therefore exist from the first task and sharpen as tasks end.
A window, not all history, because durations drift as the policy learns (episodes get shorter
or longer over training).
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
        self.order: deque[float] = deque()
        self.sorted: list[float] = []
        self.size = size

    def add(self, value: float) -> None:
        self.order.append(value)
        bisect.insort(self.sorted, value)
        if len(self.order) > self.size:
            old = self.order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]

    def quantile(self, q: float) -> float:
        index = min(int(q * len(self.sorted)), len(self.sorted) - 1)
        return self.sorted[index]


class DurationEstimator:
    """Quantiles of task durations per family, learned online."""

    def __init__(self, *, window: int = 256, min_samples: int = 5, prior_s: float = 60.0) -> None:
        self.window, self.min_samples, self.prior_s = window, min_samples, prior_s
        self._families: dict[str, _Window] = {}
        self._pooled = _Window(window * 4)

    def observe(self, family: str, duration_s: float) -> None:
        """Record how long one task of ``family`` took."""
        self._families.setdefault(family, _Window(self.window)).add(duration_s)
        self._pooled.add(duration_s)

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
