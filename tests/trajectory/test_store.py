"""The trajectory store on real files, with real processes killed by SIGKILL.

Writers run as child processes (``python -c``) that print each id once ``append`` returned; the
test kills them at chosen and at random moments (mid-episode, mid-flush, mid-part-write) and
then checks what a user relies on: reading never fails, never sees a partial part, and every
acknowledged trajectory is there exactly once after recovery.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tempering.errors import StorageError
from tempering.reward.result import RewardResult
from tempering.reward.result import TestResult as Outcome
from tempering.trajectory.schema import Status, Step, Trajectory, new_id
from tempering.trajectory.store import (
    RECOVERED_ERROR,
    REWARD_COLUMNS,
    SCHEMA,
    STEP_TYPE,
    TrajectoryStore,
    to_table,
)

# A writer that loops over episodes: begin, 4 steps, append; "ack <id>" once append returned.
# Before the append that fills the buffer it prints "flushing", and after it "took <s>".
WRITER = textwrap.dedent("""
    import sys, time
    from tempering.trajectory.schema import Step, Trajectory, new_id
    from tempering.trajectory.store import TrajectoryStore

    run, (flush_every, tokens, limit) = sys.argv[1], map(int, sys.argv[2:5])
    store = TrajectoryStore(run, flush_every=flush_every, flush_interval_s=3600)
    i = 0
    while not limit or i < limit:
        tid = new_id()
        store.begin(tid, {"task_id": f"t{i % 7}", "run_id": "crash", "started_at": time.time()})
        steps = [Step(index=j, text="x", observation="y" * 50, prompt_token_ids=list(range(tokens)),
                      completion_token_ids=list(range(tokens)), logprobs=[-0.25] * tokens)
                 for j in range(4)]
        for s in steps:
            store.record_step(tid, s)
        flushing = (i + 1) % flush_every == 0
        if flushing:
            print("flushing", flush=True)
        t0 = time.perf_counter()
        store.append(Trajectory(trajectory_id=tid, task_id=f"t{i % 7}", run_id="crash",
                                steps=steps))
        print("ack", tid, flush=True)
        if flushing:
            print("took", time.perf_counter() - t0, flush=True)
        i += 1
    store.close()
    print("done", flush=True)
""")

# An episode in flight: begin and N steps, then "ready", then die or wait to be killed.
IN_FLIGHT = textwrap.dedent("""
    import os, signal, sys, time
    from tempering.trajectory.schema import Step
    from tempering.trajectory.store import TrajectoryStore

    run, tid, steps, then = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    store = TrajectoryStore(run)
    store.begin(tid, {"task_id": "median", "run_id": "r7", "group_id": "g", "sample_index": 3,
                      "policy": "scripted", "instruction": "Fix it.", "started_at": time.time()})
    for j in range(steps):
        store.record_step(tid, Step(index=j, action="bash", observation=f"out {j}",
                                    completion_token_ids=[j, j + 1], logprobs=[-1.0, -2.0]))
    print("ready", flush=True)
    if then == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
