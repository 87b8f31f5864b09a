"""The learner on the tiny Qwen2 model: log-probs equal to the engine's, updates that follow the
advantages, gradient accumulation, publishing to a LocalEngine, checkpoints that survive
``kill -9``."""

from __future__ import annotations

import asyncio
import copy
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from learner_child import CONFIG as CHILD_CONFIG  # noqa: E402
from learner_child import batch  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from tempering.errors import ConfigError  # noqa: E402
from tempering.policy.base import GenerateRequest, Message, SamplingParams  # noqa: E402
from tempering.policy.local import LocalEngine  # noqa: E402
from tempering.reward.result import RewardResult  # noqa: E402
from tempering.train import Learner, LearnerConfig, Sample, StepStats  # noqa: E402
from tempering.train.metrics import learner_figures  # noqa: E402
from tempering.train.samples import group_advantages, samples_from  # noqa: E402
from tempering.trajectory.schema import Step, Trajectory  # noqa: E402


def grade(reward: float) -> RewardResult:
    return RewardResult(reward=reward, components={}, tests_passed=0, tests_total=0, flags=[])


async def two_turns(engine: LocalEngine, seed: int, temperature: float) -> Trajectory:
    """A two-turn episode sampled by the engine, the second turn extending the first's tokens."""
    def sampling(s: int) -> SamplingParams:
        return SamplingParams(temperature=temperature, top_p=0.9, max_tokens=20, seed=s)

    first = [Message(role="system", content="You fix bugs."),
             Message(role="user", content="The tests fail.")]
    g1 = await engine.generate(GenerateRequest(messages=first, sampling=sampling(seed)))
    conversation = [*first, Message(role="assistant", content=g1.text),
                    Message(role="user", content="exit code 1: still failing")]
    g2 = await engine.generate(GenerateRequest(
        messages=conversation, sampling=sampling(seed + 1), prefix_messages=3,
        prefix_token_ids=g1.prompt_token_ids + g1.completion_token_ids))
    assert g2.prompt_reused > 0
    steps = [Step(index=i, prompt_reused=g.prompt_reused, prompt_token_ids=g.prompt_token_ids,
                  completion_token_ids=g.completion_token_ids, logprobs=g.logprobs,
                  loss_mask=[1] * len(g.completion_token_ids), weights_version=g.weights_version)
             for i, g in enumerate((g1, g2))]
    return Trajectory(task_id="t", group_id="g", steps=steps, reward=grade(seed % 2))


def trained(sample: Sample, logprobs: list[float]) -> list[float]:
    return [lp for lp, m in zip(logprobs, sample.loss_mask, strict=True) if m]


def params(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.named_parameters()}


async def test_logprobs_equal_the_engines_so_fresh_samples_have_weight_one(
        engine: LocalEngine, tiny_model_dir: Path) -> None:
    trajs = [await two_turns(engine, seed, temperature=0.7) for seed in (1, 2)]
    # The same episode as an engine that re-rendered its prompts would record it.
    steps = trajs[0].steps
    rerendered = trajs[0].model_copy(update={"trajectory_id": "re", "steps": [
        steps[0], steps[1].model_copy(update={
            "prompt_reused": 0, "prompt_token_ids": trajs[0].prompt_ids(1)})]})
    assert trajs[0].sequence() is not None and rerendered.sequence() is None
    learner = Learner(tiny_model_dir, LearnerConfig(temperature=0.7, lr=1e-3))
    samples = learner.make_samples([*trajs, rerendered])
    assert len(samples) == 4  # one per multi-turn episode, one per re-rendered turn
    for sample, logprobs in zip(samples, learner.logprobs(samples), strict=True):
        assert trained(sample, logprobs) == pytest.approx(trained(sample, list(sample.logprobs)),
                                                          abs=1e-4)
    fresh = learner.step(samples)
    assert fresh.is_weight_mean == pytest.approx(1.0, abs=1e-4)
    assert fresh.is_truncated_frac == 0.0 and fresh.ratio_mean == pytest.approx(1.0)
    assert (fresh.staleness_mean, fresh.staleness_max, fresh.version) == (0.0, 0, 1)
    assert fresh.tokens == sum(s.tokens for s in samples) and fresh.samples == 4
    stale = learner.step(samples)  # the same samples, now one version old
    assert (stale.staleness_mean, stale.staleness_max, stale.version) == (1.0, 1, 2)
    assert abs(stale.is_weight_mean - 1.0) > 1e-3


