"""The local engine against a real (tiny, random) Qwen2 model: sampling, batching, log-probs that
a learner can recompute, token-faithful multi-turn prompts and weight swaps."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from polling import until

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tempering.errors import ConfigError, PolicyError  # noqa: E402
from tempering.policy.base import GenerateRequest, Message, Policy, SamplingParams  # noqa: E402
from tempering.policy.local import LocalEngine  # noqa: E402
from tempering.policy.tiny import build_tiny_model  # noqa: E402
from tempering.trajectory.toolcalls import parse_tool_calls, render_tool_call  # noqa: E402

BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}


def ask(text: str, **sampling: object) -> GenerateRequest:
    return GenerateRequest(messages=[Message(role="user", content=text)],
                           sampling=SamplingParams(**sampling))  # type: ignore[arg-type]


def full_forward_logprobs(model: object, prompt: list[int], completion: list[int],
                          temperature: float) -> list[float]:
    """What a learner computes: one unpadded forward pass over prompt + completion."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()  # type: ignore[operator]
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    at = torch.arange(len(completion)) + len(prompt) - 1
    return logp[at, torch.tensor(completion)].tolist()  # type: ignore[no-any-return]


def test_build_is_deterministic_idempotent_and_loads_with_auto_classes(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    again = build_tiny_model(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name
    stamp = (again / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(again) == again
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp  # returned, not rebuilt
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not written by build_tiny_model"):
        build_tiny_model(tmp_path / "foreign")

    tok = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tok)
    for marker in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"):
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker
    call = render_tool_call("bash", {"command": "ls -la"})
    text = tok.apply_chat_template(
        [{"role": "user", "content": "list"},
         {"role": "assistant", "content": "", "tool_calls": [
             {"id": "c0", "type": "function",
              "function": {"name": "bash", "arguments": json.dumps({"command": "ls -la"})}}]},
         {"role": "tool", "content": "a.py", "tool_call_id": "c0"}],
        tools=[BASH], tokenize=False, add_generation_prompt=True)
    assert '"name": "bash"' in text.split("<|im_end|>")[0]  # tools in the system message
    assert f"<|im_start|>assistant\n{call}<|im_end|>\n<|im_start|>tool\na.py" in text
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


async def test_seeded_samples_reproduce_alone_or_in_any_batch(engine: LocalEngine) -> None:
    requests = [ask("hello " * (1 + 3 * i), seed=100 + i, max_tokens=24,
                    temperature=[1.0, 0.7, 1.3][i % 3], top_p=[1.0, 0.9][i % 2])
                for i in range(6)]
    alone = [await engine.generate(r) for r in requests]
    together = await asyncio.gather(*(engine.generate(r) for r in reversed(requests)))
    for a, b in zip(alone, reversed(together), strict=True):
        assert a.completion_token_ids == b.completion_token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    other_seed = await engine.generate(ask("hello ", seed=7, max_tokens=24))
    assert other_seed.completion_token_ids != alone[0].completion_token_ids


async def test_greedy_is_deterministic_and_picks_the_argmax(engine: LocalEngine) -> None:
    first, second = await asyncio.gather(
        engine.generate(ask("greedy please", temperature=0, max_tokens=16, seed=1)),
        engine.generate(ask("greedy please", temperature=0, max_tokens=16, seed=2)))
    assert first.completion_token_ids == second.completion_token_ids
    _, prompt = engine.prompt_ids(ask("greedy please"))
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + first.completion_token_ids])).logits[0]
    picks = logits[len(prompt) - 1:-1].argmax(-1).tolist()
    assert picks[:len(first.completion_token_ids)] == first.completion_token_ids


async def test_logprobs_equal_a_full_forward_pass_despite_padding_and_joining(
        engine: LocalEngine) -> None:
    # Different prompt lengths (left padding), mixed sampling settings, and two requests that
    # arrive while the first batch is decoding (merged into its cache).
    early = [ask("x" * (5 + 40 * i), seed=i, max_tokens=40, temperature=t, top_p=p)
             for i, (t, p) in enumerate([(1.0, 1.0), (0.6, 0.8), (0.0, 1.0)])]
    late = [ask("a late question " * 9, seed=11, max_tokens=30, temperature=1.5),
            ask("short", seed=12, max_tokens=30, temperature=0.8, top_p=0.5)]
    tasks = [asyncio.create_task(engine.generate(r)) for r in early]
    await until(lambda: engine.stats.decode_steps >= 5)
    results = await asyncio.gather(*tasks, *(engine.generate(r) for r in late))
    assert engine.stats.prefills >= 2 and engine.stats.largest_batch >= 4  # joined mid-flight
    for request, gen in zip(early + late, results, strict=True):
        assert gen.prompt_reused == 0 and gen.completion_token_ids
        assert len(gen.logprobs) == len(gen.completion_token_ids)
        expected = full_forward_logprobs(engine.model, gen.prompt_token_ids,
                                         gen.completion_token_ids, request.sampling.temperature)
        assert gen.logprobs == pytest.approx(expected, abs=1e-4)


