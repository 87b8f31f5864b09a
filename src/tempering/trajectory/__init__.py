"""Trajectories: every step of every episode, with exact tokens, stored and filtered.

See ``schema.py`` for the data and the ``Recorder`` an episode journals to; ``toolcalls.py``
for the tool-call text a completion holds; ``store.py`` for how it is kept (append-only Parquet
parts, ``parquet.py``, with a crash journal, ``journal.py``); ``query.py`` (DuckDB views and
stats); ``filters.py`` and ``export.py`` (SFT JSONL, Hugging Face datasets, ATIF);
``curation.py`` for ``tempering traj`` (``cli/traj.py``).
"""

from __future__ import annotations

from tempering.trajectory.schema import SCHEMA_VERSION, Status, Step, ToolCall, Trajectory, new_id

__all__ = ["SCHEMA_VERSION", "Status", "Step", "ToolCall", "Trajectory", "new_id"]
