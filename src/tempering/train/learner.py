"""The learner: a transformers causal LM trained by group-relative, decoupled PPO.

``Learner.step(samples)`` is one policy update and one new weights version:

1. π_prox, the weights before this update, gives each trained token's log-prob. With one
   optimizer step per update (``mini_batches=1``) the forward pass that takes the gradient runs
   at π_prox, so its detached log-probs are π_prox's and no extra pass is needed; with several
   mini-batches they are computed first, without gradient, for the whole batch.
2. Each mini-batch is cut into micro-batches packed up to ``micro_batch_tokens`` (padded tokens:
   rows x longest row; longest samples first so rows of one micro-batch have similar lengths),
   right-padded with an attention mask. Each micro-batch's loss is divided by the whole
   mini-batch's token (or sequence) count, so the accumulated gradient is that of one big batch.
3. ``decoupled_ppo_loss`` (+ ``kl_coef`` x ``kl_k2`` to a frozen reference), backward, clip the
   gradient norm, one AdamW step. ``version`` goes up by one per ``step``.
4. With ``max_kl``, a trust region: the step's exact KL(π_prox ‖ π_θ) over the vocabulary is
   measured after its passes, and the update is pulled back along its own direction (halved)
   until it is within the bound.

Weights and optimizer state stay in float32 (``dtype="bfloat16"`` autocasts the forward pass
only): an update of lr 1e-6 is below bfloat16's resolution for most weights and would vanish.
Dropout stays off (eval mode) so the learner's log-probs equal the engine's: the importance
weight of an on-policy sample is then exactly 1.

Publishing: ``state_dict()`` returns views of the live parameters, no copy. ``publish(engine)``
hands them to ``engine.update_weights``, which for ``LocalEngine`` copies them into the engine's
own tensors before returning; after that nothing is shared and the learner may keep training.
So ``step`` must not run while ``publish`` does (call them from one thread, or await the
``asyncio.to_thread(learner.publish, engine)`` before the next step).

Checkpoints (``save``/``load``): a save_pretrained directory (weights, config, the base model's
tokenizer files, so an engine can load it) plus ``optimizer.pt`` and ``learner.json`` (version,
config). ``save`` writes a temporary sibling and renames it into place; an existing checkpoint
is first renamed to ``.<name>.old``, which ``load`` takes back if a kill fell between the two
renames. A process killed with ``kill -9`` at any moment leaves a complete checkpoint.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tempering.errors import ConfigError
from tempering.train.samples import (
    PaddedBatch,
    Sample,
    collate,
    group_advantages,
    pack,
    samples_from,
)
from tempering.train.trust_region import pull_back
from tempering.trajectory.schema import Trajectory

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

LossAgg = Literal["token-mean", "seq-mean-token-mean"]
ISLevel = Literal["token", "sequence"]
ISMode = Literal["truncate", "mask"]
STATE_FILE = "learner.json"
OPTIMIZER_FILE = "optimizer.pt"
_TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json",
                    "chat_template*", "vocab.*", "merges.txt", "*.model", "*.tiktoken")


class LearnerConfig(BaseModel):
    """The learner's optimiser and objective."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float = Field(default=1e-6, gt=0)
    """AdamW learning rate. 1e-6 suits pretrained LMs of 0.5B parameters and up (verl's and
    AReaL's defaults); a tiny randomly initialised model (``policy.tiny``) needs about 1e-3."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's (beta1, beta2), each in [0, 1)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW's decoupled weight decay, on every parameter. 0: RL fine-tuning is short and should
    not pull weights towards zero."""
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient norm to this (None: no clipping, the norm is still reported)."""
    clip_eps: float = Field(default=0.2, gt=0, lt=1)
    """PPO's clip: the ratio π_θ/π_prox is kept within [1 - clip_eps, 1 + clip_eps_high]."""
    clip_eps_high: float | None = Field(default=None, gt=0)
    """Upper clip (DAPO's clip-higher, e.g. 0.28); None: the same as ``clip_eps``."""
    is_cap: float | None = Field(default=2.0, ge=1)
    """Truncate the behaviour importance weight π_prox/π_behav at this (None: no cap)."""
    is_level: ISLevel = "token"
    """One importance weight per ``token``, or per ``sequence`` (the geometric mean of its
    tokens' weights): see ``losses.py``."""
    is_mode: ISMode = "truncate"
    """``truncate`` a weight above ``is_cap`` to it (TIS), or ``mask`` the token (sequence)
    whose weight leaves [1/is_cap, is_cap] out of the loss (MIS)."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the KL penalty to the initial model (an anchor: the warmed-up model's action
    format stays likely); 0 loads no reference model."""
    kl_estimator: Literal["k2", "k3"] = "k2"
    """The penalty's estimator (``losses.py``): ``k2``, ½ (log-ratio)², whose gradient stays
    bounded on stale samples; ``k3``, whose gradient grows as e^|log-ratio|."""
    temperature: float = Field(default=1.0, gt=0)
    """The sampling temperature: log-probs are of softmax(logits / temperature), as the engine
    recorded them. Use 1.0 for greedy samples (the engine records untempered log-probs)."""
    micro_batch_tokens: int = Field(default=4096, ge=1)
    """Padded tokens per forward pass (gradient accumulation beyond); a longer sample goes
    alone. Bounds activation memory, not the result."""
    mini_batches: int = Field(default=1, ge=1)
    """Optimizer steps per ``step`` (the batch split in this many); clipping only bites from the
    second on, against π_prox computed before the first."""
    epochs: int = Field(default=1, ge=1)
    """Passes over the batch per ``step`` (PPO epochs): ``epochs x mini_batches`` optimizer
    steps, all clipped against the same π_prox. More learning per sample, more learner time."""
    loss_agg: LossAgg = "token-mean"
    """``token-mean`` over every trained token of the batch, or ``seq-mean-token-mean``."""
    normalise_std: bool = True
    """``make_samples``: divide advantages by the group's std (GRPO) or not (Dr. GRPO)."""
    format_penalty: float = Field(default=0.0, ge=0)
    """``make_samples``: train each turn that made no well-formed tool call with advantage
    ``min(A, 0) - format_penalty`` (``samples_from``), A its episode's: such a turn is never
    raised and always pushed down, even where the tests cannot see it; the buffer keeps
    groups of equal rewards that hold one. 0: every token gets its episode's advantage."""
    target_kl: float | None = Field(default=None, gt=0)
    """Hold each step's move, the mean k3 KL(π_prox ‖ π_θ) of its trained tokens, near this
    (the KL-adaptive step of PPO implementations): a pass after the first that finds the
    policy already over 1.5x it is not applied and ends the step, and after a step whose
    largest KL was over 2x it the learning rate is divided by 1.5; under half of it, multiplied
    by 1.5 again (never above ``lr``, never below ``lr / 100``). None: neither."""
    max_kl: float | None = Field(default=None, gt=0)
    """A trust region on each step: after its passes, the exact KL(π_prox ‖ π_θ) over the whole
    vocabulary, a mean over the trained tokens, is measured; past this, the update is pulled
    back along its own direction (π_prox's weights + α x the step, α halved up to 8 times,
    then 0: no move) until it is within (``trust_region.py``). Adam's moments keep the whole
    step's gradients. Costs two forward passes a look, and device memory for a copy of the
    weights before the step. None: no bound."""
    lr_warmup_steps: int = Field(default=0, ge=0)
    """Raise the learning rate linearly over the first this many steps (versions), from
    ``lr / lr_warmup_steps`` to ``lr``: Adam's first updates are full-size steps in the sign
    of a gradient it has no variance estimate for yet. 0: ``lr`` from the first step."""
    device: str = "cpu"
    """Torch device for the model and optimizer: ``cpu``, ``cuda``, ``cuda:1``."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype of the forward pass (autocast); weights and optimizer stay float32."""

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas {betas} must each be in [0, 1)")
        return betas


