"""Training: group-relative advantages, samples, the learner and its losses.

``samples`` turns graded trajectories into token-level ``Sample``s with GRPO advantages;
``learner`` trains a transformers causal LM on them (decoupled PPO with truncated importance
weights for stale samples, optional KL to a reference, gradient accumulation, AdamW) and
publishes versioned weights to inference engines; ``losses`` holds the math as plain tensor
functions. Importing this package does not import torch: ``Learner`` imports it when built, and
``tempering.train.losses`` is imported on use.
"""

from tempering.train.learner import Learner, LearnerConfig, StepStats, WeightsSink
from tempering.train.samples import Sample, group_advantages, samples_from

__all__ = ["Learner", "LearnerConfig", "Sample", "StepStats", "WeightsSink", "group_advantages",
           "samples_from"]
