"""Trajectories: every step of every episode, with exact tokens, stored and filtered.

See ``schema.py`` for the data, ``store.py`` for how it is kept (append-only Parquet with a
crash journal), ``query.py`` (DuckDB), ``filters.py`` and ``export.py``.
"""

from __future__ import annotations

from tempering.trajectory.schema import SCHEMA_VERSION, Status, Step, ToolCall, Trajectory, new_id

__all__ = ["SCHEMA_VERSION", "Status", "Step", "ToolCall", "Trajectory", "new_id"]
