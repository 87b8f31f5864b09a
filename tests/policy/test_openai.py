"""OpenAIPolicy over real HTTP on 127.0.0.1: against ``PolicyServer`` end to end, and against
small scripted loopback servers for what a real server does wrong (503s, silence, 400s) and
for vLLM's own response shape."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from charpolicy import CharPolicy, call, ids, render

from tempering.errors import PolicyError, PolicyTimeoutError
from tempering.policy.base import GenerateRequest, Generation, Message, SamplingParams
from tempering.policy.openai import OpenAIPolicy
from tempering.serve.server import PolicyServer
from tempering.trajectory.schema import Trajectory

HANG = None
Answer = tuple[int, dict[str, Any], dict[str, str]] | None


class Canned:
    """A loopback HTTP server that answers from a script; the last answer repeats."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Canned:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in head.split("\r\n")[1:] if line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((headers, json.loads(body)))
                answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
                if answer is HANG:
                    await asyncio.sleep(3600)
                    return
                status, payload, extra = answer
                data = json.dumps(payload).encode()
                more = "".join(f"{k}: {v}\r\n" for k, v in extra.items())
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\n{more}\r\n".encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def vllm_answer(content: str, completion: list[int], prompt: list[int],
                finish: str = "stop") -> tuple[int, dict[str, Any], dict[str, str]]:
    """A completion as vLLM (with return_token_ids, without a tool parser) sends it."""
    return 200, {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                             "tool_calls": []},
                     "logprobs": {"content": [{"token": "x", "logprob": -0.25 * (i + 1)}
                                              for i in range(len(completion))]},
                     "finish_reason": finish, "token_ids": completion}],
        "prompt_token_ids": prompt, "usage": {}}, {"X-Weights-Version": "12"}


def ask(text: str = "hi", **kwargs: Any) -> GenerateRequest:
    return GenerateRequest(messages=[Message(role="user", content=text)], **kwargs)


@pytest.fixture
async def served() -> AsyncIterator[tuple[CharPolicy, PolicyServer, list[Trajectory]]]:
    policy = CharPolicy([call("bash", command="ls -la"), "I see.", call("submit")])
    ended: list[Trajectory] = []
    async with PolicyServer(policy, on_trajectory=ended.append) as server:
        yield policy, server, ended


# ---- end to end through tempering serve ----

async def test_tokens_logprobs_version_and_tool_calls_survive_the_round_trip(
        served: tuple[CharPolicy, PolicyServer, list[Trajectory]]) -> None:
    policy, server, _ = served
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    request = ask("list files", tools=tools, episode_id="ep-1",
                  sampling=SamplingParams(temperature=0.5, seed=3, max_tokens=40, stop=["\n\n"]))
    async with OpenAIPolicy(server.url, "chars") as client:
        got = await client.generate(request)
    direct = await CharPolicy(policy.script).generate(request)
    assert got == direct  # every field: text, calls, token ids, log-probs, version
    assert got.tool_calls[0].name == "bash"
    assert json.loads(got.tool_calls[0].arguments) == {"command": "ls -la"}
    assert got.weights_version == 7 and got.finish_reason == "tool_calls"
    seen = policy.requests[0]
    assert seen.sampling == request.sampling and seen.tools == tools
    assert seen.episode_id == "ep-1"
    assert client.name == "openai:chars"


