"""Publishing weights versions: a real LocalEngine on the tiny model in process, a real
PolicyServer over loopback HTTP, and small real HTTP servers that implement vLLM's and SGLang's
weight-reload endpoints and check the requests' shape (no vLLM or SGLang can run here)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from polling import until

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tempering.errors import ConfigError, PolicyError  # noqa: E402
from tempering.policy.base import GenerateRequest, Message, SamplingParams  # noqa: E402
from tempering.policy.local import LocalEngine  # noqa: E402
from tempering.policy.openai import OpenAIPolicy  # noqa: E402
from tempering.policy.scripted import ScriptedPolicy  # noqa: E402
from tempering.policy.weights import (  # noqa: E402
    EnginePublisher,
    Publishers,
    ServePublisher,
    SGLangPublisher,
    VLLMPublisher,
    WeightPublisher,
)
from tempering.serve.server import PolicyServer  # noqa: E402


def ask(text: str = "same prompt", **sampling: Any) -> GenerateRequest:
    return GenerateRequest(messages=[Message(role="user", content=text)],
                           sampling=SamplingParams(**{"seed": 3, "max_tokens": 12, **sampling}))


def perturbed(engine: LocalEngine, seed: int) -> dict[str, Any]:
    """New weights, as a learner's state dict (fresh tensors; lm_head is tied: left out)."""
    gen = torch.Generator().manual_seed(seed)
    return {k: p.detach() + 0.05 * torch.randn(p.shape, generator=gen)
            for k, p in engine.model.named_parameters()}


@pytest.fixture(scope="module")
def saved(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A save_pretrained directory of modified weights, as a learner's checkpoint."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    out = tmp_path_factory.mktemp("ckpt") / "version-1"
    model.save_pretrained(out)
    return out


# ---- in process ----

async def test_engine_publisher_swaps_between_completions_and_owns_its_tensors(
        engine: LocalEngine, tmp_path: Path) -> None:
    publisher = EnginePublisher(engine)
    assert isinstance(publisher, WeightPublisher) and publisher.version == 0
    before = await engine.generate(ask())
    new = perturbed(engine, 0)

    steps = engine.stats.decode_steps
    long = asyncio.create_task(engine.generate(ask("long", seed=4, max_tokens=150)))
    await until(lambda: engine.stats.decode_steps >= steps + 3)
    # publish runs off the loop: the completion in flight finishes on it meanwhile.
    publish = asyncio.create_task(publisher.publish(1, state=new))
    await until(lambda: engine._swaps_waiting > 0 or publish.done())
    queued = asyncio.create_task(engine.generate(ask()))
    await publish
    in_flight, after = await long, await queued
    assert in_flight.weights_version == 0 and len(in_flight.completion_token_ids) > 3
    assert after.weights_version == 1 == engine.weights_version == publisher.version
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)

    # Copied, not aliased: the learner training on (here: trashing) its tensors changes nothing.
    for tensor in new.values():
        tensor.zero_()
    again = await engine.generate(ask())
    assert again.logprobs == pytest.approx(after.logprobs, abs=1e-6)
    assert again.completion_token_ids == after.completion_token_ids

    with pytest.raises(ConfigError, match="cannot publish version 0 after version 1"):
        await publisher.publish(0, state=perturbed(engine, 1))
    with pytest.raises(ConfigError, match="needs state= .* or path="):
        await publisher.publish(2)
    assert engine.weights_version == 1

    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in engine.model.state_dict().items()
               if k != "lm_head.weight"}, tmp_path / "w.safetensors")
    await publisher.publish(1, path=tmp_path / "w.safetensors")  # the same version again: fine
    await publisher.publish(2, path=str(tmp_path / "w.safetensors"))
    assert (await engine.generate(ask())).weights_version == 2 == publisher.version
    with pytest.raises(PolicyError, match="no weights at"):
        await publisher.publish(3, path=tmp_path / "missing")
    assert publisher.version == 2 == engine.weights_version


# ---- tempering serve ----

