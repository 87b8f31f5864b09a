"""The training run, end to end on the tiny model in real sandboxes: both loops, the run
directory, staleness, and a ``kill -9`` in the middle of a run that resumes without losing an
acknowledged group or reusing a version number."""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends import unavailable

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(bool(unavailable("local")), reason=str(unavailable("local")))

FIELDS = {"step", "version", "mode", "wall_s", "reward_mean", "staleness_mean", "staleness_max",
          "max_staleness", "samples", "learner_idle_frac", "sandbox_util", "groups_trained"}


def small(tmp_path: Path, name: str, *extra: str) -> list[str]:
    """A small run: 2 groups of 4 per step, a short warm-up shared through the cache."""
    return [f"name={name}", f"runs_dir={tmp_path}", "rollout.batch_groups=2",
            "rollout.group_size=4", "rollout.sandboxes=8", "rollout.inference=8",
            "model.warmup.steps=120", *extra]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def env(cache: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("TEMPERING_CACHE", str(cache))
    return {**os.environ, "TEMPERING_CACHE": str(cache)}


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def acked_since_checkpoint(run: Path) -> int:
    checkpoints = sorted((run / "checkpoints").glob("step-*/state.json"))
    if not checkpoints or not (run / "groups.jsonl").exists():
        return 0
    logged = json.loads(checkpoints[-1].read_text())["groups_logged"]
    return len((run / "groups.jsonl").read_text().splitlines()) - logged


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_a_run_writes_its_directory_and_keeps_the_bound(tmp_path, env, mode) -> None:
    from tempering.train.config import load_config
    from tempering.train.trainer import Trainer
    from tempering.trajectory.query import query

    config = load_config(None, small(tmp_path, mode, "steps=4", f"mode={mode}",
                                     "rollout.max_staleness=1"))
    lines: list[str] = []
    result = await Trainer(config, say=lines.append).run()
    run = tmp_path / mode
    assert [m["step"] for m in result] == [1, 2, 3, 4] == [m["step"] for m in metrics(run)]
    assert [m["version"] for m in result] == [1, 2, 3, 4]
    for m in result:
        assert FIELDS <= m.keys()
        assert m["staleness_max"] <= m["max_staleness"] == (1 if mode == "async" else 0)
        assert 0 <= m["learner_idle_frac"] <= 1 and 0 < m["sandbox_util"] <= 1
        assert m["samples"] >= 2 * 2  # whole groups: the filters may trim a group, not empty it
    assert len([x for x in lines if x.startswith("step")]) == 4
    assert (run / "config.yaml").is_file() and (run / "tensorboard").is_dir()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "good", "step-000003", "step-000004"]  # keep_checkpoints=2, and the last good weights
    # every token records the version that sampled it; none newer than the learner's last
    _, rows = query(run, "SELECT min(weights_version), max(weights_version), count(*) "
                         "FROM steps WHERE weights_version IS NOT NULL")
    low, high, n = rows[0]
    assert n > 0 and low == 0 and high <= 4
    trained = {g for m in result for g in m["groups_trained"]}
    logged = {json.loads(x)["group"] for x in (run / "groups.jsonl").read_text().splitlines()}
    assert trained <= logged and len(trained) == 4 * 2


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
async def test_a_run_ends_once_it_reaches_its_target_reward(tmp_path, env) -> None:
    from tempering.train.config import load_config
    from tempering.train.trainer import Trainer

    config = load_config(None, small(tmp_path, "target", "steps=6", "target_reward=0.0",
                                     "target_window=2"))
    lines: list[str] = []
    result = await Trainer(config, tensorboard=False, say=lines.append).run()
    assert [m["step"] for m in result] == [1, 2]  # any 2-step mean reaches 0.0
    assert any("target reward 0.0 reached" in x for x in lines)
    assert (tmp_path / "target" / "checkpoints" / "step-000002").is_dir()  # the end's


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
def test_kill_9_resumes_with_the_next_version_and_loses_no_group(tmp_path, env) -> None:
    args = small(tmp_path, "killed", "steps=6", "rollout.max_staleness=8")
    cmd = [str(Path(sys.executable).with_name("tempering")), "train",
           *sum((["--set", a] for a in args), [])]
    run = tmp_path / "killed"
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # kill once a group was acknowledged after the newest checkpoint: it is in no
        # checkpoint, only in groups.jsonl and the store
        deadline = time.monotonic() + 240
        while not (len(metrics(run)) >= 2 and acked_since_checkpoint(run) >= 1):
            assert first.poll() is None, first.stderr.read().decode()[-2000:] if first.stderr \
                else "the run ended early"
            assert time.monotonic() < deadline, "no group acknowledged after a checkpoint"
            time.sleep(0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    acked_before = [json.loads(x)["group"] for x in
                    (run / "groups.jsonl").read_text().splitlines()]
    steps_before = len(metrics(run))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resuming run killed" in done.stdout
    assert "handed 0 " not in done.stdout and "acknowledged groups back" in done.stdout
    final = metrics(run)
    assert [m["step"] for m in final] == list(range(1, 7))
    versions = [m["version"] for m in final]
    assert versions == sorted(set(versions)), versions  # never a version twice
    assert versions[steps_before] > versions[steps_before - 1]
    # every group acknowledged before the kill was trained on, or is buffered at the end, or
    # was one the filters drop by design (all its rewards equal: no learning signal)
    from tempering.trajectory.query import query

    trained = {g for m in final for g in m["groups_trained"]}
    last = sorted((run / "checkpoints").glob("step-*"))[-1]
    state = json.loads((last / "state.json").read_text())
    buffered = {e["group"][0]["group_id"] for e in state["buffer"]["buffered"]}
    _, rows = query(run, "SELECT group_id FROM trajectories GROUP BY group_id "
                         "HAVING count(DISTINCT coalesce(reward, -1)) = 1")
    equal = {g for (g,) in rows}
    lost = [g for g in acked_before if g not in trained | buffered | equal]
    assert not lost, f"{len(lost)} acknowledged groups lost: {lost[:3]}"
    assert len(set(acked_before) & trained) >= 2  # the test saw groups cross the kill


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
@pytest.mark.ray
async def test_the_same_config_trains_on_ray(tmp_path, env) -> None:
    """Rollouts on a Ray rollout worker, the engine in an inference actor, weights published to
    it by version: the run's versions and tokens look exactly like an in-process run's."""
    ray = pytest.importorskip("ray")
    from tempering.train.config import load_config
    from tempering.train.trainer import Trainer
    from tempering.trajectory.query import query

    if ray.is_initialized():
        ray.shutdown()
    config = load_config(None, small(tmp_path, "ray", "steps=2", "rollout.executor=ray"))
    trainer = Trainer(config, tensorboard=False)
    result = await trainer.run()
    assert [m["version"] for m in result] == [1, 2] and not ray.is_initialized()
    assert trainer.backend.published == 2  # the actor's engine took every version
    # the workers were stopped, their stores flushed: what the end recovered from journals is
    # only episodes the end of the run cut off, none that finished
    from tempering.trajectory.journal import RECOVERED_ERROR

    _, rows = query(tmp_path / "ray", "SELECT count(*) FROM trajectories WHERE error = "
                                      f"'{RECOVERED_ERROR}'")
    assert trainer.recovered == rows[0][0]
    assert all(m["staleness_max"] <= m["max_staleness"] for m in result)
    _, rows = query(tmp_path / "ray", "SELECT count(*), max(weights_version) FROM steps")
    assert rows[0][0] >= 2 * 2 * 3 and rows[0][1] <= 2  # every step of every kept episode


@pytest.mark.slow  # in CI's second run (scripts/test.sh -m slow)
async def test_a_learning_rate_100x_too_high_is_diagnosed_and_rolled_back(tmp_path, env) -> None:
    from safetensors.torch import load_file

    from tempering.errors import TrainingCollapsed
    from tempering.train.config import load_config
    from tempering.train.report import read_collapses, write_report
    from tempering.train.trainer import Trainer

    # sync: step k's batch is sampled by version k - 1, so the good weights are known exactly
    config = load_config(None, small(
        tmp_path, "collapse", "steps=10", "mode=sync", "learner.lr=5e-2",
        "learner.lr_warmup_steps=0", "collapse.window=1", "collapse.reward_min=0.05",
        "collapse.reward_gain=0",
        "collapse.stall_s=20", "collapse.max_rollbacks=1"))
    lines: list[str] = []
    trainer = Trainer(config, tensorboard=False, say=lines.append)
    with pytest.raises(TrainingCollapsed, match=r"the run stops \(1 rollbacks already"):
        await trainer.run()
    said = [x for x in lines if x.startswith("collapse at step")]
    assert len(said) == 2, lines  # one rolled back, the second stops the run
    assert all(len(x.splitlines()) == 1 for x in said)
    rolled = [x for x in lines if x.startswith("rollback 1 of 1")]
    assert len(rolled) == 1 and "learning rate x0.5" in rolled[0], lines
    # the good weights are those that *sampled* the best step: the starting model's, version
    # 0, not the weights the learner made at that step (the known gap before)
    assert "(version 0," in rolled[0], rolled[0]
    good = trainer.run_dir / "checkpoints" / "good"
    assert json.loads((good / "learner.json").read_text())["version"] == 0
    start = load_file(str(next(trainer.learner.model_path.glob("*.safetensors"))))
    kept = load_file(str(next(good.glob("*.safetensors"))))
    assert all((kept[k] == v).all() for k, v in start.items() if k in kept)
    # every collapse, a stall between steps too, is in the run's record and its report
    recorded = read_collapses(trainer.run_dir)
    assert [c["diagnosis"] for c in recorded] == said
    assert recorded[0]["action"] == rolled[0] and "the run stops" in recorded[1]["action"]
    page = write_report(trainer.run_dir).read_text()
    assert "rollbacks after a collapse" in page and html.escape(said[0]) in page
    steps = metrics(trainer.run_dir)
    assert all(m["collapse"] in said for m in steps if "collapse" in m)
    after = [m for m in steps if m["wall_s"] > recorded[0]["wall_s"]]
    assert all(m["rollbacks"] == 1 and m["lr"] == pytest.approx(2.5e-2) for m in after)