async def test_a_multi_turn_episode_reuses_the_prefix_and_the_server_records_what_was_sent(
        served: tuple[CharPolicy, PolicyServer, list[Trajectory]]) -> None:
    policy, server, ended = served
    messages = [Message(role="system", content="be brief"),
                Message(role="user", content="look around")]
    gens: list[Generation] = []
    tokens: list[int] = []
    async with OpenAIPolicy(server.url, "chars") as client:
        for turn in range(3):
            gen = await client.generate(GenerateRequest(
                messages=messages, episode_id="ep-2", prefix_token_ids=tokens,
                prefix_messages=len(messages) - 1 if turn else 0))
            gens.append(gen)
            assert gen.prompt_reused == len(tokens)  # nothing re-tokenised after turn 0
            tokens = tokens[:gen.prompt_reused] + gen.prompt_token_ids + gen.completion_token_ids
            messages = [*messages, Message(role="assistant", content=gen.content,
                                           tool_calls=gen.tool_calls)]
            messages.append(Message(role="tool", content=f"output {turn}",
                                    tool_call_id=gen.tool_calls[0].id) if gen.tool_calls
                            else Message(role="user", content="go on"))
        # The engine was handed the previous turn's tokens and told which messages they cover.
        req2, req3 = policy.requests[1:]
        assert (req2.prefix_messages, req3.prefix_messages) == (3, 5)
        assert req3.prefix_token_ids == tokens[:len(req3.prefix_token_ids)]
        assert tokens[:len(ids(render(messages[:2])))] == ids(render(messages[:2]))

        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {server.token}"}) as http:
            recorded = (await http.get(f"{server.url}/episodes/ep-2")).json()["steps"]
        assert [(s["prompt_reused"], s["prompt_token_ids"], s["completion_token_ids"],
                 s["logprobs"], s["weights_version"]) for s in recorded] == [
            (g.prompt_reused, g.prompt_token_ids, g.completion_token_ids, g.logprobs,
             g.weights_version) for g in gens]
        assert [s["observation"] for s in recorded] == ["output 0", "go on", ""]
        assert [s["action"] for s in recorded] == ["bash", "message", "submit"]

        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {server.token}"}) as http:
            end = await http.post(f"{server.url}/episodes/ep-2/end",
                                  json={"reward": 1.0, "task_id": "t"})
        assert end.status_code == 200
    [trajectory] = ended
    sequence = trajectory.sequence()
    assert sequence is not None and sequence[0] == tokens  # trains as one sequence


async def test_rewritten_history_is_rendered_afresh(
        served: tuple[CharPolicy, PolicyServer, list[Trajectory]]) -> None:
    _, server, _ = served
    async with OpenAIPolicy(server.url, "chars") as client:
        first = await client.generate(ask("one", episode_id="ep-3"))
        edited = [Message(role="user", content="one, edited"),
                  Message(role="assistant", content=first.content, tool_calls=first.tool_calls),
                  Message(role="tool", content="x")]
        second = await client.generate(GenerateRequest(messages=edited, episode_id="ep-3"))
    assert second.prompt_reused == 0
    assert second.prompt_token_ids == ids(render(edited))
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {server.token}"}) as http:
        steps = (await http.get(f"{server.url}/episodes/ep-3")).json()["steps"]
    assert [s["prompt_reused"] for s in steps] == [0, 0]
    assert steps[0]["observation"] == ""  # not attributed: the history it follows was rewritten


async def test_a_prompt_past_the_context_window_is_a_generation_not_an_error() -> None:
    async with PolicyServer(CharPolicy(["x"], context=20)) as server, \
            OpenAIPolicy(server.url, "chars") as client:
        gen = await client.generate(ask("a question longer than twenty characters"))
    assert gen.context_exceeded and gen.completion_token_ids == []


# ---- vLLM's shape, and servers that fail ----

async def test_vllm_shape_with_markup_in_the_content() -> None:
    text = 'Let me look. <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    async with Canned(vllm_answer(text, [5, 6, 7], [1, 2, 3, 4])) as canned, \
            OpenAIPolicy(canned.url, "m") as client:
        gen = await client.generate(ask(prefix_token_ids=[1, 2, 9], prefix_messages=0))
    assert gen.text == text and gen.content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in gen.tool_calls] == [("bash",
                                                                             {"command": "ls"})]
    assert gen.finish_reason == "tool_calls" and gen.tool_call_error is None
    assert gen.completion_token_ids == [5, 6, 7] and gen.logprobs == [-0.25, -0.5, -0.75]
    assert gen.weights_version == 12  # from the X-Weights-Version header
    assert gen.prompt_reused == 2 and gen.prompt_token_ids == [3, 4]  # shared with the prefix