""")

# Appends pickled trajectories (acknowledged), never flushes, then dies.
APPEND_AND_DIE = textwrap.dedent("""
    import os, pickle, signal, sys
    from tempering.trajectory.store import TrajectoryStore

    store = TrajectoryStore(sys.argv[1], flush_every=10_000, flush_interval_s=3600)
    for t in pickle.loads(open(sys.argv[2], "rb").read()):
        store.append(t)
        print("ack", t.trajectory_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")

# Stops inside a part write: half the rows written to the temporary file, then killed.
KILLED_MID_PART = textwrap.dedent("""
    import os, signal, sys
    import pyarrow.parquet as pq
    from tempering.trajectory import store as store_module
    from tempering.trajectory.schema import Trajectory

    def write_half(table, where, **kwargs):
        with pq.ParquetWriter(where, table.schema) as writer:
            writer.write_table(table.slice(0, len(table) // 2))
            where.flush()
            print("writing", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    store_module.pq.write_table = write_half
    store = store_module.TrajectoryStore(sys.argv[1], flush_every=1000)
    for i in range(20):
        t = Trajectory(task_id="t")
        store.append(t)
        print("ack", t.trajectory_id, flush=True)
    store.flush()
""")


def spawn(script: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def acks(lines: list[str]) -> list[str]:
    return [line.split()[1] for line in lines if line.startswith("ack ")]


def rich_trajectory(**overrides: object) -> Trajectory:
    grade = RewardResult(
        reward=0.75, components={"tests": 0.5, "lint": 1.0}, tests_passed=3, tests_total=4,
        flags=["collection_error", "timeout"], details=["tests/test_a.py: 1 failed"],
        tests=[Outcome(id="tests/test_a.py::t1", outcome="passed"),
               Outcome(id="tests/test_a.py::t2", outcome="failed", message="assert 1 == 2")],
        changed_files=["src/a.py"], duration_s=1.25, log="== 3 passed, 1 failed ==")
    steps = [
        Step(index=0, text="<tool_call>{...}</tool_call>", action="bash", tool_call_id="call_0",
             arguments='{"command": "pytest -x"}', observation="1 failed\n", exit_code=1,
             policy_s=0.31, action_s=1.5, prompt_token_ids=[101, 2, 3],
             completion_token_ids=[7, 8, 9], logprobs=[-0.1, -math.inf, -2.5],
             loss_mask=[1, 0, 1], weights_version=4, inherited=True),
        Step(index=1, text="done", action="invalid", error="malformed call: missing name",
             timed_out=True, prompt_reused=6, prompt_token_ids=[4], completion_token_ids=[11],
             logprobs=[-0.01], loss_mask=[1], weights_version=5),
        Step(index=2, action="submit", tool_call_id="call_2", arguments="{}", exit_code=None),
    ]
    fields: dict[str, object] = dict(
        run_id="run-1", task_id="HumanEval/7", group_id="g-1", sample_index=5,
        parent_id=new_id(), branch_step=1, policy="local:tiny", system_prompt="You are ...",
        instruction="Fix median(). ünïcode ✓", tools='[{"type": "function"}]', steps=steps,
        status=Status.MODEL_TIMEOUT, finish_reason="wall_time", error="took too long",
        reward=grade, marks=["recovered"], started_at=1_700_000_000.5, duration_s=12.5,
        grade_s=2.25)
    fields.update(overrides)
    return Trajectory.model_validate(fields)


# ---- format ----

def test_the_schema_has_a_column_for_every_field() -> None:
    assert [f.name for f in STEP_TYPE] == list(Step.model_fields)
    expected = [n for n in Trajectory.model_fields if n != "reward"] + list(REWARD_COLUMNS)
    assert sorted(SCHEMA.names) == sorted(expected)


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    originals = [rich_trajectory(),
                 rich_trajectory(reward=None, status=Status.INFRA_ERROR, parent_id=None,
                                 branch_step=None, steps=[]),
                 Trajectory(task_id="minimal")]
    with TrajectoryStore(tmp_path, flush_every=2) as store:
        for t in originals:
            store.append(t)
    store = TrajectoryStore(tmp_path)
    assert list(store.read()) == originals
    assert list(store.read(where="reward > 0.5")) == originals[:1]
    assert store.count() == 3 and store.ids() == [t.trajectory_id for t in originals]
    back = next(store.read())
    assert back.steps[0].logprobs[1] == -math.inf and back.reward is not None
    assert back.reward.tests[1].message == "assert 1 == 2"


def test_layout_metadata_and_flush_triggers(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path, flush_every=3, flush_interval_s=0.3)
    for _ in range(2):
        store.append(Trajectory(task_id="t"))
    assert store.parts() == [] and len(list((tmp_path / "journal").glob("*.jsonl"))) == 1
    store.append(Trajectory(task_id="t"))  # the third: a part
    [part] = store.parts()
    _, ns, pid, seq = part.stem.split("-")
    assert pid == str(os.getpid()) and int(ns) <= time.time_ns() and seq.isdigit()
    meta = pq.read_metadata(part)
    assert meta.num_rows == 3 and meta.metadata[b"tempering.schema_version"] == b"1"
    assert pq.read_table(part).column("schema_version").to_pylist() == [1, 1, 1]
    assert list((tmp_path / "journal").glob("*.jsonl")) == []  # durable: journal dropped
    store.append(Trajectory(task_id="t"))
    time.sleep(0.35)
    store.begin("e1", {"task_id": "t"})  # any call past the interval flushes the buffer
    assert len(store.parts()) == 2
    assert not list(tmp_path.rglob(".*.tmp"))


def test_misuse_is_refused_with_a_reason(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    t = Trajectory(task_id="t")
    store.append(t)
    with pytest.raises(StorageError, match="already appended"):
        store.append(t)
    with pytest.raises(StorageError, match="begin"):
        store.record_step("nope", Step(index=0))
    store.begin("ep", {"task_id": "t"})
    with pytest.raises(StorageError, match="already in use"):
        store.begin("ep", {"task_id": "t"})
    with pytest.raises(ValueError, match="nonsense"):
        store.begin("ep2", {"task_id": "t", "nonsense": 1})
    store.close()
    with pytest.raises(StorageError, match="closed"):
        store.append(Trajectory(task_id="t"))


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    from tempering.trajectory.query import connect

    store = TrajectoryStore(tmp_path)
    store.append(Trajectory(task_id="t"))
    store.flush()
    table = to_table([Trajectory(task_id="t", schema_version=2)])
    table = table.replace_schema_metadata({b"tempering.schema_version": b"2"})
    pq.write_table(table, tmp_path / "trajectories" / "part-9999999999999999999-1-000000.parquet")
    for call in (lambda: list(store.read()), store.count, lambda: connect(tmp_path)):
        with pytest.raises(StorageError, match="schema_version 2 is newer than the 1"):
            call()


# ---- journals of dead and live writers ----

def test_dead_writer_mid_episode_is_recovered_as_infra_error(tmp_path: Path) -> None:
    tid = new_id()
    proc = spawn(IN_FLIGHT, tmp_path, tid, 3, "die")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    store = TrajectoryStore(tmp_path)
    [t] = list(store.read())
    assert (t.trajectory_id, t.task_id, t.run_id, t.group_id, t.sample_index, t.policy) == (
        tid, "median", "r7", "g", 3, "scripted")
    assert t.status == Status.INFRA_ERROR and t.finish_reason == "error" and t.reward is None
    assert t.error == RECOVERED_ERROR and t.instruction == "Fix it."
    assert [s.observation for s in t.steps] == ["out 0", "out 1", "out 2"]
    assert t.steps[2].completion_token_ids == [2, 3] and t.steps[2].logprobs == [-1.0, -2.0]
    assert list((tmp_path / "journal").glob("*.jsonl")) == []
    assert TrajectoryStore(tmp_path, recover=False).recover() == 0 and store.count() == 1


def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    tid = new_id()
    spawn(IN_FLIGHT, tmp_path, tid, 2, "die").communicate(timeout=60)
    with open(tmp_path / "journal" / f"{tid}.jsonl", "ab") as f:
        f.write(b'{"kind":"step","step":{"index":2,"text":"cut her')  # killed mid-write
    assert TrajectoryStore(tmp_path, recover=False).recover() == 1
    [t] = list(TrajectoryStore(tmp_path).read())
    assert [s.index for s in t.steps] == [0, 1]


def test_a_live_writers_journal_is_left_alone(tmp_path: Path) -> None:
    tid = new_id()
    proc = spawn(IN_FLIGHT, tmp_path, tid, 2, "wait")
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        journal = tmp_path / "journal" / f"{tid}.jsonl"
        before = journal.read_bytes()
        store = TrajectoryStore(tmp_path)
        assert store.recover() == 0 and store.count() == 0
        assert journal.read_bytes() == before
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert TrajectoryStore(tmp_path, recover=False).recover() == 1
    assert [len(t.steps) for t in TrajectoryStore(tmp_path).read()] == [2]


def test_a_journal_from_an_earlier_boot_is_dead_even_if_its_pid_lives(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    store.begin("e1", {"task_id": "t"})
    store.record_step("e1", Step(index=0, observation="before the reboot"))
    journal = tmp_path / "journal" / "e1.jsonl"
    head, *rest = journal.read_bytes().splitlines(keepends=True)
    header = json.loads(head)
    assert header["owner"]["pid"] == os.getpid()  # alive: this very process
    assert TrajectoryStore(tmp_path, recover=False).recover() == 0
    header["owner"]["boot_id"] = "00000000-0000-0000-0000-000000000000"
    journal.write_bytes(json.dumps(header).encode() + b"\n" + b"".join(rest))
    assert TrajectoryStore(tmp_path, recover=False).recover() == 1
    [t] = list(TrajectoryStore(tmp_path).read())
    assert t.steps[0].observation == "before the reboot"


def test_acknowledged_appends_survive_a_kill_before_any_flush(tmp_path: Path) -> None:
    originals = [rich_trajectory(), rich_trajectory(reward=None), Trajectory(task_id="x")]
    (tmp_path / "batch.pickle").write_bytes(pickle.dumps(originals))
    proc = spawn(APPEND_AND_DIE, tmp_path / "run", tmp_path / "batch.pickle")
    out, _ = proc.communicate(timeout=60)
    assert acks(out.splitlines()) == [t.trajectory_id for t in originals]
    assert list((tmp_path / "run" / "trajectories").glob("part-*")) == []  # only the journal
    store = TrajectoryStore(tmp_path / "run")
    assert list(store.read()) == originals  # exactly, -inf log-prob included


def test_a_journal_whose_part_was_written_is_not_counted_twice(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    store.append(Trajectory(task_id="t"))
    [journal] = (tmp_path / "journal").glob("appended-*.jsonl")
    kept = journal.read_bytes()
    store.flush()
    journal.write_bytes(kept.replace(f'"pid":{os.getpid()}'.encode(), b'"pid":999999999'))
    # as if the writer died between making its part durable and dropping its journal
    assert TrajectoryStore(tmp_path, recover=False).recover() == 0
    assert store.count() == 1 and not journal.exists()


# ---- crashes at random moments ----

def check_run(run: Path, acknowledged: set[str], steps: int = 4) -> list[Trajectory]:
    for part in (run / "trajectories").glob("part-*.parquet"):
        pq.read_table(part)  # every visible part is whole
    store = TrajectoryStore(run)
    trajectories = list(store.read())
    ids = [t.trajectory_id for t in trajectories]
    assert len(ids) == len(set(ids)), "a trajectory was stored twice"
    by_id = {t.trajectory_id: t for t in trajectories}
    missing = acknowledged - by_id.keys()
    assert not missing, f"{len(missing)} acknowledged trajectories lost"
    for tid in acknowledged:
        assert by_id[tid].status == Status.OK and len(by_id[tid].steps) == steps
    for t in trajectories:  # the others were in flight when the writer died: either
        if t.trajectory_id not in acknowledged:  # ended (journaled, not yet printed) or not
            assert (t.status, len(t.steps)) == (Status.OK, steps) or (
                t.status == Status.INFRA_ERROR and t.error == RECOVERED_ERROR)
    assert not list(run.rglob(".*.tmp")), "a dead writer's temporary file was left"
    assert list((run / "journal").glob("*.jsonl")) == []
    return trajectories


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
def test_sigkill_at_random_moments_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(os.getpid())
    acknowledged: set[str] = set()
    mid_flush = 0
    for iteration in range(6):
        proc = spawn(WRITER, tmp_path, 150, 300, 0)
        assert proc.stdout is not None
        lines: list[str] = []
        if iteration < 4:  # kill during the append that writes a part
            took = []  # the first flush also warms pyarrow up: time the second
            while len(took) < 2:
                lines.append(proc.stdout.readline())
                if lines[-1].startswith("took"):
                    took.append(float(lines[-1].split()[1]))
            while not lines[-1].startswith("flushing"):
                lines.append(proc.stdout.readline())
            time.sleep(rng.uniform(0.0, 0.8) * took[-1])
        else:  # kill at a random episode
            for _ in range(rng.randrange(1, 200)):
                lines.append(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, err
        lines += out.splitlines()
        if iteration < 4 and lines[-1].startswith("flushing"):
            mid_flush += 1
        acknowledged |= set(acks(lines))
        check_run(tmp_path, acknowledged)
    assert mid_flush >= 2, "the kills missed the flushes: the test did not test them"
    assert len(acknowledged) >= 6 * 150


def test_sigkill_while_a_part_is_being_written(tmp_path: Path) -> None:
    proc = spawn(KILLED_MID_PART, tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and out.splitlines()[-1] == "writing"
    [temp] = (tmp_path / "trajectories").glob(".part-*.tmp")  # the half-written part
    assert temp.stat().st_size > 0 and list((tmp_path / "trajectories").glob("part-*")) == []
    trajectories = check_run(tmp_path, set(acks(out.splitlines())), steps=0)
    assert len(trajectories) == 20


def test_two_processes_write_one_run_at_once(tmp_path: Path) -> None:
    writers = [spawn(WRITER, tmp_path, 16, 20, 200) for _ in range(2)]
    outputs = [w.communicate(timeout=120)[0] for w in writers]
    assert all(w.returncode == 0 for w in writers), [w.stderr for w in writers]
    acknowledged = {tid for out in outputs for tid in acks(out.splitlines())}
    assert len(acknowledged) == 400
    trajectories = check_run(tmp_path, acknowledged)
    assert len(trajectories) == 400
    pids = {p.name.split("-")[2] for p in (tmp_path / "trajectories").glob("part-*.parquet")}
    assert len(pids) == 2
