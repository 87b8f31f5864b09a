"""Built-in task families, generated in code: small enough for a tiny model to learn on a CPU.

``switchboard``: the workspace holds ``codes.txt``, a table of call signs and code words in a
shuffled order; the instruction names one call sign; the agent must write its code word to
``answer.txt`` and submit. A careful agent reads the table (``read_file``), writes the answer
(``write_file``) and submits: three turns, in a real sandbox, graded by a hidden test in a fresh
one with every tamper check. The codebook is the same in every task, so a policy can learn the
answers two ways: by copying from what it read, or by remembering each call sign's word. Either
is a real multi-turn skill for a model of a few hundred thousand parameters, and a random pick
among the words scores 1 in ``len(CODEBOOK)``, so learning shows as a rising reward.
"""

from __future__ import annotations

import random

from tempering.sandbox import SandboxSpec
from tempering.tasks.files import FileTree
from tempering.tasks.task import GradingConfig, Task, TaskConfig, TaskInfo

CODEBOOK = {"alpha": "red", "bravo": "green", "charlie": "blue", "delta": "gold"}
SANDBOX = SandboxSpec(memory_mb=256, pids=64, disk_mb=16, timeout_s=20)
TEST = """\
from pathlib import Path


def test_answer():
    answer = Path(__file__).resolve().parents[1] / "answer.txt"
    assert answer.read_text().strip() == {word!r}
"""


def switchboard_task(sign: str, layout: int = 0) -> Task:
    """The task for call sign ``sign``; ``layout`` shuffles the table's rows."""
    if sign not in CODEBOOK:
        raise ValueError(f"unknown call sign {sign!r}; the signs are {', '.join(CODEBOOK)}")
    rows = list(CODEBOOK.items())
    random.Random(f"{sign}-{layout}").shuffle(rows)
    table = "".join(f"{s} {w}\n" for s, w in rows)
    config = TaskConfig(
        task=TaskInfo(id=f"switchboard/{sign}-{layout}", family="switchboard",
                      description=f"write the code word for {sign} to answer.txt"),
        sandbox=SANDBOX,
        grading=GradingConfig(command="python3 -m pytest tests", runner="plain", timeout_s=10,
                              scoring="all", expected_tests=1),
    )
    instruction = (f"codes.txt lists call signs and their code words. Write the code word for "
                   f"{sign} to answer.txt, then submit.")
    return Task(config=config, instruction=instruction,
                workspace=FileTree.of({"codes.txt": table}),
                tests=FileTree.of({"test_answer.py": TEST.format(word=CODEBOOK[sign])}),
                solution=FileTree.of({"codes.txt": table, "answer.txt": CODEBOOK[sign] + "\n"}))


def switchboard(layouts: int = 4) -> list[Task]:
    """Every call sign in ``layouts`` table orders: ``len(CODEBOOK) * layouts`` tasks."""
    return [switchboard_task(sign, layout) for layout in range(layouts) for sign in CODEBOOK]
