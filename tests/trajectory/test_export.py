"""Exports read back as their consumers read them: json per line, datasets.load_from_disk, and
ATIF checked field by field against harbor's RFC (ATIF-v1.4)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tempering.errors import ConfigError
from tempering.reward.result import RewardResult
from tempering.trajectory.export import (
    ATIF_VERSION,
    atif_document,
    to_atif,
    to_hf_dataset,
    to_sft_jsonl,
)
from tempering.trajectory.schema import Status, Step, Trajectory
from tempering.trajectory.toolcalls import render_tool_call

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}},
         {"type": "function", "function": {"name": "submit", "description": "finish",
                                           "parameters": {"type": "object", "properties": {}}}}]


def sampled() -> Trajectory:
    """Three turns with exact tokens, each prompt extending the last: a call, a malformed call
    and its error, a submit."""
    steps = [
        Step(index=0, text="Let me look. " + render_tool_call("bash", {"command": "ls"}),
             action="bash", tool_call_id="call_a", arguments='{"command": "ls"}',
             observation="a.py\n", exit_code=0, prompt_token_ids=[1, 2, 3],
             completion_token_ids=[10, 11], logprobs=[-0.1, -0.2], loss_mask=[1, 1],
             weights_version=3, policy_s=0.5, action_s=0.25),
        Step(index=1, text='<tool_call>{"name": "bash"', action="invalid",
             observation="Error: tool call 1 is missing its closing </tool_call>",
             error="tool call 1 is missing its closing </tool_call>", prompt_reused=5,
             prompt_token_ids=[4, 5], completion_token_ids=[12, 13, 14],
             logprobs=[-0.3, -0.4, -0.5], loss_mask=[1, 1, 1], weights_version=3),
        Step(index=2, text=render_tool_call("submit", {}), action="submit",
             tool_call_id="call_c", arguments="{}", observation="", prompt_reused=10,
             prompt_token_ids=[6], completion_token_ids=[15], logprobs=[-0.6], loss_mask=[1],
             weights_version=4),
    ]
    return Trajectory(task_id="median", group_id="g", policy="local:tiny/model",
                      system_prompt="You are a careful engineer.", instruction="Fix median().",
                      tools=json.dumps(TOOLS), steps=steps, marks=["recovered"],
                      started_at=1_760_000_000.0,
                      reward=RewardResult(reward=1.0, components={"tests": 1.0}, tests_passed=3,
                                          tests_total=3, flags=[]))


def scripted(reward: float | None = 0.0, status: Status = Status.OK) -> Trajectory:
    """No tokens (a scripted policy), a plain text turn answered by the harness, a failure."""
    steps = [Step(index=0, text="thinking out loud", action="message",
                  observation="Please call a tool."),
             Step(index=1, text=render_tool_call("bash", {"command": "false"}), action="bash",
                  tool_call_id="call_1", arguments='{"command": "false"}', observation="",
                  exit_code=1)]
    grade = None if reward is None else RewardResult(
        reward=reward, components={"tests": reward}, tests_passed=0, tests_total=3, flags=[])
    return Trajectory(task_id="median", instruction="Fix median().", steps=steps,
                      status=status, reward=grade, policy="scripted")


def check_chat(messages: list[dict[str, Any]]) -> None:
    """system? user, then per turn an assistant and, for a call, the tool answer to that call."""
    roles = [m["role"] for m in messages]
    start = 1 if roles[0] == "system" else 0
    assert roles[start] == "user"
    i = start + 1
    while i < len(messages):
        assistant = messages[i]
        assert assistant["role"] == "assistant"
        calls = assistant.get("tool_calls") or []
        if calls:
            answer = messages[i + 1]
            assert answer["role"] == "tool"
            assert answer["tool_call_id"] == calls[0]["id"]
            assert calls[0]["type"] == "function"
            json.loads(calls[0]["function"]["arguments"])
            i += 2
        else:
            i += 2 if i + 1 < len(messages) and messages[i + 1]["role"] == "user" else 1


def test_sft_jsonl_reads_back_as_alternating_chat(tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    traj = sampled()
    assert to_sft_jsonl([traj, scripted()], path) == 2
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        check_chat(row["messages"])
    first = rows[0]
    assert [m["role"] for m in first["messages"]] == [
        "system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool"]
    call = first["messages"][2]
    assert call["content"] == "Let me look."  # markup out of content, into tool_calls
    assert call["tool_calls"] == [{"id": "call_a", "type": "function", "function": {
        "name": "bash", "arguments": '{"command": "ls"}'}}]
    assert first["messages"][3]["content"] == "a.py\n"
    # the malformed call: raw text as the assistant's turn, the error as the user's answer
    assert first["messages"][4]["content"] == '<tool_call>{"name": "bash"'
    assert "tool_calls" not in first["messages"][4]
    assert first["messages"][5] == {"role": "user", "content": "Error: tool call 1 is missing "
                                    "its closing </tool_call>"}
    assert first["tools"] == TOOLS
    assert first["metadata"] == {"trajectory_id": traj.trajectory_id, "task_id": "median",
                                 "group_id": "g", "policy": "local:tiny/model", "reward": 1.0,
                                 "status": "ok", "finish_reason": "submit",
                                 "marks": ["recovered"]}
    second = rows[1]
    assert [m["role"] for m in second["messages"]] == [
        "user", "assistant", "user", "assistant", "tool"]
    assert second["tools"] == []


def test_sft_selection(tmp_path: Path) -> None:
    batch = [sampled(), scripted(0.5), scripted(None, Status.INFRA_ERROR),
             scripted(1.0, Status.MODEL_TIMEOUT)]
    path = tmp_path / "out" / "sft.jsonl"
    assert to_sft_jsonl(batch, path, only_successful=True) == 1
    assert to_sft_jsonl(batch, path, min_reward=0.5) == 3
    statuses = [json.loads(line)["metadata"]["status"] for line in path.read_text().splitlines()]
    assert statuses == ["ok", "ok", "model_timeout"]
    assert to_sft_jsonl([], path) == 0 and path.read_text() == ""
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_hf_dataset_loads_with_rows_and_tokens(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    traj, plain = sampled(), scripted()
    assert to_hf_dataset([traj, plain], tmp_path / "ds") == 2
    ds = datasets.load_from_disk(str(tmp_path / "ds"))
    assert ds.num_rows == 2
    assert {"messages", "tools", "metadata", "prompt_ids", "completion_ids", "completion_mask",
            "completion_logprobs", "completion_versions"} <= set(ds.column_names)
    row = ds[0]
    assert row["metadata"]["trajectory_id"] == traj.trajectory_id
    assert row["metadata"]["reward"] == 1.0 and ds[1]["metadata"]["reward"] == 0.0
    assert json.loads(row["tools"]) == TOOLS
    ids, mask, logprobs, versions = traj.sequence()  # type: ignore[misc]
    assert row["prompt_ids"] == [1, 2, 3] == ids[:3]
    assert row["completion_ids"] == [10, 11, 4, 5, 12, 13, 14, 6, 15] == ids[3:]
    assert row["completion_mask"] == [1, 1, 0, 0, 1, 1, 1, 0, 1] == mask[3:]
    assert row["completion_logprobs"] == pytest.approx(logprobs[3:])
    assert row["completion_versions"] == [3, 3, -1, -1, 3, 3, 3, -1, 4] == versions[3:]
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant",
                     "tool"]
    assert row["messages"][3]["tool_call_id"] == row["messages"][2]["tool_calls"][0]["id"]
    # no tokens recorded: empty columns, same conversation
    assert ds[1]["prompt_ids"] == [] and ds[1]["completion_ids"] == []
    assert [m["role"] for m in ds[1]["messages"]] == ["user", "assistant", "user", "assistant",
                                                      "tool"]
    with pytest.raises(ConfigError, match="1 given, none passed the selection"):
        to_hf_dataset([plain], tmp_path / "ok", only_successful=True)
    assert to_hf_dataset([traj, plain], tmp_path / "ok", only_successful=True) == 1
    assert datasets.load_from_disk(str(tmp_path / "ok")).num_rows == 1


# ---- ATIF: the RFC's schema (harbor docs/rfcs/0001-trajectory-format.md, v1.4) ----

ROOT = {"schema_version", "session_id", "agent", "steps", "notes", "final_metrics", "extra"}
ROOT_REQUIRED = {"schema_version", "session_id", "agent", "steps"}
AGENT = {"name", "version", "model_name", "extra"}
FINAL = {"total_prompt_tokens", "total_completion_tokens", "total_cached_tokens",
         "total_cost_usd", "total_steps", "extra"}
STEP = {"step_id", "timestamp", "source", "model_name", "reasoning_effort", "message",
        "reasoning_content", "tool_calls", "observation", "metrics", "extra"}
AGENT_ONLY = {"model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"}
METRICS = {"prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd",
           "prompt_token_ids", "completion_token_ids", "logprobs", "extra"}
RESULT = {"source_call_id", "content", "subagent_trajectory_ref"}


def validate_atif(doc: dict[str, Any]) -> None:
    assert ROOT_REQUIRED <= set(doc) <= ROOT, set(doc) ^ ROOT
    assert doc["schema_version"] == "ATIF-v1.4"
    assert isinstance(doc["session_id"], str) and doc["session_id"]
    agent = doc["agent"]
    assert {"name", "version"} <= set(agent) <= AGENT
    assert isinstance(agent["name"], str) and isinstance(agent["version"], str)
    assert set(doc.get("final_metrics", {})) <= FINAL
    assert [s["step_id"] for s in doc["steps"]] == list(range(1, len(doc["steps"]) + 1))
    for step in doc["steps"]:
        assert set(step) <= STEP and {"step_id", "source", "message"} <= set(step)
        assert step["source"] in ("system", "user", "agent")
        assert isinstance(step["message"], str)
        if step["source"] != "agent":
            assert not AGENT_ONLY & set(step), step
        if step["source"] == "user":
            assert "observation" not in step
        if "timestamp" in step:
            datetime.fromisoformat(step["timestamp"])
        call_ids = set()
        for call in step.get("tool_calls", []):
            assert set(call) == {"tool_call_id", "function_name", "arguments"}
            assert isinstance(call["arguments"], dict)
            call_ids.add(call["tool_call_id"])
        if "observation" in step:
            assert set(step["observation"]) == {"results"}
            for result in step["observation"]["results"]:
                assert set(result) <= RESULT
                if result.get("source_call_id") is not None:
                    assert result["source_call_id"] in call_ids
        metrics = step.get("metrics", {})
        assert set(metrics) <= METRICS
        if "completion_token_ids" in metrics:
            assert len(metrics["completion_token_ids"]) == metrics["completion_tokens"]
        if "logprobs" in metrics:
            assert len(metrics["logprobs"]) == metrics["completion_tokens"]
        if "prompt_token_ids" in metrics:
            assert len(metrics["prompt_token_ids"]) == metrics["prompt_tokens"]


def test_atif_files_follow_the_spec(tmp_path: Path) -> None:
    traj, plain = sampled(), scripted()
    paths = to_atif([traj, plain], tmp_path / "atif", prompt_token_ids=True)
    assert [p.name for p in paths] == [f"{traj.trajectory_id}.json", f"{plain.trajectory_id}.json"]
    docs = [json.loads(p.read_text()) for p in paths]
    for doc in docs:
        validate_atif(doc)
    doc = docs[0]
    assert doc["session_id"] == traj.trajectory_id and ATIF_VERSION == doc["schema_version"]
    assert doc["agent"]["model_name"] == "tiny/model"
    assert [s["source"] for s in doc["steps"]] == ["system", "user", "agent", "agent", "agent"]
    call = doc["steps"][2]
    assert call["message"] == "Let me look."
    assert call["tool_calls"] == [{"tool_call_id": "call_a", "function_name": "bash",
                                   "arguments": {"command": "ls"}}]
    assert call["observation"] == {"results": [{"source_call_id": "call_a", "content": "a.py\n"}]}
    assert call["metrics"]["completion_token_ids"] == [10, 11]
    assert call["metrics"]["logprobs"] == [-0.1, -0.2]
    assert call["timestamp"].startswith("2025-10-09T")
    invalid = doc["steps"][3]
    assert "tool_calls" not in invalid and invalid["message"] == '<tool_call>{"name": "bash"'
    assert invalid["observation"]["results"][0]["content"].startswith("Error:")
    assert invalid["metrics"]["prompt_token_ids"] == traj.prompt_ids(1) == [1, 2, 3, 10, 11, 4, 5]
    assert doc["final_metrics"]["total_completion_tokens"] == 6
    assert doc["final_metrics"]["total_prompt_tokens"] == 3 + 7 + 11
    assert doc["final_metrics"]["total_steps"] == 5
    assert doc["extra"]["reward"]["reward"] == 1.0 and doc["extra"]["status"] == "ok"
    assert doc["extra"]["marks"] == ["recovered"]
    # without tokens: no metrics at all, and no prompt ids unless asked for
    assert all("metrics" not in s for s in docs[1]["steps"])
    assert "prompt_token_ids" not in atif_document(traj)["steps"][2]["metrics"]
