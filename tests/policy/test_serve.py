"""PolicyServer over real HTTP on 127.0.0.1: the endpoints, bad requests, keep-alive,
concurrency, and the episodes it records and hands over."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from charpolicy import CharPolicy, call

from tempering.errors import ConfigError
from tempering.policy.base import GenerateRequest, Generation, Message, SamplingParams
from tempering.policy.openai import OpenAIPolicy
from tempering.policy.scripted import ScriptedPolicy
from tempering.serve.server import PolicyServer
from tempering.trajectory.schema import Status, Trajectory

TOKEN = "operator-chosen-secret-0123456789"


def auth(srv: PolicyServer) -> dict[str, str]:
    """The operator's header: what ending, reading episodes and publishing weights take."""
    return {"Authorization": f"Bearer {srv.token}"}


def chat(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "chars", "messages": [{"role": "user", "content": text}], **extra}


@pytest.fixture
async def server() -> AsyncIterator[tuple[PolicyServer, httpx.AsyncClient, list[Trajectory]]]:
    ended: list[Trajectory] = []

    async def store(trajectory: Trajectory) -> None:  # an async hand-over is awaited
        ended.append(trajectory)

    policy = CharPolicy([call("bash", command="ls"), "done"])
    async with PolicyServer(policy, on_trajectory=store, max_body_bytes=4096) as srv, \
            httpx.AsyncClient(base_url=srv.url, headers=auth(srv)) as http:
        yield srv, http, ended


async def test_health_models_and_unknown_paths(
        server: tuple[PolicyServer, httpx.AsyncClient, list[Trajectory]]) -> None:
    srv, http, _ = server
    assert srv.url.startswith("http://127.0.0.1:") and srv.port > 0
    health = await http.get(f"http://127.0.0.1:{srv.port}/health")
    assert health.json() == {"status": "ok", "policy": "chars", "episodes": 0}
    models = (await http.get("/models")).json()
    assert [m["id"] for m in models["data"]] == ["chars"]
    missing = await http.get("/nope")
    assert missing.status_code == 404 and "POST /v1/chat/completions" in missing.text
    wrong = await http.get("/chat/completions")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"


