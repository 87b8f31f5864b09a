"""The tools an agent acts with, in the OpenAI tools format, and how each acts in a sandbox.

``bash`` runs in one persistent shell per episode (``cd`` and ``export`` last across calls);
``read_file``, ``write_file`` and ``str_replace`` use the sandbox's file API; ``submit`` and
``give_up`` end the episode. A bad call (unknown tool, missing or mistyped argument, a path that
does not exist, an edit that does not match exactly once) is the model's mistake: it becomes an
error observation the model can recover from, never an exception. What is not the model's
mistake (the sandbox died, stopped answering) raises, and the episode attributes it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from tempering.errors import SandboxClosedError, SandboxPathError, SandboxTimeoutError
from tempering.sandbox import Sandbox, ShellSession
from tempering.trajectory.schema import ToolCall

T = TypeVar("T")


def _tool(name: str, description: str, properties: dict[str, Any],
          required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


_PATH = {"type": "string", "description": "path relative to the workspace"}
TOOLS: list[dict[str, Any]] = [
    _tool("bash", "Run a shell command in the workspace; cd and export persist across calls.",
          {"command": {"type": "string", "description": "the command line"}}, ["command"]),
    _tool("read_file", "Show a file's contents.", {"path": _PATH}, ["path"]),
    _tool("write_file", "Create or overwrite a file.",
          {"path": _PATH, "content": {"type": "string"}}, ["path", "content"]),
    _tool("str_replace", "Replace the one occurrence of old with new in a file.",
          {"path": _PATH, "old": {"type": "string"}, "new": {"type": "string"}},
          ["path", "old", "new"]),
    _tool("submit", "Finish: your work in the workspace is graded.", {}, []),
    _tool("give_up", "Stop without a solution (rewarded a little, unlike a wrong or gamed "
          "answer).", {}, []),
]
TOOL_NAMES = frozenset(t["function"]["name"] for t in TOOLS)


def tools_named(names: list[str] | None) -> list[dict[str, Any]]:
    """The tools offered: those named (in ``TOOLS`` order), or all of them."""
    return TOOLS if names is None else [t for t in TOOLS if t["function"]["name"] in names]
_ARGS: dict[str, tuple[str, ...]] = {t["function"]["name"]: tuple(
    t["function"]["parameters"]["required"]) for t in TOOLS}


@dataclass(frozen=True)
class Observation:
    """What one action returned to the agent."""

    text: str
    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None
    """Set when the action failed through the model's fault (the text says so too)."""
    ends: Literal["submit", "give_up"] | None = None


