"""The local engine's batch: the rows decoding together, their shared KV cache, and sampling.

A ``Row`` is one request in flight and everything it becomes: the tokens and log-probs sampled
so far, when it is finished (an end-of-turn token, a stop string, ``max_tokens``), the
``Generation`` it yields, and delivering that to the caller's event loop.

``LocalEngine``'s worker thread is the only one that touches these objects once a row is queued;
nothing here locks. A ``DecodeBatch`` keeps row i of its Python state in row i of every tensor
and of the cache, so each operation below moves all of them together:

- ``left_pad`` lays new prompts out right-aligned, so every row's next token is the same column
  and one forward pass prefills them all (positions come from the mask, not the column).
- ``merge`` joins a newly prefilled batch to the running one by left-padding the shorter cache
  with masked zeros: admission between decode steps costs one prefill of the newcomers only.
- ``DecodeBatch.select`` drops finished or cancelled rows from the cache, then ``trim`` drops the
  leading columns that have become padding for every row left, so a long prompt that finished
  stops costing attention for the rest.

Sampling: each row has its own ``torch.Generator`` and draws an exponential race (Gumbel-max)
over the vocabulary per token, so a seed reproduces its sample whatever shares the batch (the
race, unlike inverse-CDF sampling, ignores the ~1e-7 noise batch shapes put into logits). The
log-prob recorded is under the distribution sampled from *before* top-p truncation:
``log_softmax(logits / temperature)``, untempered for temperature 0. That is what a learner
recomputes with one forward pass over prompt + completion, in fp32 within 1e-4.

Torch is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tempering.policy.base import GenerateRequest, Generation
from tempering.trajectory.toolcalls import parse_tool_calls

if TYPE_CHECKING:
    import torch


@dataclass(eq=False)
class Row:
    """One request in flight; owned by the worker thread once queued."""

    request: GenerateRequest
    future: asyncio.Future[Generation]
    loop: asyncio.AbstractEventLoop
    prompt: list[int]
    reused: int
    max_new: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    seen: int = 0  # characters of text already searched for stop strings
    stop_at: int | None = None  # where a stop string begins in the text

    def check_finished(self, stop_ids: set[int], detokenize: Callable[[list[int]], str]) -> None:
        """Set ``finish`` if the token just appended ends the completion."""
        stops = self.request.sampling.stop
        if self.tokens[-1] in stop_ids:
            self.finish = "stop"
        elif stops:
            text = detokenize(self.tokens)
            # Only text the last token added can complete a stop string (the 1 is for a
            # multi-byte character that the previous decode showed as a replacement).
            tail = max(0, self.seen - 1 - max(map(len, stops)))
            found = [i for s in stops if (i := text.find(s, tail)) >= 0]
            self.seen = len(text)
            if found:
                self.finish, self.stop_at = "stop", min(found)
        if self.finish is None and len(self.tokens) >= self.max_new:
            self.finish = "length"

    def result(self, version: int, detokenize: Callable[[list[int]], str]) -> Generation:
        """The finished row as the caller's ``Generation``, sampled on weights ``version``."""
        ended = self.finish == "stop" and self.stop_at is None  # on an end-of-turn token
        text = detokenize(self.tokens[:-1] if ended else self.tokens)
        if self.stop_at is not None:
            text = text[:self.stop_at]  # as OpenAI: the stop string is not part of the text
        parsed = parse_tool_calls(text)
        finish: Literal["stop", "length", "tool_calls"] = "length" if self.finish == "length" else (
            "tool_calls" if parsed.calls else "stop")
        return Generation(text=text, content=parsed.content, tool_calls=parsed.calls,
                          tool_call_error=parsed.error, finish_reason=finish,
                          prompt_reused=self.reused, prompt_token_ids=self.prompt[self.reused:],
                          completion_token_ids=self.tokens, logprobs=self.logprobs,
                          weights_version=version)

    def deliver(self, result: Generation | BaseException) -> None:
        """Resolve the caller's future on the caller's loop (this runs on the worker thread)."""
        def settle() -> None:
            if not self.future.done():  # else cancelled by its caller
                if isinstance(result, BaseException):
                    self.future.set_exception(result)
                else:
                    self.future.set_result(result)

        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting
            pass


