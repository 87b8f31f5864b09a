"""What every benchmark prints: figures beside their same-run baselines, ratios and verdicts.

Shared by ``sandbox.py`` and ``grading.py`` (run as scripts, so this directory is on the path).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

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
