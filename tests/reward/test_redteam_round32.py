"""Red team, round thirty-two, against 850a2ff (a failing test on that commit).

Closed here: across the boundary, round thirty's check took any text the launcher compiled
that equalled a workspace Python file for the tested code run in the launcher, and graded
again in one process, and kept the task there. The launcher compiles short texts of its own
(``raise exc`` during a call across the boundary): a workspace file of nine bytes moved any
zygote-graded task, HumanEval included, into one process, where the declared gaps of shared
grading apply, for every later episode. Now only the text of a workspace file the launcher
itself read counts, and what one grading found never moves the task's others.
"""

from __future__ import annotations

import pytest
from redteam_parts import humaneval_task

from attempts import attempt as _attempt
from tempering.reward import Grader

DECOYS = ["raise exc", "function()",
          'boundary.call(object.__getattribute__(self, "_ref"), args, kwargs)']


@pytest.mark.parametrize("decoy", DECOYS, ids=["raise", "call", "boundary"])
async def test_no_file_of_the_agents_moves_the_grading_into_one_process(decoy):
    task = humaneval_task("HumanEval/0")
    stub = task.workspace["solution.py"].decode()
    async with Grader() as grader:
        result = await _attempt(task, {"notes.py": decoy, "solution.py": stub}, grader=grader)
        assert result.reward == 0.0
        assert not any("one process" in d for d in result.details), result.details
        assert (await grader.isolation(task))[0] == "data"
