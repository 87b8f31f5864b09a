"""Tempering: infrastructure for post-training LLM agents with RL in real execution environments.

The parts live in subpackages (``sandbox``, ``reward``, ``trajectory``, ``scheduler``, ``train``);
importing this package imports none of them, so ``import tempering.sandbox`` stays light.
"""

import os

__version__ = "0.1.0"

# A learner shares its CPU with the inference engine, the event loop and the sandboxes. PyTorch's
# OpenMP workers spin between parallel regions by default and, when another process holds a
# core, spin away the time the lagging worker needs: a tiny model's learner step beside one busy
# process took 3x as long (9.4 s against 3.2 s alone) and twice the CPU; sleeping workers took
# 5.3 s (``benchmarks/cpu_sharing.py``). Set before torch loads; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
