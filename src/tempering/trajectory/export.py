"""Trajectories out as training and interchange data: SFT chat JSONL, a Hugging Face dataset, ATIF.

All three read the same conversation off a ``Trajectory`` (``chat_messages``): the system prompt,
the instruction as the user's turn, then per step the assistant's turn and what it was shown.

- A step that called a tool is an assistant message with its content (the completion outside
  the ``<tool_call>`` markup) and the call in the OpenAI format, answered by a ``tool`` message
  carrying the observation and the same ``tool_call_id``. Every call is answered, even by an
  empty observation, so the pairs always match.
- A step whose call was malformed (action ``invalid``) has no call to answer: its raw completion,
  markup and all, is the assistant's content, and the error observation follows as a ``user``
  message, which is how the model saw it. Fine-tuning on these rows teaches the correction that
  follows, not the malformed call; drop them first (``only_successful``) if that is unwanted.
- A turn without a tool call (action ``message``) is assistant content, followed by a ``user``
  message when the harness answered it.

``to_sft_jsonl`` writes one ``{"messages", "tools", "metadata"}`` object per line.
``to_hf_dataset`` saves the same records (``tools`` as JSON text: Arrow needs one schema per
column, and tool schemas differ) with token columns from ``Trajectory.sequence()``: the first
turn's prompt as ``prompt_ids``, everything after it as ``completion_ids`` with its loss mask,
log-probs and weights versions; empty lists when no tokens were recorded or the turns were
re-rendered (``sequence()`` is None). ``datasets`` is imported only there.

``to_atif`` writes one JSON file per trajectory in the Agent Trajectory Interchange Format of
harbor, version ATIF-v1.4 (harbor's RFC ``docs/rfcs/0001-trajectory-format.md``, v1.4: token ids
and log-probs in step ``metrics``). Required fields are always present: ``schema_version``,
``session_id`` (the trajectory id), ``agent.name``/``agent.version``, ``steps`` with ``step_id``
from 1, ``source`` and ``message``; ``tool_calls`` carry ``tool_call_id``, ``function_name`` and
``arguments`` as an object, and each observation result names its call in ``source_call_id``.
What ATIF has no field for (status, reward, marks, exit codes) goes under ``extra``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tempering.errors import ConfigError
from tempering.trajectory.schema import Status, Step, Trajectory

ATIF_VERSION = "ATIF-v1.4"


# ---- the conversation ----

def _content(step: Step) -> str:
    """The completion without its tool-call markup (what an OpenAI server puts in content)."""
    from tempering.trajectory.toolcalls import parse_tool_calls

    return parse_tool_calls(step.text).content


def _call_id(step: Step) -> str:
    return step.tool_call_id or f"call_{step.index}"


def _is_call(step: Step) -> bool:
    return step.action not in ("invalid", "message", "")


def chat_messages(t: Trajectory) -> list[dict[str, Any]]:
    """The episode as OpenAI chat messages (see the module docstring for each kind of step)."""
    messages: list[dict[str, Any]] = []
    if t.system_prompt:
        messages.append({"role": "system", "content": t.system_prompt})
    messages.append({"role": "user", "content": t.instruction})
    for step in t.steps:
        if _is_call(step):
            messages.append({"role": "assistant", "content": _content(step), "tool_calls": [{
                "id": _call_id(step), "type": "function",
                "function": {"name": step.action, "arguments": step.arguments or "{}"}}]})
            messages.append({"role": "tool", "content": step.observation,
                             "tool_call_id": _call_id(step), "name": step.action})
        else:
            raw = step.text if step.action == "invalid" else _content(step)
            messages.append({"role": "assistant", "content": raw})
            if step.observation:
                messages.append({"role": "user", "content": step.observation})
    return messages


def parse_tools(t: Trajectory) -> list[dict[str, Any]]:
    """``Trajectory.tools`` (OpenAI tools JSON text) as a list; [] when none were recorded."""
    if not t.tools.strip():
        return []
    try:
        tools = json.loads(t.tools)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"trajectory {t.trajectory_id}: tools is not JSON ({exc.msg}): "
                          f"{t.tools[:80]!r}") from None
    if not isinstance(tools, list):
        raise ConfigError(f"trajectory {t.trajectory_id}: tools must be a JSON list of OpenAI "
                          f"tools, not {type(tools).__name__}")
    return tools


def metadata(t: Trajectory) -> dict[str, Any]:
    return {"trajectory_id": t.trajectory_id, "task_id": t.task_id, "group_id": t.group_id,
            "policy": t.policy, "reward": t.reward_value, "status": t.status.value,
            "finish_reason": t.finish_reason, "marks": list(t.marks)}


def sft_record(t: Trajectory) -> dict[str, Any]:
    """One SFT row: ``{"messages", "tools", "metadata"}``."""
    return {"messages": chat_messages(t), "tools": parse_tools(t), "metadata": metadata(t)}


def select(trajs: Iterable[Trajectory], *, only_successful: bool = False,
           min_reward: float | None = None) -> Iterator[Trajectory]:
    """The trajectories an export keeps: with ``only_successful``, status ok and full reward
    (1.0); with ``min_reward``, graded at or above it. Ungraded ones fail either test."""
    for t in trajs:
        r = t.reward_value
        if only_successful and (t.status is not Status.OK or r is None or r < 1.0 - 1e-9):
            continue
        if min_reward is not None and (r is None or r < min_reward):
            continue
        yield t


def _write_atomically(path: Path, lines: Iterable[str]) -> None:
    """Readers never see half a file: write beside it, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(lines)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def to_sft_jsonl(trajs: Iterable[Trajectory], path: str | Path, *, only_successful: bool = False,
                 min_reward: float | None = None) -> int:
    """Write one chat-format JSON line per selected trajectory; returns how many."""
    count = 0

    def lines() -> Iterator[str]:
        nonlocal count
        for t in select(trajs, only_successful=only_successful, min_reward=min_reward):
            count += 1
            yield json.dumps(sft_record(t), ensure_ascii=False) + "\n"

    _write_atomically(Path(path), lines())
    return count


