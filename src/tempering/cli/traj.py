"""``tempering traj``: SQL over a run's trajectories, and the run at a glance.

``add_traj_commands`` creates the ``traj`` group and registers each subcommand through one
small ``_add_<name>(group)`` function; a new subcommand is one more such function and one more
line there. DuckDB, pyarrow and rich are imported when a subcommand runs, never at parse time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from tempering.cli.common import command_group
from tempering.errors import ConfigError

FORMATS = ("table", "json", "csv")
CELL_CHARS = 80  # a table cell longer than this is cut (observations run to kilobytes)


def add_traj_commands(commands: Any) -> None:
    group = command_group(commands, "traj", "query and summarise a run's stored trajectories")
    _add_query(group)
    _add_stats(group)
    from tempering.trajectory.curation import add_curation_commands

    add_curation_commands(group)  # filter, export


def run_dir(text: str) -> Path:
    """RUN as given on the command line: an existing run directory (argparse type)."""
    from tempering.trajectory.store import PARTS_DIR

    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"run directory {text} does not exist")
    if not (path / PARTS_DIR).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a run directory (it has no "
                                         f"{PARTS_DIR}/ folder)")
    return path


def _jsonable(value: Any) -> Any:
    """A DuckDB value as strict JSON holds it (maps come back as dicts, dates as text)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no -inf (a forced token's log-prob): null keeps it parseable
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# ---- traj query ----

_QUERY_EPILOG = """\
examples:
  tempering traj query runs/r1 "SELECT status, count(*), avg(reward) FROM trajectories GROUP BY 1"
  tempering traj query runs/r1 "SELECT action, count(*) FROM steps GROUP BY 1 ORDER BY 2 DESC"
  tempering traj query runs/r1 "SELECT * FROM steps WHERE exit_code <> 0" --format json
  tempering traj query runs/r1 "DESCRIBE steps"

Views: `trajectories` (one row per episode: the stored columns, see docs/trajectories.md) and
`steps` (one row per step: trajectory_id, run_id, task_id, group_id, status, reward, then every
step field). Any DuckDB SQL works; the run is only read.
"""


def _add_query(group: Any) -> None:
    parser = group.add_parser(
        "query", help="run SQL (DuckDB) over a run's trajectories and steps",
        description="Run one SQL statement over the run's trajectories with DuckDB and print "
                    "the result.", epilog=_QUERY_EPILOG)
    parser.add_argument("run", type=run_dir, metavar="RUN", help="the run directory")
    parser.add_argument("sql", metavar="SQL", help="the statement, in quotes")
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="table (default; long cells cut), json (an array of objects, one a "
                             "line; -inf and nan as null) or csv (nested values as JSON)")
    parser.add_argument("--limit", type=int, default=1000, metavar="N",
                        help="print at most N rows, 0 for all (default: 1000)")
    parser.set_defaults(func=_cmd_query)


def _recover(run: Path) -> None:
    """Bring in what dead writers acknowledged but never flushed (their journals), so a query
    sees every acknowledged trajectory; live writers' journals are left alone."""
    from tempering.trajectory.store import TrajectoryStore

    TrajectoryStore(run).close()


def _cmd_query(args: argparse.Namespace) -> int:
    from tempering.trajectory.query import query

    _recover(args.run)
    if args.limit < 0:
        raise ConfigError(f"--limit {args.limit}: give a number of rows, or 0 for all")
    limit = args.limit or None
    columns, rows = query(args.run, args.sql, limit=None if limit is None else limit + 1)
    more = limit is not None and len(rows) > limit
    rows = rows[:limit]
    if args.format == "json":
        objects = [json.dumps(dict(zip(columns, map(_jsonable, row), strict=True)))
                   for row in rows]  # one object a line: greppable, and still one JSON array
        print("[" + ",\n ".join(objects) + "]")
    elif args.format == "csv":
        import csv

        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows([v if isinstance(v, str | int | float) or v is None
                          else json.dumps(_jsonable(v)) for v in row] for row in rows)
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(*columns, show_lines=False)
        for row in rows:
            table.add_row(*[_cell(v) for v in row])
        Console().print(table)
    if more:
        print(f"tempering: showing the first {limit} rows; --limit N for more, 0 for all",
              file=sys.stderr)
    return 0


def _cell(value: Any) -> str:
    from rich.markup import escape

    text = ("NULL" if value is None else value if isinstance(value, str)
            else f"{value:.4g}" if isinstance(value, float)
            else json.dumps(_jsonable(value)) if isinstance(value, list | dict) else str(value))
    text = " ".join(text.split())
    return escape(text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…")


# ---- traj stats ----

def _add_stats(group: Any) -> None:
    parser = group.add_parser(
        "stats", help="summarise a run: statuses, rewards, steps, tokens, durations",
        description="Summarise a run's stored trajectories: episodes by status, reward mean and "
                    "std (overall and for the tasks with most episodes), steps per episode, "
                    "tokens, weights versions, episode durations, and how many were recovered "
                    "from a dead harness's journal or marked by filters.",
        epilog="examples:\n  tempering traj stats runs/r1\n  tempering traj stats runs/r1 "
               "--json | jq .reward_mean\n")
    parser.add_argument("run", type=run_dir, metavar="RUN", help="the run directory")
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    parser.add_argument("--top", type=int, default=10, metavar="N",
                        help="tasks listed with their own rewards (default: 10)")
    parser.set_defaults(func=_cmd_stats)


def _cmd_stats(args: argparse.Namespace) -> int:
    from tempering.trajectory.query import stats

    _recover(args.run)
    summary = stats(args.run, top=max(args.top, 0))
    if args.json:
        print(summary.model_dump_json(indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    def num(x: float | None, unit: str = "") -> str:
        return "-" if x is None else f"{x:.4g}{unit}"

    overview = Table.grid(padding=(0, 2))
    overview.add_column(style="bold")
    overview.add_column()
    statuses = ", ".join(f"{k} {v}" for k, v in summary.by_status.items()) or "-"
    for name, value in [
        ("episodes", f"{summary.episodes} ({statuses})"),
        ("reward", f"mean {num(summary.reward_mean)}, std {num(summary.reward_std)} over "
                   f"{summary.graded} graded"),
        ("steps / episode", f"mean {num(summary.steps_mean)}, p50 {num(summary.steps_p50)}, "
                            f"p95 {num(summary.steps_p95)}"),
        ("tokens", f"prompt {summary.prompt_tokens:,} (+{summary.prompt_tokens_reused:,} "
                   f"reused), completion {summary.completion_tokens:,}"),
        ("weights versions", ", ".join(map(str, summary.weights_versions)) or "-"),
        ("duration", f"p50 {num(summary.duration_p50_s, ' s')}, "
                     f"p95 {num(summary.duration_p95_s, ' s')}"),
        ("recovered", f"{summary.journal_recovered} from a dead harness's journal"),
        ("marks", ", ".join(f"{k} {v}" for k, v in summary.marks.items()) or "-"),
    ]:
        overview.add_row(name, value)
    console = Console()
    console.print(overview)
    if summary.per_task:
        tasks = Table("task", "episodes", "graded", "reward mean", "reward std",
                      title=f"tasks by episodes ({len(summary.per_task)} of {summary.tasks})",
                      title_justify="left")
        for t in summary.per_task:
            tasks.add_row(t.task_id, str(t.episodes), str(t.graded), num(t.reward_mean),
                          num(t.reward_std))
        console.print(tasks)
    return 0
