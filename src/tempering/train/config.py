"""The configuration of a training run: one pydantic model, read from YAML, every field documented.

``TrainConfig()`` with no arguments *is* the embedded default that ``tempering train`` runs: a
tiny model built locally and warmed up on the tool-call format, the built-in ``switchboard``
family in local sandboxes, asynchronous training with ``max_staleness=2``. A YAML file overrides
any subset of it; ``--set rollout.max_staleness=4`` style overrides apply on top. Every model is
frozen and forbids unknown keys, so a typo in a config is an error that names the key, not a
silently ignored setting.

The run directory keeps the config it was started with (``config.yaml``); a resumed run reads it
back from there, so a resumed run cannot drift from the one that was checkpointed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tempering.agent.episode import EpisodeConfig
from tempering.errors import ConfigError
from tempering.policy.base import SamplingParams
from tempering.recipes.switchboard import SlowEnvConfig, TinyModelConfig, WarmupConfig
from tempering.train.learner import LearnerConfig

Mode = Literal["sync", "async"]
SYSTEM_PROMPT = "You act in a sandbox with tools. Call submit when done."
"""The default system prompt: one line, so the tiny model's context goes to the task."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelConfig(_Frozen):
    path: str | None = None
    """A transformers causal LM directory (with its tokenizer). None: build the tiny model."""
    tiny: TinyModelConfig = TinyModelConfig()
    warmup: WarmupConfig = WarmupConfig()
    """Applies to the tiny model only (a model from ``path`` is trained as it is)."""


class TasksConfig(_Frozen):
    specs: list[str] = ["switchboard:4"]
    """Task directories, ``humaneval[:N]``, ``switchboard[:LAYOUTS]`` or ``repo-bugs[:N]`` (as
    ``tempering rollout`` takes them). Groups take the tasks in turn, in this order."""
    slow: SlowEnvConfig | None = None
    """Heavy-tailed grading time for the switchboard family (None: none)."""


class RolloutConfig(_Frozen):
    group_size: int = Field(default=16, ge=2)
    """Samples per task in a group: GRPO's advantages are relative to the group."""
    oversample: int = Field(default=0, ge=0)
    """Extra samples started per group; the first ``group_size`` to finish are kept."""
    batch_groups: int = Field(default=4, ge=1)
    """Groups per learner step (``batch_groups * group_size`` samples)."""
    max_staleness: int = Field(default=2, ge=0)
    """Most versions a trained sample may lag the learner (async mode; sync mode is 0)."""
    sandboxes: int = Field(default=32, ge=1)
    """Sandbox slots: episodes that may run at once."""
    inference: int = Field(default=64, ge=1)
    """Inference slots: episodes that may hold a place in the engine's batches."""
    executor: Literal["asyncio", "ray"] = "asyncio"
    """Where episodes run: in this process, or on Ray workers (``rollout`` resource)."""
    ray_address: str | None = None
    """An existing Ray cluster (``auto``, ``ray://host:port``); None: a local one."""
    max_batch: int = Field(default=32, ge=1)
    """The local inference engine's most rows decoded together."""
    device: str = "cpu"
    """Torch device of the local inference engine (``cuda``: with the Ray executor, its
    inference actor is placed on a GPU node)."""


class CollapseConfig(_Frozen):
    """When the trainer calls a run collapsed (``collapse.py``); each check is off at None.
    The figures are those of ``metrics.jsonl``, averaged over the last ``window`` steps."""

    window: int = Field(default=3, ge=1)
    """Steps averaged by each check (steps since the last rollback only)."""
    reward_fall: float | None = Field(default=0.5, gt=0, lt=1)
    """Collapsed when the mean reward falls below ``(1 - reward_fall)`` x the best mean the
    run reached, once that best is at least ``reward_min``."""
    reward_min: float = Field(default=0.3, ge=0)
    reward_gain: float = Field(default=0.2, ge=0)
    """The reward check measures the fall from the best only once the best is this far above
    the mean reward of the run's first ``window`` steps, and until then from that start: a best
    that is the start plus noise has nothing to protect (a run at chance, 0.25, rolled back
    from a best of 0.33 and lost half its learning rate)."""
    invalid_max: float | None = Field(default=0.5, gt=0, le=1)
    """Collapsed when the share of malformed tool calls goes above this (the action format
    breaking down: ``invalid_action_frac``)."""
    entropy_fall: float | None = Field(default=None, gt=0, lt=1)
    """Collapsed when the sampled tokens' entropy falls below ``(1 - entropy_fall)`` x its
    mean over the run's first ``window`` steps (a policy that has locked into one output)."""
    stall_s: float | None = Field(default=180.0, gt=0)
    """Collapsed when no trainable batch came for this long while rollouts kept finishing
    and every group was dropped for equal rewards, mostly 0 (with the learning rate 1000x
    too high, the default run stalled so after 3 steps, not one tool call malformed)."""
    lr_factor: float = Field(default=0.5, gt=0, le=1)
    """``on_collapse: rollback`` multiplies the learning rate by this at each rollback."""
    max_rollbacks: int = Field(default=3, ge=0)
    """Rollbacks allowed in a run; one more collapse stops it."""