# ---- Hugging Face datasets ----

def token_columns(t: Trajectory) -> dict[str, list[int] | list[float]]:
    """The episode's training sequence split after the first turn's prompt."""
    seq = t.sequence()
    ids, mask, logprobs, versions = seq if seq is not None else ([], [], [], [])
    first = next((s for s in t.steps if s.prompt_token_ids or s.completion_token_ids), None)
    n = len(first.prompt_token_ids) if first is not None and ids else 0
    return {"prompt_ids": ids[:n], "completion_ids": ids[n:], "completion_mask": mask[n:],
            "completion_logprobs": logprobs[n:], "completion_versions": versions[n:]}


def _hf_features(ds: Any) -> Any:
    string, call = ds.Value("string"), {"id": ds.Value("string"), "type": ds.Value("string"),
                                        "function": {"name": ds.Value("string"),
                                                     "arguments": ds.Value("string")}}
    return ds.Features({
        "messages": [{"role": string, "content": string, "tool_calls": [call],
                      "tool_call_id": string, "name": string}],
        "tools": string,
        "metadata": {"trajectory_id": string, "task_id": string, "group_id": string,
                     "policy": string, "reward": ds.Value("float64"), "status": string,
                     "finish_reason": string, "marks": [string]},
        "prompt_ids": [ds.Value("int64")], "completion_ids": [ds.Value("int64")],
        "completion_mask": [ds.Value("int8")], "completion_logprobs": [ds.Value("float32")],
        "completion_versions": [ds.Value("int64")],
    })


def hf_record(t: Trajectory) -> dict[str, Any]:
    """One dataset row: the SFT record, every message with all five keys, plus tokens."""
    record = sft_record(t)
    record["messages"] = [{"role": m["role"], "content": m["content"],
                           "tool_calls": m.get("tool_calls", []),
                           "tool_call_id": m.get("tool_call_id", ""), "name": m.get("name", "")}
                          for m in record["messages"]]
    record["tools"] = json.dumps(record["tools"])
    return record | token_columns(t)


def to_hf_dataset(trajs: Iterable[Trajectory], path: str | Path, *,
                  only_successful: bool = False, min_reward: float | None = None) -> int:
    """Save the selected trajectories as a ``datasets.Dataset`` (``save_to_disk``); returns how
    many rows (at least one: ``ConfigError`` when nothing is selected). Load it back with
    ``datasets.load_from_disk(path)``."""
    import importlib

    try:
        ds = importlib.import_module("datasets")
    except ModuleNotFoundError:
        raise ConfigError("the Hugging Face export needs the `datasets` package: "
                          "pip install 'datasets>=2.19' (or install tempering[dev])") from None
    given = list(trajs)
    rows = [hf_record(t) for t in select(given, only_successful=only_successful,
                                         min_reward=min_reward)]
    if not rows:  # datasets saves an empty table it cannot load back: say so now instead
        raise ConfigError(f"no trajectory to export: {len(given)} given, none passed the "
                          "selection (only_successful / min_reward); a Hugging Face dataset "
                          "needs at least one row")
    dataset = ds.Dataset.from_list(rows, features=_hf_features(ds))
    dataset.save_to_disk(str(path))
    return len(rows)


# ---- ATIF ----

def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _model_name(policy: str) -> str:
    """``local:Qwen/Qwen3-0.6B`` -> ``Qwen/Qwen3-0.6B``; the policy name when it has no kind."""
    return policy.split(":", 1)[1] if ":" in policy else policy


