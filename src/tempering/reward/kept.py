"""A bounded memo: what grading works out once per suite or task (canary plans, compiled tests,
canary templates, canary imports) and keeps for the gradings that follow."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Kept(Generic[K, V]):
    """The last ``size`` values worked out, by key, the least recently used dropped first."""

    def __init__(self, size: int = 1024) -> None:
        if size < 1:
            raise ValueError(f"a Kept must keep at least one value, got size={size}")
        self.size = size
        self._values: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value kept for ``key``, or ``make()``'s, kept from now on."""
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        value = self._values[key] = make()
        while len(self._values) > self.size:
            self._values.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._values)
