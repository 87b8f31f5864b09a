"""Built-in task families, generated in code: small enough for a tiny model to learn on a CPU.

``switchboard``: the workspace holds ``codes.txt``, a table of call signs and code words in a
shuffled order; the instruction names one call sign; the agent must write its code word to a
file named after the sign (``echo.txt``) and submit. A careful agent reads the table
(``read_file``), writes the answer (``write_file``) and submits: three turns, in a real sandbox,
graded by a hidden test in a fresh one with every tamper check. The codebook is the same in
every task, so a policy can learn the answers two ways: by copying from what it read, or by
remembering each call sign's word. Either is a real multi-turn skill for a model of a few
hundred thousand parameters, and a random pick among the words scores 1 in ``len(CODEBOOK)``, so
learning shows as a rising reward. The file is named after the sign so that the sign stands a
few tokens before the word in the agent's own ``write_file`` call (path before content): a model
of this size conditions on what is near much more easily than on the instruction hundreds of
tokens back.

``slow=(scale_s, alpha, cap_s)`` makes the hidden test sleep ``min(cap_s, scale_s *
Pareto(alpha))`` seconds in its grading sandbox, drawn afresh by every grading: heavy-tailed
environment time, like test suites whose duration varies by task and run, for benchmarks of
long-tail behaviour. The task id records it (``switchboard/echo-0:0.2:1.2:8``), so a remote
worker rebuilds the same task from the id.
"""

from __future__ import annotations

import random

from tempering.sandbox import SandboxSpec
from tempering.tasks.files import FileTree
from tempering.tasks.task import GradingConfig, Task, TaskConfig, TaskInfo

CODEBOOK = {"echo": "red", "root": "one", "main": "zero", "pipe": "wait"}
"""Call sign -> code word. Each is one token of the tiny model's tokenizer (``policy.tiny``),
written as the file name and the file's content: choosing the answer is choosing one token."""
SANDBOX = SandboxSpec(memory_mb=256, pids=64, disk_mb=16, timeout_s=20)
TEST = """\
from pathlib import Path


def test_answer():
    {sleep}answer = Path(__file__).resolve().parents[1] / {path!r}
    assert answer.read_text().strip() == {word!r}
"""


def answer_path(sign: str) -> str:
    """Where the answer for ``sign`` goes: ``echo.txt``."""
    return f"{sign}.txt"


def sign_of(task: Task) -> str:
    """The call sign a switchboard task asks about."""
    return task.id.removeprefix("switchboard/").split(":")[0].rpartition("-")[0]


Slow = tuple[float, float, float]
"""Heavy-tailed grading time: (scale_s, alpha, cap_s), see the module docstring."""


def switchboard_task(sign: str, layout: int = 0, slow: Slow | None = None) -> Task:
    """The task for call sign ``sign``; ``layout`` shuffles the table's rows."""
    if sign not in CODEBOOK:
        raise ValueError(f"unknown call sign {sign!r}; the signs are {', '.join(CODEBOOK)}")
    sleep, suffix, timeout = "", "", 10.0
    if slow is not None:
        scale, alpha, cap = slow
        if not (scale > 0 and alpha > 0 and cap > 0):
            raise ValueError(f"slow={slow}: scale_s, alpha and cap_s must all be positive")
        sleep = (f"import random, time\n    time.sleep(min({cap!r}, {scale!r} * "
                 f"random.paretovariate({alpha!r})))\n    ")
        suffix, timeout = f":{scale:g}:{alpha:g}:{cap:g}", 10.0 + cap
    rows = list(CODEBOOK.items())
    random.Random(f"{sign}-{layout}").shuffle(rows)
    table = "".join(f"{s} {w}\n" for s, w in rows)
    config = TaskConfig(
        task=TaskInfo(id=f"switchboard/{sign}-{layout}{suffix}", family="switchboard",
                      description=f"write the code word for {sign} to {answer_path(sign)}"),
        sandbox=SANDBOX,
        grading=GradingConfig(command="python3 -m pytest tests", runner="plain", timeout_s=timeout,
                              scoring="all", expected_tests=1),
    )
    instruction = (f"codes.txt lists call signs and their code words. Write the code word for "
                   f"{sign} to {answer_path(sign)}, then submit.")
    return Task(config=config, instruction=instruction,
                workspace=FileTree.of({"codes.txt": table}),
                tests=FileTree.of({"test_answer.py": TEST.format(
                    word=CODEBOOK[sign], sleep=sleep, path=answer_path(sign))}),
                solution=FileTree.of({"codes.txt": table,
                                      answer_path(sign): CODEBOOK[sign] + "\n"}))


def switchboard(layouts: int = 4, slow: Slow | None = None) -> list[Task]:
    """Every call sign in ``layouts`` table orders: ``len(CODEBOOK) * layouts`` tasks."""
    return [switchboard_task(sign, layout, slow) for layout in range(layouts)
            for sign in CODEBOOK]


def switchboard_from_id(task_id: str) -> Task:
    """The task whose id is ``task_id`` (``switchboard/echo-0``, ``...:0.2:1.2:8``)."""
    name, _, slow = task_id.removeprefix("switchboard/").partition(":")
    sign, _, layout = name.rpartition("-")
    try:
        params = [float(x) for x in slow.split(":")] if slow else None
        if params is not None and len(params) != 3:
            raise ValueError(f"{len(params)} slowness parameters, not 3")
        return switchboard_task(sign, int(layout), None if params is None else (
            params[0], params[1], params[2]))
    except ValueError as exc:
        raise ValueError(f"{task_id!r} is not a switchboard task id "
                         f"(switchboard/SIGN-LAYOUT[:SCALE:ALPHA:CAP]): {exc}") from exc