def fixed_completions(tiny_model_dir: Path) -> list[Trajectory]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    prompt = tok.encode("<|im_start|>user\nFix the bug.<|im_end|>\n<|im_start|>assistant\n")
    out = []
    for text, reward in (("I ran the tests and fixed it.", 1.0), ("No.", 0.0)):
        step = Step(index=0, prompt_token_ids=prompt,  # no log-probs recorded: weight 1
                    completion_token_ids=tok.encode(text) + [tok.convert_tokens_to_ids(
                        "<|im_end|>")])
        out.append(Trajectory(task_id="t", group_id="g", steps=[step], reward=grade(reward)))
    return out


def test_steps_raise_the_rewarded_completion_and_lower_the_other(tiny_model_dir: Path) -> None:
    trajs = fixed_completions(tiny_model_dir)
    advantages = group_advantages(trajs)
    good, bad = samples_from(trajs, advantages=advantages)
    assert good.advantage > 0 > bad.advantage
    learner = Learner(tiny_model_dir, LearnerConfig(lr=1e-3))

    def totals() -> list[float]:
        return [sum(trained(s, lp)) for s, lp in zip((good, bad),
                                                      learner.logprobs([good, bad]), strict=True)]

    before = totals()
    for _ in range(4):
        stats = learner.step([good, bad])
    after = totals()
    assert after[0] > before[0] + 1.0 and after[1] < before[1] - 1.0, (before, after)
    assert stats.version == 4 and math.isfinite(stats.grad_norm) and stats.grad_norm > 0


def test_the_format_penalty_is_the_learners_own(tiny_model_dir: Path) -> None:
    # both episodes solved the task (the tests cannot see turns), one with a malformed call
    good, garbled = fixed_completions(tiny_model_dir)
    steps = [garbled.steps[0].model_copy(update={"action": "invalid"})]
    group = [good, garbled.model_copy(update={"steps": steps, "reward": grade(1.0)})]
    plain = Learner(tiny_model_dir, LearnerConfig(lr=1e-3)).make_samples(group)
    assert [s.advantage for s in plain] == [0.0, 0.0]
    shaped = Learner(tiny_model_dir, LearnerConfig(lr=1e-3, format_penalty=0.1))
    assert [s.advantage for s in shaped.make_samples(group)] == pytest.approx([0.0, -0.1])
    with pytest.raises(ValidationError, match="format_penalty"):
        LearnerConfig(format_penalty=-0.1)


def random_samples(n: int, seed: int, learner: Learner) -> list[Sample]:
    """Samples of mixed lengths whose behaviour log-probs are off the learner's (stale)."""
    gen = torch.Generator().manual_seed(seed)
    drafts = []
    for i in range(n):
        length = 8 + 7 * i
        ids = tuple(torch.randint(0, 2000, (length,), generator=gen).tolist())
        mask = tuple(int(t >= 3 and (t % 5) != 0) for t in range(length))
        drafts.append(Sample(ids, mask, (0.0,) * length, (0,) * length,
                             float(torch.randn((), generator=gen)), f"s{i}"))
    current = learner.logprobs(drafts)
    return [Sample(d.ids, d.loss_mask, tuple(lp + 0.5 * float(torch.randn((), generator=gen))
                                             for lp in lps), d.versions, d.advantage,
                   d.trajectory_id) for d, lps in zip(drafts, current, strict=True)]


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_gradient_accumulation_equals_one_big_batch(tiny_model_dir: Path, loss_agg: str) -> None:
    def run(micro_batch_tokens: int) -> tuple[StepStats, dict[str, torch.Tensor]]:
        learner = Learner(tiny_model_dir, LearnerConfig(
            lr=1e-4, micro_batch_tokens=micro_batch_tokens, loss_agg=loss_agg,  # type: ignore[arg-type]
            is_cap=1.5, kl_coef=0.1))
        stats = learner.step(random_samples(6, 0, learner))
        return stats, params(learner)

    (big, p_big), (small, p_small) = run(10_000), run(64)
    assert (big.micro_batches, small.micro_batches) == (1, 4)  # 43 | 36 | 29+22 | 15+8
    assert big.is_truncated_frac > 0  # the cap and the KL term take part
    for field in ("loss", "pg_loss", "grad_norm", "is_weight_mean", "is_truncated_frac"):
        assert getattr(small, field) == pytest.approx(getattr(big, field), rel=1e-5), field
    moved = max((p_big[k] - p).abs().max().item() for k, p in params(
        Learner(tiny_model_dir)).items())
    diff = max((p_big[k] - p_small[k]).abs().max().item() for k in p_big)
    assert moved > 5e-5 and diff < moved / 100, (moved, diff)