@dataclass(frozen=True)
class StepStats:
    """What one ``Learner.step`` did; per-token figures are means over trained tokens."""

    version: int
    """The version the step produced."""
    loss: float
    pg_loss: float
    kl: float
    """Mean KL to the reference by ``kl_estimator`` (0 when ``kl_coef`` is 0)."""
    clip_frac: float
    ratio_mean: float
    approx_kl: float
    """Mean k3 KL(π_prox ‖ π_θ) at the forward passes: how far the update has gone."""
    approx_kl_max: float
    """The largest of the passes' ``approx_kl``: how far the step had gone at its last look
    (0 with one pass, which is taken at π_prox)."""
    step_kl: float | None
    """With ``max_kl``: the exact KL(π_prox ‖ π_θ) over the vocabulary of the step applied (after
    any pull-back), a mean over trained tokens (0 where no update was applied); None without
    it."""
    step_scale: float
    """The share of the step's move that was applied: 1, or less where ``max_kl`` pulled it
    back (0: none of it)."""
    passes: int
    """Optimizer steps applied: ``epochs x mini_batches``, fewer where ``target_kl`` ended the
    step early."""
    lr: float
    """The learning rate of the step's optimizer steps."""
    is_weight_mean: float
    is_truncated_frac: float
    """Share of trained tokens whose weight was truncated (or, with ``is_mode="mask"``,
    masked)."""
    is_weight_max: float
    """The largest importance weight before truncation."""
    behav_kl: float
    """Mean k3 KL(π_behav ‖ π_prox) over trained tokens: how far the policy that sampled the
    batch is from the learner's, before this update (0 on policy)."""
    entropy: float
    """Mean negative log-prob of the sampled tokens under the policy that sampled them: an
    estimate of the sampling policy's per-token entropy (at the sampling temperature)."""
    by_staleness: dict[int, dict[str, float]]
    """Per age in versions: ``samples``, ``tokens``, ``is_weight_mean`` (before truncation),
    ``is_weight_max``, ``is_truncated_frac``, ``behav_kl``."""
    grad_norm: float
    """Before clipping; the mean over mini-batches. Not finite: the update was skipped."""
    tokens: int
    samples: int
    micro_batches: int
    advantage_mean: float
    staleness_mean: float
    """Learner version minus each sample's (oldest token's) version, mean over samples."""
    staleness_max: int
    seconds: float


