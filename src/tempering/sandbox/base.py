"""The sandbox contract, shared by every backend.

A backend implements a handful of primitives: start a process inside the sandbox
(``_spawn`` -> ``Process``), the file API, ``fork`` and ``close``. Everything an agent or a
grader uses on top of them (``exec`` with timeouts and capped output, persistent shell sessions)
is written once here, so the backends cannot drift apart in behaviour.
"""

from __future__ import annotations

import abc
import asyncio
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, Self

from tempering.errors import SandboxClosedError, SandboxError
from tempering.sandbox.copyout import CopyLimits, TreeCopy
from tempering.sandbox.spec import ExecResult, SandboxSpec, SandboxUsage

Sink = Callable[[bytes], None]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "USER": "user",
            "LOGNAME": "user", "TERM": "dumb"}
"""What every command in a sandbox starts with (the spec's ``env`` and the command's on top)."""


class OutputCapture:
    """Collects one output stream with bounded memory: the first and last ``limit/2`` bytes."""

    __slots__ = ("_half", "_head", "_tail", "total")

    def __init__(self, limit: int) -> None:
        self._half = max(limit // 2, 1)
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._half - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > 2 * self._half:  # trim rarely, not on every chunk
                del self._tail[: len(self._tail) - self._half]

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + min(len(self._tail), self._half)

    def text(self) -> str:
        tail = bytes(self._tail[-self._half:]) if self._tail else b""
        if not self.truncated:
            return (bytes(self._head) + tail).decode("utf-8", errors="replace")
        dropped = self.total - len(self._head) - len(tail)
        note = f"\n[... {dropped} bytes of output truncated ...]\n".encode()
        return (bytes(self._head) + note + tail).decode("utf-8", errors="replace")


class Process(abc.ABC):
    """A process started inside a sandbox, with its output delivered to sinks."""

    @abc.abstractmethod
    async def wait(self) -> tuple[int | None, str]:
        """Wait for the main process to exit; all its output has reached the sinks on return.

        Returns the exit code (negative for a signal, None if it never started) and, when it
        never started, why.
        """

    @abc.abstractmethod
    async def kill(self, *, since_mark: bool = False) -> None:
        """SIGKILL everything the process started; with ``since_mark``, only what it started
        after the last ``mark()``, and never the main process itself."""

    @abc.abstractmethod
    async def mark(self) -> None:
        """Remember the processes alive now, for ``kill(since_mark=True)``."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Write to the process's stdin (only for processes spawned with ``stdin=PIPE``)."""

    @abc.abstractmethod
    def close_stdin(self) -> None:
        """Close the process's stdin."""


PIPE = object()
"""Pass as ``stdin`` to ``_spawn`` to keep stdin open for ``Process.write``."""


class Sandbox(abc.ABC):
    """One isolated environment. Use it as an async context manager, or call ``close()``."""

    id: str
    spec: SandboxSpec
    preforks: ClassVar[bool] = False
    """Whether the backend forks fresh sandboxes from a started one
    (``sandbox/local/zygote.py``)."""

    # ---- backend primitives ----

    @abc.abstractmethod
    async def _spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str,
                     stdout: Sink, stderr: Sink, stdin: bytes | object | None) -> Process:
        """Start ``argv`` inside the sandbox."""

    async def _oom_kills(self) -> int | None:
        """How many processes the OOM killer has killed in this sandbox so far (None: unknown)."""
        return None

    def _command_finished(self) -> None:  # noqa: B027 - a hook, empty unless a backend needs it
        """Called after each command (exec or session run); backends may react (writeback)."""

    async def usage(self) -> SandboxUsage:
        """Peak memory and processes so far, and OOM kills: what an episode cost."""
        return SandboxUsage(None, None, await self._oom_kills())

    @abc.abstractmethod
    async def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Write a file (parents are created), relative to the workdir."""

    @abc.abstractmethod
    async def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        """Read a regular file, relative to the workdir. A file larger than ``limit`` bytes
        (``READ_FILE_LIMIT``, 16 MiB, by default), by apparent or allocated size, is refused
        with SandboxFileTooLargeError before anything of it is loaded."""

    @abc.abstractmethod
    async def upload(self, local_path: str | os.PathLike[str], dest: str) -> None:
        """Copy a host file or directory tree into the sandbox at ``dest``."""

    @abc.abstractmethod
    async def download(self, src: str, local_path: str | os.PathLike[str], *,
                       limits: CopyLimits | None = None) -> list[str]:
        """Copy a sandbox file or directory tree to the host (regular files and directories)
        within ``limits`` (default ``download_limits(spec.disk_mb)``: nothing larger than the
        sandbox's disk); returns the paths left behind (symbolic links, devices, FIFOs, what
        the limits left out), never followed. Hard links stay hard links."""

    @abc.abstractmethod
    async def read_tree(self, src: str = ".", limits: CopyLimits | None = None, *,
                        links: bool = False) -> TreeCopy:
        """The regular files under the directory ``src``, read into memory within ``limits``
        (default ``CopyLimits()``); what was left out is listed, never raised. With ``links``,
        symbolic links are kept as their targets (``TreeCopy.links``), never followed."""

    @abc.abstractmethod
    async def write_link(self, path: str, target: str) -> None:
        """Make a symbolic link at ``path`` (relative to the workdir; parents made) to
        ``target``, which is never resolved on the host."""

    @abc.abstractmethod
    async def list(self, path: str = ".") -> list[str]:
        """Names in a sandbox directory, sorted."""

    @abc.abstractmethod
    async def fork(self) -> Sandbox:
        """A new sandbox with the same spec whose files are a copy of this one's right now."""

    async def make_readonly(self, path: str, *more: str, pin: Sequence[str] = ()) -> None:
        """Make ``path`` and ``more`` (directories or regular files, relative to the workdir)
        read-only for everything that runs in the sandbox from now on, in a way nothing inside
        can undo; the directories ``pin`` stay writable but can no longer be renamed."""
        raise NotImplementedError(f"{type(self).__name__} cannot make {path!r} read-only")

    async def stop_processes(self) -> None:
        """Kill every process running in the sandbox (commands and what they left behind);
        the sandbox and its files stay."""
        raise NotImplementedError(f"{type(self).__name__} cannot stop its processes")

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop every process and free every resource of the sandbox. Idempotent."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """Whether the sandbox was closed (or died)."""

    # ---- shared behaviour ----

    def _command_env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = dict(BASE_ENV)
        env.update(self.spec.env)
        if extra:
            env.update(extra)
        return env

    def _command_cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.spec.workdir
        return cwd if cwd.startswith("/") else os.path.join(self.spec.workdir, cwd)

    async def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None,
                   stdin: str | bytes | None = None, env: Mapping[str, str] | None = None,
                   cwd: str | None = None) -> ExecResult:
        """Run a command to completion: a ``str`` runs under ``/bin/sh -c``, a list directly.

        On timeout every process the command started is killed and the output so far is
        returned with ``timed_out=True``. If the caller is cancelled, the command is killed too.
        """
        limit = self.spec.timeout_s if timeout is None else timeout
        if limit <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        command = await self.start(cmd, env=env, cwd=cwd, stdin=data or b"")
        return await command.result(limit)

    async def start(self, cmd: str | Sequence[str], *, env: Mapping[str, str] | None = None,
                    cwd: str | None = None, stdin: bytes | None = None) -> Command:
        """Start a command and return at once; ``stdin=None`` keeps its stdin open for
        ``Command.write``. Collect it with ``Command.result(timeout)``."""
        out = OutputCapture(self.spec.output_limit_bytes)
        err = OutputCapture(self.spec.output_limit_bytes)
        ooms = await self._oom_kills()
        proc = await self._spawn(_argv(cmd), env=self._command_env(env),
                                 cwd=self._command_cwd(cwd), stdout=out.feed, stderr=err.feed,
                                 stdin=PIPE if stdin is None else stdin)
        return Command(self, proc, out, err, ooms)

    async def session(self) -> ShellSession:
        """A persistent shell: the working directory and environment survive between commands."""
        shell = ShellSession(self)
        await shell._start()
        return shell

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


class Command:
    """A command started in a sandbox (``Sandbox.start``): feed its stdin, then collect it."""

    def __init__(self, sandbox: Sandbox, proc: Process, out: OutputCapture, err: OutputCapture,
                 ooms: int | None) -> None:
        self._sandbox, self._proc, self._out, self._err, self._ooms = sandbox, proc, out, err, ooms
        self._start = time.perf_counter()

    async def write(self, data: bytes) -> None:
        """Write to its stdin (started with ``stdin=None``)."""
        await self._proc.write(data)

    def close_stdin(self) -> None:
        self._proc.close_stdin()

    async def kill(self) -> None:
        """SIGKILL everything the command started."""
        await self._proc.kill()

    async def result(self, timeout: float) -> ExecResult:
        """Wait up to ``timeout`` seconds for it to exit (from now); past that, every process
        it started is killed and the output so far is returned with ``timed_out=True``. If the
        caller is cancelled, the command is killed too."""
        timed_out = False
        waiter = asyncio.ensure_future(self._proc.wait())
        try:
            done, _ = await asyncio.wait({waiter}, timeout=timeout)
            if not done:
                timed_out = True
                await self._proc.kill()
            code, why = await waiter
        except BaseException:
            if not waiter.done():
                waiter.cancel()
                if not self._sandbox.closed:
                    await asyncio.shield(self._proc.kill())
            raise
        duration = time.perf_counter() - self._start
        self._sandbox._command_finished()
        out, err = self._out, self._err
        if why:
            err.feed(f"tempering: {why}\n".encode())
        ooms = self._ooms
        oom = ooms is not None and ((await self._sandbox._oom_kills()) or 0) > ooms
        return ExecResult(
            exit_code=None if timed_out else code, stdout=out.text(), stderr=err.text(),
            timed_out=timed_out, oom_killed=oom, truncated=out.truncated or err.truncated,
            duration_s=duration,
        )


def _argv(cmd: str | Sequence[str]) -> list[str]:
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ValueError("empty command")
        return ["/bin/sh", "-c", cmd]
    argv = list(cmd)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"a command list must be a non-empty list of str, got {cmd!r}")
    if any("\0" in a for a in argv):
        raise ValueError("command arguments cannot hold NUL bytes")
    return argv


_SHELL = 'if command -v bash >/dev/null 2>&1; then exec bash --noprofile --norc; else exec sh; fi'


class ShellSession:
    """A shell that lives across commands: ``cd`` and ``export`` persist, as for a person.

    Each ``run`` sends the command through a quoted here-document and ``eval`` (so a syntax
    error cannot swallow what follows), then prints a random marker with the exit status on
    both streams. On timeout, the processes the command started are killed and the shell
    lives on; if the shell itself is stuck (a busy builtin loop), the session is closed.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self._proc: Process | None = None
        self._lock = asyncio.Lock()
        self._streams: list[_MarkerStream | None] = [None, None]
        self._dead: str | None = None
        self._exited: asyncio.Future[tuple[int | None, str]] | None = None

    async def _start(self) -> None:
        sb = self._sandbox
        self._proc = await sb._spawn(
            ["/bin/sh", "-c", _SHELL], env=sb._command_env(None), cwd=sb.spec.workdir,
            stdout=lambda d: self._feed(0, d), stderr=lambda d: self._feed(1, d), stdin=PIPE)
        # The shell may end by what it runs (``exit``, ``kill -9 $$`` from a background job):
        # then the session is closed, and a caller opens another, as a person would.
        self._exited = asyncio.ensure_future(self._proc.wait())
        self._exited.add_done_callback(self._on_exit)

    def _on_exit(self, exited: asyncio.Future[tuple[int | None, str]]) -> None:
        if self._dead is None:
            code = None if exited.cancelled() or exited.exception() else exited.result()[0]
            self._dead = f"the shell exited (status {code})"

    def _feed(self, index: int, data: bytes) -> None:
        stream = self._streams[index]
        if stream is not None:
            stream.feed(data)

    @property
    def closed(self) -> bool:
        return self._dead is not None or self._sandbox.closed

    async def run(self, cmd: str, *, timeout: float | None = None) -> ExecResult:
        """Run ``cmd`` in the shell and return its output and exit status."""
        if not cmd.strip():
            raise ValueError("empty command")
        limit = self._sandbox.spec.timeout_s if timeout is None else timeout
        async with self._lock:
            if self.closed or self._proc is None:
                why = self._dead or "sandbox closed"
                raise SandboxClosedError(f"shell session is closed ({why}); "
                                         "open a new one with sandbox.session()")
            proc = self._proc
            nonce = secrets.token_hex(8)
            marker = f"__tempering_{nonce}__"
            limit_bytes = self._sandbox.spec.output_limit_bytes
            out, err = _MarkerStream(marker, limit_bytes), _MarkerStream(marker, limit_bytes)
            self._streams = [out, err]
            script = (f"__tempering_cmd=$(cat <<'__tempering_{nonce}_eof'\n{cmd}\n"
                      f"__tempering_{nonce}_eof\n)\n"
                      f"eval \"$__tempering_cmd\" </dev/null\n"
                      f"printf '\\n{marker}%s\\n' \"$?\"; printf '\\n{marker}\\n' >&2\n")
            ooms = await self._sandbox._oom_kills()
            start = time.perf_counter()
            await proc.mark()
            try:
                # Within the command's time: a shell that reads no input (stopped by what an
                # earlier command left) would hold a long command's write forever.
                await asyncio.wait_for(proc.write(script.encode()), limit)
                stuck = None
            except SandboxClosedError:
                self._dead = self._dead or "the shell exited"
                raise SandboxClosedError(f"shell session is closed ({self._dead}); open a new "
                                         "one with sandbox.session()") from None
            except TimeoutError:
                stuck = "the shell did not read the command within its timeout"
            both = asyncio.gather(out.done.wait(), err.done.wait())
            timed_out = False
            waits: set[asyncio.Future[Any]] = set()
            try:
                if stuck:
                    raise TimeoutError
                waits.add(asyncio.shield(both))
                if self._exited is not None:
                    waits.add(asyncio.shield(self._exited))
                done, _ = await asyncio.wait(
                    waits, timeout=max(0.0, limit - (time.perf_counter() - start)),
                    return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    raise TimeoutError
            except TimeoutError:
                timed_out = True
                await proc.kill(since_mark=True)
                try:
                    if stuck:
                        raise TimeoutError
                    await asyncio.wait_for(asyncio.shield(both), 2.0)
                except TimeoutError:
                    self._dead = stuck or (f"the command {cmd[:60]!r} outran its timeout "
                                           "inside the shell itself")
                    await proc.kill()
            finally:
                if not both.done():
                    both.cancel()
                    # a cancelled gather may end with CancelledError set as its exception,
                    # and pass it to its shields: taken here, not logged as never retrieved
                    both.add_done_callback(lambda f: f.cancelled() or f.exception())
                for wait in waits:
                    wait.cancel()  # the shields: what they guard goes on as it was
            self._streams = [None, None]
            self._sandbox._command_finished()
            status = out.status
            if status is None and self._exited is not None and self._exited.done() \
                    and not self._exited.cancelled() and self._exited.exception() is None:
                status = self._exited.result()[0]  # the command ended the shell itself
            oom = ooms is not None and ((await self._sandbox._oom_kills()) or 0) > ooms
            return ExecResult(
                exit_code=None if timed_out else status, stdout=out.capture.text(),
                stderr=err.capture.text(), timed_out=timed_out, oom_killed=oom,
                truncated=out.capture.truncated or err.capture.truncated,
                duration_s=time.perf_counter() - start)

    async def close(self) -> None:
        """Stop the shell and everything it started."""
        if self._proc is not None and self._dead is None:
            self._dead = "closed"
            if not self._sandbox.closed:
                await self._proc.kill()


class _MarkerStream:
    """Feeds a capture until the marker line appears; keeps a short window to catch a marker
    split across reads."""

    def __init__(self, marker: str, limit: int) -> None:
        self.marker = ("\n" + marker).encode()
        self.capture = OutputCapture(limit)
        self.pending = bytearray()
        self.done = asyncio.Event()
        self.status: int | None = None

    def feed(self, data: bytes) -> None:
        if self.done.is_set():
            return
        self.pending += data
        at = self.pending.find(self.marker)
        if at >= 0:
            rest = self.pending[at + len(self.marker):]
            line_end = rest.find(b"\n")
            if line_end < 0:
                return  # the status digits have not all arrived yet
            self.capture.feed(bytes(self.pending[:at]))
            match = re.match(rb"\d+", rest[:line_end])
            self.status = int(match.group()) if match else None
            self.pending.clear()
            self.done.set()
            return
        keep = len(self.marker) + 16
        if len(self.pending) > keep:
            self.capture.feed(bytes(self.pending[:-keep]))
            del self.pending[:-keep]


def ensure_open(sandbox: Sandbox) -> None:
    if sandbox.closed:
        raise SandboxClosedError(f"sandbox {sandbox.id} is closed")


__all__ = ["Sandbox", "Process", "ShellSession", "OutputCapture", "PIPE", "SandboxError",
           "ensure_open"]
