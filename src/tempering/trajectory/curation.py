"""``tempering traj filter`` and ``tempering traj export``: curating a run for training.

``filter RUN OUT`` reads RUN's store, applies the filter pipeline (``filters.build_pipeline``;
every ``FilterOptions`` field is a flag whose help is the field's docstring, so the command
line and the Python API cannot disagree), appends what is kept to a new store at OUT, writes
``OUT/filter-report.json`` and prints the report as a table. RUN is never modified, so a
different cut is one more command, not a lost run.

``export RUN --format sft|hf|atif --out PATH`` writes RUN's trajectories in one of the formats
of ``export.py``. Both take ``--where`` (a DuckDB condition on the store's columns) to start from
a slice of the run.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tempering.errors import ConfigError

if TYPE_CHECKING:
    from tempering.trajectory.filters import FilterOptions, FilterReport
    from tempering.trajectory.store import TrajectoryStore

REPORT_NAME = "filter-report.json"


def _open_run(run: Path) -> TrajectoryStore:
    """RUN's store; a directory that holds no store is an error, not a new empty store."""
    from tempering.trajectory.store import PARTS_DIR, TrajectoryStore

    if not (run / PARTS_DIR).is_dir():
        raise ConfigError(f"{run}: not a run directory (it has no {PARTS_DIR}/ folder); give "
                          "the directory a run wrote its trajectories to")
    return TrajectoryStore(run)


def _threshold(text: str) -> float | None:
    if text.strip().lower() in ("best", "none"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (or `best`)") from None


def _add_filter_options(parser: argparse.ArgumentParser) -> None:
    """One flag per ``FilterOptions`` field, its help the field's docstring."""
    from tempering.trajectory.filters import FilterOptions

    for name, field in FilterOptions.model_fields.items():
        flag = "--" + name.replace("_", "-")
        text = " ".join((field.description or "").split()).replace("%", "%%")
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, action="store_true", default=None, help=text)
            continue
        if name == "success_threshold":
            kind: Any = _threshold
            text += " `best`: the best reward of the same task in the run."
        else:  # int | None or float: the non-None member of the annotation
            args = typing.get_args(field.annotation)
            kind = next(a for a in args if a is not types.NoneType) if args else field.annotation
        parser.add_argument(flag, dest=name, type=kind, default=None,
                            metavar="N" if kind is int else "X",
                            help=f"{text} (default: "
                                 f"{'no limit' if field.default is None else field.default})")


def _options(args: argparse.Namespace) -> FilterOptions:
    from tempering.trajectory.filters import FilterOptions

    given = {name: getattr(args, name) for name in FilterOptions.model_fields
             if getattr(args, name, None) is not None}
    return FilterOptions(**given)


def render_report(report: FilterReport, title: str = "filters") -> Any:
    """The report as a rich table: one row per filter, then the totals."""
    from rich.table import Table

    table = Table("filter", "seen", "kept", "dropped", "marked", "why", title=title,
                  title_justify="left")
    for s in report.filters:
        why = ", ".join([f"{k} {v}" for k, v in s.reasons.items()]
                        + [f"+{k} {v}" for k, v in s.marks.items()])
        table.add_row(s.name, str(s.seen), str(s.kept), str(s.dropped), str(s.marked), why)
    table.add_section()
    table.add_row("[bold]total", str(report.seen), f"[bold]{report.kept}",
                  str(report.dropped), "", "")
    return table