def _arguments_object(step: Step) -> dict[str, Any]:
    try:
        args = json.loads(step.arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return args if isinstance(args, dict) else {}


def _metrics(t: Trajectory, i: int, step: Step, prompt_token_ids: bool) -> dict[str, Any] | None:
    if not (step.prompt_token_ids or step.completion_token_ids or step.prompt_reused):
        return None  # nothing was sampled with tokens (a scripted or text-only policy)
    metrics: dict[str, Any] = {"completion_tokens": len(step.completion_token_ids),
                               "completion_token_ids": list(step.completion_token_ids)}
    try:
        prompt = t.prompt_ids(i)
    except ValueError:  # the stored prefix does not line up: leave the prompt out, not wrong
        prompt = None
    if prompt is not None:
        metrics["prompt_tokens"] = len(prompt)
        if prompt_token_ids:
            metrics["prompt_token_ids"] = prompt
    if step.logprobs:
        metrics["logprobs"] = list(step.logprobs)
    metrics["extra"] = {"prompt_reused": step.prompt_reused, "loss_mask": list(step.loss_mask),
                        "weights_version": step.weights_version}
    return metrics


def atif_document(t: Trajectory, *, prompt_token_ids: bool = False) -> dict[str, Any]:
    """One trajectory as an ATIF-v1.4 object. ``prompt_token_ids`` adds each turn's full prompt
    (as v1.4 defines it: history included), which grows with the square of the turns."""
    from tempering import __version__

    steps: list[dict[str, Any]] = []
    if t.system_prompt:
        steps.append({"source": "system", "message": t.system_prompt})
    steps.append({"source": "user", "message": t.instruction})
    clock = t.started_at
    total_prompt = total_completion = 0
    for i, step in enumerate(t.steps):
        clock += step.policy_s
        out: dict[str, Any] = {"source": "agent", "message": step.text if step.action ==
                               "invalid" else _content(step)}
        if t.started_at > 0:
            out["timestamp"] = _iso(clock)
        result: dict[str, Any] = {"content": step.observation}
        if _is_call(step):
            out["tool_calls"] = [{"tool_call_id": _call_id(step), "function_name": step.action,
                                  "arguments": _arguments_object(step)}]
            result = {"source_call_id": _call_id(step), **result}
        if _is_call(step) or step.observation:
            out["observation"] = {"results": [result]}
        metrics = _metrics(t, i, step, prompt_token_ids)
        if metrics is not None:
            out["metrics"] = metrics
            total_prompt += metrics.get("prompt_tokens", 0)
            total_completion += metrics["completion_tokens"]
        out["extra"] = {"index": step.index, "action": step.action,
                        "exit_code": step.exit_code, "timed_out": step.timed_out,
                        "error": step.error, "policy_s": step.policy_s,
                        "action_s": step.action_s, "inherited": step.inherited}
        clock += step.action_s
        steps.append(out)
    agent: dict[str, Any] = {"name": "tempering", "version": __version__}
    if t.policy:
        agent["model_name"] = _model_name(t.policy)
        agent["extra"] = {"policy": t.policy}
    reward = None if t.reward is None else t.reward.model_dump(
        mode="json", include={"reward", "components", "tests_passed", "tests_total", "flags"})
    return {
        "schema_version": ATIF_VERSION,
        "session_id": t.trajectory_id,
        "agent": agent,
        "steps": [{"step_id": n, **s} for n, s in enumerate(steps, start=1)],
        "notes": f"Exported by tempering {__version__} from trajectory schema "
                 f"v{t.schema_version}; episode outcome and grade under extra.",
        "final_metrics": {"total_prompt_tokens": total_prompt,
                          "total_completion_tokens": total_completion,
                          "total_steps": len(steps)},
        "extra": {"task_id": t.task_id, "run_id": t.run_id, "group_id": t.group_id,
                  "sample_index": t.sample_index, "parent_id": t.parent_id,
                  "branch_step": t.branch_step, "status": t.status.value,
                  "finish_reason": t.finish_reason, "error": t.error, "reward": reward,
                  "marks": list(t.marks), "tools": parse_tools(t),
                  "duration_s": t.duration_s, "grade_s": t.grade_s},
    }


def _file_name(trajectory_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", trajectory_id) + ".json"


def to_atif(trajs: Iterable[Trajectory], out_dir: str | Path, *, only_successful: bool = False,
            min_reward: float | None = None, prompt_token_ids: bool = False) -> list[Path]:
    """Write ``<out_dir>/<trajectory_id>.json`` per selected trajectory; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in select(trajs, only_successful=only_successful, min_reward=min_reward):
        path = out / _file_name(t.trajectory_id)
        doc = atif_document(t, prompt_token_ids=prompt_token_ids)
        _write_atomically(path, [json.dumps(doc, indent=2, ensure_ascii=False) + "\n"])
        paths.append(path)
    return paths


__all__ = ["ATIF_VERSION", "atif_document", "chat_messages", "hf_record", "metadata",
           "parse_tools", "select", "sft_record", "to_atif", "to_hf_dataset", "to_sft_jsonl",
           "token_columns"]
