"""Resources as named quantities: what a job demands, what the cluster has, what is free.

Every scarce thing is one name: ``sandbox`` slots (per class, ``sandbox.docker`` beside
``sandbox``), ``inference`` slots, ``cpu`` cores, ``memory_mb``, ``learner``. Admission adds and
subtracts these vectors, so the sandbox quota is counted like GPU memory is elsewhere: a job that
would exceed any one of them waits. A name the capacity does not mention is not limited.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

EPS = 1e-9


@dataclass(frozen=True)
class Resources(Mapping[str, float]):
    """An immutable vector of named amounts (zeros dropped)."""

    amounts: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clean = {k: float(v) for k, v in self.amounts.items() if abs(v) > EPS}
        object.__setattr__(self, "amounts", clean)

    @classmethod
    def of(cls, **amounts: float) -> Resources:
        """``Resources.of(sandbox=1, inference=1, memory_mb=512)``."""
        return cls(amounts)

    def __getitem__(self, name: str) -> float:
        return self.amounts.get(name, 0.0)  # an absent name is an amount of 0

    def __contains__(self, name: object) -> bool:
        return name in self.amounts

    def __iter__(self) -> Iterator[str]:
        return iter(self.amounts)

    def __len__(self) -> int:
        return len(self.amounts)

    def __add__(self, other: Mapping[str, float]) -> Resources:
        names = set(self) | set(other)
        return Resources({k: self[k] + other.get(k, 0.0) for k in names})

    def __sub__(self, other: Mapping[str, float]) -> Resources:
        names = set(self) | set(other)
        return Resources({k: self[k] - other.get(k, 0.0) for k in names})

    def fits_in(self, free: Mapping[str, float], limited: set[str] | frozenset[str]) -> bool:
        """Whether this demand fits in ``free`` for every name in ``limited``."""
        return all(amount <= free.get(name, 0.0) + EPS
                   for name, amount in self.amounts.items() if name in limited)

    def key(self) -> tuple[tuple[str, float], ...]:
        """A hashable shape: jobs with equal demands queue together."""
        return tuple(sorted(self.amounts.items()))

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v:g}" for k, v in sorted(self.amounts.items()))
        return f"Resources({inner})"
