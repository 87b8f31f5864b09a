"""Shared fixtures for the policy tests: one tiny real model, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 model and ChatML tokenizer (``policy.tiny``), built locally in ~2 s."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tempering.policy.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen2")
