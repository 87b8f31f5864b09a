"""Episodes driven by a real model: the local engine in process, and the same engine behind
``PolicyServer`` over real HTTP on loopback, acting in real sandboxes, graded by the real grader.

The model is tiny and untrained, so its actions are mostly malformed; what these tests hold to
is the data: every turn's tokens and log-probs are what the engine sampled (a fresh forward pass
over the episode's one training sequence gives the same log-probs), the server's own record of
the episode equals the client's token for token, and the trajectory is stored and read back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from tempering.agent import EpisodeConfig, run_episode
from tempering.policy.base import SamplingParams
from tempering.reward import Grader
from tempering.tasks import load_task
from tempering.trajectory.schema import Status, Trajectory
from tempering.trajectory.store import TrajectoryStore

MEDIAN = Path(__file__).parents[2] / "examples" / "tasks" / "median"
TOKEN = "the-operators-token-for-this-test"  # tempering serve takes it from the environment
CONFIG = EpisodeConfig(max_turns=3, max_consecutive_errors=3,
                       sampling=SamplingParams(temperature=1.0, max_tokens=24, seed=7))


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    from tempering.policy.local import LocalEngine

    engine = LocalEngine(tiny_model_dir)
    yield engine
    engine.close()


def _recomputed_logprobs(engine, trajectory: Trajectory) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    import torch

    sequence = trajectory.sequence()
    assert sequence is not None, "every turn must extend the previous one token for token"
    ids, mask, logprobs, _ = sequence
    with torch.no_grad():
        logits = engine.model(torch.tensor([ids])).logits[0].float()
    scaled = torch.log_softmax(logits[:-1] / CONFIG.sampling.temperature, dim=-1)
    fresh = scaled.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).tolist()
    picked = [i for i in range(1, len(ids)) if mask[i]]
    return [logprobs[i] for i in picked], [fresh[i - 1] for i in picked]


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
async def test_local_engine_episode_is_token_faithful_and_stored(engine, tmp_path) -> None:
    task = load_task(MEDIAN)
    async with Grader() as grader:
        with TrajectoryStore(tmp_path / "run") as store:
            trajectory = await run_episode(task, engine, config=CONFIG, grader=grader,
                                           recorder=store, run_id="local")
    assert trajectory.status in (Status.OK, Status.MODEL_ERROR), trajectory.error
    assert trajectory.reward is not None and trajectory.policy.startswith("local:")
    assert len(trajectory.steps) >= 1
    for step in trajectory.steps:
        assert step.completion_token_ids and len(step.logprobs) == len(step.completion_token_ids)
        assert step.loss_mask == [1] * len(step.completion_token_ids)
        assert step.weights_version == engine.weights_version
    assert all(s.prompt_reused > 0 for s in trajectory.steps[1:])
    recorded, fresh = _recomputed_logprobs(engine, trajectory)
    assert max(abs(a - b) for a, b in zip(recorded, fresh, strict=True)) < 1e-4
    [stored] = list(TrajectoryStore(tmp_path / "run").read())
    assert stored == trajectory


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
async def test_episode_through_tempering_serve_matches_the_servers_record(
        engine, tiny_model_dir: Path, tmp_path: Path) -> None:
    """``tempering serve`` runs as its own process; the episode talks to it over HTTP."""
    import httpx

    from tempering.policy.openai import OpenAIPolicy

    task = load_task(MEDIAN)
    served = tmp_path / "served"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tempering.cli", "serve", "--model", str(tiny_model_dir),
        "--port", "0", "--run-dir", str(served), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TEMPERING_SERVE_TOKEN": TOKEN})
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
        assert url.startswith("http://127.0.0.1:"), "tempering serve did not start"
        async with OpenAIPolicy(url, "tiny") as client, Grader() as grader:
            trajectory = await run_episode(task, client, config=CONFIG, grader=grader)
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            record = (await http.get(f"{url}/episodes/{trajectory.trajectory_id}")).json()
            ended = await http.post(f"{url}/episodes/{trajectory.trajectory_id}/end",
                                    json={"reward": trajectory.reward_value,
                                          "task_id": task.id})
            assert ended.status_code == 200, ended.text
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 30)
    assert trajectory.reward is not None and trajectory.policy == "openai:tiny"
    steps = record["steps"]
    assert len(steps) == len(trajectory.steps) >= 1
    for ours, theirs in zip(trajectory.steps, steps, strict=True):
        assert ours.completion_token_ids == theirs["completion_token_ids"]
        assert ours.prompt_token_ids == theirs["prompt_token_ids"]
        assert ours.prompt_reused == theirs["prompt_reused"]
        assert ours.logprobs == pytest.approx(theirs["logprobs"], abs=1e-6)
        assert ours.weights_version == theirs["weights_version"]
    assert all(s.prompt_reused > 0 for s in trajectory.steps[1:])
    # the server's stored copy is the same sequence, token for token
    [kept] = list(TrajectoryStore(served).read())
    assert kept.sequence() == trajectory.sequence()
    assert [s.observation for s in kept.steps[:-1]] == \
        [s.observation for s in trajectory.steps[:-1]]
    # and the same weights, loaded here, give the log-probs the server recorded
    recorded, fresh = _recomputed_logprobs(engine, trajectory)
    assert max(abs(a - b) for a, b in zip(recorded, fresh, strict=True)) < 1e-4
