"""TrainConfig: the embedded default, YAML files, overrides, and errors that name the field."""

from __future__ import annotations

import pytest

from tempering.errors import ConfigError
from tempering.train.config import TrainConfig, dump_config, load_config, validate_config


def test_the_default_is_async_on_switchboard_with_a_tiny_model() -> None:
    config = TrainConfig()
    assert config.mode == "async" and config.max_staleness == config.rollout.max_staleness > 0
    assert config.model.path is None and config.model.warmup.steps > 0
    assert config.tasks.specs == ["switchboard:4"]
    # the learner scores tokens under the distribution they were sampled from
    assert config.learner.temperature == config.episode.sampling.temperature


def test_yaml_then_overrides(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("name: mine\nmode: sync\nrollout:\n  group_size: 4\n  max_staleness: 5\n")
    config = load_config(path, ["rollout.batch_groups=3", "learner.lr=1e-4",
                                "episode.sampling.temperature=0.9"])
    assert (config.name, config.mode, config.rollout.group_size) == ("mine", "sync", 4)
    assert config.rollout.batch_groups == 3 and config.learner.lr == 1e-4
    assert config.max_staleness == 0  # sync mode is max_staleness 0, whatever the file says
    assert config.learner.temperature == 0.9
    assert str(config.run_dir) == "runs/mine"


def test_dump_and_load_round_trip(tmp_path) -> None:
    config = load_config(None, ["steps=7", "tasks.slow={scale_s: 0.1}"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config
    assert config.tasks.slow is not None and config.tasks.slow.scale_s == 0.1


@pytest.mark.parametrize(("data", "named"), [
    ({"rollout": {"group_sise": 4}}, "rollout.group_sise"),
    ({"rollout": {"group_size": 1}}, "rollout.group_size"),
    ({"mode": "fast"}, "mode"),
    ({"learner": {"lr": -1}}, "learner.lr"),
    ({"name": "a/b"}, "a/b"),
])
def test_bad_fields_are_named(data, named) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        validate_config(data)


def test_bad_files_and_overrides(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match="expected key.sub=value"):
        load_config(None, ["steps"])
    with pytest.raises(ConfigError, match="'steps' is not a section"):
        load_config(None, ["steps=3", "steps.x=1"])


def test_a_partial_section_keeps_the_embedded_defaults_of_its_other_fields(tmp_path) -> None:
    default = TrainConfig()
    config = load_config(None, ["episode.sampling.temperature=0.4"])
    assert config.episode.sampling.temperature == 0.4
    assert config.episode.tools == default.episode.tools  # not EpisodeConfig's own default
    assert config.episode.describe_tools is False and config.episode.max_turns == 4
    assert config.episode.sampling.max_tokens == default.episode.sampling.max_tokens
    path = tmp_path / "run.yaml"
    path.write_text("episode:\n  max_turns: 6\n")
    assert load_config(path).episode.system_prompt == default.episode.system_prompt
