"""A RewardResult for people: a table of the reward, its components, the tests and the flags."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from tempering.reward.result import NOTES, TAMPER, RewardResult

OUTCOME_STYLE = {"passed": "green", "failed": "red", "error": "red", "missing": "red",
                 "skipped": "yellow", "xfailed": "yellow", "xpassed": "yellow"}


def render(result: RewardResult, title: str = "") -> Group:
    """The result as rich renderables: a summary, the tests, and every finding."""
    summary = Table(title=title or None, title_justify="left", show_header=False, box=None)
    summary.add_column(style="bold")
    summary.add_column()
    style = "red" if result.tampered else "green" if result.reward == 1 else "yellow"
    summary.add_row("reward", Text(f"{result.reward:.3f}", style=f"bold {style}"))
    for name, value in sorted(result.components.items()):
        summary.add_row(f"  {name}", f"{value:.3f}")
    summary.add_row("tests", f"{result.tests_passed}/{result.tests_total} passed")
    summary.add_row("changed", ", ".join(result.changed_files) or "nothing")
    summary.add_row("time", f"{result.duration_s * 1000:.0f} ms")
    parts: list[Table] = [summary]
    if result.tests:
        tests = Table("test", "outcome", title="tests", title_justify="left")
        for test in result.tests[:50]:
            tests.add_row(test.id, Text(test.outcome, style=OUTCOME_STYLE.get(test.outcome, "")))
        if len(result.tests) > 50:
            tests.add_row(f"... {len(result.tests) - 50} more", "")
        parts.append(tests)
    if result.flags:
        flags = Table("flag", "kind", "meaning", title="flags", title_justify="left")
        for flag in result.flags:
            kind = Text("tamper", style="bold red") if flag in TAMPER else Text("note")
            flags.add_row(flag, kind, TAMPER.get(flag) or NOTES.get(flag, ""))
        parts.append(flags)
    if result.details:
        details = Table("detail", title="details", title_justify="left")
        for line in result.details[:30]:
            details.add_row(line[:300])
        parts.append(details)
    return Group(*parts)
