"""The bases the local and docker backends share: a sandbox on this host whose files the host
reaches directly, and whose PID 1 is ``init.c``.

``HostFileSandbox`` writes the file API of the contract once, over ``Storage`` (``files.py``:
every path resolved by the kernel beneath the storage root, with the sandbox user's rights).
``InitSandbox`` adds what follows from an init reached over an ``InitChannel``
(``forkserver.py``): commands are forks of it, read-only bind mounts are made in its mount
namespace, and the sandbox is dead once the init is gone. A backend says how its init starts
(``_start``): bubblewrap on this host (``local/``) or a container (``docker/``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import posixpath
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Self, TypeVar

from tempering.errors import SandboxClosedError, SandboxError
from tempering.sandbox.base import Process, Sandbox, Sink, ensure_open
from tempering.sandbox.copyout import READ_FILE_LIMIT, CopyLimits, TreeCopy, download_limits
from tempering.sandbox.files import Storage
from tempering.sandbox.forkserver import InitChannel
from tempering.sandbox.native import native_binary
from tempering.sandbox.spec import SandboxSpec

R = TypeVar("R")


class HostFileSandbox(Sandbox):
    """A sandbox whose writable directories the host reaches directly (``Storage``): the file
    API is written once here for every such backend (local, docker)."""

    _storage: Storage | None = None

    def _files(self) -> Storage:
        ensure_open(self)
        if self._storage is None:
            raise SandboxError(f"sandbox {self.id} has not started")
        return self._storage

    async def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if len(raw) > 1 << 20:  # small writes are faster inline than through a thread
            await asyncio.to_thread(self._files().write, path, raw, mode)
        else:
            self._files().write(path, raw, mode)
        self._command_finished()

    async def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        return self._files().read(path, READ_FILE_LIMIT if limit is None else limit)

    async def upload(self, local_path: str | os.PathLike[str], dest: str) -> None:
        await asyncio.to_thread(self._files().upload, os.fspath(local_path), dest)
        self._command_finished()

    async def download(self, src: str, local_path: str | os.PathLike[str], *,
                       limits: CopyLimits | None = None) -> list[str]:
        files, local = self._files(), os.fspath(local_path)
        limits = limits or download_limits(self.spec.disk_mb)
        return await _stoppable(lambda stop: files.download(src, local, limits, stop))

    async def read_tree(self, src: str = ".", limits: CopyLimits | None = None, *,
                        links: bool = False) -> TreeCopy:
        files = self._files()
        return await _stoppable(lambda stop: files.read_tree(src, limits or CopyLimits(), stop,
                                                             links=links))

    async def write_link(self, path: str, target: str) -> None:
        self._files().symlink(target, path)
        self._command_finished()

    async def list(self, path: str = ".") -> list[str]:
        return self._files().listdir(path)


async def _stoppable(work: Callable[[threading.Event], R]) -> R:
    """Run ``work`` in a thread; if the caller is cancelled, tell it to stop and wait until it
    has (within one entry or one chunk), so nothing is still being copied once this returns."""
    stop = threading.Event()
    thread = asyncio.ensure_future(asyncio.to_thread(work, stop))
    try:
        return await asyncio.shield(thread)
    except asyncio.CancelledError:
        stop.set()
        with contextlib.suppress(BaseException):
            await thread
        raise


class InitSandbox(HostFileSandbox):
    """A sandbox whose PID 1 is ``init.c``, reached over an ``InitChannel``: commands are forks
    of that init, and the sandbox is dead once the init is gone (local and docker backends)."""

    _channel: InitChannel | None = None
    _closed: bool = False
    _dead: str | None = None  # why the init went away, if it did
    _prepared: bool = False  # set on each backend class once this process prepared its host

    @abc.abstractmethod
    def __init__(self, spec: SandboxSpec) -> None:
        """A sandbox of ``spec``, not started yet."""

    @abc.abstractmethod
    async def _start(self) -> None:
        """Start the sandbox's init and wait until it is ready."""

    @classmethod
    async def _prepare_host(cls) -> None:  # noqa: B027 - a hook, empty unless a backend needs it
        """Once per process and backend, before its first sandbox (reclaim what crashed
        processes left, register the clean-up at exit)."""

    _init_pid: int = 0

    async def make_readonly(self, path: str, *more: str, pin: Sequence[str] = ()) -> None:
        """Make ``path`` and ``more`` (directories or regular files, relative to the workdir)
        read-only for everything that runs in the sandbox from now on, which cannot undo it:
        read-only bind mounts made from the host in the sandbox's mount namespace (a file so
        bound cannot be removed or replaced either). ``pin``: directories bound onto
        themselves and left writable, so that they cannot be renamed or removed (the parents
        of a sealed file: else the way to it could be moved away). A grader seals the hidden
        tests, the task's protected files and its own launcher with it before the tested code
        runs."""
        ensure_open(self)
        targets = [posixpath.join(self.spec.workdir, p) for p in (path, *more)]
        if pin:
            targets += ["--pin", *(posixpath.join(self.spec.workdir, p) for p in pin)]
        proc = await asyncio.create_subprocess_exec(
            str(native_binary("init")), "--seal", str(self._init_pid), *targets,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise SandboxError(f"sandbox {self.id}: could not make {', '.join(targets)} "
                               f"read-only: {err.decode(errors='replace').strip()}")

    async def stop_processes(self) -> None:
        """SIGKILL every process in the sandbox (its commands, and whatever they left running)
        but its init; the sandbox and its files stay. A grader runs a task's verifiers only
        once nothing of the tested code's is left."""
        ensure_open(self)
        assert self._channel is not None
        await self._channel.kill_all()

    @classmethod
    async def create(cls, spec: SandboxSpec) -> Self:
        if not cls.__dict__.get("_prepared", False):  # each backend class once
            cls._prepared = True
            await cls._prepare_host()
        sb = cls(spec)
        try:
            await sb._start()
        except BaseException:
            await sb.close()
            raise
        return sb

    def _closing(self) -> bool:
        """Mark the sandbox closed and close its channel to the init, for ``close``; False
        if it was closed already (then ``close`` does nothing more)."""
        if self._closed:
            return False
        self._closed = True
        if self._channel is not None:
            self._channel.close("sandbox closed")
        return True

    @property
    def closed(self) -> bool:
        return self._closed or self._dead is not None

    def _on_death(self, why: str) -> None:
        self._dead = why

    async def _spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str,
                     stdout: Sink, stderr: Sink, stdin: bytes | object | None) -> Process:
        ensure_open(self)
        if self._channel is None:
            raise SandboxClosedError(f"sandbox {self.id} is not running")
        return self._channel.spawn(argv, env, cwd, stdout, stderr, stdin)
