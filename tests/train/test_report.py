"""The run report: real metrics.jsonl files as `tempering train` writes them (including the ways a
killed or resumed writer leaves them), one HTML page with a well-formed SVG per chart, the
headline figures computed here independently, and everything inserted escaped."""

from __future__ import annotations

import json
import random
import re
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tempering.errors import ConfigError
from tempering.train.report import load_metrics, summary, write_report

SVG = "{http://www.w3.org/2000/svg}"
TITLES = ["Reward over wall time", "Staleness per step (versions)",
          "Throughput over wall time (per second)", "Utilisation per step (fraction of capacity)",
          "Loss", "Clip fraction", "Gradient norm", "KL"]


def metrics_lines(n: int, *, seed: int = 0, bound: int = 2) -> list[dict[str, Any]]:
    """``n`` steps of an async run that learns: reward rising with noise, staleness within its
    bound, the learner waiting more at the start than later."""
    rng = random.Random(seed)
    lines, wall, dropped = [], 0.0, 0
    for step in range(1, n + 1):
        wait = rng.uniform(0.0, 2.0) * (3.0 if step < n // 4 else 1.0)
        learner = rng.uniform(1.0, 1.5)
        wall += wait + learner
        samples = 32
        dropped += rng.random() < 0.1
        stale = [rng.randint(0, bound) for _ in range(samples)]
        lines.append({
            "step": step, "version": step, "mode": "async", "wall_s": round(wall, 3),
            "reward_mean": min(1.0, 0.25 + 0.6 * step / n + rng.gauss(0, 0.05)),
            "reward_std": rng.uniform(0.2, 0.45), "ok_frac": rng.uniform(0.85, 1.0),
            "samples": samples, "groups": 4, "tokens": samples * rng.randint(300, 600),
            "staleness_mean": statistics.fmean(stale), "staleness_max": max(stale),
            "max_staleness": bound, "learner_s": learner, "wait_s": wait,
            "learner_idle_frac": wait / (wait + learner),
            "learner_idle_frac_total": rng.uniform(0.1, 0.5),
            "samples_per_s": samples / (wait + learner),
            "episodes_per_s": (samples + rng.randint(0, 4)) / (wait + learner),  # + dropped ones
            "sandbox_util": rng.uniform(0.6, 1.0), "inference_util": rng.uniform(0.4, 0.9),
            "loss": rng.gauss(0.0, 0.1), "pg_loss": rng.gauss(0.0, 0.1),
            "kl": abs(rng.gauss(0.01, 0.005)), "clip_frac": rng.uniform(0.0, 0.2),
            "grad_norm": rng.uniform(0.5, 3.0), "is_weight_mean": rng.uniform(0.9, 1.1),
            "approx_kl": abs(rng.gauss(0.01, 0.005)), "buffered_groups": rng.randint(0, 8),
            "dropped_stale": dropped, "dropped_filtered": 2 * step,
        })
    return lines


def write_run(tmp_path: Path, lines: list[dict[str, Any]], *, tail: str = "",
              config: str = "name: demo\nmax_staleness: 2\n") -> Path:
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(config)
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines) + tail)
    return run


def svgs(page: str) -> list[ET.Element]:
    """Every <svg> of the page, each parsed as XML (a malformed one fails the parse)."""
    return [ET.fromstring(m) for m in re.findall(r"<svg\b.*?</svg>", page, re.S)]


def title_of(svg: ET.Element) -> str:
    return "".join(svg.find(f"{SVG}text").itertext())  # type: ignore[union-attr]