async def test_concurrent_calls_are_batched(engine: LocalEngine) -> None:
    before = engine.stats
    results = await asyncio.gather(*(engine.generate(ask(f"q{i}", seed=i, max_tokens=8))
                                     for i in range(12)))
    after = engine.stats
    assert after.prefills == before.prefills + 1  # all twelve prefilled in one forward pass
    assert after.largest_batch == 12
    assert after.requests - before.requests == 12
    assert after.completion_tokens - before.completion_tokens == sum(
        len(r.completion_token_ids) for r in results)
    assert isinstance(engine, Policy) and engine.name == "local:tiny-qwen2"


async def test_max_tokens_and_stop_strings_end_a_completion(engine: LocalEngine) -> None:
    free = await engine.generate(ask("go on", seed=5, max_tokens=30))
    assert free.finish_reason == "length" and len(free.completion_token_ids) == 30
    stop = free.text[len(free.text) // 2:][:3]
    cut = await engine.generate(ask("go on", seed=5, max_tokens=30, stop=[stop]))
    assert cut.finish_reason == "stop" and cut.text == free.text[:free.text.index(stop)]
    # The tokens are what was sampled, up to the one that completed the stop string.
    assert cut.completion_token_ids == free.completion_token_ids[:len(cut.completion_token_ids)]
    assert len(cut.completion_token_ids) < 30


async def test_prefix_extension_equals_tokenising_the_whole_conversation(
        engine: LocalEngine) -> None:
    tok = engine.tokenizer
    qwen_style = tok.chat_template.replace("{{- '<|im_end|>' -}}", "{{- '<|im_end|>\\n' -}}") \
        .replace("ns.sep + ", "")  # the usual ChatML: a newline after each turn
    for template in (tok.chat_template, qwen_style):
        tok.chat_template = template
        first = [Message(role="system", content="You fix bugs."),
                 Message(role="user", content="Tests fail in src/.")]
        gen = await engine.generate(GenerateRequest(messages=first, tools=[BASH],
                                                    sampling=SamplingParams(max_tokens=4)))
        assert gen.prompt_reused == 0
        prompt = gen.prompt_token_ids
        # The model's turn as exact tokens: what the template renders for it, then <|im_end|>.
        said = "Let me look.\n" + render_tool_call("bash", {"command": "ls src"})
        parsed = parse_tool_calls(said)
        completion = [*tok.encode(said, add_special_tokens=False),
                      tok.convert_tokens_to_ids("<|im_end|>")]
        conversation = [*first, Message(role="assistant", content=parsed.content,
                                        tool_calls=parsed.calls),
                        Message(role="tool", content="a.py b.py", tool_call_id="call_0"),
                        Message(role="user", content="Go on.")]
        request = GenerateRequest(messages=conversation, tools=[BASH],
                                  sampling=SamplingParams(max_tokens=4),
                                  prefix_token_ids=prompt + completion, prefix_messages=3)
        whole = tok.encode(tok.apply_chat_template(
            [m.to_openai() for m in conversation], tools=[BASH], tokenize=False,
            add_generation_prompt=True), add_special_tokens=False)
        reused, new = engine.prompt_ids(request)
        assert prompt + completion + new == whole and reused == len(prompt + completion)
        gen = await engine.generate(request)
        assert gen.prompt_reused == reused and gen.prompt_token_ids == new
    # A template that renders earlier turns differently as the conversation grows cannot be
    # extended: the whole prompt is fed, and the generation says nothing was reused.
    tok.chat_template = qwen_style.replace(
        "messages[0].content or ''", "messages[0].content ~ ' (' ~ (messages | length) ~ ')'")
    rendered = tok.apply_chat_template([m.to_openai() for m in conversation], tools=[BASH],
                                       tokenize=False, add_generation_prompt=True)
    assert "(5)" in rendered
    assert engine.prompt_ids(request) == (0, tok.encode(rendered, add_special_tokens=False))
    gen = await engine.generate(request)
    assert gen.prompt_reused == 0


async def test_update_weights_swaps_between_completions(engine: LocalEngine,
                                                        tmp_path: Path) -> None:
    from safetensors.torch import save_file

    old = {k: v.clone() for k, v in engine.model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    new = {k: p.detach() + 0.05 * torch.randn(p.shape, generator=gen)
           for k, p in engine.model.named_parameters()}  # lm_head is tied: left out
    before = await engine.generate(ask("same prompt", seed=3, max_tokens=12))
    assert before.weights_version == 0

    steps = engine.stats.decode_steps
    long = asyncio.create_task(engine.generate(ask("long", seed=4, max_tokens=150)))
    await until(lambda: engine.stats.decode_steps >= steps + 3)
    swap = asyncio.create_task(asyncio.to_thread(engine.update_weights, new))
    await until(lambda: engine._swaps_waiting > 0 or swap.done())
    queued = asyncio.create_task(engine.generate(ask("same prompt", seed=3, max_tokens=12)))
    assert await swap == 1 and engine.weights_version == 1
    in_flight, after = await long, await queued
    # The completion in flight was sampled entirely by the old weights, the queued one by new.
    assert in_flight.weights_version == 0 and after.weights_version == 1
    new_model = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.model.load_state_dict(old)
    assert in_flight.logprobs == pytest.approx(full_forward_logprobs(
        engine.model, in_flight.prompt_token_ids, in_flight.completion_token_ids, 1.0), abs=1e-4)
    engine.model.load_state_dict(new_model)
    assert after.logprobs == pytest.approx(full_forward_logprobs(
        engine.model, after.prompt_token_ids, after.completion_token_ids, 1.0), abs=1e-4)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)

    save_file({k: v.contiguous() for k, v in old.items() if k != "lm_head.weight"},
              tmp_path / "old.safetensors")
    assert engine.update_weights(tmp_path / "old.safetensors", version=7) == 7
    restored = await engine.generate(ask("same prompt", seed=3, max_tokens=12))
    assert restored.weights_version == 7
    assert restored.completion_token_ids == before.completion_token_ids
    with pytest.raises(PolicyError, match=r"wrong shapes \['model.norm.weight \(3,\)"):
        engine.update_weights({**new, "model.norm.weight": torch.ones(3)})
    with pytest.raises(PolicyError, match=r"missing keys \['model.norm.weight'\]"):
        engine.update_weights({k: v for k, v in new.items() if k != "model.norm.weight"})
    assert engine.weights_version == 7
    again = await engine.generate(ask("same prompt", seed=3, max_tokens=12))
    assert again.completion_token_ids == before.completion_token_ids  # nothing half-loaded


async def test_context_exceeded_samples_nothing(tiny_model_dir: Path) -> None:
    async with LocalEngine(tiny_model_dir, max_context=64) as engine:
        fits = await engine.generate(ask("hi", seed=0, max_tokens=500))
        assert not fits.context_exceeded and fits.finish_reason in ("length", "stop")
        assert len(fits.prompt_token_ids) + len(fits.completion_token_ids) <= 64
        over = await engine.generate(ask("word " * 80, seed=0))
        assert over.context_exceeded and over.text == "" and not over.completion_token_ids
        assert engine.stats.requests == 1  # the second one never reached the model


async def test_cancelled_and_closed(tiny_model_dir: Path) -> None:
    engine = LocalEngine(tiny_model_dir)
    doomed = asyncio.create_task(engine.generate(ask("a", seed=0, max_tokens=1000)))
    kept = asyncio.create_task(engine.generate(ask("b", seed=1, max_tokens=20)))
    await until(lambda: engine.stats.decode_steps >= 2)
    doomed.cancel()
    assert len((await kept).completion_token_ids) == 20
    with pytest.raises(asyncio.CancelledError):
        await doomed
    await asyncio.sleep(0.05)
    steps = engine.stats.decode_steps
    await asyncio.sleep(0.05)
    assert engine.stats.decode_steps == steps  # the cancelled row stopped decoding
    pending = asyncio.create_task(engine.generate(ask("c", seed=2, max_tokens=1000)))
    await until(lambda: engine.stats.decode_steps > steps)
    await asyncio.to_thread(engine.close)
    with pytest.raises(PolicyError, match="closed"):
        await pending
    with pytest.raises(PolicyError, match="closed"):
        await engine.generate(ask("d"))


def test_the_race_samples_the_tempered_nucleus_distribution() -> None:
    """``sample``'s exponential race draws each token with its tempered probability, renormalised
    over the top-p nucleus, records the log-prob before truncation, and a seed draws the same
    token whatever else is in the batch."""
    from types import SimpleNamespace

    import torch

    from tempering.policy.batch import sample

    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 6000

    def draw(temperature: float, top_p: float, seeds: range = range(n)) -> tuple[
            torch.Tensor, torch.Tensor]:
        rows = [SimpleNamespace(request=SimpleNamespace(sampling=SimpleNamespace(
            temperature=temperature, top_p=top_p)), generator=torch.Generator().manual_seed(i))
            for i in seeds]
        return sample(p.log().expand(len(rows), 4).clone(), rows)  # type: ignore[arg-type]

    tokens, logprobs = draw(1.0, 1.0)
    assert torch.allclose(torch.bincount(tokens, minlength=4) / n, p, atol=0.025)
    assert torch.allclose(logprobs, p.log()[tokens])
    tokens, logprobs = draw(0.5, 1.0)  # p ** 2, renormalised
    assert torch.allclose(torch.bincount(tokens, minlength=4) / n, p ** 2 / (p ** 2).sum(),
                          atol=0.025)
    assert torch.allclose(logprobs, (p ** 2 / (p ** 2).sum()).log()[tokens])
    tokens, logprobs = draw(1.0, 0.8)  # 0.5 + 0.3 reach 0.8: the other two are cut
    freq = torch.bincount(tokens, minlength=4) / n
    assert freq[2:].sum() == 0 and abs(freq[0] - 0.625) < 0.025, freq
    assert torch.allclose(logprobs, p.log()[tokens])  # before truncation
    batch, _ = draw(1.0, 1.0, range(100))
    assert all(draw(1.0, 1.0, range(i, i + 1))[0].item() == batch[i] for i in range(0, 100, 7))