def truncate(text: str, limit: int) -> str:
    """Head and tail of ``text`` within ``limit`` characters, with a marker where it was cut."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters omitted ...]\n"
    keep = max(limit - len(marker), 0)
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head):]


def _error(message: str) -> Observation:
    return Observation(text=f"Error: {message}", error=message)


class ToolBox:
    """Acts on one sandbox for one episode. ``env_grace_s`` bounds how long any call may go
    without an answer beyond its own timeout before the sandbox counts as not answering."""

    def __init__(self, sandbox: Sandbox, *, observation_limit: int = 4000,
                 env_grace_s: float = 30.0, allowed: frozenset[str] = TOOL_NAMES) -> None:
        self.sandbox = sandbox
        self.allowed = allowed
        self.observation_limit = observation_limit
        self.env_grace_s = env_grace_s
        self._shell: ShellSession | None = None
        self.shell_setup = ""
        """Shell lines run when the session starts (a branch's inherited cwd and exports)."""

    @property
    def shell(self) -> ShellSession | None:
        return self._shell

    async def execute(self, call: ToolCall, *, timeout: float) -> Observation:
        """Run one call; raises only for failures of the sandbox (``SandboxError``)."""
        if call.name not in self.allowed:
            return _error(f"unknown tool {call.name!r}; the tools are "
                          f"{', '.join(sorted(self.allowed))}")
        try:
            args = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            return _error(f"the arguments of {call.name} are not valid JSON: {exc.msg}")
        except RecursionError:
            return _error(f"the arguments of {call.name} are nested too deeply to read")
        if not isinstance(args, dict):
            return _error(f"the arguments of {call.name} must be a JSON object")
        missing = [a for a in _ARGS[call.name] if not isinstance(args.get(a), str)]
        if missing:
            return _error(f"{call.name} needs string argument(s) {', '.join(missing)}")
        for name in _ARGS[call.name]:
            # JSON's \ud800 escapes decode to lone surrogates, which no file, path or shell
            # takes: the model's mistake, said as one (round twenty-eight).
            try:
                args[name].encode()
            except UnicodeEncodeError as exc:
                return _error(f"the argument {name} of {call.name} is not valid Unicode: "
                              f"{exc.object[exc.start:exc.end]!r} at character {exc.start} "
                              "(a lone surrogate)")
        if call.name in ("submit", "give_up"):
            ends: Literal["submit", "give_up"] = "submit" if call.name == "submit" else "give_up"
            return Observation(text="", ends=ends)
        try:
            if call.name == "bash":
                return await self._bash(args["command"], timeout)
            return await self._env(self._file_tool(call.name, args), self.env_grace_s)
        except SandboxPathError as exc:  # includes not found: the model named a bad path
            return _error(str(exc))

    async def _env(self, work: Awaitable[T], limit: float) -> T:
        """Await a sandbox call; past ``limit`` the sandbox is not answering."""
        try:
            return await asyncio.wait_for(work, limit)
        except TimeoutError:
            raise SandboxTimeoutError(f"sandbox {self.sandbox.id} did not answer within "
                                      f"{limit:.1f} s") from None

    async def _session(self) -> ShellSession:
        """The open shell, or a new one (with the branch's setup) where it ended."""
        if self._shell is None or self._shell.closed:
            if self.sandbox.closed:
                raise SandboxClosedError(f"sandbox {self.sandbox.id} is closed")
            self._shell = await self._env(self.sandbox.session(), self.env_grace_s)
            if self.shell_setup:
                await self._env(self._shell.run(self.shell_setup, timeout=self.env_grace_s),
                                2 * self.env_grace_s)
        return self._shell

    async def _bash(self, command: str, timeout: float) -> Observation:
        if not command.strip():
            return _error("bash needs a non-empty command")
        # A shell that ended between two commands (a background ``kill -9 $$``) is the
        # model's doing, not the sandbox's failure: a new shell runs the command. A live
        # sandbox where no new shell lives either: what the commands left holds its process
        # limit (round twenty-eight), the model's to see, and to undo.
        for _ in range(2):
            try:
                shell = await self._session()
                result = await self._env(shell.run(command, timeout=timeout),
                                         timeout + self.env_grace_s)
                break
            except SandboxClosedError:
                if self.sandbox.closed:
                    raise
        else:
            return _error("no shell could start in the sandbox (each ended at once); "
                          "processes left running may hold its limit of "
                          f"{self.sandbox.spec.pids} processes")
        if result.timed_out:
            # A command that runs past its timeout is the model's; a sandbox that cannot run
            # `true` right after is the environment's.
            await self._env(self.sandbox.exec("true", timeout=self.env_grace_s),
                            self.env_grace_s)
        text = result.stdout + (("\n" if result.stdout and result.stderr else "")
                                + result.stderr)
        if result.timed_out:
            text += f"\n[command timed out after {timeout:.0f} s and was killed]"
        elif result.oom_killed:
            text += "\n[the command was killed: out of memory]"
        text = truncate(text, self.observation_limit) if text else "(no output)"
        if result.exit_code not in (None, 0):
            text += f"\n[exit code {result.exit_code}]"
        return Observation(text=text, exit_code=result.exit_code, timed_out=result.timed_out,
                           error="timed out" if result.timed_out else None)

    async def _file_tool(self, name: str, args: dict[str, Any]) -> Observation:
        path = args["path"]
        if name == "read_file":
            data = await self.sandbox.read_file(path)
            text = data.decode("utf-8", "replace")
            return Observation(text=truncate(text, self.observation_limit) or "(empty file)")
        if name == "write_file":
            await self.sandbox.write_file(path, args["content"])
            return Observation(text=f"wrote {len(args['content'])} characters to {path}")
        old, new = args["old"], args["new"]
        text = (await self.sandbox.read_file(path)).decode("utf-8", "replace")
        count = text.count(old) if old else 0
        if count != 1:
            found = "not found" if count == 0 else f"found {count} times"
            return _error(f"str_replace needs old to occur exactly once in {path}; it was "
                          f"{found}")
        await self.sandbox.write_file(path, text.replace(old, new, 1))
        return Observation(text=f"edited {path}")

    async def close(self) -> None:
        if self._shell is not None and not self.sandbox.closed:
            await self._shell.close()