def test_mini_batches_clip_against_the_weights_before_the_update(tiny_model_dir: Path) -> None:
    learner = Learner(tiny_model_dir, LearnerConfig(lr=2e-2, mini_batches=2))
    stats = learner.step(random_samples(6, 1, learner))
    # The second optimizer step sees weights the first one moved: ratios leave 1 and clip.
    assert stats.clip_frac > 0 and stats.approx_kl > 0 and stats.version == 1


async def test_publish_bumps_the_engine_version_and_changes_its_samples(
        engine: LocalEngine, tiny_model_dir: Path) -> None:
    request = GenerateRequest(messages=[Message(role="user", content="Fix the bug.")],
                              sampling=SamplingParams(max_tokens=16, seed=3))
    before = await engine.generate(request)
    learner = Learner(tiny_model_dir, LearnerConfig(lr=1e-2))
    trajs = fixed_completions(tiny_model_dir)
    samples = samples_from(trajs, advantages=group_advantages(trajs))
    learner.step(samples)
    learner.step(samples)  # the engine takes the learner's version, not its own + 1
    assert await asyncio.to_thread(learner.publish, engine) == 2
    assert engine.weights_version == 2
    after = await engine.generate(request)
    assert after.weights_version == 2
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    sample = Sample(tuple(after.prompt_token_ids + after.completion_token_ids),
                    (0,) * len(after.prompt_token_ids) + (1,) * len(after.completion_token_ids),
                    (0.0,) * (len(after.prompt_token_ids) + len(after.completion_token_ids)),
                    (0,) * (len(after.prompt_token_ids) + len(after.completion_token_ids)), 0.0)
    (mine,) = learner.logprobs([sample])
    assert trained(sample, mine) == pytest.approx(after.logprobs, abs=1e-4)
    # The engine copied the weights: the learner training on does not reach it.
    learner.step(samples)
    again = await engine.generate(request)
    assert again.completion_token_ids == after.completion_token_ids
    assert again.logprobs == pytest.approx(after.logprobs, abs=1e-6)
    assert again.weights_version == 2 and learner.publish(engine) == 3


def test_save_and_load_resume_with_the_same_version_and_optimizer(tiny_model_dir: Path,
                                                                  tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    config = LearnerConfig(lr=1e-3)
    first = Learner(tiny_model_dir, config)
    first.step(batch(0))
    checkpoint = first.save(tmp_path / "ckpt")
    first.step(batch(1))
    assert first.save(tmp_path / "ckpt") == checkpoint  # over the old one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary left over
    saved = copy.deepcopy(first.optimizer.state_dict())
    uninterrupted = first.step(batch(2))

    resumed = Learner(tiny_model_dir, config)
    resumed.load(checkpoint)
    assert resumed.version == 2
    state = resumed.optimizer.state_dict()["state"]
    assert set(state) == set(saved["state"])
    for i, moments in saved["state"].items():
        for key, value in moments.items():
            assert torch.equal(state[i][key], value), (i, key)
    replay = resumed.step(batch(2))  # the next step equals the uninterrupted one
    assert replay.version == 3 == uninterrupted.version
    assert replay.loss == pytest.approx(uninterrupted.loss, rel=1e-6)
    ours, theirs = params(resumed), params(first)
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-6
    assert AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)  # engines load it

    # A kill between save's two renames leaves the previous checkpoint as .ckpt.old.
    checkpoint.rename(tmp_path / ".ckpt.old")
    again = Learner(tiny_model_dir, config)
    again.load(checkpoint)
    assert again.version == 2 and checkpoint.is_dir()
    with pytest.raises(ConfigError, match="no learner checkpoint"):
        again.load(tmp_path / "nothing")