def test_report_has_a_wellformed_chart_each_and_the_headline(tmp_path: Path) -> None:
    lines = metrics_lines(50)
    run = write_run(tmp_path, lines)
    path = write_report(run)
    assert path == run / "report.html"
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []  # no temp left
    page = path.read_text()

    charts = svgs(page)
    assert [title_of(s) for s in charts] == TITLES
    for chart in charts:
        width, height = (float(v) for v in chart.get("viewBox", "").split()[2:])
        lines_drawn = chart.findall(f"{SVG}polyline")
        assert lines_drawn, title_of(chart)
        for polyline in lines_drawn:  # every point scaled inside the chart
            for pair in polyline.get("points", "").split():
                x, y = map(float, pair.split(","))
                assert 0 <= x <= width and 0 <= y <= height
    staleness = charts[1]
    assert [p.get("stroke-dasharray") for p in staleness.findall(f"{SVG}polyline")] == [
        None, None, "6 4"]  # the bound is the dashed one
    assert len(staleness.findall(f"{SVG}polyline")[0].get("points", "").split()) == 50

    head = summary(load_metrics(run))
    rewards = [m["reward_mean"] for m in lines]
    assert head["steps"] == 50 and head["mode"] == "async"
    assert head["wall_s"] == lines[-1]["wall_s"]
    assert head["reward_first"] == pytest.approx(statistics.fmean(rewards[:10]))
    assert head["reward_last"] == pytest.approx(statistics.fmean(rewards[-10:]))
    assert head["reward_last"] > head["reward_first"]
    assert head["staleness_max"] == max(m["staleness_max"] for m in lines)
    assert head["max_staleness"] == 2
    assert head["learner_idle_frac"] == pytest.approx(
        statistics.fmean(m["learner_idle_frac"] for m in lines))
    assert head["samples_per_s"] == pytest.approx(50 * 32 / lines[-1]["wall_s"])
    assert head["dropped_filtered"] == 100
    for value in ("reward_first", "reward_last", "learner_idle_frac"):
        assert f">{head[value]:.3f}<" in page, value
    assert f">{head['samples_per_s']:.1f}<" in page  # above 10: one decimal
    assert f">{head['staleness_max']}<" in page and ">50<" in page
    assert "<pre>name: demo\nmax_staleness: 2\n</pre>" in page
    assert "<script" not in page  # self-contained, nothing to run


def test_truncated_last_line_is_ignored(tmp_path: Path) -> None:
    lines = metrics_lines(10)
    cut = json.dumps(metrics_lines(11)[-1])[:40]  # the writer was killed mid-line
    run = write_run(tmp_path, lines, tail=cut)
    assert [m["step"] for m in load_metrics(run)] == list(range(1, 11))
    page = write_report(run).read_text()
    assert summary(load_metrics(run))["steps"] == 10
    assert "unreadable" not in page  # a partial tail is expected, not worth a warning


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    lines = metrics_lines(4)
    run = write_run(tmp_path, lines[:3], tail=json.dumps(lines[3]))
    assert [m["step"] for m in load_metrics(run)] == [1, 2, 3, 4]


def test_resumed_run_keeps_latest_line_per_step_and_counts_the_broken_one(
        tmp_path: Path) -> None:
    first, resumed = metrics_lines(6, seed=1), metrics_lines(8, seed=2)
    # killed while writing step 7, resumed from the checkpoint at step 4 and appended after it
    text = ("".join(json.dumps(m) + "\n" for m in first) + json.dumps(resumed[6])[:30]
            + "".join(json.dumps(m) + "\n" for m in resumed[4:]))
    run = write_run(tmp_path, [])
    (run / "metrics.jsonl").write_text(text)
    got = load_metrics(run)
    assert [m["step"] for m in got] == list(range(1, 9))
    assert got[3] == first[3] and got[5] == resumed[5]  # a replayed step: the resumed line
    # the broken line swallowed the resumed step 5's line (no newline between them)
    assert got[4] == first[4]
    assert "1 unreadable line(s)" in write_report(run).read_text()


