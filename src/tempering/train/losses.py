"""The learner's objective: plain functions on tensors, named as in the papers.

Shapes: ``B`` sequences of ``T`` tokens over a vocabulary of ``V``. Every per-token tensor is
aligned with the token ids, ``x[:, t]`` being about token ``ids[:, t]``; ``mask`` is 1 on the
tokens the policy sampled (trained on) and 0 on prompts, tool observations and padding.

- ``token_logprobs``: log π(token | prefix) from a causal LM's logits, with the sampling
  temperature, exactly as ``policy.batch.sample`` recorded it (before top-p);
  ``target_logprobs`` the same at chosen positions only.
- ``ppo_clip_loss``: PPO's clipped surrogate (Schulman et al. 2017), with DAPO's optional
  asymmetric ``clip_eps_high`` ("clip-higher", Yu et al. 2025).
- ``decoupled_ppo_loss``: AReaL's decoupled PPO objective (Fu et al. 2025) for samples from
  older weights. The ratio is taken against the proximal policy π_prox (the learner's weights
  before this update), so the trust region is around weights the learner has, and the gap
  between π_prox and the behaviour policy π_behav that sampled the tokens is corrected by an
  importance weight π_prox/π_behav outside the clip. The weight is truncated at ``is_cap``
  (truncated importance sampling, TIS), which bounds the variance a very stale or mismatched
  token can add. ``is_level="sequence"`` takes one weight per sequence, the geometric mean of
  its tokens' ratios (the length-normalised sequence ratio of GSPO, Zheng et al. 2025), and
  ``is_mode="mask"`` drops a token (or sequence) whose weight leaves [1/is_cap, is_cap]
  instead of truncating it (masked importance sampling, MIS: a sample that far from the
  learner's policy is more likely to mislead than to teach, and a capped weight still trains
  on it at full strength).
- ``kl_k3``: the k3 estimator of KL(π_θ ‖ π_ref) (Schulman, "Approximating KL divergence"):
  unbiased, always >= 0, low variance as a *value*; ``kl_k2``: ½ (log-ratio)², whose gradient
  is the reverse KL's and stays bounded on stale samples (the learner's default penalty).

Aggregation (``loss_agg``): ``token-mean`` averages over every trained token of the batch (long
sequences weigh more; DAPO's choice and the default), ``seq-mean-token-mean`` averages each
sequence over its tokens and then the sequences (GRPO as published). For gradient accumulation
pass ``denominator``: the whole batch's trained-token count (token-mean) or number of sequences
with trained tokens (seq-mean-token-mean); the micro-batch losses then sum to the batch's loss.

Each loss returns ``(loss, stats)``; stats are detached 0-dim tensors, token means over this
batch's trained tokens (so a caller can weigh micro-batches by their token counts without a
device sync per micro-batch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from tempering.train.learner import ISLevel, ISMode, LossAgg

Stats = dict[str, torch.Tensor]


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """log π(ids[:, t] | ids[:, :t]) under ``softmax(logits / temperature)``; 0 at t = 0.

    ``logits`` (B, T, V) from a causal LM, position t predicting token t + 1; ``ids`` (B, T).
    Returns (B, T) in float32.
    """
    picked = target_logprobs(logits[:, :-1], ids[:, 1:], temperature)  # (B, T-1)
    return F.pad(picked, (1, 0))  # (B, T): the first token has no prediction


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                    temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) at ``targets``: logits (B, K, V), targets (B, K)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    # gather - logsumexp instead of log_softmax: never materialises a second (B, K, V) tensor.
    return (logits.gather(-1, targets[..., None]).squeeze(-1)
            - torch.logsumexp(logits, dim=-1))  # (B, K)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` (B, T) over the tokens where ``mask`` (B, T) is 1; 0 if none."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate(values: torch.Tensor, mask: torch.Tensor, loss_agg: LossAgg = "token-mean",
              denominator: float | None = None) -> torch.Tensor:
    """Reduce per-token losses (B, T) to a scalar: see the module docstring."""
    mask = mask.to(values.dtype)
    if loss_agg == "token-mean":
        total = (values * mask).sum()
        return total / (mask.sum().clamp(min=1) if denominator is None else denominator)
    if loss_agg == "seq-mean-token-mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
        n = (mask.sum(-1) > 0).sum().clamp(min=1) if denominator is None else denominator
        return per_seq.sum() / n
    raise ValueError(f"loss_agg={loss_agg!r} is not known; use 'token-mean' or "
                     "'seq-mean-token-mean'")


def _clipped_surrogate(logprobs: torch.Tensor, prox_logprobs: torch.Tensor,
                       advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float,
                       clip_eps_high: float | None) -> tuple[torch.Tensor, Stats]:
    """Per-token PPO loss -min(r A, clip(r) A), r = π_θ / π_prox, and its stats."""
    mask = mask.bool()
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # (B, 1): one advantage per sequence
    # Masked tokens get log-ratio 0 before exp: whatever they hold cannot overflow into a NaN
    # (0 * inf) nor send gradient through the where.
    log_ratio = torch.where(mask, logprobs - prox_logprobs, 0.0)  # (B, T)
    ratio = log_ratio.exp()
    high = clip_eps if clip_eps_high is None else clip_eps_high
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - clip_eps, 1.0 + high) * advantages
    pg = -torch.min(surr1, surr2)  # (B, T)
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean((surr2 < surr1).float(), mask),  # the clip is binding
            "ratio_mean": masked_mean(ratio, mask),
            # k3 of KL(π_prox ‖ π_θ): how far this update has moved from π_prox.
            "approx_kl": masked_mean((ratio - 1) - log_ratio, mask),
        }
    return pg, stats


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, clip_eps: float = 0.2, clip_eps_high: float | None = None,
                  *, loss_agg: LossAgg = "token-mean",
                  denominator: float | None = None) -> tuple[torch.Tensor, Stats]:
    """PPO's clipped surrogate loss.

    ``logprobs`` (B, T) with gradient, ``old_logprobs`` (B, T) of the policy the ratio is taken
    against, ``advantages`` (B,) or (B, T), ``mask`` (B, T). ``clip_eps_high`` (default:
    ``clip_eps``) bounds the ratio from above, ``clip_eps`` from below.
    """
    pg, stats = _clipped_surrogate(logprobs, old_logprobs, advantages, mask, clip_eps,
                                   clip_eps_high)
    return aggregate(pg, mask, loss_agg, denominator), stats


def decoupled_ppo_loss(logprobs: torch.Tensor, prox_logprobs: torch.Tensor,
                       behav_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                       clip_eps: float = 0.2, is_cap: float | None = 2.0,
                       clip_eps_high: float | None = None, *, loss_agg: LossAgg = "token-mean",
                       denominator: float | None = None, is_level: ISLevel = "token",
                       is_mode: ISMode = "truncate") -> tuple[torch.Tensor, Stats]:
    """AReaL's decoupled PPO loss with a truncated (or masked) behaviour importance weight.

    loss_t = -w_t · min(r_t A, clip(r_t, 1 - clip_eps, 1 + clip_eps_high) A), with
    r_t = π_θ / π_prox and w_t = min(π_prox / π_behav, is_cap) (no cap when ``is_cap`` is None);
    see the module docstring for ``is_level`` and ``is_mode``. ``prox_logprobs`` and
    ``behav_logprobs`` (B, T) carry no gradient; w is a constant weight. With π_prox = π_behav
    (on-policy samples) w = 1 and this is ``ppo_clip_loss``.
    """
    mask = mask.bool()
    pg, stats = _clipped_surrogate(logprobs, prox_logprobs, advantages, mask, clip_eps,
                                   clip_eps_high)
    with torch.no_grad():
        is_weight = importance_weights(prox_logprobs, behav_logprobs, mask, is_level)
        stats["is_weight_max"] = torch.where(mask, is_weight, 0.0).max()
        if is_cap is None:
            outside = torch.zeros_like(mask)
        elif is_mode == "mask":
            outside = ((is_weight > is_cap) | (is_weight < 1.0 / is_cap)) & mask
            is_weight = torch.where(outside, 0.0, is_weight)
        else:
            outside = (is_weight > is_cap) & mask
            is_weight = is_weight.clamp(max=is_cap)
        stats["is_weight_mean"] = masked_mean(is_weight, mask)
        stats["is_truncated_frac"] = masked_mean(outside.float(), mask)
    return aggregate(is_weight * pg, mask, loss_agg, denominator), stats


def importance_weights(prox_logprobs: torch.Tensor, behav_logprobs: torch.Tensor,
                       mask: torch.Tensor, level: ISLevel = "token") -> torch.Tensor:
    """π_prox/π_behav per token (B, T), or per sequence (the geometric mean of its tokens'
    ratios, on each of its tokens); 1 where ``mask`` is 0."""
    log_w = torch.where(mask, prox_logprobs - behav_logprobs, 0.0)  # (B, T)
    if level == "sequence":
        per_seq = log_w.sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
        log_w = torch.where(mask, per_seq[:, None], 0.0)
    elif level != "token":
        raise ValueError(f"is_level={level!r} is not known; use 'token' or 'sequence'")
    return log_w.exp()


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, *,
          loss_agg: LossAgg = "token-mean",
          denominator: float | None = None) -> tuple[torch.Tensor, Stats]:
    """The k2 estimate of KL(π_θ ‖ π_ref): ½ (logp - ref)² per token.

    Its gradient, (logp - ref) ∇logp, is the gradient of the reverse KL for tokens sampled
    from π_θ and grows only linearly with the log-ratio. k3's gradient, (1 - π_ref/π_θ) ∇logp,
    grows exponentially: a stale sample's token that π_θ has since made unlikely, but the
    reference still likes, sends a gradient of e^|log-ratio| that the gradient-norm clip then
    turns into an update about that one token (in a 2.5e-4 async run: grad norm 296, approx KL
    111 within one step). Not clamped: a clamp would take such a token's gradient away
    altogether, and log-softmax outputs are finite.
    """
    mask = mask.bool()
    log_r = torch.where(mask, logprobs - ref_logprobs, 0.0)  # (B, T)
    k2 = 0.5 * log_r.square()
    with torch.no_grad():
        stats = {"kl": masked_mean(k2, mask)}
    return aggregate(k2, mask, loss_agg, denominator), stats


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, *,
          loss_agg: LossAgg = "token-mean",
          denominator: float | None = None) -> tuple[torch.Tensor, Stats]:
    """The k3 estimate of KL(π_θ ‖ π_ref): exp(ref - logp) - (ref - logp) - 1 per token.

    ``logprobs`` (B, T) with gradient, ``ref_logprobs`` (B, T) of the frozen reference.
    """
    mask = mask.bool()
    # Clamped like verl's: a token the reference finds impossible must not make the loss inf.
    log_r = torch.where(mask, ref_logprobs - logprobs, 0.0).clamp(-20.0, 20.0)  # (B, T)
    k3 = log_r.exp() - log_r - 1
    with torch.no_grad():
        stats = {"kl": masked_mean(k3, mask)}
    return aggregate(k3, mask, loss_agg, denominator), stats