def auth(server: PolicyServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token}"}


async def test_serve_publisher_loads_a_checkpoint_that_the_next_completion_carries(
        engine: LocalEngine, saved: Path) -> None:
    async with PolicyServer(engine) as server, \
            httpx.AsyncClient(base_url=server.url, headers=auth(server)) as http, \
            OpenAIPolicy(server.url, "tiny") as client:
        publisher = ServePublisher(server.url, token=server.token)
        assert await publisher.current() == 0 and publisher.version is None
        first = await http.post("/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert first.json()["tempering"]["weights_version"] == 0

        await publisher.publish(1, path=saved)
        got = (await http.get("/weights")).json()
        assert got == {"weights_version": 1, "policy": engine.name, "updatable": True}
        from safetensors.torch import load_file

        norm = load_file(saved / "model.safetensors")["model.norm.weight"]
        assert torch.equal(engine.model.state_dict()["model.norm.weight"], norm)
        answer = await http.post("/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert answer.json()["tempering"]["weights_version"] == 1
        assert answer.headers["x-weights-version"] == "1"
        assert (await client.generate(ask())).weights_version == 1

        # Errors say what the server said; the version stays where it was.
        with pytest.raises(PolicyError, match=r"answered 400: loading weights version 2 from "
                                              r".*missing failed: no weights at"):
            await publisher.publish(2, path=saved.parent / "missing")
        relative = await http.post("/weights", json={"path": "ckpt/v2", "version": 2})
        assert relative.status_code == 400 and "is relative" in relative.text
        older = await http.post("/weights", json={"path": str(saved), "version": 0})
        assert older.status_code == 409
        assert "version 0 is older than version 1" in older.json()["error"]["message"]
        bad = await http.post("/weights", json={"path": str(saved)})
        assert bad.status_code == 400 and "version: Field required" in bad.text
        with pytest.raises(ConfigError, match="cannot publish version 0 after version 1"):
            await publisher.publish(0, path=saved)
        with pytest.raises(ConfigError, match="loads weights from disk: publish version 2 with "
                                              "path="):
            await publisher.publish(2, state=perturbed(engine, 2))
        assert publisher.version == 1 == engine.weights_version == await publisher.current()


async def test_serve_refuses_weights_it_cannot_or_should_not_load(saved: Path) -> None:
    async with PolicyServer(ScriptedPolicy(["ok"], weights_version=3)) as server:
        with pytest.raises(PolicyError, match=r"400: the policy scripted \(ScriptedPolicy\) "
                                              "cannot load new weights"):
            await ServePublisher(server.url, token=server.token).publish(4, path=saved)
    # Beyond loopback the endpoint would let anyone make the server load files.
    async with PolicyServer(ScriptedPolicy(["ok"]), host="0.0.0.0") as server, \
            httpx.AsyncClient(headers=auth(server)) as http:
        url = f"http://127.0.0.1:{server.port}/v1/weights"
        refused = await http.post(url, json={"path": str(saved), "version": 1})
        assert refused.status_code == 403 and "beyond loopback" in refused.text
        assert (await http.get(url)).json()["updatable"] is False


# ---- vLLM and SGLang: their endpoints' shape, on a real HTTP server ----

class FakeServer:
    """A real HTTP server on 127.0.0.1 (stdlib, one thread per request) whose ``handle`` gets
    ``(method, path, query, body)`` and returns ``(status, JSON body)``; every call is kept."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, list[str]], Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                url = urlsplit(self.path)
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw) if raw else None
                fake.calls.append((self.command, url.path, parse_qs(url.query), body))
                status, out = fake.handle(self.command, url.path, parse_qs(url.query), body)
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = answer

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: Any) -> tuple[int, Any]:
        return 404, {"detail": "Not Found"}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def completion(self, text: str, **extra: Any) -> tuple[int, Any]:
        return 200, {"id": "x", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text},
             "finish_reason": "stop"}], **extra}


def checkpoint_error(path: Any) -> str | None:
    if not isinstance(path, str) or not Path(path).is_absolute():
        return f"weights path must be an absolute string, got {path!r}"
    if not list(Path(path).glob("*.safetensors")):
        return f"no safetensors weights under {path}"
    return None


class FakeVLLM(FakeServer):
    """vLLM's dev-mode routes: /pause?mode=wait, /collective_rpc, /resume; completions wait
    while paused and carry no version, as vLLM's."""

    def __init__(self, *, dev_mode: bool = True) -> None:
        super().__init__()
        self.dev_mode, self.reloads, self.running = dev_mode, 0, threading.Event()
        self.running.set()

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: Any) -> tuple[int, Any]:
        if (method, path) == ("POST", "/v1/chat/completions"):
            self.running.wait()  # a paused vLLM holds new requests until /resume
            return self.completion(f"weights {self.reloads}")
        if not self.dev_mode or method != "POST":
            return 404, {"detail": "Not Found"}
        if path == "/pause":
            if query != {"mode": ["wait"]}:
                return 400, {"error": f"expected mode=wait, got {query}"}
            self.running.clear()
            return 200, {"status": "paused"}
        if path == "/resume":
            self.running.set()
            return 200, {"status": "resumed"}
        if path == "/collective_rpc":
            kwargs = body.get("kwargs", {})
            if (body.get("method") != "reload_weights" or set(body) - {"method", "kwargs"}
                    or not all(isinstance(v, str) for v in kwargs.values())):
                return 400, {"detail": f"unexpected collective_rpc body {body}"}
            assert not self.running.is_set(), "reload_weights while serving mixes versions"
            if error := checkpoint_error(kwargs.get("weights_path")):
                return 500, {"detail": error}
            time.sleep(0.2)
            self.reloads += 1
            return 200, {"results": [None]}
        return 404, {"detail": "Not Found"}


class FakeSGLang(FakeServer):
    """SGLang's POST /update_weights_from_disk; completions carry metadata.weight_version."""

    FIELDS = {"model_path", "load_format", "abort_all_requests", "weight_version", "is_async",
              "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step",
              "flush_cache"}

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.weight_version, self.delay_s = "default", delay_s

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: Any) -> tuple[int, Any]:
        if (method, path) == ("POST", "/v1/chat/completions"):
            return self.completion("hi", metadata={"weight_version": self.weight_version})
        if (method, path) != ("POST", "/update_weights_from_disk"):
            return 404, {"detail": "Not Found"}
        if set(body) - self.FIELDS or not isinstance(body.get("weight_version"), str) \
                or body.get("abort_all_requests") is not False:
            return 422, {"detail": f"unexpected body {body}"}
        if error := checkpoint_error(body.get("model_path")):
            return 400, {"success": False, "message": f"Failed to update weights: {error}",
                         "num_paused_requests": 0}
        time.sleep(self.delay_s)
        self.weight_version = body["weight_version"]
        return 200, {"success": True, "message": "Succeeded to update model weights.",
                     "num_paused_requests": 0}