async def test_a_completion_in_openai_shape(
        server: tuple[PolicyServer, httpx.AsyncClient, list[Trajectory]]) -> None:
    _, http, _ = server
    answer = await http.post("/chat/completions", json=chat(logprobs=True, user="u1"))
    assert answer.status_code == 200
    assert answer.headers["x-weights-version"] == "7"
    assert answer.headers["x-tempering-episode"] == "u1"
    body = answer.json()
    assert body["object"] == "chat.completion" and body["model"] == "chars"
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [tool_call] = choice["message"]["tool_calls"]
    assert tool_call["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    assert [ord(ch) for ch in body["tempering"]["text"]] == choice["token_ids"]
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"]) == len("<user>hi\n")
    assert body["tempering"] == {**body["tempering"], "weights_version": 7,
                                 "prompt_reused": 0, "episode_id": "u1", "step": 0}
    without = (await http.post("/chat/completions", json=chat())).json()
    assert without["choices"][0]["logprobs"] is None  # only when asked for, as OpenAI does


@pytest.mark.parametrize(("body", "status", "says"), [
    (b"{not json", 400, "the body is not JSON"),
    (b"[1, 2]", 400, "must be a JSON object, not list"),
    (json.dumps({"model": "m"}).encode(), 400, "messages: Field required"),
    (json.dumps(chat() | {"messages": [{"role": "robot", "content": "x"}]}).encode(), 400,
     "messages[0].role: Input should be"),
    (json.dumps(chat(stream=True)).encode(), 400, "stream: true is not supported"),
    (json.dumps(chat(n=3)).encode(), 400, "n=3"),
    (json.dumps(chat(temperature=-1)).encode(), 400, "temperature: Input should be greater"),
    (json.dumps(chat("x" * 5000)).encode(), 413, "over the server's limit of 4096"),
])
async def test_bad_requests_are_refused_with_a_reason(
        server: tuple[PolicyServer, httpx.AsyncClient, list[Trajectory]], body: bytes,
        status: int, says: str) -> None:
    _, http, _ = server
    answer = await http.post("/chat/completions", content=body,
                             headers={"Content-Type": "application/json"})
    assert answer.status_code == status
    error = answer.json()["error"]
    assert says in error["message"] and error["type"] == "invalid_request_error"


async def test_one_connection_serves_many_requests(
        server: tuple[PolicyServer, httpx.AsyncClient, list[Trajectory]]) -> None:
    srv, _, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    body = json.dumps(chat()).encode()
    for _ in range(3):
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Connection: keep-alive" in head
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert json.loads(await reader.readexactly(length))["object"] == "chat.completion"
    writer.write(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 200 OK")  # then closed by the server
    writer.close()


async def test_requests_run_concurrently() -> None:
    async with PolicyServer(ScriptedPolicy([], delay_s=0.4)) as srv, \
            httpx.AsyncClient(base_url=srv.url, headers=auth(srv)) as http:
        start = time.perf_counter()
        answers = await asyncio.gather(*(http.post("/chat/completions", json=chat())
                                         for _ in range(8)))
        elapsed = time.perf_counter() - start
    assert all(a.status_code == 200 for a in answers)
    assert elapsed < 1.5  # one after another would take 3.2 s


async def test_the_episode_comes_from_header_extension_or_user(
        server: tuple[PolicyServer, httpx.AsyncClient, list[Trajectory]]) -> None:
    _, http, _ = server
    await http.post("/chat/completions", json=chat(user="c"),
                    headers={"X-Tempering-Episode": "a"})
    await http.post("/chat/completions", json=chat(user="c", tempering={"episode_id": "b"}))
    await http.post("/chat/completions", json=chat(user="c"))
    fresh = (await http.post("/chat/completions", json=chat())).json()["tempering"]["episode_id"]
    for episode in ("a", "b", "c", fresh):
        steps = (await http.get(f"/episodes/{episode}")).json()["steps"]
        assert len(steps) == 1, episode


async def test_a_client_prefix_must_agree_with_the_recorded_tokens(
        server: tuple[PolicyServer, httpx.AsyncClient, list[Trajectory]]) -> None:
    _, http, _ = server
    first = (await http.post("/chat/completions", json=chat(user="e"))).json()
    tokens = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    reply = first["choices"][0]["message"]
    messages = [{"role": "user", "content": "hi"}, reply,
                {"role": "tool", "content": "a.txt", "tool_call_id": "call_0"}]
    wrong = await http.post("/chat/completions", json={"messages": messages, "user": "e",
                                                       "tempering": {"prefix_token_ids": [1, 2],
                                                                     "prefix_messages": 2}})
    assert wrong.status_code == 400 and "disagree with episode 'e'" in wrong.text
    right = await http.post("/chat/completions", json={
        "messages": messages, "user": "e",
        "tempering": {"prefix_token_ids": tokens, "prefix_messages": 2}})
    assert right.status_code == 200 and right.json()["tempering"]["prompt_reused"] == len(tokens)


async def test_ending_an_episode_hands_its_trajectory_over(
        server: tuple[PolicyServer, httpx.AsyncClient, list[Trajectory]]) -> None:
    _, http, ended = server
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    first = (await http.post("/chat/completions", json={"messages": messages, "user": "ep"}))
    messages += [first.json()["choices"][0]["message"],
                 {"role": "tool", "content": "a.txt", "tool_call_id": "call_0"}]
    await http.post("/chat/completions", json={"messages": messages, "user": "ep"})
    bad = await http.post("/episodes/ep/end", json={"reward": 2})
    assert bad.status_code == 400 and "reward: Input should be less than or equal to 1" in bad.text
    end = await http.post("/episodes/ep/end", json={"reward": 0.5, "task_id": "t1",
                                                    "status": "model_error"})
    assert end.status_code == 200 and end.json()["steps"] == 2
    [trajectory] = ended
    assert trajectory.trajectory_id == end.json()["trajectory_id"]
    assert (trajectory.task_id, trajectory.policy, trajectory.status) == ("t1", "chars",
                                                                          Status.MODEL_ERROR)
    assert trajectory.system_prompt == "sys" and trajectory.instruction == "task"
    assert trajectory.reward is not None and trajectory.reward.components == {"external": 0.5}
    assert [s.action for s in trajectory.steps] == ["bash", "message"]
    assert trajectory.steps[0].observation == "a.txt"
    assert trajectory.steps[1].prompt_reused == len(trajectory.prompt_ids(0)) + len(
        trajectory.steps[0].completion_token_ids)
    assert all(s.loss_mask == [1] * len(s.completion_token_ids) for s in trajectory.steps)
    assert (await http.get("/episodes/ep")).status_code == 404  # forgotten
    assert (await http.post("/episodes/ep/end")).status_code == 404


class Publishable(ScriptedPolicy):
    """A policy that takes weights versions, recording what it was asked to load."""

    def __init__(self) -> None:
        super().__init__([])
        self.weights_version = 0
        self.loads: list[tuple[Path, int]] = []

    def update_weights(self, path: Path, version: int) -> int:
        self.loads.append((path, version))
        self.weights_version = version
        return version


async def test_no_token_no_forged_reward_no_weights(tmp_path: Path) -> None:
    # What a process of this machine without the token (an agent that reached loopback) tried:
    # end its episode with reward 1, read another's, publish zeroed weights far ahead.
    ended: list[Trajectory] = []
    policy = Publishable()
    zeros = tmp_path / "zeros.safetensors"
    zeros.write_bytes(b"\0" * 64)
    async with PolicyServer(policy, on_trajectory=ended.append) as srv, \
            httpx.AsyncClient(base_url=srv.url) as anyone:
        # Sampling needs no token: it is how clients (and agents) make episodes.
        assert (await anyone.post("/chat/completions", json=chat(user="ep"))).status_code == 200
        assert (await anyone.get("/weights")).json()["weights_version"] == 0
        attempts = {
            "none": {}, "wrong": {"Authorization": "Bearer " + "x" * len(srv.token)},
            "prefix": {"Authorization": f"Bearer {srv.token[:-1]}"},
            "basic": {"Authorization": f"Basic {srv.token}"},
            "bare": {"Authorization": srv.token},
        }
        for name, headers in attempts.items():
            for method, path, body in (
                    ("POST", "/episodes/ep/end", {"reward": 1.0, "task_id": "t"}),
                    ("GET", "/episodes/ep", None),
                    ("POST", "/weights", {"path": str(zeros), "version": 10 ** 9})):
                answer = await anyone.request(method, path, json=body, headers=headers)
                assert answer.status_code == 401, (name, path, answer.text)
                assert answer.headers["www-authenticate"] == "Bearer"
                message = answer.json()["error"]["message"]
                assert ("Authorization: Bearer <token>" in message if name == "none"
                        else "token" in message), message
        assert ended == [] and policy.loads == []
        assert (await anyone.get("/weights")).json()["weights_version"] == 0
        # The operator's token works, and the trainer's publish goes through.
        operator = auth(srv)
        assert (await anyone.post("/weights", json={"path": str(zeros), "version": 1},
                                  headers=operator)).status_code == 200
        end = await anyone.post("/episodes/ep/end", json={"reward": 0.0}, headers=operator)
        assert end.status_code == 200 and [t.reward_value for t in ended] == [0.0]
    assert policy.loads == [(zeros, 1)]


async def test_tokens_are_per_server_or_the_operators() -> None:
    async with PolicyServer(ScriptedPolicy([])) as a, PolicyServer(ScriptedPolicy([])) as b:
        assert a.token != b.token and len(a.token) >= 32
        async with httpx.AsyncClient(base_url=b.url, headers=auth(a)) as http:
            assert (await http.get("/episodes/x")).status_code == 401
    async with PolicyServer(ScriptedPolicy([]), token=TOKEN) as srv:
        assert srv.token == TOKEN
        async with httpx.AsyncClient(base_url=srv.url, headers=auth(srv)) as http:
            assert (await http.get("/episodes/x")).status_code == 404  # past the token
    with pytest.raises(ConfigError, match="at least 16"):
        PolicyServer(ScriptedPolicy([]), token="short")


async def test_idle_and_open_episodes_are_handed_over_as_infra_errors() -> None:
    ended: list[Trajectory] = []
    async with PolicyServer(ScriptedPolicy([]), on_trajectory=ended.append,
                            episode_ttl_s=0.2) as srv, \
            httpx.AsyncClient(base_url=srv.url, headers=auth(srv)) as http:
        await http.post("/chat/completions", json=chat(user="idle"))
        await asyncio.sleep(0.6)
        assert [t.status for t in ended] == [Status.INFRA_ERROR]
        assert "idle for more than episode_ttl_s=0.2 s" in (ended[0].error or "")
        assert (await http.get("/episodes/idle")).status_code == 404
        srv.episode_ttl_s = 3600
        await http.post("/chat/completions", json=chat(user="open"))
    assert len(ended) == 2 and "closed before the episode ended" in (ended[1].error or "")
    assert ended[1].reward is None and ended[1].finish_reason == "error"


def test_serve_help(capsys: pytest.CaptureFixture[str]) -> None:
    from tempering.cli import main

    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for word in ("--model", "--tiny", "--host", "--port", "--run-dir", "examples:"):
        assert word in out


# ---- the local engine behind the server ----

async def test_the_local_engine_behind_serve_answers_what_the_engine_samples(
        tiny_model_dir: Path) -> None:
    from tempering.policy.local import LocalEngine

    tools = [{"type": "function", "function": {
        "name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
    messages = [Message(role="system", content="You are an agent."),
                Message(role="user", content="List the files.")]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, seed=0)
    ended: list[Trajectory] = []
    async with LocalEngine(tiny_model_dir, max_batch=4) as engine, \
            PolicyServer(engine, on_trajectory=ended.append) as srv, \
            httpx.AsyncClient(base_url=srv.url, headers=auth(srv), timeout=60) as http:
        direct = await engine.generate(GenerateRequest(messages=messages, tools=tools,
                                                       sampling=greedy))
        answer = await http.post("/chat/completions", json={
            "model": "tiny", "messages": [m.to_openai() for m in messages], "tools": tools,
            "temperature": 0, "max_tokens": 12, "seed": 0, "logprobs": True, "user": "raw"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        [choice] = body["choices"]
        template = engine.tokenizer.apply_chat_template(
            [m.to_openai() for m in messages], tools=tools, tokenize=False,
            add_generation_prompt=True)
        assert body["prompt_token_ids"] == engine.tokenizer.encode(
            template, add_special_tokens=False) == direct.prompt_token_ids
        assert choice["token_ids"] == direct.completion_token_ids != []
        assert [t["logprob"] for t in choice["logprobs"]["content"]] == pytest.approx(
            direct.logprobs, abs=1e-4)
        assert body["tempering"]["text"] == direct.text == engine.tokenizer.decode(
            choice["token_ids"], skip_special_tokens=False)

        # A sampled multi-turn episode through the client: the prefix is extended, never
        # re-tokenised, and a weights update shows in the version of the next turn only.
        client = OpenAIPolicy(srv.url, "tiny")
        convo, tokens, gens = list(messages), [], []
        for turn in range(3):
            gen = await client.generate(GenerateRequest(
                messages=convo, tools=tools, episode_id="ep",
                sampling=SamplingParams(temperature=1.0, max_tokens=8, seed=turn),
                prefix_token_ids=tokens, prefix_messages=len(convo) - 1 if turn else 0))
            assert gen.prompt_reused == len(tokens)
            gens.append(gen)
            tokens = tokens + gen.prompt_token_ids + gen.completion_token_ids
            convo += [Message(role="assistant", content=gen.content, tool_calls=gen.tool_calls),
                      Message(role="user", content=f"observation {turn}")]
            if turn == 1:
                await asyncio.to_thread(engine.update_weights, engine.model.state_dict())
        await client.aclose()
        assert [g.weights_version for g in gens] == [0, 0, 1]
        assert (await http.post("/episodes/ep/end", json={"reward": 1})).status_code == 200
    [trajectory] = [t for t in ended if t.status == Status.OK]  # "raw" closed as infra_error
    assert [(s.prompt_token_ids, s.completion_token_ids, s.logprobs, s.weights_version)
            for s in trajectory.steps] == [
        (g.prompt_token_ids, g.completion_token_ids, g.logprobs, g.weights_version)
        for g in gens]
    sequence = trajectory.sequence()
    assert sequence is not None and sequence[0] == tokens


def test_tempering_serve_records_episodes_into_the_run_dir(tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from tempering.trajectory.store import TrajectoryStore

    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tempering.cli", "serve", "--model", str(tiny_model_dir),
         "--port", "0", "--run-dir", str(run_dir), "--served-model-name", "tiny"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TEMPERING_SERVE_TOKEN": TOKEN})
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # the base URL, once it listens
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), proc.stderr
        with httpx.Client(base_url=url, timeout=60,
                          headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            assert http.get("/models").json()["data"][0]["id"] == "tiny"
            answer = http.post("/chat/completions", json=chat(max_tokens=5),
                               headers={"X-Tempering-Episode": "cli"})
            assert answer.status_code == 200 and len(answer.json()["choices"][0]["token_ids"])
            http.post("/chat/completions", json=chat("left open", max_tokens=5))
            assert http.post("/episodes/cli/end", json={"reward": 0.25}).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    stored = sorted(TrajectoryStore(run_dir).read(), key=lambda t: t.status)
    assert [(t.status, t.reward_value, len(t.steps)) for t in stored] == [
        (Status.INFRA_ERROR, None, 1), (Status.OK, 0.25, 1)]  # the open one, on Ctrl-C
    assert stored[1].steps[0].completion_token_ids == answer.json()["choices"][0]["token_ids"]


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow): the default run keeps
# under 15 minutes
def test_tempering_serve_allow_weight_updates_loads_weights_beyond_loopback(
        tiny_model_dir: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    # On 0.0.0.0 the server refuses POST /v1/weights unless told otherwise by the flag; the
    # token is generated into --token-file.
    token_file = tiny_model_dir.parent / f"token-{os.getpid()}"
    token_file.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tempering.cli", "serve", "--model", str(tiny_model_dir),
         "--host", "0.0.0.0", "--port", "0", "--allow-weight-updates",
         "--token-file", str(token_file)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://0.0.0.0:"), proc.stderr
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        with httpx.Client(base_url=url.replace("0.0.0.0", "127.0.0.1"), timeout=60,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            before = http.get("/weights").json()
            assert before["updatable"] is True and before["weights_version"] == 0
            loaded = http.post("/weights", json={"path": str(tiny_model_dir), "version": 1})
            assert loaded.status_code == 200, loaded.text
            assert loaded.json()["weights_version"] == 1
            answer = http.post("/chat/completions", json=chat(max_tokens=2))
            assert answer.headers["x-weights-version"] == "1"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        token_file.unlink(missing_ok=True)
    assert proc.returncode == 0, err
    assert token not in err  # written to the file, not printed


# ---- retries: the recorded answer, replayed ----

class SlowChars(CharPolicy):
    def __init__(self, *args: Any, delay_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay_s = delay_s

    async def generate(self, request: GenerateRequest) -> Generation:
        await asyncio.sleep(self.delay_s)
        return await super().generate(request)


async def test_a_retried_request_gets_the_recorded_answer_and_records_nothing() -> None:
    policy = CharPolicy([call("bash", command="ls"), call("bash", command="cat a"), "done"])
    async with PolicyServer(policy) as srv, \
            httpx.AsyncClient(base_url=srv.url, headers=auth(srv)) as http:
        first = await http.post("/chat/completions", json=chat(user="r"))
        again = await http.post("/chat/completions", json=chat(user="r"))
        assert again.status_code == 200 and again.json() == first.json()  # same id, same tokens
        assert again.headers["x-tempering-replay"] == "true"
        assert "x-tempering-replay" not in first.headers and len(policy.requests) == 1

        # A retry of a continuing turn repeats its token prefix, which still agrees.
        tokens = first.json()["prompt_token_ids"] + first.json()["choices"][0]["token_ids"]
        turn = {"messages": chat()["messages"] + [
            first.json()["choices"][0]["message"],
            {"role": "tool", "content": "a.txt", "tool_call_id": "call_0"}], "user": "r",
            "tempering": {"prefix_token_ids": tokens, "prefix_messages": 2}}
        second = await http.post("/chat/completions", json=turn)
        retried = await http.post("/chat/completions", json=turn)
        assert retried.status_code == 200 and retried.json() == second.json()
        assert second.json()["tempering"]["prompt_reused"] == len(tokens)

        changed = await http.post("/chat/completions", json=turn | {"temperature": 0.5})
        assert changed.status_code == 409 and "a retry must repeat its request" in changed.text
        steps = (await http.get("/episodes/r")).json()["steps"]
    assert len(policy.requests) == 2
    assert [s["action"] for s in steps] == ["bash", "bash"] and steps[0]["observation"] == "a.txt"


async def test_a_client_that_times_out_and_retries_gets_the_one_sample() -> None:
    ended: list[Trajectory] = []
    policy = SlowChars([call("bash", command="ls")], delay_s=0.6)
    async with PolicyServer(policy, on_trajectory=ended.append) as srv, \
            OpenAIPolicy(srv.url, "chars", timeout_s=0.25, retries=6, backoff_s=0.01) as client:
        # Each attempt gives up after 0.25 s; the retries that come while the first is still
        # sampling wait for it, and one after it gets its answer: nothing is sampled twice.
        gen = await client.generate(GenerateRequest(
            messages=[Message(role="user", content="hi")], episode_id="slow"))
        async with httpx.AsyncClient(base_url=srv.url, headers=auth(srv)) as http:
            assert (await http.post("/episodes/slow/end")).status_code == 200
    assert len(policy.requests) == 1
    [trajectory] = ended
    [step] = trajectory.steps
    assert (step.prompt_token_ids, step.completion_token_ids) == (gen.prompt_token_ids,
                                                                  gen.completion_token_ids)


# ---- journaling into a trajectory store ----

def _journal_lines(run_dir: Path, trajectory_id: str) -> list[dict[str, Any]]:
    path = run_dir / "journal" / f"{trajectory_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_recorder_journals_each_step_once_it_is_final(tmp_path: Path) -> None:
    from tempering.trajectory.store import TrajectoryStore

    handed: list[Trajectory] = []
    with TrajectoryStore(tmp_path) as store:
        async with PolicyServer(CharPolicy([call("bash", command="ls"), "done"]),
                                recorder=store, on_trajectory=handed.append) as srv, \
                httpx.AsyncClient(base_url=srv.url, headers=auth(srv)) as http:
            first = await http.post("/chat/completions", json=chat(user="j"))
            tid = (await http.get("/episodes/j")).json()["trajectory_id"]
            assert [r["kind"] for r in _journal_lines(tmp_path, tid)] == ["begin"]  # not final
            messages = chat()["messages"] + [first.json()["choices"][0]["message"],
                                             {"role": "tool", "content": "a.txt"}]
            await http.post("/chat/completions", json={"messages": messages, "user": "j"})
            await http.post("/chat/completions", json={"messages": messages, "user": "j"})
            lines = _journal_lines(tmp_path, tid)
            assert [r["kind"] for r in lines] == ["begin", "step"]  # the retry adds nothing
            assert lines[0]["header"]["instruction"] == "hi"
            assert lines[1]["step"]["observation"] == "a.txt"
            assert lines[1]["step"]["completion_token_ids"] == first.json()["choices"][0][
                "token_ids"]
            end = await http.post("/episodes/j/end", json={"reward": 1, "task_id": "t"})
            assert end.json()["trajectory_id"] == tid
            assert not (tmp_path / "journal" / f"{tid}.jsonl").exists()  # stored: journal done
        [stored] = store.read()
    assert stored == handed[0] and stored.trajectory_id == tid
    assert [s.action for s in stored.steps] == ["bash", "message"] and stored.reward_value == 1


@pytest.mark.slow  # CI's slow half: the default run's 15 min budget
def test_a_killed_serve_leaves_its_open_episode_in_the_run_dir(tiny_model_dir: Path,
                                                                tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from tempering.trajectory.store import RECOVERED_ERROR, TrajectoryStore

    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tempering.cli", "serve", "--model", str(tiny_model_dir),
         "--port", "0", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})

    async def three_turns(url: str) -> list[Generation]:
        convo, tokens, gens = [Message(role="user", content="List the files.")], [], []
        async with OpenAIPolicy(url, "tiny") as client:
            for turn in range(3):
                gen = await client.generate(GenerateRequest(
                    messages=convo, episode_id="crash", prefix_token_ids=tokens,
                    prefix_messages=len(convo) - 1 if turn else 0,
                    sampling=SamplingParams(max_tokens=6, seed=turn)))
                gens.append(gen)
                tokens = tokens + gen.prompt_token_ids + gen.completion_token_ids
                convo += [Message(role="assistant", content=gen.content,
                                  tool_calls=gen.tool_calls),
                          Message(role="user", content=f"observation {turn}")]
        return gens

    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), "tempering serve did not start"
        gens = asyncio.run(three_turns(url))
    finally:
        proc.send_signal(signal.SIGKILL)  # no shutdown: only the journal can tell
        proc.wait(timeout=30)
    [recovered] = TrajectoryStore(run_dir).read()
    assert (recovered.status, recovered.error) == (Status.INFRA_ERROR, RECOVERED_ERROR)
    assert recovered.policy.startswith("local:") and recovered.instruction == "List the files."
    # Both steps whose observation had arrived; the third completion's had not.
    assert [(s.prompt_token_ids, s.completion_token_ids, s.logprobs, s.observation)
            for s in recovered.steps] == [
        (g.prompt_token_ids, g.completion_token_ids, g.logprobs, f"observation {turn}")
        for turn, g in enumerate(gens[:2])]
    assert recovered.steps[1].prompt_reused == len(gens[0].prompt_token_ids) + len(
        gens[0].completion_token_ids)
