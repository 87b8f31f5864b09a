"""Rewards: tamper-resistant, multi-dimensional grading of an agent's work.

    from tempering.reward import grade
    result = await grade(task, sb)   # RewardResult: reward, components, tests, flags

See ``grader.py`` for the path a grade takes and ``result.py`` for every flag.
"""

from __future__ import annotations

from tempering.reward.grader import Grader, grade, grading_spec
from tempering.reward.result import NOTES, TAMPER, RewardResult, TestResult

__all__ = ["grade", "Grader", "grading_spec", "RewardResult", "TestResult", "TAMPER", "NOTES"]
