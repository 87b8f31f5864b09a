"""The bounded memo behind the grader's per-suite caches."""

from __future__ import annotations

import pytest

from tempering.reward.kept import Kept


def test_it_keeps_the_most_recently_used_values_within_its_size() -> None:
    made: list[str] = []
    kept: Kept[str, str] = Kept(2)

    def make(key: str) -> str:
        made.append(key)
        return key.upper()

    assert kept.get("a", lambda: make("a")) == "A"
    assert kept.get("b", lambda: make("b")) == "B"
    assert kept.get("a", lambda: make("a")) == "A"  # kept: not made again, and now newest
    assert kept.get("c", lambda: make("c")) == "C"  # drops b, the least recently used
    assert kept.get("a", lambda: make("a")) == "A"
    assert kept.get("b", lambda: make("b")) == "B"
    assert made == ["a", "b", "c", "b"] and len(kept) == 2


def test_a_value_of_none_is_kept_too() -> None:
    calls = []
    kept: Kept[str, None] = Kept(4)
    for _ in range(3):
        kept.get("x", lambda: calls.append(1))
    assert calls == [1]


def test_a_size_below_one_is_refused_with_the_size() -> None:
    with pytest.raises(ValueError, match="size=0"):
        Kept(0)
