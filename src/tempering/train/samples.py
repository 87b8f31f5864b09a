"""From graded trajectories to what the learner trains on: advantages and token samples.

``group_advantages`` is GRPO's critic-free baseline (Shao et al. 2024): each trajectory's reward
relative to the other samples of its group (same task, same prompt),

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

or, with ``normalise_std=False``, Dr. GRPO's unnormalised ``r_i - mean(r_group)`` (Liu et al.
2025), which does not up-weight groups whose rewards barely differ. The std is the sample
standard deviation (n - 1), as verl and TRL compute it. A group of one, or of equal rewards, has
advantage 0 for all: it carries no learning signal.

``samples_from`` turns each trajectory into ``Sample``s: token ids, loss mask, the behaviour
policy's log-probs and weights version per token, and the trajectory's advantage on every
trained token. A multi-turn episode whose prompts extend each other token for token (what the
local engine and ``tempering serve`` produce) is one sample: ``Trajectory.sequence()``, tool
observations masked. An episode whose prompts were re-rendered (``sequence()`` is None) becomes
one sample per turn, the turn's full prompt (``prompt_ids(i)``, masked) then its completion:
the same tokens the policy saw, at the cost of encoding shared prefixes once per turn.

A token whose step recorded no log-probs (an engine that returns none) gets NaN as its behaviour
log-prob; the learner then uses π_prox for it (importance weight 1: no staleness correction).

``pack`` and ``collate`` lay samples out for the learner's forward passes: micro-batches of at
most a given number of padded tokens, longest first so that rows of one micro-batch have similar
lengths, right-padded with an attention mask. Torch is imported only by ``collate``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from tempering.trajectory.schema import Step, Trajectory

if TYPE_CHECKING:
    import torch


T = TypeVar("T")


@dataclass(frozen=True)
class Sample:
    """One training sequence; every per-token field has one entry per token of ``ids``."""

    ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    """1 on tokens the policy sampled (trained on), 0 on prompts and tool observations."""
    logprobs: tuple[float, ...]
    """The behaviour policy's log-prob of each token as sampled (0 where masked, NaN where the
    engine recorded none)."""
    versions: tuple[int, ...]
    """The weights version that sampled each token (-1 where masked)."""
    advantage: float
    trajectory_id: str = ""
    group_id: str = ""
    reward: float | None = None

    def __post_init__(self) -> None:
        n = len(self.ids)
        lengths = {"loss_mask": len(self.loss_mask), "logprobs": len(self.logprobs),
                   "versions": len(self.versions)}
        wrong = {k: v for k, v in lengths.items() if v != n}
        if wrong:
            raise ValueError(f"sample {self.trajectory_id!r} has {n} ids but {wrong}: every "
                             "per-token field needs one entry per token")
        if n < 2:
            raise ValueError(f"sample {self.trajectory_id!r} has {n} token(s); a causal LM "
                             "predicts nothing from fewer than 2")
        if self.loss_mask[0]:
            raise ValueError(f"sample {self.trajectory_id!r} trains on its first token, which "
                             "no prefix predicts; it must be a prompt token (mask 0)")
        if not math.isfinite(self.advantage):
            raise ValueError(f"sample {self.trajectory_id!r} has advantage {self.advantage}")

    @property
    def tokens(self) -> int:
        """How many tokens are trained on."""
        return sum(self.loss_mask)

    @property
    def version(self) -> int:
        """The oldest weights version among the trained tokens (what bounds its staleness)."""
        return min((v for v, m in zip(self.versions, self.loss_mask, strict=True) if m),
                   default=-1)


def group_advantages(trajectories: Iterable[Trajectory], *, normalise_std: bool = True,
                     eps: float = 1e-6) -> dict[str, float]:
    """Each graded trajectory's advantage relative to its group, by ``trajectory_id``.

    Trajectories without a reward (not graded) are left out and do not count in their group's
    mean. A trajectory with an empty ``group_id`` is a group of its own (advantage 0).
    """
    groups: dict[str, list[tuple[str, float]]] = {}
    for traj in trajectories:
        reward = traj.reward_value
        if reward is not None:
            key = traj.group_id or f"\0{traj.trajectory_id}"  # cannot collide with a group id
            groups.setdefault(key, []).append((traj.trajectory_id, reward))
    advantages: dict[str, float] = {}
    for members in groups.values():
        rewards = [r for _, r in members]
        if len(rewards) < 2:
            advantages.update((tid, 0.0) for tid, _ in members)
            continue
        mean = statistics.fmean(rewards)
        scale = statistics.stdev(rewards) + eps if normalise_std else 1.0
        advantages.update((tid, (r - mean) / scale) for tid, r in members)
    return advantages


def samples_from(trajectories: Iterable[Trajectory], *, advantages: Mapping[str, float],
                 failed_call_penalty: float = 0.0) -> list[Sample]:
    """The training samples of every trajectory that has an advantage.

    Trajectories missing from ``advantages`` (ungraded ones, by ``group_advantages``) are
    skipped, and so are samples with no trained token: they would add nothing to the loss.

    With ``failed_call_penalty`` p > 0, the turns that made no well-formed tool call
    (``Step.failed_call``) are trained apart from the rest of their episode, with advantage
    ``min(A, 0) - p``: never raised, however well the episode did (it won despite them), and
    pushed down even in a group whose rewards are all equal. The episode's other tokens keep
    its advantage A. Such an episode gives two samples over the same ids, their masks
    complementary, so every token is trained once.
    """
    samples: list[Sample] = []
    for traj in trajectories:
        if traj.trajectory_id not in advantages:
            continue
        advantage = float(advantages[traj.trajectory_id])
        apart = failed_call_penalty > 0 and any(s.failed_call for s in traj.steps)
        failed_advantage = min(advantage, 0.0) - failed_call_penalty

        def sample(ids: list[int], mask: list[int], logprobs: list[float],
                   versions: list[int], traj: Trajectory = traj,
                   advantage: float = advantage) -> Sample:
            return Sample(tuple(ids), tuple(mask), tuple(logprobs), tuple(versions), advantage,
                          traj.trajectory_id, traj.group_id, traj.reward_value)

        seq = traj.sequence()
        if seq is not None:
            ids, mask, _, versions = seq
            # sequence() writes 0.0 where a step recorded no log-probs; NaN says "unknown".
            logprobs = _laid_out(traj, 0.0, _behaviour)
            if apart:
                failed = _laid_out(traj, 0, lambda s: [int(s.failed_call)]
                                   * len(s.completion_token_ids))
                found = [sample(ids, [m * (1 - f) for m, f in zip(mask, failed, strict=True)],
                                logprobs, versions),
                         sample(ids, [m * f for m, f in zip(mask, failed, strict=True)],
                                logprobs, versions, advantage=failed_advantage)]
            else:
                found = [sample(ids, mask, logprobs, versions)]
        else:
            found = []
            for i, step in enumerate(traj.steps):
                n = len(step.completion_token_ids)
                if n:
                    prompt = traj.prompt_ids(i)
                    found.append(sample(prompt + step.completion_token_ids,
                                        [0] * len(prompt) + (step.loss_mask or [1] * n),
                                        [0.0] * len(prompt) + _behaviour(step),
                                        [-1] * len(prompt) + [step.weights_version] * n,
                                        advantage=failed_advantage if apart and
                                        step.failed_call else advantage))
        samples.extend(s for s in found if s.tokens)
    return samples


def _laid_out(traj: Trajectory, prompt: T, completion: Callable[[Step], list[T]]) -> list[T]:
    """A value per token, laid out as ``traj.sequence()`` lays out the episode: ``prompt`` on
    each turn's prompt tokens, then ``completion(step)`` on its completion's."""
    return [v for step in traj.steps if step.completion_token_ids or step.prompt_token_ids
            for v in [prompt] * len(step.prompt_token_ids) + completion(step)]


def _behaviour(step: Step) -> list[float]:
    """The completion's behaviour log-probs as recorded, NaN for each token if none were."""
    return step.logprobs or [math.nan] * len(step.completion_token_ids)