def _cmd_filter(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tempering.trajectory.filters import build_pipeline
    from tempering.trajectory.store import PARTS_DIR, TrajectoryStore

    run, out = args.run.resolve(), args.out.resolve()
    if out == run:
        raise ConfigError(f"OUT {args.out} is RUN itself: filtering writes a new store, give "
                          "another directory")
    if any((out / PARTS_DIR).glob("*.parquet")):
        raise ConfigError(f"OUT {args.out} already holds trajectories: give a new directory "
                          "(filtered runs are never merged into existing ones)")
    options = _options(args)
    pipeline = build_pipeline(options)
    source = _open_run(run)
    kept, report = pipeline.run(source.read(where=args.where))
    with TrajectoryStore(out, flush_every=max(len(kept), 1)) as target:
        for start in range(0, len(kept), 1024):  # one fsync per chunk, not per trajectory
            target.append_many(kept[start:start + 1024])
    (out / REPORT_NAME).write_text(json.dumps({
        "run": str(run), "where": args.where, "options": options.model_dump(),
        "report": report.model_dump()}, indent=2) + "\n")
    if args.json:
        print(report.model_dump_json())
    else:
        Console().print(render_report(report, f"{args.run} -> {args.out}"))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from tempering.trajectory.export import to_atif, to_hf_dataset, to_sft_jsonl

    trajs = _open_run(args.run).read(where=args.where)
    select = {"only_successful": args.only_successful, "min_reward": args.min_reward}
    if args.format == "sft":
        count = to_sft_jsonl(trajs, args.out, **select)
    elif args.format == "hf":
        count = to_hf_dataset(trajs, args.out, **select)
    else:
        count = len(to_atif(trajs, args.out, prompt_token_ids=args.prompt_token_ids, **select))
    print(f"wrote {count} trajectories to {args.out} ({args.format})", file=sys.stderr)
    return 0


_FILTER_EPILOG = """\
examples:
  tempering traj filter runs/r1 runs/r1-clean
  tempering traj filter runs/r1 runs/r1-fixes --only-recovered --max-steps 40
  tempering traj filter runs/r1 runs/r1-he --where "task_id LIKE 'HumanEval/%'"

In order: drop infra failures (env_timeout, infra_error; model failures stay), tampered
episodes, duplicates, episodes outside the length limits, groups whose rewards are all equal;
then mark error-correction episodes `recovered` (kept, never dropped, unless --only-recovered).
Writes OUT as a new store plus OUT/filter-report.json, and prints what each filter did.
"""

_EXPORT_EPILOG = """\
examples:
  tempering traj export runs/r1-clean --format sft --out sft.jsonl --only-successful
  tempering traj export runs/r1-clean --format hf --out datasets/r1
  tempering traj export runs/r1-clean --format atif --out atif/

sft: one chat-format JSON line per trajectory (messages with OpenAI tool calls, tools,
metadata). hf: the same records as a Hugging Face dataset saved with save_to_disk, plus token
columns (needs the `datasets` package). atif: one ATIF-v1.4 JSON file per trajectory in the
--out directory.
"""


def add_curation_commands(traj_commands: Any) -> None:
    """Register ``filter`` and ``export`` under the ``tempering traj`` group's subparsers."""
    filt = traj_commands.add_parser(
        "filter", help="keep the trajectories that teach; write them to a new store",
        description="Apply the filter pipeline to RUN's trajectories and write the kept ones "
                    "to a new store at OUT, with a report of what each filter dropped and "
                    "marked.", epilog=_FILTER_EPILOG)
    filt.add_argument("run", type=Path, metavar="RUN", help="the run directory to read")
    filt.add_argument("out", type=Path, metavar="OUT", help="a new run directory to write")
    _add_filter_options(filt)
    filt.add_argument("--where", metavar="SQL",
                      help="start from the trajectories matching this DuckDB condition")
    filt.add_argument("--json", action="store_true", help="print the report as JSON")
    filt.set_defaults(func=_cmd_filter)

    export = traj_commands.add_parser(
        "export", help="write a run's trajectories as SFT JSONL, a HF dataset or ATIF",
        description="Write RUN's trajectories in a training or interchange format.",
        epilog=_EXPORT_EPILOG)
    export.add_argument("run", type=Path, metavar="RUN", help="the run directory to read")
    export.add_argument("--format", required=True, choices=["sft", "hf", "atif"],
                        help="sft (JSONL), hf (datasets.save_to_disk) or atif (JSON files)")
    export.add_argument("--out", type=Path, required=True, metavar="PATH",
                        help="the file (sft) or directory (hf, atif) to write")
    export.add_argument("--only-successful", action="store_true",
                        help="only status ok with full reward (1.0)")
    export.add_argument("--min-reward", type=float, metavar="X",
                        help="only trajectories graded at or above X")
    export.add_argument("--prompt-token-ids", action="store_true",
                        help="atif: add each turn's full prompt token ids (large)")
    export.add_argument("--where", metavar="SQL",
                        help="only the trajectories matching this DuckDB condition")
    export.set_defaults(func=_cmd_export)
