"""The policy contracts (``policy/base.py``): every policy can be closed, and the ones a learner
trains say so by type, so no caller looks for either with ``getattr``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tempering.errors import PolicyError
from tempering.policy import Policy, TrainablePolicy
from tempering.policy.base import GenerateRequest, Message
from tempering.policy.local import LocalEngine
from tempering.policy.openai import OpenAIPolicy
from tempering.policy.scripted import ScriptedPolicy


def test_every_policy_closes_and_only_the_local_engine_trains() -> None:
    scripted = ScriptedPolicy([("submit", {})])
    client = OpenAIPolicy("http://127.0.0.1:9/v1", "m")
    for policy in (scripted, client):
        assert isinstance(policy, Policy)
        assert not isinstance(policy, TrainablePolicy)
    assert callable(LocalEngine.aclose) and callable(LocalEngine.update_weights)


async def test_a_closed_local_engine_refuses_requests(tiny_model_dir: Path) -> None:
    engine = LocalEngine(tiny_model_dir)
    assert isinstance(engine, TrainablePolicy)
    await engine.aclose()
    await engine.aclose()  # once more: nothing left to release
    with pytest.raises(PolicyError):
        await engine.generate(GenerateRequest(messages=[Message(role="user", content="hi")]))
