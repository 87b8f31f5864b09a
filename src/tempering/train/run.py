"""What a training run is made of, built from its config or resumed from its directory.

``open_run`` does everything before the first rollout: it checks the run directory against
the config it was started with, loads the tasks, builds (or reuses) the model RL starts from,
the learner, the replay buffer, the trajectory store (recovering what a killed run left), the
group log and the metrics, and loads the newest checkpoint into them. ``Run.backend`` is where
the episodes will run (``agent/backends.py``). The trainer (``trainer.py``) takes a ``Run`` and
drives the loop; it builds nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tempering.errors import ConfigError
from tempering.tasks.task import Task
from tempering.train import checkpoints
from tempering.train.buffer import ReplayBuffer, group_pipeline
from tempering.train.collapse import CollapseDetector
from tempering.train.config import TrainConfig, dump_config, validate_config
from tempering.train.learner import Learner
from tempering.train.metrics import MetricsLog
from tempering.train.report import CONFIG_FILE

if TYPE_CHECKING:
    from tempering.agent.backends import RolloutBackend
    from tempering.trajectory.store import TrajectoryStore


@dataclass
class Run:
    """The parts of one training run, in the state its newest checkpoint left them."""

    config: TrainConfig
    tasks: list[Task]
    model_dir: Path
    """The model RL started from (the learner holds the weights trained since)."""
    learner: Learner
    buffer: ReplayBuffer
    store: TrajectoryStore
    group_log: checkpoints.GroupLog
    metrics: MetricsLog
    detector: CollapseDetector
    state: checkpoints.RunState | None
    """The checkpoint resumed from; None for a fresh run."""

    def backend(self) -> contextlib.AbstractAsyncContextManager[RolloutBackend]:
        """Where the episodes run (this process, or Ray with the engine in an inference
        actor), serving the model being trained."""
        from tempering.agent.backends import rollout_backend
        from tempering.policy.config import LocalPolicyConfig
        from tempering.scheduler import Resources

        cfg = self.config.rollout
        return rollout_backend(
            cfg.executor, LocalPolicyConfig(model=str(self.model_dir), max_batch=cfg.max_batch,
                                            device=cfg.device), self.store,
            slots=Resources.of(sandbox=cfg.sandboxes, inference=cfg.inference),
            ray_address=cfg.ray_address, serve_policy=True)

    def restore_groups(self) -> int:
        """Hand back to the buffer every group acknowledged after the checkpoint
        (``checkpoints.py``); returns how many."""
        entries = self.group_log.take_after(self.state.groups_logged if self.state else 0)
        if not entries:
            return 0
        wanted = sorted({tid for e in entries for tid in e["trajectories"]})
        ids = ", ".join("'" + tid.replace("'", "''") + "'" for tid in wanted)
        found = {t.trajectory_id: t for t in self.store.read(where=f"trajectory_id IN ({ids})")}
        restored = 0
        for entry in entries:
            group = [found[tid] for tid in entry["trajectories"] if tid in found]
            if group:
                self.buffer.restore(group, version_started=entry["version_started"])
                restored += 1
        return restored


async def open_run(config: TrainConfig, say: Callable[[str], None], *,
                   tensorboard: bool = True) -> Run:
    """The run ``config`` names, fresh or resumed from its newest checkpoint."""
    from tempering.trajectory.store import TrajectoryStore

    prepare_run_dir(config)
    tasks = load_tasks(config)
    model_dir = (await asyncio.to_thread(prepare_model, config, tasks, say)).absolute()
    learner = await asyncio.to_thread(Learner, model_dir, config.learner)
    buffer = ReplayBuffer(batch_groups=config.rollout.batch_groups,
                          max_staleness=config.max_staleness,
                          filters=group_pipeline(config.learner.format_penalty > 0))
    store = TrajectoryStore(config.run_dir)  # recovers what a killed run left
    state = await asyncio.to_thread(_resume, config, learner, buffer, say)
    return Run(
        config=config, tasks=tasks, model_dir=model_dir, learner=learner, buffer=buffer,
        store=store, group_log=checkpoints.GroupLog(config.run_dir),
        metrics=MetricsLog(config.run_dir, resume_after=state.step if state else 0,
                           tensorboard=tensorboard),
        detector=CollapseDetector(config.collapse,
                                  best=state.best_reward if state else None,
                                  entropy_base=state.entropy_base if state else None,
                                  reward_base=state.reward_base if state else None,
                                  good=state.good_reward if state else None),
        state=state)


def prepare_run_dir(config: TrainConfig) -> None:
    """Create the run directory, or check that the run in it was started with ``config``
    (only ``steps`` may change), and write the config there."""
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_FILE
    text = dump_config(config)
    if path.exists():
        import yaml

        before = validate_config(yaml.safe_load(path.read_text()), where=str(path))
        if before.model_copy(update={"steps": config.steps}) != config:
            raise ConfigError(f"run {run_dir} was started with another config "
                              f"({path}); resume it with the same config (only `steps` may "
                              "change), choose another --name, or --restart it")
    path.write_text(text)


def _resume(config: TrainConfig, learner: Learner, buffer: ReplayBuffer,
            say: Callable[[str], None]) -> checkpoints.RunState | None:
    """Load the newest checkpoint into ``learner`` and ``buffer``; return its state."""
    found = checkpoints.latest(config.run_dir)
    state = None
    if found is not None:
        state = checkpoints.read_state(found)
        learner.load(found / checkpoints.MODEL_DIR)
        buffer.load_state_dict(state.buffer)
    # a version the killed run published after its last checkpoint (or before its first)
    # must not come again
    newest = _newest_version(config.run_dir)
    if newest is not None and newest > learner.version:
        learner.version = newest
    buffer.set_version(learner.version)
    if state is not None or newest is not None:
        say(f"resuming run {config.name} at step {state.step if state else 0}, "
            f"next version {learner.version + 1}")
    return state


def _newest_version(run_dir: Path) -> int | None:
    from tempering.trajectory.query import query

    _, rows = query(run_dir, "SELECT max(weights_version) FROM steps")
    value = rows[0][0] if rows else None
    return int(value) if value is not None else None


def load_tasks(config: TrainConfig) -> list[Task]:
    """The config's tasks (``tasks.slow`` applies to the switchboard family)."""
    from tempering.tasks.refs import select

    slow = config.tasks.slow
    try:
        tasks = select(config.tasks.specs, slow=None if slow is None else slow.as_tuple())
    except ConfigError as exc:
        raise ConfigError(f"tasks.specs: {exc}") from None
    if not tasks:
        raise ConfigError("tasks.specs selects no task")
    return tasks


def prepare_model(config: TrainConfig, tasks: list[Task], say: Callable[[str], None]) -> Path:
    """The model RL starts from: ``model.path``, or the tiny model built and warmed up (cached
    under ``$TEMPERING_CACHE`` by everything that shapes it, so a second run reuses it)."""
    if config.model.path is not None:
        path = Path(config.model.path)
        if not path.is_dir():
            raise ConfigError(f"model.path {path}: no such directory (a save_pretrained "
                              "directory; nothing is downloaded)")
        return path
    from tempering.recipes.warmup import prepare_tiny

    return prepare_tiny(config.model.tiny, config.model.warmup, config.episode, tasks,
                        seed=config.seed, device=config.learner.device, say=say)
