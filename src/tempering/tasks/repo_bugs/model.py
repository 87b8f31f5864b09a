"""What a ``repo-bugs`` repository is made of: its files, its tests, its seeded bugs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    name: str
    kind: str
    """off-by-one, wrong default, swapped arguments, missed edge case, wrong exception"""
    path: str
    good: str
    bad: str
    issue: str
    """The report the agent is given: the symptom, in a user's words."""
    fail_to_pass: tuple[str, ...]
    """Test ids (``tests/FILE.py::NAME``) that fail with the bug and pass without it."""


@dataclass(frozen=True)
class Repo:
    name: str
    summary: str
    sources: dict[str, str]
    tests: dict[str, dict[str, str]]
    """test file -> (test name -> its source); a file's preamble is under the name ``""``."""
    bugs: tuple[Bug, ...]
