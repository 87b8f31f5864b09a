"""A supervised format warm-up: teach a freshly built model to call tools, not what to answer.

A randomly initialised model cannot write a single valid tool call, so reinforcement learning
would never see a reward to learn from. The warm-up trains it, with the ordinary next-token loss
on the assistant's tokens only, on synthetic transcripts of the switchboard family whose
*answers are random*: after it the model reads the table, writes some code word and submits,
in valid markup, but picks the word at chance (1 in 4). What RL must then learn, which word
each call sign needs, is left entirely to RL; the reward starts near 0.25 and has room to rise.

Transcripts are tokenised with the model's own chat template, turn by turn, and the template
must be prefix-stable (``policy.tiny``'s is): the tokens trained on are exactly those the engine
will later put in front of the model and expect from it.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tempering.errors import ConfigError
from tempering.recipes.switchboard import WORDS, switchboard_transcript
from tempering.tasks.task import Task

if TYPE_CHECKING:
    from tempering.agent.episode import EpisodeConfig
    from tempering.recipes.switchboard import TinyModelConfig, WarmupConfig

WARMUP_FILE = "tempering-warmup.json"
"""Written into a warmed-up model's directory: the settings, the steps taken and the format
probability of every task at the end (``format_probabilities``)."""


def tokenize(tokenizer: Any, messages: list[dict[str, Any]],
             tools: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """``(ids, mask)``: the conversation's tokens, mask 1 on the assistant's own tokens."""
    def render(upto: int, generation: bool) -> list[int]:
        out = tokenizer.apply_chat_template(messages[:upto], tools=tools, tokenize=True,
                                            add_generation_prompt=generation)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    ids: list[int] = []
    mask: list[int] = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, after = render(k, True), render(k + 1, False)
        if before[:len(ids)] != ids or after[:len(before)] != before:
            raise ConfigError("the chat template is not prefix-stable: earlier turns render "
                              "differently later, so a warm-up would train on tokens the "
                              "engine never shows (build the model with policy.tiny)")
        mask += [0] * (len(before) - len(ids)) + [1] * (len(after) - len(before))
        ids = after
    return ids, mask


def warm_up(model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
            tasks: Sequence[Task], *, system_prompt: str, tools: list[dict[str, Any]],
            steps: int = 100, batch: int = 16, lr: float = 3e-3, seed: int = 0,
            demos: int = 256, progress: Callable[[int, float], None] | None = None,
            tool_names: Sequence[str] = ("read_file", "write_file", "submit"),
            device: str = "cpu", temperature: float = 1.0, format_min: float | None = None,
            max_steps: int | None = None) -> Path:
    """Train ``model_dir``'s model on random-answer transcripts of ``tasks``; save to
    ``out_dir`` (written aside, then renamed into place). Returns ``out_dir``.

    The transcripts are balanced: every task with every word equally often (as near as
    ``demos`` allows), so the model's answers start at chance for every call sign rather than
    at whatever imbalance a random draw left (which sampling at a low temperature sharpens).
    ``format_min``: after ``steps``, train on (checking every quarter of ``steps``) until
    ``format_probabilities`` at ``temperature`` is at least this for every task, or
    ``max_steps``. The figures at the end go into ``tempering-warmup.json``.

    ``tools`` are the schemas the prompt describes (empty: none are described, see
    ``EpisodeConfig.describe_tools``); the transcripts call the tools they name, or
    ``tool_names`` when they describe none. ``device``: where it trains (the learner's); the
    result is saved from the CPU either way."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # callers show progress
    if steps < 1 or batch < 1 or demos < 1:
        raise ConfigError(f"steps={steps}, batch={batch}, demos={demos}: each must be >= 1")
    last = max(steps, max_steps or steps)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    model.to(device)
    names = [t["function"]["name"] for t in tools] if tools else list(tool_names)
    data = [tokenize(tokenizer, switchboard_transcript(
        task, word, system_prompt=system_prompt, tools=names), tools)
        for task, word in _balanced(tasks, demos, rng)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def check() -> dict[str, float]:
        return format_probabilities(model, tokenizer, tasks, system_prompt=system_prompt,
                                    tools=tools, tool_names=names, temperature=temperature)

    model.train()
    every, trained = max(1, steps // 4), 0
    formats: dict[str, float] | None = None  # the check of the weights as they are now
    for step in range(last):
        if step >= steps and (step - steps) % every == 0:
            if format_min is None:
                break
            formats = check()
            if min(formats.values()) >= format_min:
                break
        chosen = [data[rng.randrange(len(data))] for _ in range(batch)]
        width = max(len(ids) for ids, _ in chosen)
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in chosen],
                           device=device)  # (B, T)
        attention = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in chosen],
                                 device=device)
        mask = torch.tensor([m + [0] * (width - len(m)) for _, m in chosen],
                            dtype=torch.float32, device=device)[:, 1:]  # (B, T-1): trained
        logits = model(ids, attention_mask=attention).logits[:, :-1].float()  # (B, T-1, V)
        logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logprobs * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        trained, formats = step + 1, None
        if progress is not None:
            progress(step, float(loss.detach()))
    if formats is None:
        formats = check()
    model.to("cpu").eval()
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / WARMUP_FILE).write_text(json.dumps({
        "base": str(model_dir), "steps": trained, "batch": batch, "lr": lr, "seed": seed,
        "demos": demos, "temperature": temperature, "format_min": format_min,
        "format": formats, "finished_at": time.time()}) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def _balanced(tasks: Sequence[Task], demos: int, rng: random.Random) -> list[tuple[Task, str]]:
    """``demos`` (task, word) pairs taking every pair in turn, each round in a new order."""
    pairs = [(task, word) for task in tasks for word in WORDS]
    out: list[tuple[Task, str]] = []
    while len(out) < demos:
        rng.shuffle(pairs)
        out += pairs[:demos - len(out)]
    return out


def format_probabilities(model: Any, tokenizer: Any, tasks: Sequence[Task], *,
                         system_prompt: str, tools: list[dict[str, Any]],
                         tool_names: Sequence[str], temperature: float = 1.0
                         ) -> dict[str, float]:
    """Task id -> the probability, under softmax(logits / ``temperature``), that the model
    writes each of its turns of the task's transcript token for token, the answer word
    excepted: how likely an episode at that temperature comes out well formed, the call
    sign's file name (copied from the instruction) included. The word's tokens are found as
    those that differ between the transcript answered with two different words."""
    import torch

    first, second = WORDS[:2]
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    out: dict[str, float] = {}
    try:
        for task in tasks:
            ids, mask = tokenize(tokenizer, switchboard_transcript(
                task, first, system_prompt=system_prompt, tools=tool_names), tools)
            other, _ = tokenize(tokenizer, switchboard_transcript(
                task, second, system_prompt=system_prompt, tools=tool_names), tools)
            if len(other) != len(ids):
                raise ConfigError(f"the code words {first!r} and {second!r} tokenize to "
                                  "different lengths: each must be one token")
            keep = [m and a == b for m, a, b in zip(mask, ids, other, strict=True)]
            x = torch.tensor([ids], device=device)
            with torch.no_grad():
                logits = model(x).logits[0, :-1].float() / temperature  # (T-1, V)
            picked = torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0]  # (T-1,)
            kept = torch.tensor(keep[1:], dtype=torch.bool, device=device)
            out[task.id] = float(picked[kept].sum().exp())
    finally:
        model.train(was_training)
    return out


