"""A tiny but real causal LM, built on this machine in a second: for tests, demos and benchmarks.

``build_tiny_model`` writes a directory that ``AutoModelForCausalLM`` and ``AutoTokenizer`` load
with ``local_files_only=True``, exactly like a downloaded checkpoint: a randomly initialised
Qwen2 model (the architecture most agent RL runs start from) and a byte-level BPE tokenizer
trained with ``tokenizers`` on text every Python install ships (the source of a few stdlib
modules) plus agent transcripts with tool calls. Nothing is downloaded, and the same seed gives
the same files on the same Python.

The tokenizer speaks ChatML (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``) with
``<tool_call>`` and ``</tool_call>`` as single tokens, and its chat template renders tools into
the system message and assistant tool calls in the markup of ``policy.toolcalls``. The template
is *prefix-stable*: turns are joined by a newline written before each ``<|im_start|>`` rather
than after each ``<|im_end|>``, so rendering the first k messages gives a textual prefix of
rendering all of them, ending exactly on the ``<|im_end|>`` token a model samples. That makes
"previous prompt + sampled completion + new messages" equal the tokenisation of the whole
conversation, token for token (``LocalEngine`` relies on it for multi-turn episodes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

from tempering.errors import ConfigError
from tempering.trajectory.toolcalls import render_tool_call

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
MARKER = "tempering-tiny.json"
"""Written last: the build parameters, so a second call with the same ones returns at once."""
_FORMAT = 1  # bump when the files a build writes change

# Whitespace lives in the string literals only ({%- -%} everywhere), so what a turn renders is
# exactly what is written here. The newline between turns comes before <|im_start|>: see the
# module docstring for why.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(sep='') -%}"
    "{%- if tools or (messages and messages[0].role == 'system') -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- messages[0].content or '' -}}"
    "{%- else -%}{{- 'You are a helpful assistant.' -}}{%- endif -%}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson(ensure_ascii=True)) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a JSON object with the function name"
    " and arguments within <tool_call></tool_call> tags:\\n<tool_call>{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- set ns.sep = '\\n' -%}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and message.role == 'system') -%}"
    "{{- ns.sep + '<|im_start|>' + message.role + '\\n' + (message.content or '') -}}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>{\"name\": ' + (fn.name | tojson(ensure_ascii=True)) + ', \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}"
    "{%- else -%}{{- fn.arguments | tojson(ensure_ascii=True) -}}{%- endif -%}"
    "{{- '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- set ns.sep = '\\n' -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- ns.sep + '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Modules whose source is the tokenizer's corpus: plain Python and English docstrings, about
# 400 KB, present in every CPython install.
_CORPUS_MODULES = ("argparse", "textwrap", "shlex", "json.decoder", "json.encoder",
                   "subprocess", "pathlib", "difflib", "string")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_COMMANDS = ("ls -la", "cat src/main.py", "python3 -m pytest -q tests", "git diff",
             "grep -rn 'def solve' .", "sed -n 1,40p README.md", "pip install -e .",
             "python3 solution.py", "echo done", "find . -name '*.py'")


def _corpus() -> list[str]:
    texts = []
    for name in _CORPUS_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            texts.append(Path(spec.origin).read_text(encoding="utf-8"))
    # Agent transcripts, weighted up so that roles, markup and common commands get merges of
    # their own next to the thousands of code words.
    for n, command in enumerate(_COMMANDS * 20):
        call = render_tool_call("bash", {"command": command})
        texts.append(f"{IM_START}system\nYou are a helpful assistant.{IM_END}\n"
                     f"{IM_START}user\nFix the failing test number {n}.{IM_END}\n"
                     f"{IM_START}assistant\nLet me look first.\n{call}{IM_END}\n"
                     f"{IM_START}tool\nexit code 0{IM_END}\n")
    return texts


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    # Qwen2's pipeline exactly: AutoTokenizer loads this directory as a Qwen2Tokenizer, which
    # rebuilds normaliser and pre-tokeniser its own way around our vocabulary and merges.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 2, min_frequency=2, show_progress=False,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # Single tokens, but not "special": decoding with skip_special_tokens keeps the markup.
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in (TOOL_OPEN, TOOL_CLOSE)])
    return tok


def build_tiny_model(path: str | os.PathLike[str], *, seed: int = 0, vocab_size: int = 2048,
                     hidden_size: int = 64, layers: int = 2, heads: int = 4,
                     max_positions: int = 2048) -> Path:
    """Write a tiny Qwen2 model and its tokenizer to ``path`` and return it.

    Idempotent: a directory already built with the same parameters is returned as is; one built
    with others is rebuilt; a non-empty directory this function did not write is refused.
    """
    params = {"format": _FORMAT, "seed": seed, "vocab_size": vocab_size,
              "hidden_size": hidden_size, "layers": layers, "heads": heads,
              "max_positions": max_positions}
    if vocab_size < 300:
        raise ConfigError(f"vocab_size={vocab_size} is too small: byte-level BPE needs 256 "
                          "byte tokens plus the special ones; use 300 or more")
    if hidden_size % heads:
        raise ConfigError(f"hidden_size={hidden_size} is not divisible by heads={heads}")
    out = Path(path)
    marker = out / MARKER
    if marker.is_file():
        if json.loads(marker.read_text()) == params:
            return out
    elif out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty and was not written by build_tiny_model; "
                          "give an empty or new directory")

    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # a second's build needs no progress bar

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=_train_tokenizer(vocab_size), eos_token=IM_END,
            pad_token=ENDOFTEXT, chat_template=CHAT_TEMPLATE,
            clean_up_tokenization_spaces=False, model_max_length=max_positions)
        ids = [cast(int, tokenizer.convert_tokens_to_ids(t)) for t in (IM_END, ENDOFTEXT)]
        config = Qwen2Config(
            vocab_size=len(tokenizer), hidden_size=hidden_size,
            intermediate_size=4 * hidden_size, num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads // 2 if heads % 2 == 0 else heads,  # GQA, as in Qwen2
            max_position_embeddings=max_positions, tie_word_embeddings=True,
            bos_token_id=None, eos_token_id=ids, pad_token_id=ids[1])
        with torch.random.fork_rng(devices=[]):  # the caller's RNG state stays untouched
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(config)
        model.generation_config.eos_token_id = ids
        model.generation_config.pad_token_id = ids[1]
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(params, indent=2) + "\n")
        if out.exists():  # ours (checked above) with other parameters, or empty
            shutil.rmtree(out)
        try:
            tmp.rename(out)
        except OSError:  # a concurrent build won the race; its result is as good as ours
            if not (marker.is_file() and json.loads(marker.read_text()) == params):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
