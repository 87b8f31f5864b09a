"""Recipes: what one built-in workload needs beyond the general machinery, kept out of it.

``switchboard`` holds the toy family's training settings (the tiny model's shape, the
tool-format warm-up, heavy-tailed grading time for benchmarks) and its synthetic transcripts;
``warmup`` builds the tiny model and teaches it the tool-call format before RL. The training
core (``tempering.train``) names these settings in its config and calls ``prepare_tiny``; it
knows nothing of code words or call signs.
"""
