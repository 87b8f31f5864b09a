"""``tempering serve``'s service: any policy behind an OpenAI-compatible HTTP API, recording
the episodes that outside agents play through it.

``server.py`` holds the endpoints (``PolicyServer``), ``episodes.py`` what each episode keeps,
its journaling, end and idle expiry (``EpisodeBook``), ``http.py`` the small HTTP/1.1 server
on asyncio streams they run on. The policies themselves are ``tempering.policy``'s.
"""

from __future__ import annotations

from tempering.serve.server import PolicyServer

__all__ = ["PolicyServer"]