@pytest.mark.parametrize("content", [None, "", '{"step": 1, "rew'])
def test_no_complete_metrics_is_a_config_error_naming_the_path(
        tmp_path: Path, content: str | None) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if content is not None:
        (run / "metrics.jsonl").write_text(content)
    with pytest.raises(ConfigError, match=re.escape(str(run / "metrics.jsonl"))):
        write_report(run)
    assert not (run / "report.html").exists()


def test_missing_fields_do_not_crash(tmp_path: Path) -> None:
    lines = metrics_lines(20)
    for i, m in enumerate(lines):
        del m["grad_norm"], m["learner_idle_frac"]  # an older writer never logged them
        if i % 2:
            del m["ok_frac"]
        if i == 3:
            m["loss"] = float("nan")  # non-finite: left out of its chart, not drawn at NaN
        if i >= 10:
            del m["loss"]  # a series that stops early still spans the run's steps
    run = write_run(tmp_path, lines)
    (run / "config.yaml").unlink()
    page = write_report(run).read_text()
    charts = {title_of(s): s for s in svgs(page)}

    assert charts["Gradient norm"].findall(f"{SVG}polyline") == []
    assert "not recorded in this run" in "".join(charts["Gradient norm"].itertext())
    reward = charts["Reward over wall time"].findall(f"{SVG}polyline")
    assert [len(p.get("points", "").split()) for p in reward] == [20, 10]
    loss = charts["Loss"].findall(f"{SVG}polyline")
    assert len(loss[0].get("points", "").split()) == 9
    assert "20" in [t.text for t in charts["Loss"].iter(f"{SVG}text")]  # the last x tick
    assert "learner busy (not recorded)" in "".join(
        charts["Utilisation per step (fraction of capacity)"].itertext())
    assert summary(lines)["learner_idle_frac"] is None
    assert "no config.yaml" in page


def test_config_and_title_are_escaped(tmp_path: Path) -> None:
    config = 'name: "<script>alert(1)</script>"\nnote: a & b\n'
    run = write_run(tmp_path, metrics_lines(5), config=config)
    page = write_report(run, title="<b>run</b> & co").read_text()
    assert "<script" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "a &amp; b" in page
    assert "<title>&lt;b&gt;run&lt;/b&gt; &amp; co</title>" in page


def test_a_single_step_and_a_constant_series_still_draw(tmp_path: Path) -> None:
    line = metrics_lines(1)[0] | {"staleness_mean": 0.0, "staleness_max": 0, "max_staleness": 0}
    run = write_run(tmp_path, [line])
    charts = svgs(write_report(run).read_text())
    assert len(charts) == len(TITLES)
    assert all(c.findall(f"{SVG}circle") for c in charts)  # one point each, drawn as a dot
    head = summary([line])
    assert head["reward_first"] == head["reward_last"] == line["reward_mean"]


def test_rollbacks_are_in_the_headline_the_collapse_list_and_the_train_summary(
        tmp_path: Path) -> None:
    from tempering.cli.train import _summary_line
    from tempering.train.report import COLLAPSES_FILE, read_collapses

    lines = metrics_lines(12)
    for m in lines:
        m["rollbacks"] = int(m["step"] > 6)
    run = write_run(tmp_path, lines)
    collapse = {"step": 6, "check": "format", "wall_s": 9.0, "diagnosis": "collapse at step 6 "
                "(format): 60% of tool calls <malformed>", "action": "rollback 1 of 3: ..."}
    (run / COLLAPSES_FILE).write_text(json.dumps(collapse) + "\n" + "{cut sh")
    assert read_collapses(run) == [collapse]  # a line cut short is not a record
    head = summary(load_metrics(run))
    assert head["rollbacks"] == 1
    assert _summary_line(head).endswith("1 rollback(s) after a collapse (collapses.jsonl)")
    page = write_report(run).read_text()
    assert "rollbacks after a collapse" in page
    assert "60% of tool calls &lt;malformed&gt;" in page and "<malformed>" not in page
    assert "rollback" not in _summary_line(summary(metrics_lines(12)))