def test_a_snapshot_saves_the_learner_as_it_was_when_taken(tiny_model_dir: Path,
                                                           tmp_path: Path) -> None:
    config = LearnerConfig(lr=1e-3)
    learner = Learner(tiny_model_dir, config)
    learner.step(batch(0))
    snap = learner.snapshot()
    before, optimizer = params(learner), copy.deepcopy(learner.optimizer.state_dict())
    learner.step(batch(1))  # the live weights move on; the snapshot must not
    learner.step(batch(2))
    learner.save(tmp_path / "good", snap)

    back = Learner(tiny_model_dir, config)
    back.load(tmp_path / "good")
    assert back.version == 1 and learner.version == 3
    ours = params(back)
    assert max((ours[k] - before[k]).abs().max().item() for k in before) == 0.0
    assert max((ours[k] - params(learner)[k]).abs().max().item() for k in ours) > 0
    for i, moments in optimizer["state"].items():
        for key, value in moments.items():
            assert torch.equal(back.optimizer.state_dict()["state"][i][key], value), (i, key)


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
def test_a_killed_learner_resumes_from_its_last_checkpoint(tiny_model_dir: Path,
                                                           tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    acknowledged = 0
    rng = random.Random(0)
    for _ in range(2):
        child = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("learner_child.py")),
             str(tiny_model_dir), str(checkpoint)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        resumed = int(child.stdout.readline().split()[1])
        assert resumed == acknowledged  # every acknowledged version survived the kill
        while acknowledged < resumed + 3:
            acknowledged = int(child.stdout.readline().split()[1])
        time.sleep(rng.uniform(0.0, 0.05))  # somewhere in a step or a save
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        # It may have saved more after its last line was read; it never saves less.
        learner = Learner(tiny_model_dir, CHILD_CONFIG)
        learner.load(checkpoint)
        assert learner.version >= acknowledged
        acknowledged = learner.version
    replay = Learner(tiny_model_dir, CHILD_CONFIG)
    while replay.version < learner.version:
        replay.step(batch(replay.version))
    mine, theirs = params(replay), params(learner)
    assert max((mine[k] - theirs[k]).abs().max().item() for k in mine) < 1e-5
    assert learner.step(batch(learner.version)).version == acknowledged + 1


@pytest.mark.parametrize(("field", "value"), [
    ("lr", 0.0), ("betas", (0.9, 1.0)), ("clip_eps", 1.5), ("clip_eps_high", -0.1),
    ("is_cap", 0.5), ("kl_coef", -1.0), ("temperature", 0.0), ("micro_batch_tokens", 0),
    ("mini_batches", 0), ("loss_agg", "sum"), ("dtype", "float16"), ("max_grad_norm", 0.0),
    ("lr_schedule", "cosine"), ("max_kl", 0.0)])
def test_bad_config_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        LearnerConfig(**{field: value})  # type: ignore[arg-type]


def test_bad_model_or_device_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot load a causal LM"):
        Learner(tmp_path)
    with pytest.raises(ConfigError, match="no model directory at"):
        Learner(tmp_path / "org" / "model")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device 'cuda'"):
            Learner(tiny_model_dir, LearnerConfig(device="cuda"))
    with pytest.raises(ConfigError, match="device 'tpu9'"):
        Learner(tiny_model_dir, LearnerConfig(device="tpu9"))
    learner = Learner(tiny_model_dir)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        learner.step([Sample((1, 99_999), (0, 1), (0.0, 0.0), (0, 0), 1.0)])
    with pytest.raises(ValueError, match="more than the model's 2048 positions"):
        learner.step([Sample((1,) * 2049, (0,) + (1,) * 2048, (0.0,) * 2049, (0,) * 2049, 1.0)])
    with pytest.raises(ValueError, match="no samples"):
        learner.step([])
    assert learner.version == 0


