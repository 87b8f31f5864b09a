"""Policies: inference engines behind one protocol (``base.Policy``).

``scripted`` replays fixed actions; ``local`` samples from a PyTorch/transformers model in this
process (a ``TrainablePolicy``: a learner swaps its weights); ``openai`` talks to any
OpenAI-compatible server (vLLM, SGLang, ``tempering serve``); ``ray`` serves any of them from
a Ray actor to every node. Engines are imported on use, so this package pulls in neither torch
nor an HTTP client. ``tempering serve`` itself is ``tempering.serve``.
"""

from __future__ import annotations

from tempering.policy.base import (
    GenerateRequest,
    Generation,
    Message,
    Policy,
    SamplingParams,
    TrainablePolicy,
)

__all__ = ["GenerateRequest", "Generation", "Message", "Policy", "SamplingParams",
           "TrainablePolicy"]
