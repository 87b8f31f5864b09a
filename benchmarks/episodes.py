"""Episodes and trajectories: framework overhead per step, store throughput, query latency.

    python benchmarks/episodes.py [--quick] [--only overhead,store,query,engine] [--json FILE]

- overhead: an episode of T bash turns (`true`) with a scripted policy, with and without the
  trajectory journal, against the same policy calls and the same commands in the same kind of
  sandbox issued directly, side by side; the difference per step is what the episode loop adds
  (target <= 1 ms).
- store: trajectories of 10 steps stored durably (acknowledged one by one, in groups of 8, and
  journaled step by step as the episode loop does), per second, against writing the same rows
  with pyarrow alone (nothing acknowledged until the end, no journal).
- engine: the local engine's continuous batching, tokens per second with 16 requests at once
  against the same requests one at a time (the tiny model on the CPU).
- query: an aggregate over 100,000 stored steps with DuckDB (`tempering traj query`), against
  reading every trajectory back into Python and aggregating there.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from figures import Figure, benchmark_main, console, report

from tempering.agent import EpisodeConfig
from tempering.agent.episode import Episode
from tempering.policy.base import GenerateRequest, Message
from tempering.policy.scripted import ScriptedPolicy
from tempering.reward.result import RewardResult
from tempering.sandbox import open_sandbox
from tempering.tasks import load_task
from tempering.trajectory.schema import Status, Step, Trajectory

MEDIAN = Path(__file__).parents[1] / "examples" / "tasks" / "median"


# ---- overhead per step ----

async def overhead(args: argparse.Namespace) -> list[Figure]:
    from tempering.trajectory.store import TrajectoryStore

    task = load_task(MEDIAN)
    turns, rounds = (20, 5) if args.quick else (50, 15)
    policy = ScriptedPolicy([("bash", {"command": "true"})] * turns)
    config = EpisodeConfig(max_turns=turns)
    bare: list[float] = []
    journaled: list[float] = []
    direct: list[float] = []
    with tempfile.TemporaryDirectory(prefix="tempering-bench-") as tmp:
        store = TrajectoryStore(Path(tmp, "run"))
        async with open_sandbox(task.sandbox) as sb:
            await task.prepare(sb)
            for _ in range(rounds):
                for recorder, samples in ((None, bare), (store, journaled)):
                    episode = Episode(task, policy, sb, config=config, recorder=recorder)
                    episode.begin()
                    t0 = time.perf_counter()
                    await episode.play()
                    elapsed = time.perf_counter() - t0
                    if recorder is not None and episode.ending is not None:
                        recorder.append(episode.trajectory(episode.ending))
                    await episode.close()
                    samples.append(elapsed / len(episode.steps))
                shell = await sb.session()
                request = GenerateRequest(messages=[Message(role="user", content="go")])
                t0 = time.perf_counter()
                for _ in range(turns):
                    await policy.generate(request)
                    await shell.run("true")
                direct.append((time.perf_counter() - t0) / turns)
                await shell.close()
        store.close()
    base = statistics.median(direct) * 1e3
    plain, with_journal = statistics.median(bare) * 1e3, statistics.median(journaled) * 1e3
    return report([
        Figure("overhead", f"step of an episode (bash `true`), p50 of {rounds}", plain, "ms",
               base, "policy + command issued directly"),
        Figure("overhead", "  loop overhead per step", plain - base, "ms", target="<= 1 ms",
               passed=plain - base <= 1.0, relative=False),
        Figure("overhead", "step with the trajectory journal", with_journal, "ms", base,
               "policy + command issued directly"),
        Figure("overhead", "  loop + journal overhead per step", with_journal - base, "ms",
               target="<= 1 ms", passed=with_journal - base <= 1.0, relative=False),
    ])


# ---- store and query ----

def synthetic(n: int, steps: int, seed: int = 0) -> list[Trajectory]:
    """Trajectories shaped like real ones: 10 steps of ~60 prompt and ~40 completion tokens."""
    import random

    rng = random.Random(seed)
    statuses = [Status.OK] * 8 + [Status.MODEL_ERROR, Status.INFRA_ERROR]
    out = []
    for i in range(n):
        status = rng.choice(statuses)
        reward = None if status.infra else RewardResult(
            reward=rng.choice([0.0, 0.5, 1.0]), components={"tests": 1.0}, tests_passed=2,
            tests_total=2, flags=[])
        out.append(Trajectory(
            task_id=f"task-{i % 50}", group_id=f"g{i // 8}", sample_index=i % 8,
            run_id="bench", policy="scripted", status=status, reward=reward,
            steps=[Step(index=k, text="<tool_call>{}</tool_call>", action="bash",
                        arguments='{"command": "ls"}', observation="a.py\nb.py\n" * 5,
                        exit_code=0, policy_s=0.01, action_s=0.002,
                        prompt_token_ids=[rng.randrange(2000) for _ in range(60)],
                        completion_token_ids=[rng.randrange(2000) for _ in range(40)],
                        logprobs=[-rng.random() for _ in range(40)], loss_mask=[1] * 40,
                        weights_version=i // 100)
                   for k in range(steps)]))
    return out


async def store_throughput(args: argparse.Namespace) -> list[Figure]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tempering.trajectory.store import TrajectoryStore

    n = 2000 if args.quick else 10_000
    trajs = synthetic(n, 10)
    with tempfile.TemporaryDirectory(prefix="tempering-bench-") as tmp:
        t0 = time.perf_counter()
        with TrajectoryStore(Path(tmp, "one"), flush_every=1000) as store:
            for t in trajs:
                store.append(t)  # acknowledged one by one: one fsync each
        one_by_one = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        with TrajectoryStore(Path(tmp, "groups"), flush_every=1000) as store:
            for i in range(0, n, 8):
                store.append_many(trajs[i:i + 8])  # a GRPO group acknowledged together
        grouped = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        with TrajectoryStore(Path(tmp, "journaled"), flush_every=1000) as store:
            for t in trajs:  # the episode loop's path: begin, each step, the end
                store.begin(t.trajectory_id, t)
                for step in t.steps:
                    store.record_step(t.trajectory_id, step)
                store.append(t)
        journaled = n / (time.perf_counter() - t0)
        rows = [t.model_dump(mode="json") for t in trajs]
        t0 = time.perf_counter()
        for i in range(0, n, 1000):
            pq.write_table(pa.Table.from_pylist(rows[i:i + 1000]), Path(tmp, f"raw-{i}.parquet"))
        raw = n / (time.perf_counter() - t0)
    base = "pyarrow alone (no journal, no fsync)"
    return report([
        Figure("store", f"appended one by one, {n} x 10 steps", one_by_one, "/s", raw, base),
        Figure("store", "appended in groups of 8", grouped, "/s", raw, base),
        Figure("store", "journaled step by step, then appended", journaled, "/s", raw, base),
    ])


async def query_latency(args: argparse.Namespace) -> list[Figure]:
    from tempering.trajectory.query import query
    from tempering.trajectory.store import TrajectoryStore

    n = 10_000  # x 10 steps = 100,000 steps
    sql = ("SELECT status, count(*) AS steps, avg(reward) AS reward, "
           "sum(len(completion_token_ids)) AS tokens FROM steps GROUP BY status")
    repeats = 5 if args.quick else 11
    with tempfile.TemporaryDirectory(prefix="tempering-bench-") as tmp:
        run = Path(tmp, "run")
        with TrajectoryStore(run, flush_every=2000) as store:
            for t in synthetic(n, 10):
                store.append(t)
        ours = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _, rows = await asyncio.to_thread(query, run, sql)
            ours.append(time.perf_counter() - t0)
        assert sum(r[1] for r in rows) == n * 10, rows
        t0 = time.perf_counter()
        totals: dict[str, list[float]] = {}
        for t in TrajectoryStore(run).read():
            for _ in t.steps:
                totals.setdefault(t.status, []).append(t.reward_value or 0.0)
        python = time.perf_counter() - t0
    console.print(f"  [dim]{len(rows)} groups; DuckDB runs over the Parquet parts directly[/]")
    return report([Figure("query", "aggregate over 100,000 steps, p50", statistics.median(ours)
                          * 1e3, "ms", python * 1e3, "read back into Python and aggregate")])


async def engine(args: argparse.Namespace) -> list[Figure]:
    from tempering.policy.base import SamplingParams
    from tempering.policy.local import LocalEngine
    from tempering.policy.tiny import build_tiny_model

    batch, tokens = 16, 64
    with tempfile.TemporaryDirectory(prefix="tempering-bench-") as tmp:
        model = build_tiny_model(Path(tmp, "tiny"))
        async with LocalEngine(model, max_batch=batch) as eng:
            def request(seed: int) -> GenerateRequest:
                return GenerateRequest(
                    messages=[Message(role="user", content=f"Write a function {seed}.")],
                    sampling=SamplingParams(max_tokens=tokens, seed=seed, stop=[]))

            await eng.generate(request(0))  # warm up
            rounds = 2 if args.quick else 5
            together, alone = [], []
            for r in range(rounds):
                t0 = time.perf_counter()
                gens = await asyncio.gather(*(eng.generate(request(r * batch + i))
                                              for i in range(batch)))
                together.append(sum(len(g.completion_token_ids) for g in gens)
                                / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                n = 0
                for i in range(batch):
                    n += len((await eng.generate(request(r * batch + i))).completion_token_ids)
                alone.append(n / (time.perf_counter() - t0))
    return report([Figure("engine", f"tiny model, {batch} requests at once", statistics.median(
        together), "tokens/s", statistics.median(alone), "the same requests one at a time")])


SECTIONS: dict[str, Callable[[argparse.Namespace], Awaitable[list[Figure]]]] = {
    "overhead": overhead, "store": store_throughput, "query": query_latency, "engine": engine}


def main() -> None:
    benchmark_main(__doc__ or "", SECTIONS, "episodes", quick_help="fewer runs")


if __name__ == "__main__":
    main()
