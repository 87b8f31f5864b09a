"""The scale path on a GPU machine, in one short run (issue #7, deliverable 6).

1. ``tempering train --config examples/train/gpu.yaml``: rollouts on Ray workers, the inference
   engine in a Ray actor on the GPU, the learner (and the format warm-up) on the GPU. Checked:
   every step's staleness within its bound, versions 1..steps, the learner's weights on CUDA,
   every stored token's version <= the last.
2. A ~0.4B-parameter Qwen2 (hidden 1024, 24 layers, random init, the tiny model's tokenizer):
   the learner's step on the run's own trajectories, on the GPU in bf16 autocast, then the
   weights published to a ``LocalEngine`` on the GPU that generates with them (its version
   moves). Timed: the step's tokens/s and the publish.

Prints one line per finding and writes them to ``--out``/gpu_check.json. Exit 1 when a check
fails. Needs a CUDA device; nothing is downloaded (both models are built locally).

    python scripts/gpu_check.py --out /tmp/gpu-check [--steps 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
findings: dict[str, Any] = {}
failed: list[str] = []


def note(key: str, value: Any, ok: bool | None = None) -> None:
    findings[key] = value
    mark = "" if ok is None else ("  ok" if ok else "  FAILED")
    if ok is False:
        failed.append(key)
    print(f"{key}: {value}{mark}", flush=True)


async def scale_path(out: Path, steps: int, device: str) -> Path:
    """Stage 1: the GPU config through the Trainer; returns the run directory."""
    from tempering.train.config import load_config
    from tempering.train.report import write_report
    from tempering.train.trainer import Trainer
    from tempering.trajectory.query import query

    config = load_config(ROOT / "examples" / "train" / "gpu.yaml", [
        f"steps={steps}", f"runs_dir={out / 'runs'}", f"rollout.device={device}",
        f"learner.device={device}", "target_reward=null"])  # the checks count every step
    started = time.monotonic()
    trainer = Trainer(config, say=lambda line: print(line, flush=True))
    result = await trainer.run()
    wall = time.monotonic() - started
    run = out / "runs" / config.name
    fifth = max(1, len(result) // 5)
    mean = lambda rows: round(sum(m["reward_mean"] for m in rows) / len(rows), 3)  # noqa: E731
    note("run_wall_s", round(wall, 1))
    note("run_steps", len(result), len(result) == steps)
    note("versions", [m["version"] for m in result][-3:], [m["version"] for m in result] ==
         list(range(1, steps + 1)))
    note("staleness_max", max(m["staleness_max"] for m in result),
         all(m["staleness_max"] <= m["max_staleness"] for m in result))
    note("reward_first_fifth", mean(result[:fifth]))
    note("reward_last_fifth", mean(result[-fifth:]))
    for key in ("learner_idle_frac", "learner_s", "samples_per_s", "sandbox_util"):
        note(f"{key}_median", sorted(m[key] for m in result)[len(result) // 2])
    placed = str(next(trainer.learner.model.parameters()).device)
    note("learner_device", placed, placed.startswith(device))
    note("report", str(write_report(run)))
    newest = query(run, "SELECT max(weights_version) FROM steps")[1][0][0]
    note("newest_token_version", newest, newest is not None and newest <= steps)
    return run


async def big_model(out: Path, run: Path | None, device: str, hidden: int, layers: int
                    ) -> None:
    """Stage 2: a ~0.4B Qwen2 learner step and publish on the GPU, on the trajectories of
    ``run`` (or, when stage 1 could not run, on 64 completions the engine samples itself)."""
    import torch

    from tempering.policy.base import GenerateRequest, Message, SamplingParams
    from tempering.policy.local import LocalEngine
    from tempering.policy.tiny import build_tiny_model
    from tempering.train.learner import Learner, LearnerConfig
    from tempering.train.samples import Sample
    from tempering.trajectory.store import TrajectoryStore

    started = time.monotonic()
    big = build_tiny_model(out / "qwen2-big", hidden_size=hidden, layers=layers,
                           heads=hidden // 64)
    learner = Learner(big, LearnerConfig(device=device, temperature=0.4, mini_batches=4))
    params = sum(p.numel() for p in learner.model.parameters())
    note("big_params_m", round(params / 1e6, 1))
    note("big_build_load_s", round(time.monotonic() - started, 1))
    sampling = SamplingParams(max_tokens=48, temperature=0.4)
    request = GenerateRequest(messages=[Message(role="user", content="Which word goes with echo?")],
                              sampling=sampling)
    async with LocalEngine(big, device=device, max_batch=64) as engine:
        if run is not None:
            samples = [s for s in learner.make_samples(TrajectoryStore(run).read()) if s.tokens]
            note("big_samples_from", "stage 1 trajectories")
        else:
            t = time.perf_counter()
            gens = await asyncio.gather(*(engine.generate(request) for _ in range(64)))
            note("big_engine_64_completions_s", round(time.perf_counter() - t, 2))
            samples = [Sample(ids=tuple(g.prompt_token_ids + g.completion_token_ids),
                              loss_mask=(0,) * len(g.prompt_token_ids) + (1,) * len(g.logprobs),
                              logprobs=(0.0,) * len(g.prompt_token_ids) + tuple(g.logprobs),
                              versions=(-1,) * len(g.prompt_token_ids) + (0,) * len(g.logprobs),
                              advantage=1.0 if i % 2 else -1.0, trajectory_id=f"gen-{i}")
                       for i, g in enumerate(gens)]
            note("big_samples_from", "the engine's own completions")
        samples = samples[:64]
        note("big_samples", len(samples), len(samples) > 0)
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        times, stats = [], None
        for _ in range(3):
            sync()
            t = time.perf_counter()
            stats = learner.step(samples)
            sync()
            times.append(time.perf_counter() - t)
        assert stats is not None
        tokens = sum(len(s.ids) for s in samples)
        note("big_step_s", [round(x, 2) for x in times])
        note("big_tokens_per_s", round(tokens / sorted(times)[1]))
        note("big_loss_finite", [stats.loss, stats.grad_norm],
             all(math.isfinite(x) for x in (stats.loss, stats.grad_norm)))
        if device.startswith("cuda"):
            note("big_peak_gib", round(torch.cuda.max_memory_allocated() / 2**30, 1))
        t = time.perf_counter()
        version = learner.publish(engine)
        note("big_publish_s", round(time.perf_counter() - t, 2))
        gen = await engine.generate(request)
        note("big_engine_version", gen.weights_version,
             gen.weights_version == version == learner.version == 3)
        generated = len(gen.completion_token_ids)
        note("big_generated_tokens", generated, generated > 0)
    shutil.rmtree(big)  # random weights: nothing to keep


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the run and findings go")
    parser.add_argument("--steps", type=int, default=60, help="learner steps of stage 1")
    parser.add_argument("--device", default="cuda", help="torch device (cpu: a dry run)")
    parser.add_argument("--skip-big", action="store_true", help="stage 1 only")
    parser.add_argument("--big-hidden", type=int, default=1024, help="stage 2 model width")
    parser.add_argument("--big-layers", type=int, default=24, help="stage 2 model depth")
    args = parser.parse_args()
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("no CUDA device: run this on a GPU machine (or --device cpu)", file=sys.stderr)
            return 2
        note("gpu", torch.cuda.get_device_name())
    note("torch", torch.__version__)
    run: Path | None = None
    try:
        try:
            run = asyncio.run(scale_path(args.out, args.steps, args.device))
        except Exception as exc:  # stage 2 still says what it can
            note("stage_1", f"{type(exc).__name__}: {exc}", False)
        if not args.skip_big:
            asyncio.run(big_model(args.out, run, args.device, args.big_hidden,
                                  args.big_layers))
    finally:
        (args.out / "gpu_check.json").write_text(json.dumps(
            {**findings, "failed": failed}, indent=1) + "\n")
    print("FAILED: " + ", ".join(failed) if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
