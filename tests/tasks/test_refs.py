"""Task references (``tasks/refs.py``): one grammar for configs, commands and jobs."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tempering.errors import ConfigError
from tempering.tasks import FileTree, load_task
from tempering.tasks.refs import TaskRef, select
from tempering.tasks.task import GradingConfig, Task, TaskConfig, TaskInfo

MEDIAN = Path(__file__).parents[2] / "examples" / "tasks" / "median"


def test_one_grammar_names_families_their_first_n_ids_and_directories() -> None:
    tasks = select(["humaneval:2", "switchboard:1", "repo-bugs:1", "HumanEval/7",
                    "switchboard/echo-0", str(MEDIAN)])
    ids = [t.id for t in tasks]
    assert ids[:2] == ["HumanEval/0", "HumanEval/1"]
    assert ids[-3:] == ["HumanEval/7", "switchboard/echo-0", "median"]
    assert len(select(["humaneval"])) == 164


@pytest.mark.parametrize(("ref", "said"), [
    ("humaneval:0", "'humaneval:0': the count after humaneval: must be a whole number"),
    ("repo-bugs:999", "repo-bugs:999: there are"),
    ("HumanEval/999", "no HumanEval problem has the id 'HumanEval/999'"),
    ("switchboard/nope", "'switchboard/nope' is not a switchboard task id"),
    ("no/such/task", "task 'no/such/task' is neither a task directory, humaneval[:N]"),
])
def test_a_reference_that_names_nothing_says_which(ref: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        select([ref])
    assert said in str(caught.value)


def test_a_reference_pickles_to_its_name_and_loads_there() -> None:
    for task in (load_task(MEDIAN), select(["HumanEval/3"])[0], select(["switchboard:1"])[0]):
        ref = TaskRef.of(task)
        assert ref.task() is task  # in this process, the task itself
        back = pickle.loads(pickle.dumps(ref))
        assert back.name == ref.name and back.task().id == task.id
    assert TaskRef.named(str(MEDIAN)).task().id == "median"


def test_a_task_made_in_code_cannot_leave_its_process() -> None:
    task = Task(config=TaskConfig(task=TaskInfo(id="made-here"), grading=GradingConfig()),
                instruction="", workspace=FileTree(), tests=FileTree())
    ref = TaskRef.of(task)
    assert ref.name is None and ref.task() is task
    with pytest.raises(ConfigError, match="'made-here' has no directory or built-in id"):
        pickle.dumps(ref)
