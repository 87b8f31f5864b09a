"""A trust region on a learner step (``LearnerConfig.max_kl``).

After a step's PPO passes, how far the update went is measured as the exact KL(π_prox ‖ π_θ)
over the whole vocabulary at each trained token's position, a mean over those tokens. The
sampled-token k3 (``approx_kl``) sees only the tokens that were sampled; this also sees
probability moving to tokens nobody sampled, which is where a malformed tool call starts: a
token held at 0.999 that falls to 0.9 has a sampled-token k3 of 0.005, while the exact KL is
about 0.1.

Past the bound, ``pull_back`` sets the weights to π_prox's plus half the step, a quarter, ...
(up to ``MAX_HALVINGS`` halvings, then none of it), the first that is within the bound: TRPO's
backtracking line search, applied to the update Adam took. Adam's moments keep the whole
step's gradients.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

MAX_HALVINGS = 8
"""How many times a step is halved before it is not applied at all."""
_CHUNK = 512
"""Positions per row whose vocabulary-wide log-probs are held at once (``vocab_kl``)."""


def pull_back(params: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor],
              measure: Callable[[], float], max_kl: float) -> tuple[float, float]:
    """Halve the move of ``params`` from ``start`` (the weights before the step) until
    ``measure()``, the step's KL, is at most ``max_kl``; returns (that KL, the share of the
    step kept). Where even ``1 / 2**MAX_HALVINGS`` of it is too far, ``params`` are set back to
    ``start`` and (0, 0) is returned."""
    import torch

    kl = measure()
    if kl <= max_kl:
        return kl, 1.0
    scale = 1.0
    with torch.no_grad():
        for _ in range(MAX_HALVINGS):
            scale /= 2
            for name, p in params.items():
                p.lerp_(start[name], 0.5)  # start + scale x the step, one copy less than that
            kl = measure()
            if kl <= max_kl:
                return kl, scale
        for name, p in params.items():
            p.copy_(start[name])
    log.warning("even 1/%d of the update went past max_kl %g (KL %.3g): not applied",
                2 ** MAX_HALVINGS, max_kl, kl)
    return 0.0, 0.0


def vocab_kl(before: torch.Tensor, after: torch.Tensor,
             temperature: float = 1.0) -> torch.Tensor:
    """KL(π_before ‖ π_after) over the whole vocabulary at each position: logits (B, K, V) of
    the two policies at the same positions, under ``softmax(logits / temperature)``. Returns
    (B, K) in float32. Works ``_CHUNK`` positions at a time: with a vocabulary of 150k, a
    (B, K, V) float32 tensor of a 4096-token micro-batch is 2.5 GB."""
    import torch

    out = torch.empty(before.shape[:-1], dtype=torch.float32, device=before.device)
    for i in range(0, before.shape[1], _CHUNK):
        log_p = _log_softmax(before[:, i:i + _CHUNK], temperature)
        diff = log_p - _log_softmax(after[:, i:i + _CHUNK], temperature)
        out[:, i:i + _CHUNK] = torch.linalg.vecdot(log_p.exp_(), diff)
    return out


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    import torch

    logits = logits.float()
    return torch.log_softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)
