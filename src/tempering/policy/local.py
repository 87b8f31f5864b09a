"""The in-process inference engine: a transformers causal LM sampled with continuous batching.

One worker thread owns the model. ``generate`` renders and tokenises the prompt on the caller's
loop, queues it and awaits a future the worker resolves. The worker runs *sessions* on one
weights version: it prefills the queued requests together (left padding, attention mask,
explicit position ids) into a KV cache, then decodes one token per running row per step. Between
steps it admits newcomers (prefilled on their own, merged into the running cache by left-padding
the shorter one) and drops finished or cancelled rows, so nobody waits for a whole batch.

``update_weights`` stops admission, waits for the rows in flight (a swap that a completion spans
would mix two policies in one sample), copies the tensors in and bumps the version; every
``Generation`` carries the version that sampled all of it.

Sampling: each row has its own ``torch.Generator`` and draws an exponential race (Gumbel-max)
over the vocabulary per token, so a seed reproduces its sample whatever shares the batch (the
race, unlike inverse-CDF sampling, ignores the ~1e-7 noise batch shapes put into logits). The
log-prob recorded is under the distribution sampled from *before* top-p truncation:
``log_softmax(logits / temperature)``, untempered for temperature 0. That is what a learner
recomputes with one forward pass over prompt + completion, in fp32 within 1e-4.

Prompts: with ``prefix_token_ids`` the prompt is those tokens plus the tokenisation of only
what the chat template adds for ``messages[prefix_messages:]``; with a prefix-stable template
(``policy.tiny``'s) that equals tokenising the whole conversation. A template that renders
earlier turns differently falls back to the full prompt with ``prompt_reused=0``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tempering.errors import PolicyError
from tempering.policy.base import GenerateRequest, Generation
from tempering.policy.toolcalls import parse_tool_calls

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStats:
    """Counters since the engine started (a snapshot; read ``LocalEngine.stats`` again)."""

    requests: int = 0
    prefills: int = 0
    """Forward passes over new prompts (one per group admitted together)."""
    decode_steps: int = 0
    largest_batch: int = 0
    """Most rows in one forward pass: above 1 means requests were batched."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    busy_s: float = 0.0
    """Seconds spent in forward passes and sampling."""


@dataclass(eq=False)
class _Row:
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


@dataclass
class _Batch:
    """The rows decoding together and their shared KV cache; row i is cache row i."""

    rows: list[_Row]
    cache: Any
    mask: torch.Tensor  # (B, L) 1 where the cache holds a real token
    next_pos: torch.Tensor  # (B,) position of each row's next token
    last: torch.Tensor  # (B,) the token each row sampled last, not yet fed


