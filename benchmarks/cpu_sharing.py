"""A learner step on a CPU it shares: OpenMP worker threads that spin against ones that sleep.

    python benchmarks/cpu_sharing.py [--quick] [--json FILE]

In an asynchronous run on a CPU host the learner never has the cores to itself: the inference
engine, the event loop and the sandboxes run beside it. PyTorch's OpenMP workers by default
*spin* for a while at the end of each parallel region, waiting for the next; when another
process holds one of the cores they spin away the time slices the lagging worker needs, and a
step of many small parallel regions (a small model's forward and backward) crawls. With
``OMP_WAIT_POLICY=PASSIVE`` they sleep instead. Importing ``tempering`` sets that policy for the
processes that load torch after it (``tempering/__init__.py``; an explicit setting wins).

The figure: one ``Learner.step`` of the async benchmark's shape (64 samples of 150 tokens, the
last 72 trained, 8 epochs, the 2-layer tiny model built here), each in a fresh interpreter with
the policy set before torch loads, alone and beside one process that keeps a core busy; the two
policies alternate, so drift hits both. The baseline is the same step with the policy unset
(libgomp's default, what every run had before). Full: 5 rounds of 3 steps each way; quick: 2
of 2. Alone, sleeping workers cost a little (a wake-up per region: target at most 1.1x); beside
a busy process they must save at least a fifth (target at most 0.8x). A shorter spin
(``GOMP_SPINCOUNT=20000``) was tried beside a busy process too: 9.9 s against 9.7 s, no help.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from figures import Figure, benchmark_main, console, report

STEP = r"""
import json, os, sys, time
import torch  # before tempering: the policy under test is the one this process was given
from tempering.train import Learner, LearnerConfig, Sample

model, steps = sys.argv[1], int(sys.argv[2])
learner = Learner(model, LearnerConfig(lr=1.25e-4, epochs=8))
gen = torch.Generator().manual_seed(0)
length, trained = 150, 72

def batch(version):
    samples = []
    for i in range(64):
        ids = torch.randint(0, 2000, (length,), generator=gen).tolist()
        head = length - trained
        samples.append(Sample(tuple(ids), (0,) * head + (1,) * trained,
                              (0.0,) * head + (float("nan"),) * trained,
                              (-1,) * head + (version,) * trained, 1.0 if i % 2 else -1.0,
                              f"s{i}"))
    return samples

learner.step(batch(learner.version))  # the first step pays for allocations
out = []
for _ in range(steps):
    samples = batch(learner.version)
    wall, cpu = time.perf_counter(), time.process_time()
    learner.step(samples)
    out.append((time.perf_counter() - wall, time.process_time() - cpu))
print(json.dumps(out))
"""

POLICIES: dict[str, dict[str, str]] = {"default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}}


def step_times(model: Path, policy: dict[str, str], steps: int,
               busy: bool) -> list[tuple[float, float]]:
    """(wall, cpu) seconds of ``steps`` learner steps in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | policy
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        out = subprocess.run([sys.executable, "-c", STEP, str(model), str(steps)], env=env,
                             capture_output=True, text=True, check=True).stdout
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    return [(float(w), float(c)) for w, c in json.loads(out.splitlines()[-1])]


async def sharing(args: argparse.Namespace) -> list[Figure]:
    from tempering.policy.tiny import build_tiny_model

    rounds, steps = (2, 2) if args.quick else (5, 3)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        await asyncio.to_thread(build_tiny_model, model)
        figures = []
        for busy in (False, True):
            label = "beside a busy process" if busy else "alone"
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in POLICIES}
            for r in range(rounds):
                for name, policy in POLICIES.items():
                    times[name] += await asyncio.to_thread(step_times, model, policy, steps, busy)
                console.print(f"  [dim]{label}: round {r + 1}/{rounds}[/]")
            wall = {n: statistics.median(w for w, _ in t) for n, t in times.items()}
            cpu = {n: statistics.median(c for _, c in t) for n, t in times.items()}
            ratio = wall["passive"] / wall["default"]
            target, passed = (("<= 0.8x", ratio <= 0.8) if busy else ("<= 1.1x", ratio <= 1.1))
            figures += report([
                Figure(label, f"learner step p50, {label}", wall["passive"], "s",
                       wall["default"], "spinning workers (default)", target, passed),
                Figure(label, f"CPU per step p50, {label}", cpu["passive"], "s",
                       cpu["default"], "spinning workers (default)")])
        return figures


if __name__ == "__main__":
    benchmark_main(__doc__, {"sharing": sharing}, "cpu sharing",
                   quick_help="2 rounds of 2 steps each way, not 5 of 3")
