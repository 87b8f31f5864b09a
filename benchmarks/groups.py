"""Starting a group of samples: prepare once and fork, against preparing every sample.

    .venv/bin/python benchmarks/groups.py [--quick] [--samples N] [--json PATH] [--only ...]

An RL step plays N samples of one task. Each needs the task's environment ready: a sandbox
started, the repository written, its setup run (an install, a compile). Sections:

1. group: time until all N sandboxes of a repo-bugs task are ready for an agent, on a task
   whose setup step installs the package (``pip install --target .deps .``) and compiles a C
   accelerator (at least 2 s of one CPU on these machines; its time alone is printed), built
   two ways: ``serial`` (one compiler run over one file) and ``parallel`` (the same code in
   eight files, compiled one job per CPU, as ``make -j"$(nproc)"`` would). ``prepare once +
   fork`` is what rollouts do (``tasks/setup.py``: the setup runs once, in one sandbox with
   every CPU of the host, one prepared root is written, each sample forks it); ``prepare
   each`` is every sample starting its own sandbox (the task's: one CPU), writing the
   repository and running the setup, all N at once (as N sandbox slots would). The two
   alternate round by round; medians, and their ratio (target: at least 5x sooner).
   Preparing each runs N setups on the machine's cores at once; preparing once runs one, so
   counting the setups' time only, the ratio the cores allow is N / cores for a serial setup
   (4x for 8 samples on 2 cores) and N for a parallel one: printed beside each (the sandbox
   starts and file writes that preparing each also repeats can take it a little past). The
   setup runs once per task per process, so every later group of the task (an RL step after
   the first) forks a root written from the prepared tree: that figure too. Every sample's
   sandbox is checked to hold the built accelerator.
2. fork: fork of a sandbox holding a 1 MiB and a 200 MiB workspace (1 MiB files) on volume
   storage, against fork of an empty one, p50 and p99 (target: p50 at most 10 ms, whatever
   the size); ``benchmarks/sandbox.py``'s fork section, at these two sizes.

Targets are printed with PASS/MISS; a MISS does not fail the run, a crash does (exit status 1).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable

from figures import Figure, Section, console, report, run_benchmark

from sandbox import _fork, storages
from tempering.sandbox import Sandbox, open_sandbox
from tempering.tasks import setup as setup_module
from tempering.tasks.repo_bugs import repo_bugs
from tempering.tasks.setup import PreparedRoot, without_setup
from tempering.tasks.task import SetupConfig, Task

ACCELERATOR_FUNCTIONS = 900  # about 2 s of cc -O2 on this project's CI machines
INSTALL = "python3 -m pip install -q --no-index --no-deps --no-build-isolation --target .deps ."
# Two builds of the same accelerator: one compiler run over one file (a serial setup), or the
# file in eight parts, compiled as a build system would, one job per CPU (make -j"$(nproc)").
SETUPS = {
    "serial": f"{INSTALL} && cc -O2 -shared -fPIC -o .deps/_speedups.so _native/speedups.c",
    "parallel": (f"{INSTALL} && ls _native/*.c | xargs -P \"$(nproc)\" -I{{}} "
                 "cc -O2 -fPIC -c {} -o {}.o && cc -shared -o .deps/_speedups.so _native/*.o"),
}
PARTS = 8


def mixers(first: int, count: int) -> list[str]:
    """C definitions of ``count`` small mixing functions, numbered from ``first``."""
    return [f"uint64_t mix{i}(uint64_t x) {{ for (int k = 0; k < {i % 7 + 3}; k++) "
            f"{{ x ^= x << 13; x ^= x >> 7; x ^= x << 17; x += {i}u; }} "
            f"return x * {2 * i + 1}u; }}" for i in range(first, first + count)]


def accelerator_sources(functions: int, parts: int) -> dict[str, bytes]:
    """The accelerator's C files: ``functions`` mixing functions over ``parts`` files, and in
    the first, one that calls them all."""
    per = -(-functions // parts)
    files: dict[str, bytes] = {}
    for part in range(parts):
        first, count = part * per, min(per, functions - part * per)
        lines = ["#include <stdint.h>", *mixers(first, count)]
        if part == 0:
            lines += [f"uint64_t mix{i}(uint64_t x);" for i in range(per, functions)]
            lines.append("uint64_t mix_all(uint64_t x) { " + " ".join(
                f"x = mix{i}(x);" for i in range(functions)) + " return x; }")
        name = "speedups.c" if parts == 1 else f"speedups{part}.c"
        files[f"_native/{name}"] = ("\n".join(lines) + "\n").encode()
    return files


def setup_task(build: str = "serial") -> Task:
    """The first repo-bugs task, with an accelerator to compile and a setup step (``build``:
    a key of SETUPS). Its sandbox has one CPU, as each sample's has."""
    task = repo_bugs(1)[0]
    parts = 1 if build == "serial" else PARTS
    workspace = task.workspace.overlay(accelerator_sources(ACCELERATOR_FUNCTIONS, parts))
    config = task.config.model_copy(update={
        "setup": SetupConfig(command=SETUPS[build], timeout_s=300),
        "sandbox": task.config.sandbox.model_copy(update={"memory_mb": 1024, "cpus": 1.0})})
    return dataclasses.replace(task, config=config, workspace=workspace)


async def check_ready(sb: Sandbox) -> None:
    names = await sb.list(".deps")
    if "_speedups.so" not in names or "ledger" not in names:
        raise RuntimeError(f"a sample's sandbox lacks the setup's output: .deps holds {names}")