class LocalEngine:
    """A ``Policy`` that samples from a transformers model in this process."""

    def __init__(self, model_path: str | os.PathLike[str], *, device: str = "cpu",
                 dtype: torch.dtype | str | None = None, max_batch: int = 16,
                 max_context: int | None = None, name: str | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(model_path).resolve()
        if isinstance(dtype, str) and not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise PolicyError(f"dtype {dtype!r} is not a torch dtype; use e.g. 'bfloat16'")
        # fp32 by default: log-probs that the learner's forward pass reproduces within 1e-4.
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype or torch.float32
        self.device = torch.device(device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model: Any = AutoModelForCausalLM.from_pretrained(  # Any: its .to() is mistyped
                path, local_files_only=True, dtype=self.dtype)
            self.model = model.to(self.device).eval()
        except (OSError, ValueError) as exc:
            raise PolicyError(f"cannot load a causal LM and tokenizer from {path}: {exc}; give "
                              "a directory written by save_pretrained") from exc
        config = self.model.config
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            raise PolicyError(f"{path} uses sliding-window attention, which the local engine's "
                              "cache merging does not support; serve it with vLLM instead")
        self.name = name or f"local:{path.name}"
        self.max_batch = max_batch
        self.max_context = max_context or int(config.max_position_embeddings)
        self._stop_ids = _stop_ids(self.tokenizer, self.model)
        self._pad_id = (self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                        else min(self._stop_ids))
        # transformers 5 renamed past_key_values to cache (the old name warns until 5.40).
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._version = 0
        self._stats = EngineStats()
        self._queue: deque[_Row] = deque()
        self._cond = threading.Condition()
        self._swap_lock = threading.Lock()  # held by the worker for a whole session
        self._swaps_waiting = 0
        self._closed = False
        self._tok_lock = threading.Lock()  # HF fast tokenizers are not safe across threads
        self._worker = threading.Thread(target=self._work, name=f"{self.name} worker",
                                        daemon=True)
        self._worker.start()

    # -- public API ------------------------------------------------------------------------

    @property
    def weights_version(self) -> int:
        return self._version

    @property
    def stats(self) -> EngineStats:
        return self._stats

    def prompt_ids(self, request: GenerateRequest) -> tuple[int, list[int]]:
        """The request's prompt as (tokens reused from ``prefix_token_ids``, new token ids)."""
        messages = [m.to_openai() for m in request.messages]
        full = self._render(messages, request.tools, generation_prompt=True)
        prefix, k = request.prefix_token_ids, request.prefix_messages
        if not prefix:
            return 0, self._tokenize(full)
        if not 0 <= k <= len(messages):
            raise PolicyError(f"prefix_messages={k} but the request has {len(messages)} "
                              "messages; it counts the messages the prefix tokens render")
        head = self._render(messages[:k], request.tools, generation_prompt=False) if k else ""
        cut = len(head)
        if prefix[-1] in self._stop_ids:
            # The sampled turn ends on its end-of-turn token; anything a template writes after
            # it (Qwen's "\n") was never sampled, so it belongs to the continuation.
            end = str(self.tokenizer.convert_ids_to_tokens(prefix[-1]))
            cut = head.rfind(end) + len(end) if end in head else cut
        if not full.startswith(head[:cut]):
            log.warning("%s: the chat template does not render earlier turns as a prefix of the "
                        "whole conversation; re-tokenising it (prompt_reused=0)", self.name)
            return 0, self._tokenize(full)
        return len(prefix), self._tokenize(full[cut:])

    async def generate(self, request: GenerateRequest) -> Generation:
        if self._closed:
            raise PolicyError(f"{self.name} is closed; open a new LocalEngine")
        import torch

        sp = request.sampling
        if sp.max_tokens < 1 or not 0 < sp.top_p <= 1 or sp.temperature < 0:
            raise PolicyError(f"sampling {sp!r} is out of range: max_tokens must be >= 1, top_p "
                              "in (0, 1] and temperature >= 0 (0 is greedy)")
        reused, new_ids = self.prompt_ids(request)
        prompt = [*request.prefix_token_ids[:reused], *new_ids]
        room = self.max_context - len(prompt)
        if room < 1:
            return Generation(text="", context_exceeded=True, prompt_reused=reused,
                              prompt_token_ids=new_ids, weights_version=self._version)
        loop = asyncio.get_running_loop()
        generator = torch.Generator(device=self.device)
        generator.manual_seed(sp.seed if sp.seed is not None else secrets.randbits(63))
        row = _Row(request=request, future=loop.create_future(), loop=loop, prompt=prompt,
                   reused=reused, max_new=min(sp.max_tokens, room),
                   generator=generator)
        with self._cond:
            self._queue.append(row)
        # Wake the worker on the next loop iteration, so that requests made together (one
        # asyncio.gather) are queued by then and prefilled as one batch.
        loop.call_soon(self._wake)
        return await row.future

    def update_weights(self, state: Mapping[str, torch.Tensor] | str | os.PathLike[str],
                       version: int | None = None) -> int:
        """Load new weights once the completions in flight finish; return the new version.

        ``state`` is a state dict (tensors on any device or dtype; tied weights may be left out)
        or a path: a save_pretrained directory, a .safetensors file or a torch.save file. The
        version becomes ``version`` if given, else the current one plus 1. Blocks until the
        swap is done; from a coroutine, ``await asyncio.to_thread(engine.update_weights, ...)``.
        """
        tensors = _load_state(Path(state)) if isinstance(state, str | os.PathLike) else state
        with self._cond:
            self._swaps_waiting += 1  # the worker admits nobody new from here on
        try:
            with self._swap_lock:  # released when the rows in flight have finished
                self._copy_in(tensors)
                self._version = self._version + 1 if version is None else version
                return self._version
        finally:
            with self._cond:
                self._swaps_waiting -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """Stop the worker; requests still queued or in flight fail with ``PolicyError``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._worker:
            self._worker.join()

    async def __aenter__(self) -> LocalEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # -- prompts and weights ---------------------------------------------------------------

    def _render(self, messages: list[dict[str, Any]], tools: list[Any],
                *, generation_prompt: bool) -> str:
        return str(self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt))

    def _tokenize(self, text: str) -> list[int]:
        with self._tok_lock:
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _detokenize(self, ids: list[int]) -> str:
        with self._tok_lock:
            return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def _copy_in(self, state: Mapping[str, torch.Tensor]) -> None:
        import torch

        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        wrong = [f"{k} {tuple(state[k].shape)} (expected {tuple(own[k].shape)})"
                 for k in state if k in own and state[k].shape != own[k].shape]
        # A tied weight (lm_head = embeddings) may come under either name only.
        aliases: dict[int, set[str]] = {}
        for key, tensor in own.items():
            aliases.setdefault(id(tensor.untyped_storage()), set()).add(key)
        missing = sorted(k for k in set(own) - set(state)
                         if not aliases[id(own[k].untyped_storage())] & set(state))
        problems = [f"{what} {names[:5]}" for what, names in (
            ("unknown keys", unknown), ("wrong shapes", wrong), ("missing keys", missing))
            if names]
        if problems:  # checked before copying anything: a bad push leaves the weights intact
            raise PolicyError(f"the new weights do not fit {self.name}: {'; '.join(problems)}; "
                              "push a state dict of the same architecture")
        with torch.no_grad():
            for key, tensor in state.items():
                own[key].copy_(tensor)

    # -- the worker ------------------------------------------------------------------------

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _admit(self, room: int) -> list[_Row]:
        with self._cond:
            if self._swaps_waiting or self._closed:
                return []
            rows: list[_Row] = []
            while self._queue and len(rows) < room:
                row = self._queue.popleft()
                if not row.future.cancelled():
                    rows.append(row)
            return rows

    def _work(self) -> None:
        import torch

        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or bool(
                    self._queue and not self._swaps_waiting))
                if self._closed:
                    break
            with self._swap_lock, torch.inference_mode():
                self._session(self._version)
        with self._cond:
            orphans, self._queue = list(self._queue), deque()
        for row in orphans:
            _deliver(row, PolicyError(f"{self.name} was closed before this request ran"))

    def _session(self, version: int) -> None:
        """Decode until no row is left and nobody new may be admitted, on one weights version."""
        batch: _Batch | None = None
        new: list[_Row] = []
        try:
            while True:
                new = self._admit(self.max_batch - (len(batch.rows) if batch else 0))
                if new:
                    batch = _merge(batch, self._prefill(new, version))
                    new = []
                if batch is None:
                    return
                if self._closed:
                    raise PolicyError(f"{self.name} was closed while this request ran")
                batch = self._decode(batch, version)
        except Exception as exc:  # the engine failed: every row in flight learns why
            error = exc if isinstance(exc, PolicyError) else PolicyError(
                f"{self.name} failed while sampling: {exc!r}")
            for row in [*(batch.rows if batch else []), *new]:
                _deliver(row, error)

    def _prefill(self, rows: list[_Row], version: int) -> _Batch | None:
        import torch
        from transformers import DynamicCache

        width = max(len(r.prompt) for r in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # left padding: every row's next token is column L
            ids[i, width - len(row.prompt):] = torch.tensor(row.prompt)
            mask[i, width - len(row.prompt):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        batch = _Batch(rows, DynamicCache(config=self.model.config), mask, mask.sum(-1),
                       torch.empty(0))
        return self._step(batch, ids, (mask.cumsum(-1) - 1).clamp(min=0), version, prefills=1,
                          requests=len(rows), prompt_tokens=sum(len(r.prompt) for r in rows))

    def _decode(self, batch: _Batch, version: int) -> _Batch | None:
        import torch

        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=-1)
        batch.next_pos = batch.next_pos + 1
        return self._step(batch, batch.last[:, None], batch.next_pos[:, None] - 1, version,
                          decode_steps=1)

    def _step(self, batch: _Batch, ids: torch.Tensor, positions: torch.Tensor, version: int,
              **counts: int) -> _Batch | None:
        """One forward pass and one sampled token per row; finished rows get their result."""
        started, width = time.perf_counter(), len(batch.rows)
        out = self.model(input_ids=ids, attention_mask=batch.mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1, **{self._cache_kw: batch.cache})
        after, done = self._advance(batch, out.logits[:, -1, :].float())  # (B, V)
        self._count(time.perf_counter() - started, largest_batch=width, completion_tokens=width,
                    **counts)
        for row in done:  # after counting, so a caller woken by its result sees the stats
            _deliver(row, self._result(row, version))
        return after

    def _advance(self, batch: _Batch, logits: torch.Tensor) -> tuple[_Batch | None, list[_Row]]:
        """Sample each row's next token; return the rows still going and those now finished."""
        import torch

        tokens, logprobs = _sample(logits, batch.rows)
        keep, done = [], []
        for i, (row, token, logprob) in enumerate(
                zip(batch.rows, tokens.tolist(), logprobs.tolist(), strict=True)):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            self._check_finished(row)
            if row.finish:
                done.append(row)
            elif not row.future.cancelled():
                keep.append(i)
        if not keep:
            return None, done
        batch.last = tokens
        if len(keep) < len(batch.rows):
            index = torch.tensor(keep, device=batch.mask.device)
            batch.rows = [batch.rows[i] for i in keep]
            batch.cache.batch_select_indices(index)
            batch.mask, batch.next_pos, batch.last = (
                batch.mask[index], batch.next_pos[index], batch.last[index])
            _trim(batch)
        return batch, done

    def _check_finished(self, row: _Row) -> None:
        stops = row.request.sampling.stop
        if row.tokens[-1] in self._stop_ids:
            row.finish = "stop"
        elif stops:
            text = self._detokenize(row.tokens)
            # Only text the last token added can complete a stop string (the 1 is for a
            # multi-byte character that the previous decode showed as a replacement).
            tail = max(0, row.seen - 1 - max(map(len, stops)))
            found = [i for s in stops if (i := text.find(s, tail)) >= 0]
            row.seen = len(text)
            if found:
                row.finish, row.stop_at = "stop", min(found)
        if row.finish is None and len(row.tokens) >= row.max_new:
            row.finish = "length"

    def _result(self, row: _Row, version: int) -> Generation:
        ended = row.finish == "stop" and row.stop_at is None  # on an end-of-turn token
        text = self._detokenize(row.tokens[:-1] if ended else row.tokens)
        if row.stop_at is not None:
            text = text[:row.stop_at]  # as OpenAI: the stop string is not part of the text
        parsed = parse_tool_calls(text)
        finish: Literal["stop", "length", "tool_calls"] = "length" if row.finish == "length" else (
            "tool_calls" if parsed.calls else "stop")
        return Generation(text=text, content=parsed.content, tool_calls=parsed.calls,
                          tool_call_error=parsed.error, finish_reason=finish,
                          prompt_reused=row.reused, prompt_token_ids=row.prompt[row.reused:],
                          completion_token_ids=row.tokens, logprobs=row.logprobs,
                          weights_version=version)

    def _count(self, busy_s: float, *, largest_batch: int, **add: int) -> None:
        s = self._stats  # replaced whole, so a reader on another thread sees one snapshot
        self._stats = replace(s, busy_s=s.busy_s + busy_s,
                              largest_batch=max(s.largest_batch, largest_batch),
                              **{k: getattr(s, k) + v for k, v in add.items()})


def _sample(logits: torch.Tensor, rows: list[_Row]) -> tuple[torch.Tensor, torch.Tensor]:
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
    # vocabulary entry from the row's own generator.
    race = torch.stack([torch.empty(logits.shape[-1], device=logits.device)
                        .exponential_(generator=r.generator) for r in rows])
    # E can round to 0 (log -inf), which would let a dropped token (-inf) win as NaN.
    sampled = (scores - race.clamp(min=torch.finfo(race.dtype).tiny).log()).argmax(dim=-1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _merge(running: _Batch | None, new: _Batch | None) -> _Batch | None:
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


def _trim(batch: _Batch) -> None:
    """Drop leading cache columns that are padding for every remaining row."""
    start = int(batch.mask.any(0).int().argmax())
    if start > 0:
        batch.mask = batch.mask[:, start:]
        for layer in batch.cache.layers:
            layer.keys, layer.values = layer.keys[..., start:, :], layer.values[..., start:, :]


def _deliver(row: _Row, result: Generation | BaseException) -> None:
    def settle() -> None:
        if not row.future.done():  # else cancelled by its caller
            if isinstance(result, BaseException):
                row.future.set_exception(result)
            else:
                row.future.set_result(result)

    try:
        row.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting
        pass


def _stop_ids(tokenizer: Any, model: Any) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = {*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id,
           im_end if im_end != tokenizer.unk_token_id else None} - {None}
    if not ids:
        raise PolicyError("the model names no end-of-sequence token; set eos_token_id in its "
                          "generation_config.json")
    return ids


def _load_state(path: Path) -> dict[str, torch.Tensor]:
    import torch
    from safetensors.torch import load_file

    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise PolicyError(f"{path} holds no *.safetensors files; save the model with "
                              "save_pretrained")
        return {k: v for f in files for k, v in load_file(f).items()}
    if not path.is_file():
        raise PolicyError(f"no weights at {path}; give a state dict, a directory or a file")
    if path.suffix == ".safetensors":
        return load_file(path)
    return dict(torch.load(path, map_location="cpu", weights_only=True))
