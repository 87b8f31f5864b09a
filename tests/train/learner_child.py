"""A learner process to kill: it trains, checkpoints after every step and says which version
it has saved (``python learner_child.py MODEL_DIR CHECKPOINT_DIR``). ``batch(version)`` gives
the same samples to the test that replays the run."""

from __future__ import annotations

import sys

from tempering.train.learner import Learner, LearnerConfig
from tempering.train.samples import Sample

CONFIG = LearnerConfig(lr=1e-3)


def batch(version: int, vocab: int = 2000) -> list[Sample]:
    """Four samples of 24 tokens, different for every version, deterministic."""
    import torch

    gen = torch.Generator().manual_seed(version)
    out = []
    for i in range(4):
        ids = torch.randint(0, vocab, (24,), generator=gen).tolist()
        out.append(Sample(tuple(ids), (0,) * 8 + (1,) * 16, (0.0,) * 8 + (float("nan"),) * 16,
                          (-1,) * 8 + (version,) * 16, 1.0 if i % 2 else -1.0, f"s{i}"))
    return out


def main(model_dir: str, checkpoint: str) -> None:
    learner = Learner(model_dir, CONFIG)
    try:
        learner.load(checkpoint)
    except ValueError:  # ConfigError: nothing saved yet
        pass
    print(f"resumed {learner.version}", flush=True)
    while True:
        learner.step(batch(learner.version))
        learner.save(checkpoint)
        print(f"saved {learner.version}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