async def prepare_each(task: Task, n: int) -> float:
    """N samples, each starting its sandbox, writing the repository and running the setup."""
    bare = without_setup(task)
    opened: list[Sandbox] = []

    async def one() -> None:
        sb = await open_sandbox(task.sandbox)
        opened.append(sb)
        await bare.prepare(sb)
        done = await sb.exec(["bash", "-c", task.config.setup.command], timeout=300)
        if not done.ok:
            raise RuntimeError(f"setup failed: {done.stderr[-300:]}")

    start = time.perf_counter()
    try:
        await asyncio.gather(*(one() for _ in range(n)))
        elapsed = time.perf_counter() - start
        await asyncio.gather(*(check_ready(sb) for sb in opened))
    finally:
        await asyncio.gather(*(sb.close() for sb in opened))
    return elapsed


async def prepare_once(task: Task, n: int, *, cached: bool = False) -> float:
    """N samples forking one prepared root; the setup runs once in this round (the process's
    cache of prepared tasks is emptied first), or not at all (``cached``: a later group of
    the same task, as every RL step after the first)."""
    if not cached:
        setup_module._prepared.clear()
    forks: list[Sandbox] = []
    start = time.perf_counter()
    async with PreparedRoot(task) as root:
        try:
            forks += await asyncio.gather(*(root.sandbox() for _ in range(n)))
            elapsed = time.perf_counter() - start
            await asyncio.gather(*(check_ready(sb) for sb in forks))
        finally:
            await asyncio.gather(*(sb.close() for sb in forks))
    return elapsed


async def setup_alone(task: Task) -> float:
    """The setup step's time in a sandbox of the task's (one CPU), as each sample has it."""
    bare = without_setup(task)
    async with open_sandbox(task.sandbox) as sb:
        await bare.prepare(sb)
        start = time.perf_counter()
        done = await sb.exec(["bash", "-c", task.config.setup.command], timeout=300)
        elapsed = time.perf_counter() - start
    if not done.ok:
        raise RuntimeError(f"setup failed: {done.stderr[-300:]}")
    return elapsed


async def group(args: argparse.Namespace) -> list[Figure]:
    figures: list[Figure] = []
    for build in SETUPS:
        figures += await _group(args, build)
    return report(figures)


async def _group(args: argparse.Namespace, build: str) -> list[Figure]:
    n, rounds = args.samples, (2 if args.quick else 5)
    task = setup_task(build)
    setup_s = statistics.median([await setup_alone(task) for _ in range(2)])
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(rounds):  # alternated, and which goes first too
        order: list[tuple[list[float], Callable[[Task, int], Awaitable[float]]]] = [
            (ours, prepare_once), (theirs, prepare_each)]
        for samples, how in (order if i % 2 == 0 else order[::-1]):
            samples.append(await how(task, n))
    console.print(f"  [dim]{build} build, rounds (s): once+fork "
                  f"{', '.join(f'{x:.2f}' for x in ours)}; "
                  f"each {', '.join(f'{x:.2f}' for x in theirs)}[/]")
    later = statistics.median([await prepare_once(task, n, cached=True)
                               for _ in range(rounds)])
    once, each = statistics.median(ours), statistics.median(theirs)
    cores = len(os.sched_getaffinity(0))
    # Preparing each runs N setups on the machine's cores at once; preparing once runs one,
    # which a parallel build spreads over every core: bound N / cores, or N.
    allowed = n / cores if build == "serial" else n
    section = f"group, {build} build"
    why = f"{n} setups over {cores} cores" if build == "serial" else f"{n} setups, one spread"
    return [
        Figure(section, "setup step alone, one CPU (install + compile)", setup_s, "s", None,
               "", ">= 2 s", setup_s >= 2.0),
        Figure(section, f"start a group of {n}: prepare once + fork", once, "s", each,
               "prepare each", "<= 0.2x (5x sooner)", once <= each / 5),
        Figure(section, "  times sooner", each / once, "x", relative=False),
        Figure(section, f"  what the cores allow ({why}; setup time only)", allowed, "x",
               relative=False),
        Figure(section, f"start a later group of {n} (setup done once per process)", later,
               "s", each, "prepare each", "<= 0.2x (5x sooner)", later <= each / 5),
        Figure(section, "  times sooner", each / later, "x", relative=False),
    ]


async def fork(args: argparse.Namespace) -> list[Figure]:
    if "volume" not in storages("fork"):
        return []
    runs = 10 if args.quick else 30
    figures: list[Figure] = []
    for mb in (1, 200):
        figures += await _fork("volume", mb, runs)
    return report(figures)


SECTIONS: dict[str, Callable[[argparse.Namespace], Awaitable[list[Figure]]]] = {
    "group": group, "fork": fork}


def machine() -> dict[str, object]:
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return {"kernel": platform.release(), "cpus": len(os.sched_getaffinity(0)),
            "memory_gib": round(total / (1 << 20), 1), "python": platform.python_version(),
            "load_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--samples", type=int, default=8, help="samples in a group (8)")
    run_benchmark(parser, list(SECTIONS), "groups", sections, machine)


def sections(args: argparse.Namespace) -> dict[str, Section]:
    return {name: (lambda f=f: f(args)) for name, f in SECTIONS.items()}


if __name__ == "__main__":
    main()