@dataclass
class DecodeBatch:
    """The rows decoding together and their shared KV cache; row i is cache row i."""

    rows: list[Row]
    cache: Any
    mask: torch.Tensor  # (B, L) 1 where the cache holds a real token
    next_pos: torch.Tensor  # (B,) position of each row's next token
    last: torch.Tensor  # (B,) the token each row sampled last, not yet fed

    def select(self, keep: list[int]) -> None:
        """Keep only the rows at these indices (in order), in the cache and every tensor."""
        import torch

        index = torch.tensor(keep, device=self.mask.device)
        self.rows = [self.rows[i] for i in keep]
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos, self.last = (
            self.mask[index], self.next_pos[index], self.last[index])
        trim(self)


def left_pad(rows: list[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' prompts as (ids, mask), both (B, L), right-aligned on the CPU."""
    import torch

    width = max(len(r.prompt) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):  # left padding: every row's next token is column L
        ids[i, width - len(row.prompt):] = torch.tensor(row.prompt)
        mask[i, width - len(row.prompt):] = 1
    return ids, mask


def sample(logits: torch.Tensor, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's next token and its log-prob under the tempered, untruncated distribution."""
    import torch

    temps = torch.tensor([r.request.sampling.temperature for r in rows], device=logits.device)
    greedy = temps <= 0
    logp = torch.log_softmax(logits / torch.where(greedy, 1.0, temps)[:, None], dim=-1)  # (B, V)
    scores = logp.clone()
    top_p = torch.tensor([r.request.sampling.top_p for r in rows], device=logits.device)
    if bool((top_p < 1).any()):
        sorted_logp, order = logp.sort(dim=-1, descending=True, stable=True)
        probs = sorted_logp.exp()
        # Drop a token when the tokens more likely than it already reach top_p.
        drop = ((probs.cumsum(-1) - probs) >= top_p[:, None]) & (top_p < 1)[:, None]
        scores.masked_fill_(drop.scatter(-1, order, drop), float("-inf"))
    # Exponential race (Gumbel-max): argmax of log p - log E with E ~ Exp(1), one draw per
    # vocabulary entry from the row's own generator. E = -log U with U uniform: a uniform draw
    # costs a fifth of an ``exponential_`` one on a CPU, and this is a draw per row per token.
    uniform = torch.empty(logits.shape, device=logits.device)
    for i, r in enumerate(rows):
        uniform[i].uniform_(generator=r.generator)
    race = -uniform.log()  # U = 0 gives E = inf: that token cannot win
    # E can round to 0 (log -inf), which would let a dropped token (-inf) win as NaN.
    sampled = (scores - race.clamp(min=torch.finfo(race.dtype).tiny).log()).argmax(dim=-1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def merge(running: DecodeBatch | None, new: DecodeBatch | None) -> DecodeBatch | None:
    """One batch from two, the shorter cache left-padded with masked zeros."""
    import torch
    import torch.nn.functional as F

    if running is None or new is None:
        return running or new
    width = max(running.mask.shape[1], new.mask.shape[1])

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - t.shape[dim]
        return F.pad(t, (0, 0) * (t.dim() - 1 - dim % t.dim()) + (missing, 0))

    for a, b in zip(running.cache.layers, new.cache.layers, strict=True):
        a.keys = torch.cat([pad(a.keys, -2), pad(b.keys, -2)])  # (B, H, L, D)
        a.values = torch.cat([pad(a.values, -2), pad(b.values, -2)])
    running.rows = running.rows + new.rows
    running.mask = torch.cat([pad(running.mask, -1), pad(new.mask, -1)])
    running.next_pos = torch.cat([running.next_pos, new.next_pos])
    running.last = torch.cat([running.last, new.last])
    return running


def trim(batch: DecodeBatch) -> None:
    """Drop leading cache columns that are padding for every remaining row."""
    start = int(batch.mask.any(0).int().argmax())
    if start > 0:
        batch.mask = batch.mask[:, start:]
        for layer in batch.cache.layers:
            layer.keys, layer.values = layer.keys[..., start:, :], layer.values[..., start:, :]
