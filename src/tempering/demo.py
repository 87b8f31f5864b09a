"""The sandbox demo: many short episodes through one pool, a few of them misbehaving.

This is the project's main job until the trainer exists. ``run_demo`` pushes ``n`` episodes
through a ``SandboxPool`` the way a rollout scheduler will: ``concurrency`` workers each take the
next episode, allocate a fresh sandbox (``timeout=None``: wait for a free slot rather than fail),
run one small Python program in it, grade its output and release the sandbox. Workers, rather
than one task per episode, keep the allocate latency a measure of the pool, not of the backlog.

Every 25th episode runs a program that misbehaves instead (eats memory, loops forever, floods
stdout) to show that the limits contain it: that episode passes when the sandbox reports the
matching outcome (``oom``, ``timeout``, ``truncated``) and the run goes on. A failed episode is
data, not a crash: its exception becomes its outcome and the other episodes carry on.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from tempering.errors import ConfigError
from tempering.sandbox import ExecResult, SandboxPool, SandboxSpec

if TYPE_CHECKING:
    from rich.console import Console

MISBEHAVE_EVERY = 25
LOOP_TIMEOUT_S = 0.5
_MAX_N = 100_000

_PRIMES = """\
import sys
n = int(sys.argv[1])
sieve = bytearray([1]) * n
sieve[:2] = b"\\0\\0"
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i::i] = bytes(len(range(i * i, n, i)))
print(sum(sieve), sieve.rindex(1))
"""
_EAT_MEMORY = "chunks = []\nwhile True:\n    chunks.append(b'x' * (16 << 20))"
_LOOP = "while True:\n    pass"
_FLOOD = "import sys\nsys.stdout.write('x' * int(sys.argv[1]))"


@dataclass(frozen=True, slots=True)
class Latency:
    """Percentiles of one phase's latency, in milliseconds."""

    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency:
        ms = sorted(s * 1000 for s in seconds)  # not empty: phases nobody reached are left out

        def rank(q: float) -> float:  # nearest rank: a value that was measured
            return ms[max(0, min(len(ms) - 1, int(q * len(ms) + 0.999999) - 1))]

        return cls(len(ms), rank(0.50), rank(0.90), rank(0.99), ms[-1])


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """What a demo run did: outcomes per expected outcome and latency per phase."""

    episodes: int
    concurrency: int
    wall_s: float
    outcomes: Mapping[tuple[str, str], int]
    """(expected outcome, actual outcome) -> how many episodes."""
    latency: Mapping[str, Latency]
    """Phase -> its percentiles: "allocate", "exec" (well-behaved episodes), "exec (oom)",
    "exec (timeout)", "exec (truncated)" (the misbehaving ones), "release"."""
    warm_hits: int
    """Allocations served by a pre-started sandbox."""

    @property
    def unexpected(self) -> int:
        return sum(n for (want, got), n in self.outcomes.items() if want != got)

    @property
    def ok(self) -> bool:
        """Every episode ran and had its expected outcome."""
        return sum(self.outcomes.values()) == self.episodes and self.unexpected == 0

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class _Plan:
    expected: str
    argv: list[str]
    timeout: float | None
    answer: str | None


@dataclass(frozen=True, slots=True)
class _Episode:
    expected: str
    outcome: str
    seconds: dict[str, float]


