"""Tempering: infrastructure for post-training LLM agents with RL in real execution environments.

The parts live in subpackages (``sandbox``, ``reward``, ``trajectory``, ``scheduler``, ``train``);
importing this package imports none of them, so ``import tempering.sandbox`` stays light.
"""

__version__ = "0.1.0"
