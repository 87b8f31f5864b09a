"""Agent episodes: a policy acting through tools in a sandbox, recorded step by step.

    trajectory = await run_episode(task, policy)            # played, graded, attributed
    siblings = await run_branches(task, policy, at=3, n=8)  # one prefix, eight continuations

``tools.py`` holds the tools (bash, read_file, write_file, str_replace, submit, give_up),
``episode.py`` the loop and how an ending is attributed, ``play.py`` one episode (or a
branched one) from start to grade. Through the scheduler: ``jobs.py`` an episode as a job,
``groups.py`` a group of them per task, ``backends.py`` where they run (this process or Ray).
"""

from __future__ import annotations

from tempering.agent.episode import SYSTEM_PROMPT, Episode, EpisodeConfig
from tempering.agent.play import run_branches, run_episode
from tempering.agent.tools import TOOLS, ToolBox, truncate
from tempering.trajectory.schema import Recorder

__all__ = ["Episode", "EpisodeConfig", "Recorder", "SYSTEM_PROMPT", "TOOLS", "ToolBox",
           "run_branches", "run_episode", "truncate"]