async def test_malformed_markup_becomes_the_tool_call_error() -> None:
    async with Canned(vllm_answer("<tool_call>{nope</tool_call>", [1], [1])) as canned, \
            OpenAIPolicy(canned.url, "m") as client:
        gen = await client.generate(ask())
    assert gen.tool_calls == [] and gen.tool_call_error and "not valid JSON" in gen.tool_call_error


async def test_the_request_body_and_the_options_for_openai() -> None:
    answer = vllm_answer("ok", [], [])
    async with Canned(answer) as canned:
        async with OpenAIPolicy(canned.url, "m") as client:
            await client.generate(ask(episode_id="e", prefix_token_ids=[4], prefix_messages=1))
        async with OpenAIPolicy(canned.url, "gpt", api_key="sk-test", send_token_prefix=False,
                                return_token_ids=False, extra_body={"top_k": 5}) as hosted:
            await hosted.generate(ask())
    (h1, ours), (h2, plain) = canned.requests
    assert ours["tempering"] == {"episode_id": "e", "prefix_token_ids": [4],
                                 "prefix_messages": 1}
    assert ours["return_token_ids"] is True and ours["logprobs"] is True
    assert h1["x-tempering-episode"] == "e" and "authorization" not in h1
    assert "tempering" not in plain and "return_token_ids" not in plain
    assert plain["top_k"] == 5 and plain["model"] == "gpt"
    assert h2["authorization"] == "Bearer sk-test"


async def test_503s_and_429s_are_retried_until_an_answer() -> None:
    error = {"error": {"message": "overloaded"}}
    async with Canned((503, error, {}), (429, error, {"Retry-After": "0"}),
                      vllm_answer("fine", [1], [2])) as canned, \
            OpenAIPolicy(canned.url, "m", retries=3, backoff_s=0.01) as client:
        gen = await client.generate(ask())
    assert gen.text == "fine" and len(canned.requests) == 3


async def test_retries_give_up_with_the_last_status() -> None:
    async with Canned((503, {"error": {"message": "engine dead"}}, {})) as canned, \
            OpenAIPolicy(canned.url, "m", retries=2, backoff_s=0.01) as client:
        with pytest.raises(PolicyError, match="503 to 3 attempt.*engine dead"):
            await client.generate(ask())
    assert len(canned.requests) == 3


async def test_a_400_is_not_retried_and_names_url_status_and_message() -> None:
    async with Canned((400, {"error": {"message": "unknown tool 'x'"}}, {})) as canned, \
            OpenAIPolicy(canned.url, "m", retries=3, backoff_s=0.01) as client:
        with pytest.raises(PolicyError) as raised:
            await client.generate(ask())
    assert len(canned.requests) == 1
    assert f"{canned.url}/chat/completions answered 400: unknown tool 'x'" in str(raised.value)


async def test_a_server_that_never_answers_times_out() -> None:
    async with Canned(HANG) as canned, \
            OpenAIPolicy(canned.url, "m", timeout_s=0.3, retries=1, backoff_s=0.01) as client:
        start = time.perf_counter()
        with pytest.raises(PolicyTimeoutError, match="timeout_s=0.3 s") as raised:
            await client.generate(ask())
        elapsed = time.perf_counter() - start
    assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, PolicyError)
    assert len(canned.requests) == 2 and 0.6 <= elapsed < 2.0


async def test_nothing_listening_is_a_policy_error_after_the_retries() -> None:
    async with Canned() as canned:
        url = canned.url  # closed on exit: nothing listens there any more
    async with OpenAIPolicy(url, "m", retries=1, backoff_s=0.01) as client:
        with pytest.raises(PolicyError, match="cannot reach .* after 2 attempt"):
            await client.generate(ask())
