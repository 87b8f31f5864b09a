"""Policies: inference engines behind one protocol (``base.Policy``).

``scripted`` replays fixed actions; ``local`` samples from a PyTorch/transformers model in this
process; ``openai`` talks to any OpenAI-compatible server (vLLM, SGLang, ``tempering serve``).
Engines are imported on use, so this package pulls in neither torch nor an HTTP client.
"""

from __future__ import annotations

from tempering.policy.base import GenerateRequest, Generation, Message, Policy, SamplingParams

__all__ = ["GenerateRequest", "Generation", "Message", "Policy", "SamplingParams"]
