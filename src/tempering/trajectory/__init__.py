"""Trajectories: every step of every episode, with exact tokens, stored and filtered.

See ``schema.py`` for the data; ``store.py`` for how it is kept (append-only Parquet parts,
``parquet.py``, with a crash journal, ``journal.py``); ``query.py`` (DuckDB views and stats);
``filters.py`` and ``export.py`` (SFT JSONL, Hugging Face datasets, ATIF); ``commands.py`` and
``curation.py`` for ``tempering traj``.
"""

from __future__ import annotations

from tempering.trajectory.schema import SCHEMA_VERSION, Status, Step, ToolCall, Trajectory, new_id

__all__ = ["SCHEMA_VERSION", "Status", "Step", "ToolCall", "Trajectory", "new_id"]