@pytest.fixture
def vllm() -> Iterator[FakeVLLM]:
    server = FakeVLLM()
    yield server
    server.running.set()
    server.close()


def client_of(server: FakeServer) -> OpenAIPolicy:
    return OpenAIPolicy(server.url + "/v1", "m", send_token_prefix=False, return_token_ids=False,
                        retries=0)


async def test_vllm_publisher_pauses_reloads_from_disk_and_resumes(
        vllm: FakeVLLM, saved: Path) -> None:
    async with client_of(vllm) as client:
        publisher = VLLMPublisher(vllm.url + "/v1", clients=[client])
        assert (await client.generate(ask())).weights_version == 0
        publish = asyncio.create_task(publisher.publish(1, path=saved))
        await until(lambda: not vllm.running.is_set())
        during = await client.generate(ask())  # held by the paused server, sampled by version 1
        await publish
        after = await client.generate(ask())
    assert [(m, p) for m, p, _, _ in vllm.calls if p != "/v1/chat/completions"] == [
        ("POST", "/pause"), ("POST", "/collective_rpc"), ("POST", "/resume")]
    [rpc] = [body for _, p, _, body in vllm.calls if p == "/collective_rpc"]
    assert rpc == {"method": "reload_weights", "kwargs": {"weights_path": str(saved)}}
    # vLLM says no version: the client stamps what it knew at sending, never a newer one.
    assert (during.content, during.weights_version) == ("weights 1", 0)
    assert (after.content, after.weights_version) == ("weights 1", 1)
    assert publisher.version == 1 == client.weights_version