class TrainConfig(_Frozen):
    """Everything a training run is: ``TrainConfig()`` is the embedded default."""

    name: str = "default"
    """The run's directory under ``runs_dir``; resuming continues the run of this name."""
    runs_dir: str = "runs"
    mode: Mode = "async"
    """``async``: rollouts keep generating while the learner updates, within max_staleness;
    ``sync``: each batch is generated by the current weights, then trained on."""
    steps: int = Field(default=80, ge=1)
    """Learner steps (each publishes one weights version)."""
    target_reward: float | None = 0.95
    """End the run early, once the mean ``reward_mean`` of its last ``target_window`` steps
    reaches this (train to a target); None: always ``steps`` steps. Near a reward of 1 most
    groups score all 1, the filters drop them and a step costs many rollouts for no signal."""
    target_window: int = Field(default=3, ge=1)
    seed: int = 0
    checkpoint_every: int = Field(default=1, ge=1)
    """Checkpoint after every this many steps (and at the end)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Newest checkpoints kept on disk."""
    model: ModelConfig = ModelConfig()
    tasks: TasksConfig = TasksConfig()
    episode: EpisodeConfig = EpisodeConfig(
        system_prompt=SYSTEM_PROMPT, tools=["read_file", "write_file", "submit"], max_turns=4,
        describe_tools=False, sampling=SamplingParams(temperature=0.4, max_tokens=40))
    """Per-episode budgets, tools, prompt and sampling (see docs/agent.md)."""
    rollout: RolloutConfig = RolloutConfig()
    learner: LearnerConfig = LearnerConfig(lr=3e-4, lr_warmup_steps=20, epochs=2)
    """Optimiser and objective (docs/training.md); ``temperature`` follows the sampling one.
    Two passes at a peak of 3e-4: one pass at 5e-4 broke the tool-call format at the ramp's
    peak in some seeds and learned too slowly in others (docs/training.md, over seeds)."""
    on_collapse: Literal["stop", "rollback"] = "rollback"
    """What a detected collapse does (it is always said, in one line, with its evidence):
    ``stop`` ends the run (``TrainingCollapsed``); ``rollback`` reloads the last good
    checkpoint (the best mean reward so far, or the starting model), multiplies the learning
    rate by ``collapse.lr_factor``, drops what the collapsed weights sampled and goes on."""
    collapse: CollapseConfig = CollapseConfig()

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"name {self.name!r}: a run name is one directory name")
        sampled = self.episode.sampling.temperature
        if sampled > 0 and abs(self.learner.temperature - sampled) > 1e-9:
            # the learner must score tokens under the distribution they were sampled from
            object.__setattr__(self, "learner",
                               self.learner.model_copy(update={"temperature": sampled}))
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir, self.name)

    @property
    def max_staleness(self) -> int:
        """The bound the buffer enforces: 0 in sync mode."""
        return 0 if self.mode == "sync" else self.rollout.max_staleness


def load_config(path: str | os.PathLike[str] | None = None,
                overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """The config in YAML file ``path`` (None: the embedded default), with ``key.sub=value``
    overrides (values parsed as YAML) applied on top."""
    import yaml

    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config {path} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping of fields, got "
                              f"{type(loaded).__name__}")
        data = loaded or {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key.sub=value")
        *parents, leaf = key.strip().split(".")
        node = data
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[leaf] = yaml.safe_load(raw)
    return validate_config(_merged(TrainConfig().model_dump(mode="json"), data),
                           where=str(path) if path else "config")


def _merged(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` laid over ``base`` section by section: a file that sets one field of a
    section keeps the section's other fields as the embedded default has them (not the
    defaults of the section's class, which may differ: the default episode's tools)."""
    out = dict(base)
    for key, value in update.items():
        below = out.get(key)
        out[key] = (_merged(below, value) if isinstance(below, dict) and isinstance(value, dict)
                    else value)
    return out


def validate_config(data: dict[str, Any], *, where: str = "config") -> TrainConfig:
    """``TrainConfig`` from plain data; errors name each bad field and value."""
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}"
            + (f" (got {e['input']!r})" if e["type"] != "missing" else "")
            for e in exc.errors())
        raise ConfigError(f"{where}: {problems}") from None


def dump_config(config: TrainConfig) -> str:
    """The config as YAML, every field written out (what ``config.yaml`` holds)."""
    import yaml

    return str(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