@dataclass(frozen=True)
class Snapshot:
    """The learner at one version, in host memory (``Learner.snapshot``)."""

    version: int
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]


class WeightsSink(Protocol):
    """An inference engine that takes new weights (``LocalEngine`` is one)."""

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int | None = None,
                       /) -> int: ...


class Learner:
    """Trains a causal LM on ``Sample``s; one ``step`` is one new weights version."""

    def __init__(self, model_path: str | os.PathLike[str],
                 config: LearnerConfig | None = None) -> None:
        import torch

        self.config = config or LearnerConfig()
        self.model_path = Path(model_path).resolve()
        try:
            self.device = torch.device(self.config.device)
        except RuntimeError as exc:
            raise ConfigError(f"device {self.config.device!r} is not a torch device: {exc}") \
                from exc
        if self.device.type == "cuda" and (not torch.cuda.is_available() or (
                self.device.index or 0) >= torch.cuda.device_count()):
            raise ConfigError(f"device {self.config.device!r}: this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s); use 'cpu' or one "
                              "that exists")
        self.model = self._load_model()
        self.ref_model = self._load_model().requires_grad_(False) if self.config.kl_coef else None
        cfg = self.config
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=cfg.betas,
                                           weight_decay=cfg.weight_decay)
        self.version = 0
        self.lr_scale = 1.0
        """Multiplies the learning rate (a rollback after a collapse lowers it)."""
        self.kl_lr_scale = 1.0
        """Multiplies the learning rate too: what ``target_kl`` has made of it, in [0.01, 1]."""
        self._vocab = int(self.model.get_input_embeddings().num_embeddings)
        self._context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        # transformers >= 4.50 projects only chosen positions onto the vocabulary.
        self._logits_to_keep = "logits_to_keep" in inspect.signature(
            self.model.forward).parameters

    def _load_model(self) -> Any:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # loads and saves in a loop
        if not self.model_path.is_dir():  # else transformers takes it for a hub repo id
            raise ConfigError(f"no model directory at {self.model_path}; give a directory "
                              "written by save_pretrained (nothing is downloaded)")
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(  # Any: its .to() is mistyped
                self.model_path, local_files_only=True, dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load a causal LM from {self.model_path}: {exc}; give a "
                              "directory written by save_pretrained") from exc
        return model.to(self.device).eval()  # eval: no dropout, see the module docstring

    # -- training --------------------------------------------------------------------------

    def make_samples(self, trajectories: Iterable[Trajectory]) -> list[Sample]:
        """Group-relative advantages (``normalise_std``, ``format_penalty``), then samples."""
        trajectories = list(trajectories)
        advantages = group_advantages(trajectories, normalise_std=self.config.normalise_std)
        return samples_from(trajectories, advantages=advantages,
                            failed_call_penalty=self.config.format_penalty)

    def step(self, samples: Sequence[Sample]) -> StepStats:
        """One policy update on ``samples``; ``version`` goes up by one."""
        import torch

        from tempering.train.losses import decoupled_ppo_loss, kl_k2, kl_k3

        started = time.perf_counter()
        cfg = self.config
        self._check(samples)
        n_mini = min(cfg.mini_batches, len(samples))
        minis = [list(range(i, len(samples), n_mini)) for i in range(n_mini)] * cfg.epochs
        prox = self._logprobs(samples) if len(minis) > 1 else None
        # the reference is frozen: its log-probs are computed once, not once per pass
        ref_all = (self._logprobs(samples, self.ref_model)
                   if self.ref_model is not None and len(minis) > 1 else None)
        sums: dict[str, torch.Tensor] = {}
        weights = torch.zeros((), device=self.device)  # trained tokens over every pass
        losses = torch.zeros(2, device=self.device)  # (loss, pg_loss) summed over mini-batches
        grad_norms: list[torch.Tensor] = []
        ages = [self.version - s.version for s in samples]
        behaviour = _BehaviourStats(cfg.is_cap, cfg.is_level, cfg.is_mode)
        micro = passes = looked = 0
        lr = self.lr_at(self.version)
        pass_kls: list[torch.Tensor] = []  # on the device: read with the step's figures
        start = ({name: p.detach().clone() for name, p in self.model.named_parameters()}
                 if cfg.max_kl is not None else None)
        for n, mini in enumerate(minis):
            self.optimizer.zero_grad(set_to_none=True)
            chosen = [samples[i] for i in mini]
            denominator = float(max(1, sum(s.tokens for s in chosen)) if cfg.loss_agg ==
                                "token-mean" else max(1, sum(s.tokens > 0 for s in chosen)))
            mini_kl = torch.zeros(2, device=self.device)  # (KL x tokens, tokens) of this pass
            for group in pack([len(s.ids) for s in chosen], cfg.micro_batch_tokens):
                batch = collate([chosen[j] for j in group], self.device,
                                None if prox is None else [prox[mini[j]] for j in group],
                                None if ref_all is None else [ref_all[mini[j]] for j in group])
                logprobs = self._forward(self.model, batch)  # (B, T)
                prox_lp = logprobs.detach() if batch.prox is None else batch.prox
                behav = torch.where(batch.behav.isnan(), prox_lp, batch.behav)
                if n < n_mini:  # the first pass over each sample: what it was sampled by
                    behaviour.add(prox_lp, behav, batch.mask, [ages[mini[j]] for j in group])
                pg_loss, stats = decoupled_ppo_loss(
                    logprobs, prox_lp, behav, batch.advantages, batch.mask, cfg.clip_eps,
                    cfg.is_cap, cfg.clip_eps_high, loss_agg=cfg.loss_agg,
                    denominator=denominator, is_level=cfg.is_level, is_mode=cfg.is_mode)
                is_max = stats.pop("is_weight_max")
                loss = pg_loss
                if self.ref_model is not None:
                    ref = batch.ref
                    if ref is None:
                        with torch.no_grad():
                            ref = self._forward(self.ref_model, batch)
                    penalty = kl_k2 if cfg.kl_estimator == "k2" else kl_k3
                    kl_loss, kl_stats = penalty(logprobs, ref, batch.mask,
                                                loss_agg=cfg.loss_agg, denominator=denominator)
                    loss = loss + cfg.kl_coef * kl_loss
                    stats |= kl_stats
                loss.backward()  # type: ignore[no-untyped-call]
                losses += torch.stack([loss.detach(), pg_loss.detach()])
                weight = batch.mask.sum()  # stats are token means: weigh by tokens
                weights += weight
                for key, value in stats.items():
                    sums[key] = sums[key] + value * weight if key in sums else value * weight
                sums["is_weight_max"] = torch.maximum(sums.get("is_weight_max", is_max), is_max)
                mini_kl += torch.stack([stats["approx_kl"].detach() * weight, weight])
                micro += 1
            looked += 1
            if n > 0:  # the first pass is taken at π_prox: its KL is 0
                pass_kls.append(mini_kl[0] / mini_kl[1].clamp(min=1))
                # a sync a pass, only where target_kl needs the value now
                if cfg.target_kl is not None and pass_kls[-1].item() > 1.5 * cfg.target_kl:
                    break  # this pass's update is not applied, nor any after it
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                  cfg.max_grad_norm or math.inf)
            if torch.isfinite(norm):
                for params in self.optimizer.param_groups:
                    params["lr"] = lr
                self.optimizer.step()
                passes += 1
            else:  # one poisoned batch must not destroy the weights
                log.warning("gradient norm %s at version %d: update skipped", norm.item(),
                            self.version)
            grad_norms.append(norm)
        step_kl: float | None = None
        step_scale = 1.0
        if start is not None and cfg.max_kl is not None:
            self.optimizer.zero_grad(set_to_none=True)  # the passes are done: free their grads
            step_kl, step_scale = pull_back(
                dict(self.model.named_parameters()), start,
                lambda: self._step_kl(samples, start), cfg.max_kl) if passes else (0.0, 1.0)
        tokens = sum(s.tokens for s in samples)
        keys = ["clip_frac", "ratio_mean", "approx_kl", "is_weight_mean", "is_truncated_frac",
                "kl"]
        zero = torch.zeros((), device=self.device)
        # token means over every pass (each pass of ``epochs`` adds the batch's tokens again)
        figures = torch.stack([*(losses / looked), torch.stack(grad_norms).mean(),
                               *(sums.get(k, zero) / weights.clamp(min=1) for k in keys),
                               sums.get("is_weight_max", zero),
                               torch.stack(pass_kls).max() if pass_kls else zero]).tolist()
        (loss, pg_loss, grad_norm, clip_frac, ratio_mean, approx_kl, is_w, is_trunc, kl,
         is_max, kl_max) = figures
        overall, by_age = behaviour.figures()
        if cfg.target_kl is not None:
            if kl_max > 2 * cfg.target_kl:
                self.kl_lr_scale = max(0.01, self.kl_lr_scale / 1.5)
            elif kl_max < cfg.target_kl / 2:
                self.kl_lr_scale = min(1.0, self.kl_lr_scale * 1.5)
        self.version += 1
        return StepStats(
            version=self.version, loss=loss, pg_loss=pg_loss, kl=kl, clip_frac=clip_frac,
            ratio_mean=ratio_mean, approx_kl=approx_kl, approx_kl_max=kl_max,
            step_kl=step_kl, step_scale=step_scale, passes=passes,
            lr=lr, is_weight_mean=is_w,
            is_truncated_frac=is_trunc, is_weight_max=is_max, behav_kl=overall["behav_kl"],
            entropy=overall["entropy"], by_staleness=by_age, grad_norm=grad_norm,
            tokens=tokens, samples=len(samples), micro_batches=micro,
            advantage_mean=sum(s.advantage for s in samples) / len(samples),
            staleness_mean=sum(ages) / len(ages), staleness_max=max(ages),
            seconds=time.perf_counter() - started)

    def _step_kl(self, samples: Sequence[Sample], start: dict[str, torch.Tensor]) -> float:
        """The exact KL(π_start ‖ π_θ) over the vocabulary, mean over the trained tokens:
        π_start is the model with the weights ``start``, π_θ with its own."""
        import torch

        from tempering.train.trust_region import vocab_kl

        total = torch.zeros(2, device=self.device)  # (KL summed over tokens, tokens)
        with torch.no_grad():
            for group in pack([len(s.ids) for s in samples], self.config.micro_batch_tokens):
                batch = collate([samples[i] for i in group], self.device)
                keep, select = self._positions(batch)
                if not len(keep):
                    continue
                before = self._logits(self.model, batch, keep, select, params=start)
                after = self._logits(self.model, batch, keep, select)
                if not select:
                    before, after = before[:, keep], after[:, keep]
                mask = batch.mask[:, keep + 1]  # (B, K): the tokens these positions predict
                kl = vocab_kl(before, after, self.config.temperature)
                total += torch.stack([torch.where(mask, kl, 0.0).sum(), mask.sum()])
        kl_sum, count = (float(v) for v in total.tolist())
        return kl_sum / max(1.0, count)

    def lr_at(self, version: int) -> float:
        """The learning rate of the step that makes version ``version + 1``."""
        warmup = self.config.lr_warmup_steps
        return self.lr_scale * self.kl_lr_scale * self.config.lr * (
            min(1.0, (version + 1) / warmup) if warmup else 1.0)

    def logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Each sample's per-token log-probs under the current weights: of every trained token
        (loss mask 1), 0 for the others (they are not computed)."""
        self._check(samples)
        return [row.tolist() for row in self._logprobs(samples)]

    def _logprobs(self, samples: Sequence[Sample], model: Any = None) -> list[torch.Tensor]:
        """Per sample a (T_i,) tensor of log-probs under ``model`` (None: the one trained),
        without gradient."""
        import torch

        out: list[torch.Tensor] = [torch.empty(0)] * len(samples)
        with torch.no_grad():
            for group in pack([len(s.ids) for s in samples], self.config.micro_batch_tokens):
                batch = collate([samples[i] for i in group], self.device)
                logprobs = torch.where(batch.mask, self._forward(model or self.model, batch),
                                       0.0)
                for row, i in enumerate(group):
                    out[i] = logprobs[row, :len(samples[i].ids)]
        return out

    def _forward(self, model: Any, batch: PaddedBatch) -> torch.Tensor:
        """Log-probs (B, T) of the batch's tokens; 0 where the next token is not trained."""
        import torch

        from tempering.train.losses import target_logprobs, token_logprobs

        keep, select = self._positions(batch)
        logits = self._logits(model, batch, keep, select)
        if not select:
            return token_logprobs(logits, batch.ids, self.config.temperature)  # (B, T)
        picked = target_logprobs(logits, batch.ids[:, keep + 1],
                                 self.config.temperature)  # (B, K)
        out = torch.zeros(batch.ids.shape, dtype=picked.dtype, device=picked.device)
        return out.index_copy(1, keep + 1, picked)  # (B, T), differentiable in picked

    def _positions(self, batch: PaddedBatch) -> tuple[torch.Tensor, bool]:
        """The columns (K,) whose logits are needed, t predicting a trained token t + 1, and
        whether to ask the model for those alone (``logits_to_keep``) or slice them after.
        Only they need the vocabulary projection, usually the largest matrix product and,
        with its log-softmax, the largest activation."""
        keep = batch.mask[:, 1:].any(0).nonzero().squeeze(-1)
        return keep, self._logits_to_keep and 0 < len(keep) < batch.ids.shape[1] - 1

    def _logits(self, model: Any, batch: PaddedBatch, keep: torch.Tensor, select: bool,
                params: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """``model``'s logits for the batch (``_positions``: at the columns ``keep`` alone
        where ``select``, else at every column), with the weights ``params`` in place of its
        own where given."""
        import torch
        from torch.func import functional_call

        inputs = {"input_ids": batch.ids, "attention_mask": batch.attention, "use_cache": False,
                  **({"logits_to_keep": keep} if select else {})}
        with torch.autocast(self.device.type, dtype=torch.bfloat16,
                            enabled=self.config.dtype == "bfloat16"):
            out = (model(**inputs) if params is None else
                   functional_call(model, dict(params), args=(), kwargs=inputs))
        logits: torch.Tensor = out.logits
        return logits

    def _check(self, samples: Sequence[Sample]) -> None:
        if not samples:
            raise ValueError("no samples to train on; give at least one")
        for s in samples:
            if max(s.ids) >= self._vocab or min(s.ids) < 0:
                raise ValueError(f"sample {s.trajectory_id!r} has token ids outside the "
                                 f"model's vocabulary [0, {self._vocab}); was it sampled by "
                                 "another model?")
            if self._context and len(s.ids) > self._context:
                raise ValueError(f"sample {s.trajectory_id!r} has {len(s.ids)} tokens, more "
                                 f"than the model's {self._context} positions; cap episodes' "
                                 "tokens below it")

    # -- weights out -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model's weights: views of the live parameters, valid until the next ``step``."""
        return dict(self.model.state_dict())

    def publish(self, engine: WeightsSink) -> int:
        """Push the weights to ``engine`` as version ``self.version``; returns its version."""
        return engine.update_weights(self.state_dict(), self.version)

    # -- checkpoints -----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """A copy of the learner as it is now (weights, optimizer state, version) in host
        memory, for ``save`` to write later: the trainer keeps the weights that sampled a good
        stretch of a run, which are some versions behind the learner by the time it is judged.
        Costs host memory of about three times the model (weights and Adam's two moments)."""
        import torch

        def host(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value.detach().to("cpu", copy=True)
            if isinstance(value, dict):
                return {k: host(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return type(value)(host(v) for v in value)
            return value

        return Snapshot(self.version, host(dict(self.model.state_dict())),
                        host(self.optimizer.state_dict()))

    def save(self, path: str | os.PathLike[str], snapshot: Snapshot | None = None) -> Path:
        """Write model, optimizer and version to ``path`` atomically; returns the path. With
        ``snapshot``, what it holds instead of the learner's state now."""
        import torch

        out = Path(path).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by a save that was killed
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        old = out.parent / f".{out.name}.old"
        try:
            if snapshot is None:
                self.model.save_pretrained(tmp)
            else:
                self.model.save_pretrained(tmp, state_dict=snapshot.weights)
            for pattern in _TOKENIZER_FILES:  # so that an engine can load the checkpoint
                for f in self.model_path.glob(pattern):
                    if f.is_file():
                        shutil.copy2(f, tmp / f.name)
            torch.save(self.optimizer.state_dict() if snapshot is None else snapshot.optimizer,
                       tmp / OPTIMIZER_FILE)
            (tmp / STATE_FILE).write_text(json.dumps({
                "version": self.version if snapshot is None else snapshot.version,
                "base_model": str(self.model_path),
                "config": self.config.model_dump(mode="json")}, indent=2) + "\n")
            _fsync(*(f for f in tmp.iterdir() if f.is_file()), tmp)
            if out.exists():
                shutil.rmtree(old, ignore_errors=True)
                os.rename(out, old)
            os.rename(tmp, out)
            _fsync(out.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        return out

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore model, optimizer and version from a checkpoint ``save`` wrote."""
        import torch
        from safetensors.torch import load_file

        path = Path(path).resolve()
        old = path.parent / f".{path.name}.old"
        if not (path / STATE_FILE).is_file() and (old / STATE_FILE).is_file():
            os.rename(old, path)  # a kill fell between save's two renames: take the last one
        if not (path / STATE_FILE).is_file():
            raise ConfigError(f"no learner checkpoint at {path} (no {STATE_FILE}); give a "
                              "directory written by Learner.save")
        state = json.loads((path / STATE_FILE).read_text())
        weights = {k: v for f in sorted(path.glob("*.safetensors")) for k, v in
                   load_file(f, device=str(self.device)).items()}
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        own = self.model.state_dict()
        loaded = {own[k].data_ptr() for k in weights if k in own}
        tied = {k for k, v in own.items() if v.data_ptr() in loaded}  # lm_head = embeddings
        if unexpected or set(missing) - tied:
            raise ConfigError(f"the checkpoint at {path} does not fit {self.model_path}: "
                              f"missing {sorted(set(missing) - tied)[:5]}, unexpected "
                              f"{sorted(unexpected)[:5]}; load it into a learner of the same "
                              "model")
        self.optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, map_location=self.device,
                                                  weights_only=True))
        self.version = int(state["version"])


class _BehaviourStats:
    """How far each sample's behaviour policy is from π_prox, by the sample's age: sums over
    the trained tokens of one pass, kept on the device until ``figures`` (one sync a step)."""

    COLUMNS = ("samples", "tokens", "is_weight", "is_outside", "behav_kl", "nll")

    def __init__(self, is_cap: float | None, level: ISLevel, mode: ISMode) -> None:
        self.is_cap, self.level, self.mode = is_cap, level, mode
        self.sums: dict[int, torch.Tensor] = {}
        self.max: dict[int, torch.Tensor] = {}

    def add(self, prox: torch.Tensor, behav: torch.Tensor, mask: torch.Tensor,
            ages: Sequence[int]) -> None:
        import torch

        from tempering.train.losses import importance_weights

        maskf = mask.float()
        log_r = torch.where(mask, prox - behav, 0.0)  # (B, T) log π_prox/π_behav per token
        weight = importance_weights(prox, behav, mask, self.level)
        cap = self.is_cap if self.is_cap is not None else math.inf
        outside = (weight > cap) | ((weight < 1.0 / cap) if self.mode == "mask" else False)
        rows = torch.stack([
            torch.ones(len(ages), device=mask.device), maskf.sum(-1),
            (weight * maskf).sum(-1), (outside.float() * maskf).sum(-1),
            ((log_r.exp() - 1 - log_r) * maskf).sum(-1),  # k3 of KL(π_behav ‖ π_prox)
            (torch.where(mask, -behav, 0.0)).sum(-1)], dim=-1)  # (B, 6)
        peak = torch.where(mask, weight, 0.0).amax(-1)  # (B,)
        for age in set(ages):
            chosen = torch.tensor([a == age for a in ages], device=mask.device)
            total = rows[chosen].sum(0)
            self.sums[age] = self.sums[age] + total if age in self.sums else total
            top = peak[chosen].max()
            self.max[age] = torch.maximum(self.max[age], top) if age in self.max else top

    def figures(self) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
        """(``behav_kl`` and ``entropy`` over all samples, the per-age figures)."""
        import torch

        if not self.sums:
            return {"behav_kl": 0.0, "entropy": 0.0}, {}
        ages = sorted(self.sums)
        table = torch.stack([self.sums[a] for a in ages]).tolist()
        peaks = torch.stack([self.max[a] for a in ages]).tolist()
        by_age: dict[int, dict[str, float]] = {}
        for age, row, peak in zip(ages, table, peaks, strict=True):
            got = dict(zip(self.COLUMNS, row, strict=True))
            n = max(1.0, got["tokens"])
            by_age[age] = {"samples": got["samples"], "tokens": got["tokens"],
                           "is_weight_mean": got["is_weight"] / n, "is_weight_max": peak,
                           "is_truncated_frac": got["is_outside"] / n,
                           "behav_kl": got["behav_kl"] / n}
        tokens = max(1.0, sum(row[1] for row in table))
        return {"behav_kl": sum(row[4] for row in table) / tokens,
                "entropy": sum(row[5] for row in table) / tokens}, by_age


def _fsync(*paths: Path) -> None:
    """Flush files and directories to disk (a rename is durable once its directory is)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
