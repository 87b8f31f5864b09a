"""A training run's report: one self-contained HTML page from its ``metrics.jsonl``.

``tempering train`` appends one JSON object per learner step to ``runs/<name>/metrics.jsonl``
and keeps the run's ``config.yaml`` beside it. ``write_report`` turns both into
``report.html``: a headline table (``summary``, which the train command also prints), line
charts of reward, staleness against its bound, throughput, utilisation of sandboxes, inference
and the learner, and the learner's own figures, then the config as it was run.

Design:

- No dependencies and no script: the page is HTML with inline SVG drawn by ``_chart`` (nice
  ticks, polylines, a legend), so it opens offline, from a CI artifact or an e-mail attachment,
  and can be written while the run is still going.
- Tolerant reading, because the file is appended to live and outlives the code that wrote it. A
  last line cut short (still being written, or its writer was killed) is not a record yet and
  is ignored. A line that does not parse anywhere else (a writer killed mid-line, then a resume
  appending after it) is skipped and counted on the page. A step that appears twice (a resume
  that replayed steps from its checkpoint) keeps its latest line. A field missing from a line
  (older runs), or not a finite number, is left out of its chart; nothing crashes on it.
- Everything inserted into the page is escaped, and the page is replaced atomically (temp file
  and ``os.replace``), so a browser refreshing it never sees half a report.
"""

from __future__ import annotations

import html
import json
import math
import os
import statistics
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tempering.errors import ConfigError

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
REPORT_FILE = "report.html"
COLLAPSES_FILE = "collapses.jsonl"
"""Every collapse the trainer detected and what it did (a rollback, or the run's end)."""

Metrics = Sequence[Mapping[str, Any]]

# presentation attributes, not page CSS: a chart copied out of the page still draws the same
_GRID, _MISSING = ' stroke="#ececec"', ' fill="#999"'
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


def load_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The run's per-step metrics in step order, one dict per learner step.

    Skips a partial trailing line and any line that is not a JSON object with an integer
    ``step``; a step logged twice keeps its latest line. Raises ``ConfigError`` naming the path
    when ``metrics.jsonl`` cannot be read.
    """
    return _read(Path(run_dir) / METRICS_FILE)[0]


def _read(path: Path) -> tuple[list[dict[str, Any]], int]:
    """``(records, unreadable)``: the records, and how many complete lines were skipped."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"cannot read the run's metrics at {path} ({e.strerror or e}): pass "
                          f"the directory of a run that `tempering train` has written, which "
                          f"holds {METRICS_FILE}") from None
    *lines, tail = text.split("\n")  # tail: "" when the file ends with a newline
    by_step: dict[int, dict[str, Any]] = {}
    unreadable = 0
    for line in lines:
        record = _parse(line)
        if record is None:
            unreadable += bool(line.strip())
        else:
            by_step[record["step"]] = record
    # a tail without its newline may still be complete JSON (killed between record and newline)
    if (record := _parse(tail)) is not None:
        by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)], unreadable


