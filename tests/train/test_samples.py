"""Group-relative advantages and trajectories turned into token samples."""

from __future__ import annotations

import math
import statistics

import pytest

from tempering.reward.result import RewardResult
from tempering.train.samples import Sample, group_advantages, samples_from
from tempering.trajectory.schema import Step, Trajectory


def graded(reward: float | None, group: str = "g", **kw: object) -> Trajectory:
    result = None if reward is None else RewardResult(
        reward=reward, components={}, tests_passed=0, tests_total=0, flags=[])
    return Trajectory(task_id="t", group_id=group, reward=result, **kw)  # type: ignore[arg-type]


def test_group_advantages_grpo_and_dr_grpo() -> None:
    group = [graded(r) for r in (1.0, 0.0, 0.5, 0.5)]
    others = [graded(0.3, "h"), graded(0.3, "h"), graded(0.9, "alone"), graded(None, "h"),
              graded(0.2, ""), graded(0.8, "")]
    adv = group_advantages(group + others)
    std = statistics.stdev([1.0, 0.0, 0.5, 0.5])  # n - 1, as verl and TRL
    assert [adv[t.trajectory_id] for t in group] == pytest.approx(
        [0.5 / std, -0.5 / std, 0.0, 0.0], rel=1e-5)
    # Equal rewards, a group of one, ungraded ones and ungrouped ones carry no signal.
    assert [adv[t.trajectory_id] for t in others if t.reward] == [0.0] * 5
    assert others[3].trajectory_id not in adv
    plain = group_advantages(group, normalise_std=False)
    assert [plain[t.trajectory_id] for t in group] == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_one_sample_per_episode_with_observations_masked() -> None:
    steps = [Step(index=0, prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5],
                  logprobs=[-0.1, -0.2], weights_version=3),
             Step(index=1, prompt_reused=5, prompt_token_ids=[6, 7],
                  completion_token_ids=[8, 9, 10], logprobs=[], loss_mask=[1, 0, 1],
                  weights_version=4)]
    traj = graded(1.0, steps=steps)
    (s,) = samples_from([traj, graded(0.0)], advantages={traj.trajectory_id: 0.5})
    assert s.ids == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    assert s.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1, 0, 1)
    assert s.logprobs[:7] == (0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0)
    assert all(math.isnan(x) for x in s.logprobs[7:])  # not recorded: unknown, not 0
    assert s.versions == (-1, -1, -1, 3, 3, -1, -1, 4, 4, 4)
    assert (s.advantage, s.reward, s.tokens, s.version) == (0.5, 1.0, 4, 3)


def test_re_rendered_prompts_give_one_sample_per_turn() -> None:
    steps = [Step(index=0, prompt_token_ids=[1, 2], completion_token_ids=[3],
                  logprobs=[-0.5], weights_version=1),
             Step(index=1, prompt_token_ids=[1, 2, 3, 9], completion_token_ids=[4, 5],
                  logprobs=[-0.3, -0.4], weights_version=2)]  # prompt_reused=0: re-rendered
    traj = graded(0.0, steps=steps)
    assert traj.sequence() is None
    first, second = samples_from([traj], advantages={traj.trajectory_id: -1.0})
    assert (first.ids, first.loss_mask, first.logprobs) == ((1, 2, 3), (0, 0, 1),
                                                            (0.0, 0.0, -0.5))
    assert second.ids == (1, 2, 3, 9, 4, 5) and second.loss_mask == (0, 0, 0, 0, 1, 1)
    assert second.versions == (-1, -1, -1, -1, 2, 2) and second.advantage == -1.0


def test_bad_samples_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"3 ids but \{'logprobs': 2\}"):
        Sample((1, 2, 3), (0, 1, 1), (0.0, -1.0), (-1, 0, 0), 1.0, "t1")
    with pytest.raises(ValueError, match="first token"):
        Sample((1, 2), (1, 1), (0.0, 0.0), (0, 0), 1.0)
    with pytest.raises(ValueError, match="advantage nan"):
        Sample((1, 2), (0, 1), (0.0, 0.0), (0, 0), math.nan)