def test_bfloat16_autocast_keeps_float32_weights(tiny_model_dir: Path) -> None:
    exact = Learner(tiny_model_dir, LearnerConfig(lr=1e-3))
    fast = Learner(tiny_model_dir, LearnerConfig(lr=1e-3, dtype="bfloat16"))
    samples = batch(0)
    for a, b in zip(exact.logprobs(samples), fast.logprobs(samples), strict=True):
        assert a == pytest.approx(b, abs=0.1) and a != pytest.approx(b, abs=1e-6)
    stats = fast.step(samples)
    assert math.isfinite(stats.loss) and stats.version == 1
    assert all(p.dtype == torch.float32 for p in fast.model.parameters())


def test_lr_warmup_rises_linearly_then_holds(tiny_model_dir: Path) -> None:
    learner = Learner(tiny_model_dir, LearnerConfig(lr=1e-3, lr_warmup_steps=4))
    assert [learner.lr_at(v) for v in range(6)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert Learner(tiny_model_dir, LearnerConfig(lr=1e-3)).lr_at(0) == 1e-3
    learner.step(batch(0))  # the optimizer steps at the warmed-up rate
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(2.5e-4)


def test_epochs_pass_over_the_batch_again_against_one_prox(tiny_model_dir: Path) -> None:
    one = Learner(tiny_model_dir, LearnerConfig(lr=1e-2)).step(batch(0))
    three = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, epochs=3))
    stats = three.step(batch(0))
    assert stats.version == 1 == three.version  # still one version per step
    assert stats.micro_batches == 3 * one.micro_batches
    # the 2nd and 3rd passes see weights that moved: the ratio to π_prox leaves 1
    assert stats.approx_kl > 0 and abs(stats.ratio_mean - 1) > 1e-6
    # token means over every pass, not summed over the passes (they were 3x before)
    assert 0 <= stats.clip_frac <= 1 and abs(stats.ratio_mean - 1) < 0.5, stats
    assert stats.is_weight_mean == pytest.approx(1.0, abs=1e-4)  # fresh samples: weight 1
    assert stats.by_staleness and all(row["behav_kl"] < 1e-4
                                      for row in stats.by_staleness.values())
    assert stats.entropy > 0


def _vocab_kl(p: Learner, q: Learner, samples: list[Sample],
              temperature: float = 1.0) -> float:
    """KL(π_p ‖ π_q) over the whole vocabulary, a mean over the trained tokens, from the two
    models' logits one sample at a time (an independent check of ``Learner._step_kl``)."""
    total = count = 0.0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.ids])
            log_p = torch.log_softmax(p.model(input_ids=ids).logits[0, :-1] / temperature, -1)
            log_q = torch.log_softmax(q.model(input_ids=ids).logits[0, :-1] / temperature, -1)
            trained = torch.tensor(s.loss_mask[1:], dtype=torch.bool)  # position t predicts t + 1
            kl = (log_p.exp() * (log_p - log_q)).sum(-1)
            total += kl[trained].sum().item()
            count += trained.sum().item()
    return total / count


def _mixed(version: int) -> list[Sample]:
    """``batch(version)`` and a shorter sample that trains other tokens: rows of one
    micro-batch padded, with masks that differ, which together train every column (so the
    logits of all positions are computed, then sliced: ``batch`` alone asks for its own)."""
    short = Sample((5, 17, 300, 42, 9, 1000, 77, 3, 11, 250), (0,) + (1,) * 9,
                   (0.0,) + (float("nan"),) * 9, (-1,) + (version,) * 9, -1.0, "short")
    return [*batch(version), short]


def _at(tiny_model_dir: Path, start: dict[str, torch.Tensor], end: dict[str, torch.Tensor],
        scale: float) -> Learner:
    """A learner whose weights are ``start + scale x (end - start)``."""
    probe = Learner(tiny_model_dir)
    probe.model.load_state_dict({k: start[k] + scale * (end[k] - start[k]) for k in start})
    return probe


