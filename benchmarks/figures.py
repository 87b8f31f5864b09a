"""What every benchmark prints: figures beside their same-run baselines, ratios and verdicts.

Shared by ``sandbox.py`` and ``grading.py`` (run as scripts, so this directory is on the path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)


@dataclass(frozen=True)
class Figure:
    """One measured value, its baseline from the same run, and its target if it has one."""

    section: str
    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: str = ""
    passed: bool | None = None
    relative: bool = True
    """Whether value / baseline means something (not for counts compared for equality)."""

    @property
    def ratio(self) -> float | None:
        if not self.relative or self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile: a value that was actually observed."""
    ordered = sorted(samples)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def report(figures: list[Figure]) -> list[Figure]:
    """Print each figure on a line as it is measured; returns them."""
    for f in figures:
        line = f"  {f.name:<44} {fmt(f.value, f.unit):>12}"
        if f.baseline is not None:
            line += f"   {f.baseline_name}: {fmt(f.baseline, f.unit)}"
        if f.ratio is not None:
            line += f"   ratio {f.ratio:.2f}x"
        if f.target:
            line += f"   target {f.target}: {verdict(f.passed)}"
        console.print(line)
    return figures


def fmt(value: float, unit: str) -> str:
    return (f"{value:,.0f} {unit}" if abs(value) >= 1000 else f"{value:.3g} {unit}").strip()


def verdict(passed: bool | None) -> str:
    return "" if passed is None else "[green]PASS[/]" if passed else "[red]MISS[/]"


def summary(figures: list[Figure], title: str) -> Table:
    """Every figure of the run in one table."""
    table = Table(title=title, title_justify="left")
    for col, justify in (("section", "left"), ("figure", "left"), ("value", "right"),
                         ("baseline (same run)", "right"), ("ratio", "right"),
                         ("target", "left"), ("", "left")):
        table.add_column(col, justify=justify)
    previous = None
    for f in figures:
        base = "" if f.baseline is None else f"{fmt(f.baseline, f.unit)} ({f.baseline_name})"
        ratio = "" if f.ratio is None else f"{f.ratio:.2f}x"
        table.add_row("" if f.section == previous else f.section, f.name.strip(),
                      fmt(f.value, f.unit), base, ratio, f.target, verdict(f.passed))
        previous = f.section
    return table


Section = Callable[[], Awaitable[list[Figure]]]


def run_benchmark(parser: argparse.ArgumentParser, names: list[str], title: str,
                  sections: Callable[[argparse.Namespace], dict[str, Section]],
                  machine: Callable[[], dict[str, object]]) -> None:
    """Parse the command line (adds ``--only`` and ``--json``; ``--quick`` is the caller's),
    run the chosen sections (one that crashes is reported and the rest still run), print the
    summary, write the JSON, exit 1 if a section crashed."""
    parser.add_argument("--only", type=lambda s: s.split(","),
                        help=f"comma-separated sections out of {','.join(names)}")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    args = parser.parse_args()
    unknown = set(args.only or ()) - set(names)
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(names)}")
    result = asyncio.run(_run(args, title, sections(args), machine()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"figures written to {args.json}")
    sys.exit(1 if result["crashed"] else 0)


async def _run(args: argparse.Namespace, title: str, sections: dict[str, Section],
               info: dict[str, object]) -> dict[str, object]:
    console.print(f"[bold]tempering {title} benchmark[/] ({'quick' if args.quick else 'full'}) "
                  + ", ".join(f"{k} {v}" for k, v in info.items()))
    figures: list[Figure] = []
    crashed: dict[str, str] = {}
    started = time.perf_counter()
    for name in args.only or list(sections):
        console.rule(name)
        section_start = time.perf_counter()
        try:
            figures += await sections[name]()
        except Exception as exc:
            console.print_exception()
            crashed[name] = repr(exc)
        console.print(f"  [dim]({time.perf_counter() - section_start:.1f} s)[/]")
    total = time.perf_counter() - started
    console.print()
    console.print(summary(figures, title))
    load = os.getloadavg()[0]  # other jobs on the host show here, and in every ratio's spread
    console.print(f"total {total:.0f} s, load (1 min) {info['load_1m']:.2f} at start, "
                  f"{load:.2f} at end" + (f"; [red]crashed: {', '.join(crashed)}[/]"
                                         if crashed else ""))
    return {"machine": info, "quick": args.quick, "total_s": total, "load_1m_end": load,
            "crashed": crashed, "figures": [asdict(f) | {"ratio": f.ratio} for f in figures]}


def basic_machine() -> dict[str, object]:
    """What every figure depends on: kernel, cores, Python, and the load when the run began."""
    import platform

    return {"kernel": platform.release(), "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "load_1m": os.getloadavg()[0]}


def benchmark_main(doc: str, sections: dict[str, Callable[[argparse.Namespace],
                                                          Awaitable[list[Figure]]]],
                   title: str, *, quick_help: str = "fewer runs",
                   machine: Callable[[], dict[str, object]] = basic_machine,
                   options: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """The command line of a benchmark script whose sections take the parsed arguments;
    ``options`` adds the script's own."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    if options is not None:
        options(parser)
    run_benchmark(parser, list(sections), title,
                  lambda args: {name: (lambda f=f: f(args)) for name, f in sections.items()},
                  machine)
