"""Choosing a policy by configuration: one model per engine, told apart by ``type``.

    policy = build_policy(LocalPolicyConfig(model="path/to/model"))
    policy = build_policy(parse_policy("openai:http://127.0.0.1:8000/v1", model="tiny"))

The engine's module is imported only when it is built, so configuring an OpenAI endpoint never
imports torch. ``parse_policy`` reads the command line's short form.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tempering.errors import ConfigError
from tempering.policy.base import Policy

ENGINES = {
    "scripted": "tempering.policy.scripted:ScriptedPolicy",
    "local": "tempering.policy.local:LocalEngine",
    "openai": "tempering.policy.openai:OpenAIPolicy",
}


def tiny_model_dir() -> Path:
    """Where the tiny model is built: ``$TEMPERING_CACHE/tiny-model``, or under ~/.cache."""
    cache = os.environ.get("TEMPERING_CACHE") or Path.home() / ".cache" / "tempering"
    return Path(cache, "tiny-model")


class ScriptedPolicyConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["scripted"] = "scripted"
    actions: list[tuple[str, dict[str, Any]]] = []
    """Tool calls replayed in order, e.g. ``[["bash", {"command": "ls"}], ["submit", {}]]``."""


class LocalPolicyConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["local"] = "local"
    model: str | None = None
    """A model directory (transformers format, loaded offline); None builds the tiny model
    into the cache (``$TEMPERING_CACHE`` or ~/.cache/tempering)."""
    device: str = "cpu"
    max_batch: Annotated[int, Field(ge=1)] = 16
    """Most requests sampled together in one batch."""


class OpenAIPolicyConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["openai"] = "openai"
    base_url: str
    """The server's OpenAI API root, e.g. ``http://127.0.0.1:8000/v1``."""
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding the API key (None: send none)."""
    timeout_s: Annotated[float, Field(gt=0)] = 120.0
    retries: Annotated[int, Field(ge=0)] = 3
    send_token_prefix: bool = True
    """Send the previous turn's tokens (vLLM, SGLang, ``tempering serve``); turn off for
    hosted APIs that reject unknown fields."""


PolicyConfig = Annotated[ScriptedPolicyConfig | LocalPolicyConfig | OpenAIPolicyConfig,
                         Field(discriminator="type")]


def engine_class(name: str) -> Any:
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def build_policy(config: ScriptedPolicyConfig | LocalPolicyConfig | OpenAIPolicyConfig
                 ) -> Policy:
    """The engine ``config`` describes, ready to generate."""
    engine = engine_class(config.type)
    if isinstance(config, ScriptedPolicyConfig):
        policy: Policy = engine(config.actions)
    elif isinstance(config, LocalPolicyConfig):
        model = config.model
        if model is None:
            from tempering.policy.tiny import build_tiny_model

            model = str(build_tiny_model(tiny_model_dir()))
        policy = engine(model, device=config.device, max_batch=config.max_batch)
    else:
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        policy = engine(config.base_url, config.model, api_key=key, timeout_s=config.timeout_s,
                        retries=config.retries, send_token_prefix=config.send_token_prefix)
    return policy


def parse_policy(text: str, *, model: str | None = None
                 ) -> ScriptedPolicyConfig | LocalPolicyConfig | OpenAIPolicyConfig:
    """The command line's short form: ``tiny``, ``local:DIR`` or ``openai:URL``."""
    kind, _, rest = text.partition(":")
    if text == "tiny":
        return LocalPolicyConfig()
    if kind == "local" and rest:
        if not Path(rest).is_dir():
            raise ConfigError(f"policy {text!r}: {rest} is not a model directory")
        return LocalPolicyConfig(model=rest)
    if kind == "openai" and rest:
        if not model:
            raise ConfigError(f"policy {text!r} needs --model NAME (the server's model name)")
        return OpenAIPolicyConfig(base_url=rest, model=model)
    raise ConfigError(f"unknown policy {text!r}: use tiny, local:DIR or openai:URL")