def test_max_kl_pulls_a_step_back_into_its_trust_region(tiny_model_dir: Path) -> None:
    """A step whose exact KL passes ``max_kl`` is pulled back along its own direction, to the
    first halving that is within it, and reports that KL; a bound the step stays within
    changes nothing; one no halving meets leaves the weights as they were."""
    samples = _mixed(0)
    before = Learner(tiny_model_dir)
    free = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, epochs=4))
    stats = free.step(samples)
    assert stats.step_kl is None and stats.step_scale == 1.0
    assert "step_kl" not in learner_figures(stats)
    far = _vocab_kl(before, free, samples)
    assert far > 0
    start, end = before.model.state_dict(), free.model.state_dict()

    bounded = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, epochs=4, max_kl=far / 10))
    stats = bounded.step(samples)
    assert 0 < stats.step_scale < 1 and stats.step_kl is not None
    assert stats.step_kl <= far / 10
    assert _vocab_kl(before, bounded, samples) == pytest.approx(stats.step_kl, rel=1e-3)
    assert learner_figures(stats)["step_scale"] == stats.step_scale
    # the first halving within the bound: twice as far was past it
    assert _vocab_kl(before, _at(tiny_model_dir, start, end, 2 * stats.step_scale),
                     samples) > far / 10
    for name, value in bounded.model.state_dict().items():  # along the free step's line
        expected = start[name] + stats.step_scale * (end[name] - start[name])
        assert torch.allclose(value, expected, atol=1e-6), name

    loose = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, epochs=4, max_kl=far * 10))
    stats = loose.step(samples)
    assert stats.step_scale == 1.0 and stats.step_kl == pytest.approx(far, rel=1e-3)
    for name, value in loose.model.state_dict().items():
        assert torch.equal(value, end[name]), name

    tight = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, epochs=4, max_kl=1e-30))
    stats = tight.step(samples)
    assert stats.step_scale == 0.0 and stats.step_kl == 0.0 and tight.version == 1
    for name, value in tight.model.state_dict().items():
        assert torch.equal(value, start[name]), name


def test_max_kl_measures_at_the_sampling_temperature(tiny_model_dir: Path) -> None:
    """The KL bounded is that of the tempered policies the engine samples from."""
    samples = batch(1)
    before = Learner(tiny_model_dir, LearnerConfig(temperature=0.5))
    learner = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, epochs=2, temperature=0.5,
                                                    max_kl=1e9))
    stats = learner.step(samples)
    assert stats.step_scale == 1.0 and stats.step_kl is not None
    untempered = _vocab_kl(before, learner, samples)
    tempered = _vocab_kl(before, learner, samples, temperature=0.5)
    assert stats.step_kl == pytest.approx(tempered, rel=1e-3)
    assert tempered != pytest.approx(untempered, rel=1e-2)


def test_target_kl_ends_the_step_and_lowers_the_rate(tiny_model_dir: Path) -> None:
    """A pass that finds the policy over 1.5x ``target_kl`` is not applied: a step cut after
    its first pass leaves the weights a one-epoch step leaves. A step that went over 2x it
    divides the next rate by 1.5; quiet steps raise it back, never above ``lr``."""
    one = Learner(tiny_model_dir, LearnerConfig(lr=1e-2))
    one.step(batch(0))
    cut = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, epochs=4, target_kl=1e-9))
    stats = cut.step(batch(0))
    assert stats.passes == 1 and stats.approx_kl_max > 2e-9 and stats.lr == 1e-2
    for name, value in cut.model.state_dict().items():
        assert torch.equal(value, one.model.state_dict()[name]), name
    assert cut.kl_lr_scale == pytest.approx(1 / 1.5)
    assert cut.lr_at(cut.version) == pytest.approx(1e-2 / 1.5)
    assert cut.step(batch(1)).lr == pytest.approx(1e-2 / 1.5)

    free = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, epochs=4, target_kl=10.0))
    free.kl_lr_scale = 1 / 2.25  # as if two steps had gone too far
    stats = free.step(batch(0))
    assert stats.passes == 4 and 0 < stats.approx_kl_max < 5.0
    assert free.kl_lr_scale == pytest.approx(1 / 1.5)  # a quiet step: x1.5
    free.step(batch(1))
    free.step(batch(0))
    assert free.kl_lr_scale == 1.0  # and never above lr

    off = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, epochs=4)).step(batch(0))
    assert off.passes == 4 and off.approx_kl_max > 0  # measured, nothing cut