def read_collapses(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every collapse recorded in the run's ``collapses.jsonl``, in order (none: [])."""
    try:
        text = Path(run_dir, COLLAPSES_FILE).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return [r for r in map(_parse, text.splitlines()) if r is not None]


def _parse(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    return record if isinstance(step, int) and not isinstance(step, bool) else None


def _num(value: Any) -> float | None:
    """A finite number, else ``None`` (absent, a string, ``true``, NaN or infinite)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _values(metrics: Metrics, key: str) -> list[float]:
    return [v for m in metrics if (v := _num(m.get(key))) is not None]


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def summary(metrics: Metrics) -> dict[str, Any]:
    """Headline figures of a run; a figure the metrics do not record is ``None``.

    ``mode``; ``steps`` (the latest step); ``wall_s`` (the latest wall time); ``reward_first``
    and ``reward_last``: the mean of ``reward_mean`` over the first and the last fifth of the
    steps (at least one step each); ``staleness_max`` (the largest observed) against
    ``max_staleness`` (the configured bound, as of the latest line); ``learner_idle_frac``
    (mean over steps); ``samples_per_s`` (samples trained over the wall time);
    ``dropped_stale`` and ``dropped_filtered`` (cumulative, as of the latest line);
    ``rollbacks`` (after a collapse, as of the latest line).
    """
    fifth = max(1, len(metrics) // 5)
    wall = _values(metrics, "wall_s")
    samples = _values(metrics, "samples")
    modes = [m["mode"] for m in metrics if isinstance(m.get("mode"), str)]

    def last(key: str) -> int | None:
        values = _values(metrics, key)
        return int(values[-1]) if values else None

    return {
        "mode": modes[-1] if modes else None,
        "steps": last("step"),
        "wall_s": wall[-1] if wall else None,
        "reward_first": _mean(_values(metrics[:fifth], "reward_mean")),
        "reward_last": _mean(_values(metrics[-fifth:], "reward_mean")),
        "staleness_max": _whole(max(_values(metrics, "staleness_max"), default=None)),
        "max_staleness": last("max_staleness"),
        "learner_idle_frac": _mean(_values(metrics, "learner_idle_frac")),
        "samples_per_s": sum(samples) / wall[-1] if samples and wall and wall[-1] > 0 else None,
        "dropped_stale": last("dropped_stale"),
        "dropped_filtered": last("dropped_filtered"),
        "rollbacks": last("rollbacks"),
    }


_HEADLINE = (("mode", "mode"), ("steps", "learner steps"), ("wall_s", "wall time (s)"),
             ("reward_first", "reward, first fifth of steps"),
             ("reward_last", "reward, last fifth of steps"),
             ("staleness_max", "staleness, largest observed"),
             ("max_staleness", "staleness bound (max_staleness)"),
             ("learner_idle_frac", "learner idle fraction, mean"),
             ("samples_per_s", "samples/s, overall"), ("dropped_stale", "groups dropped stale"),
             ("dropped_filtered", "groups dropped by filters"),
             ("rollbacks", "rollbacks after a collapse"))


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


@dataclass(frozen=True)
class _Series:
    name: str
    points: tuple[tuple[float, float], ...]
    dashed: bool = False


def _series(metrics: Metrics, name: str, x: str, y: str, *, dashed: bool = False,
            f: Callable[[float], float] = lambda v: v) -> _Series:
    """``(x, f(y))`` for every line that records both as finite numbers."""
    return _Series(name, tuple((xv, f(yv)) for m in metrics
                               if (xv := _num(m.get(x))) is not None
                               and (yv := _num(m.get(y))) is not None), dashed)


def _axis(lo: float, hi: float, count: int = 5) -> tuple[list[float], float, float]:
    """Ticks at 1, 2 or 5 times a power of ten covering ``[lo, hi]``, and the widened range."""
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):  # a constant still needs a band to sit in
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = (lo, lo + pad) if lo == 0 else (lo - pad, hi + pad)
    raw = (hi - lo) / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = [i * step for i in range(first, last + 1)]
    return ticks, ticks[0], ticks[-1]


def _tick(value: float) -> str:
    return f"{round(value, 9) + 0.0:g}"  # + 0.0 turns -0.0 into 0


def _chart(title: str, series: Sequence[_Series], *, x_label: str,
           include: tuple[float, ...] = (), x_include: tuple[float, ...] = (),
           width: int = 600, height: int = 280) -> str:
    """An SVG line chart, titled and labelled, with a legend that names a series that was not
    recorded. ``include``: values the y range must cover (0, or 0 and 1);
    ``x_include``: the run's whole x span, so charts of one run line up even where a series
    stops early."""
    e = html.escape
    left, right, top, bottom = 58, 16, 30, 62  # bottom holds tick labels, x label and legend
    pw, ph = width - left - right, height - top - bottom
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title)}" '
           f'font-family="sans-serif" font-size="11" fill="#333">',
           f'<text x="{left}" y="18" font-size="13" font-weight="600">{e(title)}</text>']
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    if not xs:
        out.append(f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" '
                   f'{_MISSING}>not recorded in this run</text></svg>')
        return "".join(out)
    x_ticks, x0, x1 = _axis(min(xs + list(x_include)), max(xs + list(x_include)))
    y_ticks, y0, y1 = _axis(min(ys + list(include)), max(ys + list(include)))

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    for t in y_ticks:
        out.append(f'<line x1="{left}" y1="{sy(t):.1f}" x2="{left + pw}" y2="{sy(t):.1f}" '
                   f'{_GRID}/><text x="{left - 6}" y="{sy(t) + 4:.1f}" '
                   f'text-anchor="end">{_tick(t)}</text>')
    for t in x_ticks:
        out.append(f'<line x1="{sx(t):.1f}" y1="{top}" x2="{sx(t):.1f}" y2="{top + ph}" '
                   f'{_GRID}/><text x="{sx(t):.1f}" y="{top + ph + 16}" '
                   f'text-anchor="middle">{_tick(t)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>'
               f'<text x="{left + pw / 2}" y="{top + ph + 32}" text-anchor="middle">'
               f'{e(x_label)}</text>')
    legend_x = float(left)
    for i, s in enumerate(series):  # colours follow the series' place, recorded or not
        color, dash = _COLORS[i % len(_COLORS)], ' stroke-dasharray="6 4"' if s.dashed else ""
        if len(s.points) == 1:  # a polyline of one point draws nothing
            out.append(f'<circle cx="{sx(s.points[0][0]):.1f}" cy="{sy(s.points[0][1]):.1f}" '
                       f'r="2.5" fill="{color}"/>')
        elif s.points:
            points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s.points)
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} '
                       f'points="{points}"/>')
        name, cls = (s.name, "") if s.points else (f"{s.name} (not recorded)", _MISSING)
        ly = height - 10
        out.append(f'<line x1="{legend_x:.0f}" y1="{ly - 4}" x2="{legend_x + 18:.0f}" '
                   f'y2="{ly - 4}" stroke="{color}" stroke-width="2"{dash}/>'
                   f'<text x="{legend_x + 22:.0f}" y="{ly}"{cls}>{e(name)}</text>')
        legend_x += 34 + 6.2 * len(name)  # about the width of an 11px sans-serif character
    out.append("</svg>")
    return "".join(out)


def _charts(metrics: Metrics) -> list[tuple[str, list[str]]]:
    """The report's sections: a heading and its charts."""
    def s(name: str, x: str, y: str, **kw: Any) -> _Series:
        return _series(metrics, name, x, y, **kw)

    steps, walls = _values(metrics, "step"), _values(metrics, "wall_s")
    step_span = (steps[0], steps[-1])  # every record has a step: _parse insists
    wall_span = (walls[0], walls[-1]) if walls else ()

    def per_step(title: str, series: list[_Series], include: tuple[float, ...] = (), *,
                 small: bool = False) -> str:
        width, height = (300, 220) if small else (600, 280)
        return _chart(title, series, x_label="learner step", include=include,
                      x_include=step_span, width=width, height=height)

    def per_wall(title: str, series: list[_Series], include: tuple[float, ...]) -> str:
        return _chart(title, series, x_label="wall time (s)", include=include,
                      x_include=wall_span)

    return [
        ("Reward", [per_wall("Reward over wall time", [
            s("reward_mean", "wall_s", "reward_mean"), s("ok_frac", "wall_s", "ok_frac")],
            (0.0, 1.0))]),
        ("Staleness", [per_step("Staleness per step (versions)", [
            s("staleness_mean", "step", "staleness_mean"),
            s("staleness_max", "step", "staleness_max"),
            s("max_staleness (bound)", "step", "max_staleness", dashed=True)], (0.0,))]),
        ("Throughput", [per_wall("Throughput over wall time (per second)", [
            s("samples/s", "wall_s", "samples_per_s"),
            s("episodes/s", "wall_s", "episodes_per_s")], (0.0,))]),
        ("Utilisation", [per_step("Utilisation per step (fraction of capacity)", [
            s("sandbox_util", "step", "sandbox_util"),
            s("inference_util", "step", "inference_util"),
            s("learner busy", "step", "learner_idle_frac", f=lambda v: 1.0 - v)], (0.0, 1.0))]),
        ("Learner", [
            per_step("Loss", [s("loss", "step", "loss"), s("pg_loss", "step", "pg_loss")],
                     small=True),
            per_step("Clip fraction", [s("clip_frac", "step", "clip_frac")], (0.0,), small=True),
            per_step("Gradient norm", [s("grad_norm", "step", "grad_norm")], (0.0,), small=True),
            per_step("KL", [s("kl", "step", "kl"), s("approx_kl", "step", "approx_kl")],
                     small=True)]),
    ]


_STYLE = """body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1300px}
table{border-collapse:collapse}td{padding:3px 14px 3px 0;border-bottom:1px solid #e4e4e4}
td.v{text-align:right;font-variant-numeric:tabular-nums}
svg{margin:4px 10px 4px 0;vertical-align:top}.note{color:#777}
pre{background:#f6f6f6;padding:12px;overflow:auto}"""


def _page(title: str, head: Mapping[str, Any], config: str | None,
          sections: Sequence[tuple[str, list[str]]], unreadable: int,
          collapses: Sequence[Mapping[str, Any]] = ()) -> str:
    e = html.escape
    rows = "".join(f'<tr><td>{e(label)}</td><td class="v">{e(_fmt(head.get(key)))}</td></tr>'
                   for key, label in _HEADLINE)
    if collapses:
        rows += "".join(
            f"<tr><td>collapse at step {e(str(c.get('step')))}</td><td>"
            f"{e(str(c.get('diagnosis')))}<br>{e(str(c.get('action')))}</td></tr>"
            for c in collapses)
    note = (f'<p class="note">{unreadable} unreadable line(s) in {METRICS_FILE} skipped '
            f"(a writer killed mid-line).</p>" if unreadable else "")
    body = "".join(f"<section><h2>{e(name)}</h2>{''.join(svgs)}</section>"
                   for name, svgs in sections)
    shown = e(config) if config is not None else f"(no {CONFIG_FILE} in the run directory)"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{e(title)}</h1><table>{rows}</table>{note}{body}"
            f"<section><h2>Config</h2><pre>{shown}</pre></section></body></html>\n")


def write_report(run_dir: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Write ``run_dir/report.html`` from the run's metrics and config; returns its path.

    Raises ``ConfigError`` naming the path when ``metrics.jsonl`` is missing or has no complete
    line yet. Safe to call while the run is writing: the page is replaced atomically.
    """
    run = Path(run_dir)
    metrics, unreadable = _read(run / METRICS_FILE)
    if not metrics:
        raise ConfigError(f"{run / METRICS_FILE} has no complete metrics line: a report needs "
                          f"at least one learner step; wait for the first step, or check that "
                          f"the run did not fail before it")
    try:
        config: str | None = (run / CONFIG_FILE).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        config = None
    collapses = read_collapses(run)
    page = _page(title or f"Tempering run {run.resolve().name}", summary(metrics), config,
                 _charts(metrics), unreadable, collapses)
    out = run / REPORT_FILE
    # a unique name: two writers never share a temp file; opened normally so the umask applies
    tmp = run / f".{REPORT_FILE}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