def _plan(i: int, spec: SandboxSpec) -> _Plan:
    """Episode ``i``'s program, deterministic so that every run is comparable."""
    if i % MISBEHAVE_EVERY == MISBEHAVE_EVERY - 1:
        kind = (i // MISBEHAVE_EVERY) % 3
        if kind == 0:
            return _Plan("oom", ["python3", "-c", _EAT_MEMORY], None, None)
        if kind == 1:
            return _Plan("timeout", ["python3", "-c", _LOOP], LOOP_TIMEOUT_S, None)
        flood = str(4 * spec.output_limit_bytes)
        return _Plan("truncated", ["python3", "-c", _FLOOD, flood], None, None)
    n = 10_000 + (i * 7_919) % (_MAX_N - 10_000)
    return _Plan("ok", ["python3", "-c", _PRIMES, str(n)], None, _primes_below(n))


def _primes_below(n: int) -> str:
    """The expected answer ("count largest"), from one host-side table of primes."""
    primes = _primes(_MAX_N)
    count = bisect.bisect_left(primes, n)
    return f"{count} {primes[count - 1]}"


@cache
def _primes(limit: int) -> list[int]:
    sieve = [True] * limit
    for i in range(2, int(limit ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = [False] * len(range(i * i, limit, i))
    return [k for k in range(2, limit) if sieve[k]]


def _grade(result: ExecResult, answer: str | None) -> str:
    if result.timed_out:
        return "timeout"
    if result.oom_killed:
        return "oom"
    if result.truncated:
        return "truncated"
    if result.exit_code != 0:
        last = (result.stderr.strip().splitlines() or [""])[-1]
        return f"error: exit {result.exit_code}: {last[:60]}".rstrip(": ")
    if answer is not None and result.stdout.strip() != answer:
        return "wrong output"
    return "ok"


async def _episode(pool: SandboxPool, spec: SandboxSpec, i: int, plan: _Plan) -> _Episode:
    task_id = f"episode-{i}"
    seconds: dict[str, float] = {}
    outcome = "error: never ran"
    clock = time.perf_counter()

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[phase], clock = now - clock, now

    try:
        sandbox = await pool.allocate(task_id, spec, timeout=None)
        lap("allocate")
        try:
            result = await sandbox.exec(plan.argv, timeout=plan.timeout)
            lap("exec" if plan.expected == "ok" else f"exec ({plan.expected})")
            outcome = _grade(result, plan.answer)
        finally:
            await pool.release(task_id)
            lap("release")
    except Exception as exc:  # a failed episode is data, not a crash of the run
        first = (str(exc).splitlines() or [""])[0]
        outcome = f"error: {type(exc).__name__}: {first[:80]}".rstrip(": ")
    return _Episode(plan.expected, outcome, seconds)


async def run_demo(n: int = 300, concurrency: int = 32, spec: SandboxSpec | None = None,
                   console: Console | None = None) -> DemoSummary:
    """Run ``n`` episodes, ``concurrency`` at a time; show progress, then print the summary."""
    import rich.progress as rp
    from rich.console import Console

    if n < 1:
        raise ConfigError(f"episodes must be at least 1, got {n}")
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
    spec = spec or SandboxSpec()
    console = console or Console()
    plans = [_plan(i, spec) for i in range(n)]
    done: list[_Episode] = []
    start = time.perf_counter()
    with rp.Progress(rp.SpinnerColumn(), rp.TextColumn("[bold]episodes"), rp.BarColumn(),
                     rp.MofNCompleteColumn(), rp.TextColumn("{task.fields[status]}"),
                     rp.TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("episodes", total=n, status="[green]all as expected")
        async with SandboxPool(max_instances=concurrency, warm=min(8, concurrency),
                               spec=spec) as pool:
            queue = iter(enumerate(plans))  # shared: each worker takes the next episode

            async def worker() -> None:
                for i, plan in queue:
                    episode = await _episode(pool, spec, i, plan)
                    done.append(episode)
                    bad = sum(e.outcome != e.expected for e in done)
                    status = f"[red]{bad} unexpected" if bad else "[green]all as expected"
                    progress.update(bar, advance=1, status=status)

            await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
            warm_hits = pool.stats().warm_hits
    wall = time.perf_counter() - start

    phases = ("allocate", "exec", "exec (oom)", "exec (timeout)", "exec (truncated)", "release")
    summary = DemoSummary(
        episodes=n, concurrency=concurrency, wall_s=wall,
        outcomes=dict(Counter((e.expected, e.outcome) for e in done)),
        latency={p: Latency.of(t) for p in phases
                 if (t := [e.seconds[p] for e in done if p in e.seconds])},
        warm_hits=warm_hits)
    print_summary(summary, console)
    return summary


def print_summary(summary: DemoSummary, console: Console) -> None:
    """The latency table, the outcome table and the totals."""
    from rich.table import Column, Table

    latency = Table("phase", title="Latency per phase (ms)", title_justify="left")
    for name in ("episodes", "p50", "p90", "p99", "max"):
        latency.add_column(name, justify="right")
    for phase, lat in summary.latency.items():
        latency.add_row(phase, str(lat.count), *(f"{v:.1f}" for v in
                                                 (lat.p50_ms, lat.p90_ms, lat.p99_ms, lat.max_ms)))

    outcomes = Table("expected", "outcome", Column("episodes", justify="right"),
                     Column("as expected", justify="center"), title="Outcomes",
                     title_justify="left")
    for (want, got), count in sorted(summary.outcomes.items()):  # "ok" sorts first
        mark = "[green]✓" if want == got else "[red]✗"
        outcomes.add_row(want, got if want == got else f"[red]{got}", str(count), mark)

    console.print(latency)
    console.print(outcomes)
    console.print(f"{summary.episodes} episodes in {summary.wall_s:.2f} s: "
                  f"[bold]{summary.episodes_per_s:.0f} episodes/s[/bold], concurrency "
                  f"{summary.concurrency}, {summary.warm_hits} warm allocations")
    if summary.ok:
        console.print("[bold green]✓ every episode had its expected outcome")
    else:
        console.print(f"[bold red]✗ {summary.unexpected} of {summary.episodes} episodes had an "
                      "unexpected outcome")