async def test_vllm_publisher_leaves_a_failed_reload_paused_and_names_dev_mode(
        vllm: FakeVLLM, saved: Path, tmp_path: Path) -> None:
    client = client_of(vllm)
    publisher = VLLMPublisher(vllm.url, clients=[client])
    with pytest.raises(PolicyError, match=r"collective_rpc answered 500: no safetensors weights"
                                          r".*stays paused"):
        await publisher.publish(1, path=tmp_path)
    assert "/resume" not in [p for _, p, _, _ in vllm.calls] and not vllm.running.is_set()
    assert publisher.version is None and client.weights_version is None
    await publisher.publish(1, path=saved)  # publishing again recovers
    assert vllm.running.is_set() and client.weights_version == 1

    off = FakeVLLM(dev_mode=False)
    try:
        with pytest.raises(PolicyError, match="404: Not Found; .*VLLM_SERVER_DEV_MODE=1"):
            await VLLMPublisher(off.url).publish(1, path=saved)
    finally:
        off.close()


async def test_sglang_publisher_tags_the_version_its_answers_carry(saved: Path,
                                                                  tmp_path: Path) -> None:
    sglang = FakeSGLang()
    try:
        async with client_of(sglang) as client:  # not handed to the publisher: SGLang says it
            publisher = SGLangPublisher(sglang.url + "/v1/")
            assert (await client.generate(ask())).weights_version == 0  # "default"
            await publisher.publish(3, path=saved)
            assert sglang.calls[-1][3] == {"model_path": str(saved), "weight_version": "3",
                                           "abort_all_requests": False}
            assert (await client.generate(ask())).weights_version == 3
            with pytest.raises(PolicyError, match="answered 400: Failed to update weights: no "
                                                  "safetensors"):
                await publisher.publish(4, path=tmp_path)
            assert publisher.version == 3 and sglang.weight_version == "3"
    finally:
        sglang.close()


# ---- several engines ----

async def test_publishers_fan_out_concurrently_and_name_the_engine_that_failed(
        engine: LocalEngine, saved: Path) -> None:
    slow = [FakeSGLang(delay_s=0.5), FakeSGLang(delay_s=0.5)]
    try:
        both = Publishers([SGLangPublisher(s.url, name=f"sglang{i}") for i, s in enumerate(slow)])
        started = time.monotonic()
        await both.publish(1, path=saved)
        assert time.monotonic() - started < 0.9  # side by side, not one after the other
        assert [s.weight_version for s in slow] == ["1", "1"] and both.version == 1

        async with PolicyServer(ScriptedPolicy(["ok"])) as server:
            local = EnginePublisher(engine)
            served = ServePublisher(server.url, token=server.token, name="scripted-server")
            mixed = Publishers([served, local])
            assert mixed.version == 0
            with pytest.raises(PolicyError, match=r"version 1 failed on 1 of 2 engine\(s\): "
                                                  r"scripted-server: PolicyError: .*400.*"
                                                  r"\(1 other\(s\) serve version 1\)"):
                await mixed.publish(1, state=perturbed(engine, 0), path=saved)
            # The failure waited for the others: the engine took the state dict, no disk.
            assert local.version == 1 == engine.weights_version and mixed.version == 0
            with pytest.raises(ConfigError, match="cannot publish version 0 after version 1"):
                await both.publish(0, path=saved)
    finally:
        for s in slow:
            s.close()
    with pytest.raises(ConfigError, match="at least one"):
        Publishers([])
