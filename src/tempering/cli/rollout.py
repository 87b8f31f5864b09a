"""``tempering rollout``: play episodes of tasks with a policy and store their trajectories.

Each task gets one group of ``--samples`` episodes; episodes run ``--concurrency`` at a time
with one shared grader, and every step is journaled into the run directory's trajectory store
as it happens, so an interrupted rollout keeps what it did (``tempering traj stats RUN``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tempering.cli.common import positive_int
from tempering.tasks.refs import select

if TYPE_CHECKING:
    from tempering.tasks.task import Task
    from tempering.trajectory.schema import Trajectory

_EPILOG = """\
Examples:

  tempering rollout examples/tasks/median --policy tiny --samples 8
  tempering rollout humaneval:20 --policy openai:http://127.0.0.1:8000/v1 --model tiny
  tempering traj stats runs/rollout-20261130-101500

TASK is a task directory, `humaneval` (all 164 problems), `humaneval:N` (the first N),
`switchboard[:LAYOUTS]` (the built-in family a tiny model can learn; 4 layouts by default) or
`repo-bugs[:N]` (small repositories with one seeded bug each, graded by their test suites).
POLICY is `tiny` (the local engine on a tiny model built here), `local:DIR` (a transformers
model directory) or `openai:URL` (any OpenAI-compatible server: vLLM, SGLang, `tempering serve`;
the key is read from $OPENAI_API_KEY).
"""


def _cmd_rollout(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tempering.agent import EpisodeConfig
    from tempering.policy.base import SamplingParams
    from tempering.policy.config import parse_policy

    tasks = select(args.tasks)
    policy_config = parse_policy(args.policy, model=args.model)
    config = EpisodeConfig(max_turns=args.max_turns, wall_time_s=args.wall_time,
                           sampling=SamplingParams(temperature=args.temperature,
                                                   max_tokens=args.max_tokens, seed=args.seed))
    run_dir = args.run_dir or Path("runs") / time.strftime("rollout-%Y%m%d-%H%M%S")
    console = Console(stderr=True)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "rollout.json").write_text(json.dumps({
        "tasks": args.tasks, "policy": policy_config.model_dump(), "samples": args.samples,
        "oversample": args.oversample, "concurrency": args.concurrency,
        "executor": args.executor, "episode": config.model_dump()}, indent=2) + "\n")
    trajectories = asyncio.run(_scheduled(args, tasks, policy_config, config, Path(run_dir),
                                          console))
    table = Table(title=f"{len(trajectories)} episodes in {run_dir}", title_justify="left")
    for col in ("status", "episodes", "mean reward", "mean steps"):
        table.add_column(col, justify="left" if col == "status" else "right")
    by_status: dict[str, list[Any]] = {}
    for t in trajectories:
        by_status.setdefault(str(t.status), []).append(t)
    for status, group in sorted(by_status.items()):
        rewards = [t.reward_value for t in group if t.reward_value is not None]
        table.add_row(status, str(len(group)),
                      f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
                      f"{sum(len(t.steps) for t in group) / len(group):.1f}")
    Console().print(table)
    print(f"query them: tempering traj stats {run_dir}")
    return 0


async def _scheduled(args: argparse.Namespace, tasks: list[Task], policy_config: Any,
                     config: Any, run_dir: Path, console: Any) -> list[Trajectory]:
    """Every group through the scheduler, with a live line of its metrics."""
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from tempering.agent.backends import rollout_backend
    from tempering.scheduler import JobResult, Resources, SchedulerConfig
    from tempering.trajectory.store import TrajectoryStore

    total = len(tasks) * (args.samples + args.oversample)
    progress = Progress("[progress.description]{task.description}", BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console)
    bar = progress.add_task("episodes", total=total)
    counts: Counter[str] = Counter()

    def ended(result: JobResult) -> None:
        value = result.value
        counts[str(value.status) if value is not None and hasattr(value, "status")
               else str(result.status)] += 1
        progress.update(bar, advance=1, description=" ".join(
            f"{k} {v}" for k, v in sorted(counts.items())))

    def view() -> Table:
        m = backend.scheduler.metrics()
        grid = Table.grid(padding=(0, 2))
        grid.add_row(progress)
        util = " ".join(f"{k} {v:.0%}" for k, v in sorted(m.utilisation.items()))
        grid.add_row(f"[dim]queued {m.queued}  running {m.running}  paused {m.paused}  "
                     f"utilisation {util or '-'}  run p50 {m.run_p50_s:.1f} s "
                     f"p99 {m.run_p99_s:.1f} s  lost {m.lost}[/]")
        return grid

    with TrajectoryStore(run_dir) as store:
        backend = rollout_backend(
            args.executor, policy_config, store,
            slots=Resources.of(sandbox=args.concurrency, inference=args.concurrency),
            ray_address=args.ray_address,
            scheduler_config=SchedulerConfig(deadlines=args.deadlines))
        async with backend:
            with Live(view(), console=console, refresh_per_second=4) as live:
                work = asyncio.ensure_future(backend.play(
                    tasks, samples=args.samples, oversample=args.oversample, config=config,
                    run_id=run_dir.name, on_result=ended))
                while not work.done():
                    await asyncio.wait([work], timeout=0.25)
                    live.update(view())
                return work.result()


def add_rollout_command(commands: Any) -> None:
    rollout = commands.add_parser(
        "rollout", help="play episodes of tasks with a policy and store the trajectories",
        description="Play episodes: for each task, a group of --samples episodes in which the "
                    "policy acts through tools in a fresh sandbox until it submits; each is "
                    "graded in a fresh grading sandbox and stored, step by step, in the run "
                    "directory's trajectory store. Prints progress, then a table by status.",
        epilog=_EPILOG)
    rollout.add_argument("tasks", nargs="+", metavar="TASK",
                         help="task directories, humaneval[:N], switchboard[:LAYOUTS] or "
                              "repo-bugs[:N]")
    rollout.add_argument("--policy", default="tiny", metavar="POLICY",
                         help="tiny, local:DIR or openai:URL (default: tiny)")
    rollout.add_argument("--model", metavar="NAME", help="the model name for openai:URL")
    rollout.add_argument("--samples", type=positive_int, default=1, metavar="N",
                         help="episodes per task, one group (default: 1)")
    rollout.add_argument("--concurrency", type=positive_int, default=8, metavar="C",
                         help="sandbox and inference slots: episodes in flight at once "
                              "(default: 8; with --executor ray, per rollout node)")
    rollout.add_argument("--oversample", type=int, default=0, metavar="K",
                         help="start K extra episodes per task and keep the first --samples "
                              "to finish; the rest are cancelled (default: 0)")
    rollout.add_argument("--deadlines", action="store_true",
                         help="cancel episodes that run far past their task family's learned "
                              "duration (3x its p90)")
    rollout.add_argument("--executor", choices=["asyncio", "ray"], default="asyncio",
                         help="run episodes in this process (asyncio, default) or on the "
                              "rollout nodes of a Ray cluster")
    rollout.add_argument("--ray-address", metavar="ADDR",
                         help="the Ray cluster to join (default: start one on this machine)")
    rollout.add_argument("--run-dir", type=Path, metavar="DIR",
                         help="where trajectories go (default: runs/rollout-<time>)")
    rollout.add_argument("--max-turns", type=positive_int, default=10, metavar="N",
                         help="turns per episode (default: 10)")
    rollout.add_argument("--max-tokens", type=positive_int, default=256, metavar="N",
                         help="tokens per turn (default: 256)")
    rollout.add_argument("--wall-time", type=float, default=300.0, metavar="S",
                         help="seconds per episode (default: 300)")
    rollout.add_argument("--temperature", type=float, default=1.0, metavar="T",
                         help="sampling temperature (default: 1.0)")
    rollout.add_argument("--seed", type=int, metavar="N", help="makes sampling reproducible")
    rollout.set_defaults(func=_cmd_rollout)