def prepare_tiny(tiny: TinyModelConfig, warmup: WarmupConfig, episode: EpisodeConfig,
                 tasks: Sequence[Task], *, seed: int, device: str,
                 say: Callable[[str], None]) -> Path:
    """The tiny model ``tiny`` describes, built and warmed up (``warmup``) on the switchboard
    tasks among ``tasks`` (a run's, already loaded) with ``episode``'s prompt and tools;
    cached under ``$TEMPERING_CACHE`` by a hash of all of those, so runs that share them (a
    benchmark's sync and async runs, a rerun) build it once. ``device``: where it trains."""
    from tempering.agent.tools import tools_named
    from tempering.policy.config import tiny_model_dir
    from tempering.policy.tiny import build_tiny_model

    cache = tiny_model_dir().parent
    shape = tiny.model_dump()
    base = build_tiny_model(cache / f"tiny-{_digest(shape)}", seed=tiny.seed,
                            hidden_size=tiny.hidden_size, layers=tiny.layers, heads=tiny.heads)
    if warmup.steps == 0:
        return base
    tasks = [t for t in tasks if t.family == "switchboard"]
    if not tasks:
        raise ConfigError("model.warmup teaches the tool format on switchboard tasks, and the "
                          "run's tasks.specs select none: add switchboard, set "
                          "model.warmup.steps=0, or give model.path")
    names = episode.tools
    tools = tools_named(names) if episode.describe_tools else []
    temperature = episode.sampling.temperature or 1.0  # greedy: checked at 1, stricter
    key = {"tiny": shape, "warmup": warmup.model_dump(), "tools": names,
           "system": episode.system_prompt, "described": episode.describe_tools,
           "tasks": sorted(t.id.split(":")[0] for t in tasks), "seed": seed,
           "temperature": temperature}
    out = cache / f"warm-{_digest(key)}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs starting together warm up once
        if (out / WARMUP_FILE).is_file():
            say(f"tool-format warm-up: reusing {out}")
            _say_format(out, say)
            return out
        w = warmup
        until = ("" if w.format_min is None else
                 f", then on until every task is well formed with p >= {w.format_min:g} at "
                 f"temperature {temperature:g} (at most {w.max_steps})")
        say(f"tool-format warm-up: {w.steps} steps of {w.batch} transcripts{until} "
            f"(cached in {out})")
        started = time.monotonic()

        def progress(step: int, loss: float) -> None:
            if (step + 1) % max(1, w.steps // 5) == 0:
                say(f"  warm-up step {step + 1}  loss {loss:.3f}  "
                    f"{time.monotonic() - started:.0f}s")

        warm_up(base, out, tasks, system_prompt=episode.system_prompt,
                tools=tools, steps=w.steps, batch=w.batch, lr=w.lr, seed=seed,
                demos=w.demos, progress=progress,
                tool_names=[t["function"]["name"] for t in tools_named(names)],
                device=device, temperature=temperature,
                format_min=w.format_min, max_steps=w.max_steps)
        _say_format(out, say)
        return out


def _say_format(out: Path, say: Callable[[str], None]) -> None:
    """One line: the warmed-up model's format probability, worst task named; a warning when
    it is short of the ``format_min`` it was trained to."""
    record = json.loads((out / WARMUP_FILE).read_text())
    formats: dict[str, float] = record.get("format") or {}
    if not formats:
        return
    worst = min(formats, key=formats.__getitem__)
    line = (f"  warm-up: {record['steps']} steps, episodes well formed with p "
            f"{min(formats.values()):.3f} (worst: {worst}) to {max(formats.values()):.3f} at "
            f"temperature {record['temperature']:g}")
    wanted = record.get("format_min")
    if wanted is not None and formats[worst] < wanted:
        line += (f"; WARNING: short of format_min {wanted:g}, so RL may never see a reward on "
                 f"{worst} (raise model.warmup.max_steps or lr)")
    say(line)


def _digest(data: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
