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

The batch (each row's tokens, stop detection and result; the KV cache, merged and trimmed) and
sampling (per-row seeded Gumbel-max, log-probs a learner recomputes) live in ``policy.batch``;
this module owns the API, prompts, weights and the worker thread that drives them.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tempering.errors import PolicyError
from tempering.policy.base import GenerateRequest, Generation
from tempering.policy.batch import DecodeBatch, Row, left_pad, merge, sample

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


class LocalEngine:
    """A ``Policy`` that samples from a transformers model in this process."""

    def __init__(self, model_path: str | os.PathLike[str], *, device: str = "cpu",
                 dtype: torch.dtype | str | None = None, max_batch: int = 16,
                 max_context: int | None = None, name: str | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # our commands show their own progress

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
        self._queue: deque[Row] = deque()
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
        row = Row(request=request, future=loop.create_future(), loop=loop, prompt=prompt,
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

    async def aclose(self) -> None:
        """``close``, from a coroutine."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> LocalEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

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

    def _admit(self, room: int) -> list[Row]:
        with self._cond:
            if self._swaps_waiting or self._closed:
                return []
            rows: list[Row] = []
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
            row.deliver(PolicyError(f"{self.name} was closed before this request ran"))

    def _session(self, version: int) -> None:
        """Decode until no row is left and nobody new may be admitted, on one weights version."""
        batch: DecodeBatch | None = None
        new: list[Row] = []
        try:
            while True:
                new = self._admit(self.max_batch - (len(batch.rows) if batch else 0))
                if new:
                    batch = merge(batch, self._prefill(new, version))
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
                row.deliver(error)

    def _prefill(self, rows: list[Row], version: int) -> DecodeBatch | None:
        import torch
        from transformers import DynamicCache

        ids, mask = left_pad(rows, self._pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        batch = DecodeBatch(rows, DynamicCache(config=self.model.config), mask, mask.sum(-1),
                      torch.empty(0))
        return self._step(batch, ids, (mask.cumsum(-1) - 1).clamp(min=0), version, prefills=1,
                          requests=len(rows), prompt_tokens=sum(len(r.prompt) for r in rows))

    def _decode(self, batch: DecodeBatch, version: int) -> DecodeBatch | None:
        import torch

        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=-1)
        batch.next_pos = batch.next_pos + 1
        return self._step(batch, batch.last[:, None], batch.next_pos[:, None] - 1, version,
                          decode_steps=1)

    def _step(self, batch: DecodeBatch, ids: torch.Tensor, positions: torch.Tensor, version: int,
              **counts: int) -> DecodeBatch | None:
        """One forward pass and one sampled token per row; finished rows get their result."""
        started, width = time.perf_counter(), len(batch.rows)
        out = self.model(input_ids=ids, attention_mask=batch.mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1, **{self._cache_kw: batch.cache})
        after, done = self._advance(batch, out.logits[:, -1, :].float())  # (B, V)
        self._count(time.perf_counter() - started, largest_batch=width, completion_tokens=width,
                    **counts)
        for row in done:  # after counting, so a caller woken by its result sees the stats
            row.deliver(row.result(version, self._detokenize))
        return after

    def _advance(self, batch: DecodeBatch, logits: torch.Tensor
                 ) -> tuple[DecodeBatch | None, list[Row]]:
        """Sample each row's next token; return the rows still going and those now finished."""
        tokens, logprobs = sample(logits, batch.rows)
        keep, done = [], []
        for i, (row, token, logprob) in enumerate(
                zip(batch.rows, tokens.tolist(), logprobs.tolist(), strict=True)):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            row.check_finished(self._stop_ids, self._detokenize)
            if row.finish:
                done.append(row)
            elif not row.future.cancelled():
                keep.append(i)
        if not keep:
            return None, done
        batch.last = tokens
        if len(keep) < len(batch.rows):
            batch.select(keep)
        return batch, done

    def _count(self, busy_s: float, *, largest_batch: int, **add: int) -> None:
        s = self._stats  # replaced whole, so a reader on another thread sees one snapshot
        self._stats = replace(s, busy_s=s.busy_s + busy_s,
                              largest_batch=max(s.largest_batch, largest_batch),
                              **{k: getattr(s, k) + v for k, v in add.items()})


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
