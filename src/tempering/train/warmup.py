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

import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tempering.errors import ConfigError
from tempering.tasks.builtin import CODEBOOK
from tempering.tasks.task import Task


def switchboard_transcript(task: Task, word: str, *, system_prompt: str) -> list[dict[str, Any]]:
    """One episode of ``task`` answered with ``word``, as chat messages; the observations are
    what the episode's tools would show."""
    def call(i: int, name: str, args: dict[str, str]) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}]}

    table = task.workspace["codes.txt"].decode()
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": task.instruction},
        call(0, "read_file", {"path": "codes.txt"}),
        {"role": "tool", "content": table, "tool_call_id": "call_0"},
        call(1, "write_file", {"path": "answer.txt", "content": word}),
        {"role": "tool", "content": f"wrote {len(word)} characters to answer.txt",
         "tool_call_id": "call_1"},
        call(2, "submit", {}),
    ]


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
            demos: int = 256, progress: Callable[[int, float], None] | None = None) -> Path:
    """Train ``model_dir``'s model on random-answer transcripts of ``tasks``; save to
    ``out_dir`` (written aside, then renamed into place). Returns ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if steps < 1 or batch < 1 or demos < 1:
        raise ConfigError(f"steps={steps}, batch={batch}, demos={demos}: each must be >= 1")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    words = sorted(CODEBOOK.values())
    data = [tokenize(tokenizer, switchboard_transcript(
        rng.choice(list(tasks)), rng.choice(words), system_prompt=system_prompt), tools)
        for _ in range(demos)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        chosen = [data[rng.randrange(len(data))] for _ in range(batch)]
        width = max(len(ids) for ids, _ in chosen)
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in chosen])  # (B, T)
        attention = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in chosen])
        mask = torch.tensor([m + [0] * (width - len(m)) for _, m in chosen],
                            dtype=torch.float32)[:, 1:]  # (B, T-1): which targets train
        logits = model(ids, attention_mask=attention).logits[:, :-1].float()  # (B, T-1, V)
        logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logprobs * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if progress is not None:
            progress(step, float(loss.detach()))
    model.eval()  # type: ignore[no-untyped-call]
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "tempering-warmup.json").write_text(json.dumps({
        "base": str(model_dir), "steps": steps, "batch": batch, "lr": lr, "seed": seed,
        "demos": demos, "finished_at": time.time()}) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
