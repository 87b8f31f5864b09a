"""The format warm-up teaches the tiny model the tool-call format of a switchboard episode, and
nothing about the answers: after it, real episodes in real sandboxes are well formed and the
words are the model's guesses."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tempering.agent import EpisodeConfig, run_episode
from tempering.agent.tools import tools_named
from tempering.policy.base import SamplingParams
from tempering.recipes.switchboard import switchboard_transcript
from tempering.recipes.warmup import (
    WARMUP_FILE,
    _balanced,
    format_probabilities,
    tokenize,
    warm_up,
)
from tempering.reward import Grader
from tempering.tasks.builtin import CODEBOOK, switchboard

SYSTEM = "You act in a sandbox with tools. Call submit when done."
TOOLS = ["read_file", "write_file", "submit"]


def test_transcripts_train_only_the_assistants_tokens(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    task = switchboard(layouts=1)[0]
    ids, mask = tokenize(tokenizer, switchboard_transcript(task, "gold", system_prompt=SYSTEM),
                         tools_named(TOOLS))
    trained = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert trained.count("<tool_call>") == 3 and '"content": "gold"' in trained
    assert "codes.txt lists" not in trained and "echo red" not in trained  # prompt, observations


def test_every_task_gets_every_word_equally_often() -> None:
    """A random draw of words leaves one sign's answers lopsided (seed 1's warm-up gave
    main's word 2% where root's got 42% at temperature 0.4), and RL never recovered it."""
    tasks = switchboard(layouts=2)
    pairs = Counter((task.id, word) for task, word in _balanced(tasks, 96, random.Random(1)))
    assert len(pairs) == len(tasks) * len(CODEBOOK) == 32
    assert set(pairs.values()) == {3}
    partial = Counter(task.id for task, _ in _balanced(tasks, 40, random.Random(1)))
    assert sum(partial.values()) == 40 and max(partial.values()) <= 8  # 1 round + 8 of 32


def _format(model_dir: Path, tasks: list, temperature: float) -> dict[str, float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return format_probabilities(model, tokenizer, tasks, system_prompt=SYSTEM,
                                tools=tools_named(TOOLS), tool_names=TOOLS,
                                temperature=temperature)


def _warm(model_dir: Path, tmp_path: Path, tasks: list, **settings: Any
          ) -> tuple[Path, dict[str, Any], list[float]]:
    """``warm_up`` at temperature 0.4: the model, its ``WARMUP_FILE`` record, each step's loss."""
    losses: list[float] = []
    warmed = warm_up(model_dir, tmp_path / "warm", tasks, system_prompt=SYSTEM,
                     tools=tools_named(TOOLS), temperature=0.4,
                     progress=lambda step, loss: losses.append(loss), **settings)
    return warmed, json.loads((warmed / WARMUP_FILE).read_text()), losses


def test_an_untrained_model_writes_no_episode_well_formed(tiny_model_dir: Path) -> None:
    tasks = switchboard(layouts=1)
    formats = _format(tiny_model_dir, tasks, 1.0)
    assert set(formats) == {t.id for t in tasks}
    assert all(0 <= p < 1e-6 for p in formats.values())


def test_a_warm_up_short_of_format_min_stops_at_max_steps(tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    tasks = switchboard(layouts=1)
    warmed, record, losses = _warm(tiny_model_dir, tmp_path, tasks, steps=4, batch=2,
                                   demos=16, format_min=0.999, max_steps=9)
    assert len(losses) == 9 and record["steps"] == 9
    assert record["format"] == pytest.approx(_format(warmed, tasks, 0.4), rel=1e-4)
    assert max(record["format"].values()) < 0.999


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
async def test_after_warm_up_episodes_are_well_formed(tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    from tempering.policy.local import LocalEngine

    tasks = switchboard(layouts=2)
    warmed, record, losses = _warm(tiny_model_dir, tmp_path, tasks, steps=100, batch=8,
                                   demos=64, format_min=0.9, max_steps=600)
    assert losses[-1] < 0.2 * losses[0]
    assert 100 <= record["steps"] < 600 and len(losses) == record["steps"]
    assert min(record["format"].values()) >= 0.9  # checked against, so it stopped there
    config = EpisodeConfig(system_prompt=SYSTEM, tools=TOOLS, max_turns=4,
                           sampling=SamplingParams(temperature=0.0, max_tokens=40))
    async with LocalEngine(warmed) as engine, Grader() as grader:
        trajectory = await run_episode(tasks[0], engine, config=config, grader=grader)
    assert [s.action for s in trajectory.steps] == ["read_file", "write_file", "submit"]
    assert trajectory.reward is not None
    answer = trajectory.steps[1].arguments
    assert any(f'"{word}"' in answer for word in CODEBOOK.values())
