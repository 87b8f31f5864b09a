"""``tempering train``: run, or resume, a training run from its YAML config.

With no arguments it runs the embedded default (``TrainConfig()``): the tiny model, built and
warmed up locally, learning the built-in switchboard tasks in local sandboxes, asynchronously.
Options that name a config field are shortcuts for ``--set``; everything else lives in the YAML
config (``docs/training.md`` documents every field, ``--print-config`` shows them all).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from typing import Any

_EPILOG = """\
examples:
  tempering train                                 # the embedded default, runs/default/
  tempering train --mode sync --name sync-run     # the same, synchronous
  tempering train --config my.yaml --set rollout.max_staleness=4
  tempering train --print-config > my.yaml        # every field, to edit

A run killed at any point (even with kill -9) is resumed by running the same command again:
it continues from its newest checkpoint with the next weights version. --restart deletes the
run directory first.
"""


def _cmd_train(args: argparse.Namespace) -> int:
    from tempering.train.config import dump_config, load_config
    from tempering.train.report import METRICS_FILE, load_metrics, summary, write_report
    from tempering.train.trainer import Trainer

    overrides = list(args.set or [])
    for option, key in (("name", "name"), ("mode", "mode"), ("steps", "steps"),
                        ("runs_dir", "runs_dir")):
        value = getattr(args, option)
        if value is not None:
            overrides.append(f"{key}={value}")
    config = load_config(args.config, overrides)
    if args.print_config:
        sys.stdout.write(dump_config(config))
        return 0
    if args.restart and config.run_dir.exists():
        shutil.rmtree(config.run_dir)

    def say(line: str) -> None:
        print(line, flush=True)

    say(f"run {config.name}: {config.mode}, {config.steps} steps of "
        f"{config.rollout.batch_groups} groups x {config.rollout.group_size} samples, "
        f"max_staleness {config.max_staleness}, tasks {' '.join(config.tasks.specs)} -> "
        f"{config.run_dir}/")
    started = time.monotonic()
    trainer = Trainer(config, say=say)
    try:
        asyncio.run(trainer.run())
    finally:
        metrics = load_metrics(config.run_dir) if (config.run_dir / METRICS_FILE).exists() \
            else []
        if metrics:
            report = write_report(config.run_dir)
            say(_summary_line(summary(metrics)))
            say(f"report: {report}  ({time.monotonic() - started:.0f}s in this process)")
    return 0


def _summary_line(s: dict[str, Any]) -> str:
    def fmt(value: Any, spec: str) -> str:
        return "?" if value is None else format(value, spec)

    return (f"done: {s['steps']} steps in {fmt(s['wall_s'], '.0f')}s; reward "
            f"{fmt(s['reward_first'], '.2f')} (first fifth) -> {fmt(s['reward_last'], '.2f')} "
            f"(last fifth); staleness max {s['staleness_max']} <= {s['max_staleness']}; learner "
            f"idle {fmt(s['learner_idle_frac'], '.1%')}; {fmt(s['samples_per_s'], '.1f')} "
            "samples/s" + (f"; {s['rollbacks']} rollback(s) after a collapse (collapses.jsonl)"
                           if s.get("rollbacks") else ""))


def add_train_command(commands: Any) -> None:
    train = commands.add_parser(
        "train", help="train a policy with RL in sandboxes (the embedded default without "
                      "arguments)",
        description="Train with asynchronous (or synchronous) RL: rollout groups in sandboxes, "
                    "graded in fresh sandboxes, into a staleness-bounded replay buffer; a "
                    "learner that publishes a new weights version per step. Writes "
                    "runs/<name>/: config.yaml, metrics.jsonl, TensorBoard logs, "
                    "trajectories, checkpoints and report.html.",
        epilog=_EPILOG)
    train.add_argument("--config", metavar="FILE", help="a YAML config (default: the "
                       "embedded default; see --print-config)")
    train.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override one config field, e.g. rollout.max_staleness=4 "
                            "(repeatable; the value is read as YAML)")
    train.add_argument("--name", help="the run's name: its directory under runs_dir")
    train.add_argument("--mode", choices=["sync", "async"], help="the training loop")
    train.add_argument("--steps", type=int, metavar="N", help="learner steps")
    train.add_argument("--runs-dir", dest="runs_dir", metavar="DIR",
                       help="where run directories go (default: runs)")
    train.add_argument("--restart", action="store_true",
                       help="delete the run's directory and start over instead of resuming")
    train.add_argument("--print-config", action="store_true",
                       help="print the full config (defaults and overrides) as YAML and exit")
    train.set_defaults(func=_cmd_train)
