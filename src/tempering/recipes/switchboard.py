"""The switchboard family's recipe: its training settings and its synthetic transcripts.

The family itself (``tasks/builtin.py``) is a task like any other; what is particular to
*training* on it lives here, out of the training core: the shape of the tiny model built
for it, the supervised tool-format warm-up that lets RL see a first reward
(``recipes/warmup.py``), heavy-tailed grading time for the benchmarks, and the transcripts
that warm-up trains on. ``TrainConfig`` names the three settings as its ``model.tiny``,
``model.warmup`` and ``tasks.slow`` sections.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tempering.errors import ConfigError
from tempering.tasks.builtin import CODEBOOK, answer_path, sign_of
from tempering.tasks.task import Task

WORDS = sorted(CODEBOOK.values())
"""The answers a switchboard task can have; the warm-up's transcripts use each equally."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TinyModelConfig(_Frozen):
    """The tiny Qwen2 model built locally when ``model.path`` is not set (``policy.tiny``)."""

    hidden_size: int = Field(default=64, ge=16)
    layers: int = Field(default=2, ge=1)
    heads: int = Field(default=4, ge=1)
    seed: int = 0


class WarmupConfig(_Frozen):
    """The supervised tool-format warm-up (``recipes/warmup.py``) run before RL on a fresh model.
    Answers in its transcripts are random, so RL still starts from chance."""

    steps: int = Field(default=200, ge=0)
    """Optimizer steps at least; 0 skips the warm-up (a model that already calls tools)."""
    format_min: float | None = Field(default=0.9, gt=0, le=1)
    """Train on, past ``steps``, until every task's episode is written in the right format
    with at least this probability at the sampling temperature (the path copied from the
    instruction included; the answer word excluded); None: ``steps`` steps, unchecked."""
    max_steps: int = Field(default=1000, ge=1)
    """The most steps ``format_min`` may take; short of it, the run warns and goes on."""
    batch: int = Field(default=16, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    demos: int = Field(default=256, ge=1)
    """Distinct synthetic transcripts drawn from."""


class SlowEnvConfig(_Frozen):
    """Heavy-tailed environment time for benchmarks: each switchboard episode's hidden test
    sleeps ``min(cap_s, scale_s * Pareto(alpha))`` seconds inside its grading sandbox, like a
    test suite whose run time varies from task to task and from run to run."""

    scale_s: float = Field(default=0.2, gt=0)
    """The minimum (Pareto scale); the median is ``scale_s * 2 ** (1 / alpha)``."""
    alpha: float = Field(default=1.2, gt=0)
    """The tail index: below 2 the variance is infinite, below 1 the mean too."""
    cap_s: float = Field(default=8.0, gt=0)
    """No sleep is longer (the grading timeout must exceed it)."""

    def as_tuple(self) -> tuple[float, float, float]:
        """``(scale_s, alpha, cap_s)``, as ``tasks.builtin.switchboard`` takes it."""
        return self.scale_s, self.alpha, self.cap_s


def switchboard_transcript(task: Task, word: str, *, system_prompt: str,
                           tools: Sequence[str] = ("read_file", "write_file", "submit"),
                           ) -> list[dict[str, Any]]:
    """One episode of ``task`` answered with ``word``, as chat messages: the file read and the
    answer written with ``read_file``/``write_file`` when ``tools`` offers them, else with
    ``bash`` (``cat``, ``echo``); the observations are what those tools show."""
    def call(i: int, name: str, args: dict[str, str]) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}]}

    def seen(i: int, text: str) -> dict[str, Any]:
        return {"role": "tool", "content": text, "tool_call_id": f"call_{i}"}

    table = task.workspace["codes.txt"].decode()
    path = answer_path(sign_of(task))
    if {"read_file", "write_file"} <= set(tools):
        steps = [(call(0, "read_file", {"path": "codes.txt"}), seen(0, table)),
                 (call(1, "write_file", {"path": path, "content": word}),
                  seen(1, f"wrote {len(word)} characters to {path}"))]
    elif "bash" in tools:
        steps = [(call(0, "bash", {"command": "cat codes.txt"}), seen(0, table)),
                 (call(1, "bash", {"command": f"echo {word} > {path}"}), seen(1, "(no output)"))]
    else:
        raise ConfigError(f"tools {list(tools)}: the warm-up needs read_file and write_file, "
                          "or bash, to read codes.txt and write the answer")
    return [{"role": "system", "content": system_prompt},
            {"role": "user", "content": task.instruction},
            *(m for pair in steps for m in pair), call(2, "submit", {})]
