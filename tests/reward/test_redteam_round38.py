"""Red team, round thirty-eight: the static screen, read by reflection and made to pay for size.

1. The rules and lint read names written in the text: ``sys.modules["builtins"].__dict__
   ["__im" + "port__"]("subprocess")`` imported a forbidden module with no name the screen
   watched, and code kept base64 in a data file and run by ``exec`` reached that way was
   never linted and counted as one changed line: a sloppy, rule-breaking solution scored
   rules 1, lint 1. Reflection (a namespace such as ``__dict__``, ``sys.modules`` or
   ``vars()``; ``getattr`` with a computed name) now makes a module's imports and calls
   dynamic for the rules, and where it is indexed by a computed key (or code runs from text
   the file does not hold) lint is 0 and ``max_changed_lines`` fails; changed lines count once
   per 100 characters.
2. A flat 3 MiB list literal took ~1.5 GB of the grader's memory to parse, with the event
   loop stopped for seconds: other episodes' honest gradings timed out. Big files are now
   parsed in a process of their own under memory and CPU limits, off the event loop.

Each fails on the commit before this round; honest work keeps its reward.
"""

from __future__ import annotations

import asyncio
import base64
import resource
import time

from redteam_parts import humaneval_task

from attempts import attempt as _attempt
from conftest import EXAMPLES
from tempering.tasks import load_task

SLUG = (EXAMPLES / "slugify" / "solution" / "slug.py").read_text()
SLOPPY = "import subprocess, os, json, re, unicodedata\n" + "\n".join(
    f"x{i}=1;y{i} = 2 ; z{i}= 3" for i in range(100)) + "\n" + SLUG.replace(
    "import json\n", "").replace("import re\n", "").replace("import unicodedata\n", "")
STUB = '''import base64
import sys
from pathlib import Path

_run = sys.modules["builtins"].__dict__["ex" + "ec"]
_run(base64.b64decode(Path(__file__).with_name("notes.txt").read_bytes()), globals())
'''


async def test_an_import_reached_through_namespaces_breaks_forbidden_imports() -> None:
    task = load_task(EXAMPLES / "slugify")
    honest = await _attempt(task, {"slug.py": SLUG})
    assert honest.reward == 1.0 and not honest.flags, honest.details[:3]
    hidden = SLUG.replace("import json\n", "import json\nimport sys\n") + (
        '\n\nrun = sys.modules["builtins"].__dict__["__im" + "port__"]("subprocess").run\n')
    result = await _attempt(task, {"slug.py": hidden})
    assert any(d.startswith("rule_failed: forbidden_imports") for d in result.details), (
        result.details)
    assert result.components["lint"] == 0.0, result.details


async def test_code_run_from_a_data_file_scores_no_better_than_the_same_code_in_place() -> None:
    task = load_task(EXAMPLES / "slugify")
    in_place = await _attempt(task, {"slug.py": SLOPPY})
    hidden = await _attempt(task, {"slug.py": STUB,
                                   "notes.txt": base64.b64encode(SLOPPY.encode())})
    assert hidden.tests_passed == hidden.tests_total == in_place.tests_passed
    assert hidden.components["lint"] == 0.0 and hidden.components["rules"] <= 1 / 3, (
        hidden.components, hidden.details)
    assert hidden.reward <= in_place.reward, (hidden.components, in_place.components)


async def test_a_big_flat_file_is_parsed_outside_the_grader() -> None:
    task = humaneval_task("HumanEval/0")
    junk = "a=[" + "0," * ((3 << 20) // 2) + "]\n"
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ticking = asyncio.create_task(ticker())
    try:
        result = await _attempt(task, {"solution.py": task.solution["solution.py"],
                                       "junk.py": junk})
    finally:
        ticking.cancel()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result.reward == 1.0, (result.flags, result.details[:3])
    assert any("not screened" in d for d in result.details), result.details
    assert max(gaps) < 1.0, f"the event loop stopped for {max(gaps):.1f} s"
    assert grown_mib < 300, f"the grader grew by {grown_mib:.0f} MiB"