def test_pack_bounds_padded_tokens_longest_first() -> None:
    from tempering.train.samples import pack

    lengths = [10, 50, 20, 200, 45, 5]
    groups = pack(lengths, 100)
    assert groups == [[3], [1, 4], [2, 0, 5]]  # 200 alone; 2 x 50; 3 x 20
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(len(g) * max(lengths[i] for i in g) <= 100 for g in groups if len(g) > 1)



def _episode(reward: float, *actions: str, inherited: int = 0) -> Trajectory:
    steps = [Step(index=i, action=a, inherited=i < inherited) for i, a in enumerate(actions)]
    return graded(reward, "fmt", steps=steps)


def test_failed_calls_are_the_own_turns_without_a_well_formed_call() -> None:
    assert _episode(1.0, "read_file", "invalid", "message", "submit").failed_calls == 2
    # a branch's inherited turns are its parent's, not this sample's
    assert _episode(1.0, "invalid", "write_file", "submit", inherited=1).failed_calls == 0
    assert _episode(1.0).failed_calls == 0


def test_the_buffer_keeps_an_all_solved_group_with_a_failed_call_for_a_format_penalty() -> None:
    from tempering.train.buffer import group_pipeline

    clean = [_episode(1.0, "write_file", "submit") for _ in range(3)]
    garbled = _episode(1.0, "write_file", "invalid", "submit")  # passed, but a call broke
    group = [*clean, garbled]
    assert set(group_advantages(group).values()) == {0.0}  # the reward cannot see the call
    assert group_pipeline().apply(group) == []  # so the plain filters drop the group
    assert len(group_pipeline(keep_failed_calls=True).apply(group)) == 4
    assert group_pipeline(keep_failed_calls=True).apply(clean) == []  # nothing to teach


def _two_turns(reward: float, first: str, *, reused: bool = True) -> Trajectory:
    steps = [Step(index=0, action=first, prompt_token_ids=[1, 2], completion_token_ids=[3, 4],
                  logprobs=[-0.1, -0.2], weights_version=1),
             Step(index=1, action="submit", prompt_reused=4 if reused else 0,
                  prompt_token_ids=[5] if reused else [1, 2, 3, 4, 5],
                  completion_token_ids=[6], logprobs=[-0.3], weights_version=1)]
    return graded(reward, steps=steps)


def test_a_failed_call_is_trained_apart_never_raised_and_always_pushed_down() -> None:
    won, lost = _two_turns(1.0, "invalid"), _two_turns(0.0, "invalid")
    advantages = {won.trajectory_id: 0.5, lost.trajectory_id: -0.5}
    plain = samples_from([won, lost], advantages=advantages)
    assert [(s.loss_mask, s.advantage) for s in plain] == [((0, 0, 1, 1, 0, 1), 0.5),
                                                           ((0, 0, 1, 1, 0, 1), -0.5)]
    shaped = samples_from([won, lost], advantages=advantages, failed_call_penalty=0.1)
    assert [(s.trajectory_id, s.loss_mask, round(s.advantage, 6)) for s in shaped] == [
        (won.trajectory_id, (0, 0, 0, 0, 0, 1), 0.5),  # the episode won despite the call
        (won.trajectory_id, (0, 0, 1, 1, 0, 0), -0.1),
        (lost.trajectory_id, (0, 0, 0, 0, 0, 1), -0.5),
        (lost.trajectory_id, (0, 0, 1, 1, 0, 0), -0.6)]
    assert all(s.ids == (1, 2, 3, 4, 5, 6) for s in shaped)
    # an episode of equal rewards (advantage 0) still pushes its broken call down
    even = samples_from([won], advantages={won.trajectory_id: 0.0}, failed_call_penalty=0.1)
    assert [s.advantage for s in even] == pytest.approx([0.0, -0.1])
    # an episode without a failed call is one sample, as without the penalty
    good = _two_turns(1.0, "write_file")
    assert len(samples_from([good], advantages={good.trajectory_id: 0.5},
                            failed_call_penalty=0.1)) == 1
    # re-rendered prompts (one sample per turn): the broken turn's sample gets the penalty
    turns = _two_turns(1.0, "invalid", reused=False)
    assert turns.sequence() is None
    by_turn = samples_from([turns], advantages={turns.trajectory_id: 0.5},
                           failed_call_penalty=0.1)
    assert [(s.ids[-1], round(s.advantage, 6)) for s in by_turn] == [(4, -0.1), (6, 0.5)]
