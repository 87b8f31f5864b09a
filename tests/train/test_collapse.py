"""The collapse detector on metrics lines, the buffer's rollback floor, and the importance
weights' sequence level and masking."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from test_buffer import group  # noqa: E402

from tempering.train.buffer import ReplayBuffer  # noqa: E402
from tempering.train.collapse import CollapseDetector  # noqa: E402
from tempering.train.config import CollapseConfig  # noqa: E402
from tempering.train.losses import decoupled_ppo_loss, importance_weights  # noqa: E402


def line(step: int, reward: float, invalid: float = 0.02, entropy: float = 1.0) -> dict:
    return {"step": step, "reward_mean": reward, "invalid_action_frac": invalid,
            "entropy": entropy, "behav_kl": 0.01, "is_weight_max": 1.5, "clip_frac": 0.1,
            "staleness_mean": 1.2, "lr": 1e-4}


def test_a_noisy_climb_is_not_a_collapse_and_marks_good_points() -> None:
    detector = CollapseDetector(CollapseConfig())
    rewards = [0.1, 0.2, 0.15, 0.35, 0.3, 0.5, 0.45, 0.6, 0.55, 0.7]
    verdicts = [detector.observe(line(i + 1, r)) for i, r in enumerate(rewards)]
    assert all(c is None for c, _ in verdicts)
    assert [good for _, good in verdicts].count(True) >= 4
    assert detector.best == pytest.approx((0.6 + 0.55 + 0.7) / 3)


def test_a_best_reached_while_the_format_drifts_is_no_point_to_return_to() -> None:
    detector = CollapseDetector(CollapseConfig(window=1, invalid_max=0.5))
    windows = [(0.3, 0.0), (0.5, 0.0), (0.9, 0.4), (0.85, 0.05), (0.88, 0.0), (0.87, 0.0)]
    verdicts = [detector.observe(line(i + 1, r, invalid))
                for i, (r, invalid) in enumerate(windows)]
    # 0.9 came with 40% malformed calls: the best (the reward check falls from it), but not
    # good; the sound windows after it that beat the last good one are
    assert [good for _, good in verdicts] == [True, True, False, True, True, False]
    assert all(c is None for c, _ in verdicts)
    assert (detector.best, detector.good) == (0.9, 0.88)


@pytest.mark.parametrize("window,bound", [(1, 0), (3, 2), (4, 4), (5, 3)])
def test_the_weights_a_good_window_names_are_always_still_held(window: int, bound: int) -> None:
    """The trainer holds the learner's state from before each step (three times the model in
    host memory) and drops what ``unneeded`` says no window can name any more; whatever
    the staleness, the version a later good window names is still held, and no more than
    window + max_staleness + 1 are."""
    import random

    rng = random.Random(window * 10 + bound)
    detector = CollapseDetector(CollapseConfig(window=window))
    held: set[int] = set()
    for version in range(60):  # the learner's version before its step
        held.add(version)
        held -= set(detector.unneeded(held, version + 1, bound))
        assert len(held) <= window + bound + 1
        staleness = rng.uniform(0, bound) if version >= bound else rng.uniform(0, version)
        detector.observe({**line(version + 1, 0.5), "version": version + 1,
                          "staleness_mean": staleness})
        wanted = detector.sampler_version()
        assert wanted is not None and max(v for v in held if v <= wanted) == wanted
        if version == 30 and window == 3 and bound == 2:
            assert len(held) == 4  # 6 before the bound


def test_a_reward_fall_is_diagnosed_in_one_line_with_its_evidence() -> None:
    detector = CollapseDetector(CollapseConfig())
    for i, r in enumerate([0.6, 0.7, 0.8, 0.8, 0.4, 0.1, 0.0]):
        collapse, _ = detector.observe(line(i + 1, r))
    assert collapse is not None and collapse.check == "reward" and collapse.step == 7
    assert "\n" not in collapse.line and "its best, 0.77" in collapse.line
    assert "invalid calls 2%" in collapse.line and "lr 1.00e-04" in collapse.line
    detector.reset()  # after a rollback: the best is kept, the window starts again
    assert detector.observe(line(8, 0.1))[0] is None
    assert detector.best == pytest.approx(0.7667, abs=1e-3)


def test_a_fall_from_a_best_that_is_only_the_start_plus_noise_is_not_a_collapse() -> None:
    """A run at chance (0.25) whose best window is 0.33 protects nothing by rolling back: until
    the best is ``reward_gain`` above the first window, a fall counts from that start."""
    rewards = [0.25, 0.22, 0.28, 0.3, 0.35, 0.33, 0.2, 0.14, 0.15]
    detector = CollapseDetector(CollapseConfig())
    assert all(detector.observe(line(i + 1, r))[0] is None for i, r in enumerate(rewards))
    assert detector.reward_base == pytest.approx(0.25) and detector.best is not None
    assert detector.best > CollapseConfig().reward_min  # the old arming point was passed
    climbed = CollapseDetector(CollapseConfig())
    verdicts = [climbed.observe(line(i + 1, r))[0]
                for i, r in enumerate([0.25, 0.22, 0.28, 0.5, 0.6, 0.55, 0.2, 0.14, 0.15])]
    assert [c.check for c in verdicts if c is not None][:1] == ["reward"]
    resumed = CollapseDetector(CollapseConfig(), best=0.33, reward_base=0.25)
    assert all(resumed.observe(line(i + 1, r))[0] is None for i, r in enumerate([0.15] * 4))
    started_high = CollapseDetector(CollapseConfig())  # a good model that falls apart
    found = [started_high.observe(line(i + 1, r))[0] for i, r in enumerate([0.7, 0.72, 0.68,
                                                                              0.75, 0.1, 0.05])]
    assert found[-1] is not None and "from its start of 0.70" in found[-1].line


def test_the_format_breaking_down_and_entropy_falling_are_collapses() -> None:
    detector = CollapseDetector(CollapseConfig())
    found = [detector.observe(line(i + 1, 0.2, invalid=v))[0] for i, v in
             enumerate([0.05, 0.1, 0.3, 0.6, 0.9])]
    assert found[-1] is not None and found[-1].check == "format", found
    detector = CollapseDetector(CollapseConfig(entropy_fall=0.5))
    found = [detector.observe(line(i + 1, 0.2, entropy=e))[0] for i, e in
             enumerate([1.0, 1.0, 1.0, 0.5, 0.2, 0.1])]
    assert found[-1] is not None and found[-1].check == "entropy", found


def test_a_stall_needs_time_and_dropped_groups() -> None:
    detector = CollapseDetector(CollapseConfig(stall_s=60))
    assert detector.stalled(5, 30, 40, 0.0) is None
    assert detector.stalled(5, 90, 0, None) is None  # slow rollouts, nothing dropped
    assert detector.stalled(5, 90, 40, 1.0) is None  # every task solved: no signal, no collapse
    stall = detector.stalled(5, 90, 40, 0.0)
    assert stall is not None and "40 groups" in stall.line and "90 s" in stall.line


async def test_discard_before_drops_and_refuses_what_collapsed_weights_sampled() -> None:
    buf = ReplayBuffer(batch_groups=1, max_staleness=3)
    for name in ("a", "b"):
        assert buf.try_admit()
        assert buf.put(group(name, version=0), version_started=0) == "buffered"
    assert buf.try_admit()  # in flight across the rollback
    buf.set_version(1)
    assert buf.discard_before(1) == 2 and len(buf) == 0
    assert buf.put(group("c", version=0), version_started=0) == "rolled_back"
    assert buf.try_admit()
    assert buf.put(group("d", version=1), version_started=1) == "buffered"
    assert buf.stats().dropped["rolled_back"] == 3
    again = ReplayBuffer(batch_groups=1, max_staleness=3)
    again.load_state_dict(buf.state_dict())
    assert again.try_admit()
    assert again.put(group("e", version=0), version_started=0) == "rolled_back"


def test_sequence_level_weights_and_masking() -> None:
    prox = torch.tensor([[0.0, -1.0, -1.0], [0.0, -1.0, -1.0]])
    behav = torch.tensor([[0.0, -1.0 - math.log(4), -1.0], [0.0, -1.0, -1.0]])
    mask = torch.tensor([[False, True, True], [False, True, True]])
    token = importance_weights(prox, behav, mask, "token")
    assert token[0, 1].item() == pytest.approx(4.0) and token[0, 2].item() == pytest.approx(1)
    seq = importance_weights(prox, behav, mask, "sequence")
    assert seq[0, 1].item() == pytest.approx(2.0) and seq[0, 2].item() == pytest.approx(2.0)
    logp = prox.clone().requires_grad_(True)
    adv = torch.tensor([1.0, 1.0])
    _, cut = decoupled_ppo_loss(logp, prox, behav, adv, mask, is_cap=3.0)
    _, masked = decoupled_ppo_loss(logp, prox, behav, adv, mask, is_cap=3.0, is_mode="mask")
    assert cut["is_weight_mean"].item() == pytest.approx((3 + 1 + 1 + 1) / 4)
    assert masked["is_weight_mean"].item() == pytest.approx((0 + 1 + 1 + 1) / 4)
    assert masked["is_truncated_frac"].item() == pytest.approx(0.25)
    assert cut["is_weight_max"].item() == pytest.approx(4.0)


def test_a_target_counts_only_steps_of_the_weights_now_trained(tmp_path) -> None:
    from tempering.train.config import load_config
    from tempering.train.metrics import MetricsLog
    from tempering.train.trainer import Trainer

    trainer = Trainer(load_config(None, [f"runs_dir={tmp_path}", "target_reward=0.9",
                                         "target_window=2"]))
    trainer.run_dir.mkdir(parents=True)
    trainer.metrics = MetricsLog(trainer.run_dir, tensorboard=False)
    trainer.step = 2

    def step(reward: float, **extra: object) -> bool:
        trainer.step += 1
        trainer.metrics.write({"step": trainer.step, "reward_mean": reward,
                               "rollbacks": trainer.rollbacks, **extra})
        return trainer._finished()

    assert not step(0.95)
    assert not step(0.97, collapse="collapse at step 4 (format): ...")  # it rolled back
    trainer.rollbacks = 1
    assert not step(0.96)  # one step of the weights rolled back to, and one from before
    assert step(0.94)