def pack(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped so that rows x longest row <= ``max_tokens`` (a longer one alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        # Longest first: the first row of a group is its widest.
        if groups and lengths[groups[-1][0]] * (len(groups[-1]) + 1) <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@dataclass(frozen=True)
class PaddedBatch:
    """Samples as right-padded tensors on one device."""

    ids: torch.Tensor  # (B, T) long, padded with 0
    attention: torch.Tensor  # (B, T) long
    mask: torch.Tensor  # (B, T) bool: trained tokens
    behav: torch.Tensor  # (B, T) float32 behaviour log-probs, NaN where unknown
    advantages: torch.Tensor  # (B,)
    prox: torch.Tensor | None  # (B, T) float32 π_prox log-probs, if computed beforehand
    ref: torch.Tensor | None = None  # (B, T) float32 reference log-probs, if computed before


def collate(chosen: Sequence[Sample], device: torch.device,
            prox: Sequence[torch.Tensor] | None = None,
            ref: Sequence[torch.Tensor] | None = None) -> PaddedBatch:
    """``chosen`` as one ``PaddedBatch``; ``prox`` and ``ref`` hold one (T_i,) tensor per sample
    if given."""
    import torch

    shape = (len(chosen), max(len(s.ids) for s in chosen))
    ids = torch.zeros(shape, dtype=torch.long)  # pad id 0: masked by attention and loss
    attention = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.bool)
    behav = torch.zeros(shape, dtype=torch.float32)
    for row, s in enumerate(chosen):
        n = len(s.ids)
        ids[row, :n] = torch.tensor(s.ids)
        attention[row, :n] = 1
        mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.bool)
        behav[row, :n] = torch.tensor(s.logprobs)
    return PaddedBatch(ids.to(device), attention.to(device), mask.to(device), behav.to(device),
                 torch.tensor([s.advantage for s in chosen], device=device),
                 _padded(prox, shape, device), _padded(ref, shape, device))


def _padded(rows: Sequence[torch.Tensor] | None, shape: tuple[int, int],
            device: torch.device) -> torch.Tensor | None:
    import torch

    if rows is None:
        return None
    out = torch.zeros(shape, dtype=torch.float32, device=device)
    for row, values in enumerate(rows):
        out[row, :len(values)] = values
    return out
