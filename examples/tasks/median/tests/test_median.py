import pytest

from stats import median


def test_odd():
    assert median([3, 1, 2]) == 2


def test_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_single():
    assert median([7]) == 7


def test_unsorted_with_duplicates():
    assert median([5, 1, 5, 2, 5]) == 5


def test_empty_raises():
    with pytest.raises(ValueError):
        median([])
