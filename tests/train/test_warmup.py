"""The format warm-up teaches the tiny model the tool-call format of a switchboard episode, and
nothing about the answers: after it, real episodes in real sandboxes are well formed and the
words are the model's guesses."""

from __future__ import annotations

from pathlib import Path

import pytest

from tempering.agent import EpisodeConfig, run_episode
from tempering.agent.tools import tools_named
from tempering.policy.base import SamplingParams
from tempering.reward import Grader
from tempering.tasks.builtin import CODEBOOK, switchboard
from tempering.train.warmup import switchboard_transcript, tokenize, warm_up

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


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
async def test_after_warm_up_episodes_are_well_formed(tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    from tempering.policy.local import LocalEngine

    tasks = switchboard(layouts=2)
    losses: list[float] = []
    warmed = warm_up(tiny_model_dir, tmp_path / "warm", tasks, system_prompt=SYSTEM,
                     tools=tools_named(TOOLS), steps=100, batch=8, demos=64,
                     progress=lambda step, loss: losses.append(loss))
    assert losses[-1] < 0.2 * losses[0]
    config = EpisodeConfig(system_prompt=SYSTEM, tools=TOOLS, max_turns=4,
                           sampling=SamplingParams(temperature=0.0, max_tokens=40))
    async with LocalEngine(warmed) as engine, Grader() as grader:
        trajectory = await run_episode(tasks[0], engine, config=config, grader=grader)
    assert [s.action for s in trajectory.steps] == ["read_file", "write_file", "submit"]
    assert trajectory.reward is not None
    answer = trajectory.steps[1].arguments
    assert any(f'"{word}"' in answer for word in CODEBOOK.values())
