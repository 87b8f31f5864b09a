"""The host side of the local backend's two fork servers (``spawner.c`` and ``init.c``).

``Spawner`` owns the one process per harness that starts bubblewrap, each sandbox as the host
uid it leased (``uids.py``), and reports when each exits. ``InitChannel`` owns the
SOCK_SEQPACKET socket to one sandbox's PID 1: it starts commands (``EXEC``, with host pipes
passed as SCM_RIGHTS), routes exit statuses back to them, and asks for tree kills and marks.
``LocalProcess`` reads a command's pipes on the event loop: no thread per sandbox or per
command, so thousands of sandboxes share one loop.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import os
import signal
import socket
import struct
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence

from tempering.errors import SandboxClosedError, SandboxStartError
from tempering.sandbox.base import PIPE, Process, Sink
from tempering.sandbox.uids import UidRange

MSG_EXEC, MSG_KILL, MSG_MARK, MSG_KILL_ALL, MSG_CGROUP = 1, 2, 3, 4, 5
MSG_READY, MSG_EXIT, MSG_MARKED, MSG_FAIL = 100, 101, 102, 103
_HEADER = struct.Struct("=IIII")
_SPAWN_HEADER = struct.Struct("=IIIIII")  # type, id, argc, nfds, uid, gid
SPAWN, USERNS, SPAWNED, SPAWN_FAILED, SPAWN_EXITED, USERNS_READY = 1, 2, 101, 102, 103, 104


def _send(sock: socket.socket, data: bytes, fds: Sequence[int]) -> None:
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    try:
        sock.sendmsg([data], anc)
    except BlockingIOError:  # the peer is busy: a short blocking send is the simplest fix
        sock.setblocking(True)
        try:
            sock.sendmsg([data], anc)
        finally:
            sock.setblocking(False)


def _received(sock: socket.socket, size: int) -> Iterator[bytes]:
    """The messages waiting on a non-blocking socket; an empty one means the peer is gone.
    Stops quietly if a handler closed the socket meanwhile."""
    while sock.fileno() != -1:
        try:
            msg = sock.recv(size)
        except BlockingIOError:
            return
        except OSError:
            msg = b""
        yield msg
        if not msg:
            return


def _signed(value: int) -> int:
    signed: int = struct.unpack("=i", struct.pack("=I", value))[0]
    return signed


class Spawner:
    """Starts bubblewrap through ``spawner.c``: forking a small process, not the harness.

    One per harness process; it dies with the thread that started it (PR_SET_PDEATHSIG), and
    the sandboxes with it. Its socket is read on whichever event loop is running.
    """

    def __init__(self, binary: str, uids: UidRange) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Started as root: it keeps CAP_SETUID and CAP_SETGID only, as uids.spawner.
            self._proc = subprocess.Popen(
                [binary, str(theirs.fileno()), str(os.getpid()), str(uids.spawner),
                 str(uids.first), str(uids.last)], pass_fds=(theirs.fileno(),), env={},
                cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._sock: socket.socket | None = ours
        ours.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count(1)
        # spawn id -> (its pid, its wait status); by pid once it started
        self._pending: dict[int, tuple[asyncio.Future[int], asyncio.Future[int]]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._userns: dict[int, asyncio.Future[int]] = {}  # request id -> the namespace's fd

    @property
    def alive(self) -> bool:
        return self._sock is not None and self._proc.poll() is None

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop and self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._sock.fileno())
            loop.add_reader(self._sock.fileno(), self._on_readable)
            self._loop = loop
        return loop

    async def spawn(self, argv: Sequence[str], fds: Sequence[int], uid: int,
                    gid: int) -> tuple[int, asyncio.Future[int]]:
        """Start ``argv`` as ``uid``/``gid`` with ``fds`` as its fds 0, 1, 2, ...; returns its
        pid and a future of its wait status."""
        started, exited = self.request(argv, fds, uid, gid)
        return await started, exited

    def request(self, argv: Sequence[str], fds: Sequence[int], uid: int,
                gid: int) -> tuple[asyncio.Future[int], asyncio.Future[int]]:
        """Send the start of ``argv`` (as ``uid``/``gid``, one of the sandbox range) now and
        return at once: futures of its pid and of its wait status. The caller may work while
        the spawner forks (the fds may be closed)."""
        loop = self._bind()
        if self._sock is None:
            raise SandboxStartError("the sandbox spawner is gone")
        ident = next(self._ids)
        # The exit may arrive in the same read as the start: the caller gets its future anyway.
        started: asyncio.Future[int] = loop.create_future()
        exited: asyncio.Future[int] = loop.create_future()
        self._pending[ident] = (started, exited)
        payload = b"".join(a.encode() + b"\0" for a in argv)
        _send(self._sock, _SPAWN_HEADER.pack(SPAWN, ident, len(argv), len(fds), uid, gid)
              + payload, fds)
        return started, exited

    async def userns(self, inside: int, outside: int) -> int:
        """A descriptor of a new user namespace that maps uid and gid ``inside`` to
        ``outside`` (both of the sandbox range): the mapping of an idmapped mount. The caller
        closes it."""
        loop = self._bind()
        if self._sock is None:
            raise SandboxStartError("the sandbox spawner is gone")
        ident = next(self._ids)
        made: asyncio.Future[int] = loop.create_future()
        self._userns[ident] = made
        _send(self._sock, _SPAWN_HEADER.pack(USERNS, ident, inside, outside, 0, 0), ())
        return await made

    def _on_readable(self) -> None:
        if self._sock is None:
            return
        while self._sock is not None:
            try:
                msg, fds, _, _ = socket.recv_fds(self._sock, 64, 1)
            except BlockingIOError:
                return
            except OSError:
                msg, fds = b"", []
            if not msg:
                self._die()
                return
            kind, ident, a, b = _HEADER.unpack_from(msg)
            if kind == USERNS_READY and ident in self._userns and fds:
                made = self._userns.pop(ident)
                if made.done() or made.get_loop().is_closed():
                    os.close(fds[0])
                else:
                    made.set_result(fds[0])
                continue
            for fd in fds:
                os.close(fd)
            if kind == SPAWN_FAILED and ident in self._userns:
                _settle(self._userns.pop(ident), error=SandboxStartError(
                    f"cannot make a user namespace for an idmapped volume: {os.strerror(a)}"))
            elif kind == SPAWNED and ident in self._pending:
                started, self._exits[a] = self._pending.pop(ident)
                _settle(started, result=a)
            elif kind == SPAWN_FAILED and ident in self._pending:
                error = SandboxStartError(f"cannot start bubblewrap: {os.strerror(a)}")
                for fut in self._pending.pop(ident):  # it will never exit either
                    _settle(fut, error=error)
            elif kind == SPAWN_EXITED and a in self._exits:
                _settle(self._exits.pop(a), result=_signed(b))

    def _die(self) -> None:
        if self._sock is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.fileno())
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for fut in [*(f for pair in self._pending.values() for f in pair),
                    *self._exits.values(), *self._userns.values()]:
            _settle(fut, error=SandboxClosedError("the sandbox spawner died"))
        self._pending.clear()
        self._exits.clear()
        self._userns.clear()


def _settle(fut: asyncio.Future[int], *, result: int = 0,
            error: BaseException | None = None) -> None:
    """Resolve a future that may belong to an event loop that has since closed."""
    if fut.done() or fut.get_loop().is_closed():
        return
    if error is not None:
        fut.set_exception(error)
        fut.add_done_callback(lambda f: f.exception())
    else:
        fut.set_result(result)


class InitChannel:
    """Talks to one sandbox's init; ``on_death`` is called once if the init goes away."""

    def __init__(self, sock: socket.socket, label: str, on_death: Callable[[str], None]) -> None:
        self._sock: socket.socket | None = sock
        self._label = label
        self._on_death = on_death
        self._loop = asyncio.get_running_loop()
        self._jobs: dict[int, LocalProcess] = {}
        self._marks: dict[int, asyncio.Future[None]] = {}
        self._ids = itertools.count(1)
        self.ready: asyncio.Future[None] = self._loop.create_future()
        # A start can be abandoned (cancelled, pool closed) before anyone reads `ready`.
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._on_readable)

    @property
    def open(self) -> bool:
        return self._sock is not None

    def close(self, why: str) -> None:
        """Close the socket (the init exits, and the sandbox with it) and fail what waits."""
        if self._sock is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if not self.ready.done():
            self.ready.set_exception(SandboxClosedError(f"{self._label}: {why}"))
        for proc in list(self._jobs.values()):
            proc._finish(None, why)
        self._jobs.clear()
        for fut in self._marks.values():
            if not fut.done():
                fut.set_result(None)

    def close_now(self) -> None:
        """Synchronous close for interpreter exit (no loop calls)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def _on_readable(self) -> None:
        if self._sock is None:
            return
        for msg in _received(self._sock, 4096):
            if not msg:
                why = "the sandbox's init exited (sandbox died)"
                self.close(why)
                self._on_death(why)
                return
            kind, ident, value, _ = _HEADER.unpack_from(msg)
            text = msg[_HEADER.size:].decode(errors="replace")
            if kind == MSG_READY and not self.ready.done():
                if value:
                    self.ready.set_exception(SandboxStartError(text))
                else:
                    self.ready.set_result(None)
            elif kind == MSG_EXIT and ident in self._jobs:
                self._jobs.pop(ident)._finish(os.waitstatus_to_exitcode(_signed(value)), "")
            elif kind == MSG_FAIL and ident in self._jobs:
                self._jobs.pop(ident)._finish(None, text)
            elif kind == MSG_MARKED and ident in self._marks:
                fut = self._marks.pop(ident)
                if not fut.done():
                    fut.set_result(None)

    def send(self, kind: int, ident: int, a: int = 0, b: int = 0, payload: bytes = b"",
             fds: Sequence[int] = ()) -> None:
        if self._sock is None:
            raise SandboxClosedError(f"{self._label} is closed")
        try:
            _send(self._sock, _HEADER.pack(kind, ident, a, b) + payload, fds)
        except (BrokenPipeError, ConnectionResetError) as exc:  # init died under us
            raise SandboxClosedError(f"{self._label} died: its init no longer answers "
                                     f"({exc.strerror})") from exc

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, stdout: Sink,
              stderr: Sink, stdin: bytes | object | None) -> LocalProcess:
        ident = next(self._ids)
        env_items = [f"{k}={v}" for k, v in env.items()]
        payload = b"".join(s.encode() + b"\0" for s in [cwd, *argv, *env_items])
        pipes = [os.pipe() for _ in range(3)]
        theirs = (pipes[0][0], pipes[1][1], pipes[2][1])
        try:
            self.send(MSG_EXEC, ident, len(argv), len(env_items), payload, theirs)
        except BaseException:
            for r, w in pipes:
                os.close(r)
                os.close(w)
            raise
        for fd in theirs:
            os.close(fd)
        proc = LocalProcess(self, ident, pipes[0][1], pipes[1][0], pipes[2][0], stdout, stderr)
        self._jobs[ident] = proc
        if stdin is not PIPE:
            proc._feed_stdin(stdin if isinstance(stdin, bytes) else b"")
        return proc

    async def mark(self, ident: int, kind: int = MSG_MARK) -> None:
        fut = self._loop.create_future()
        self._marks[ident] = fut
        try:
            self.send(kind, ident)
        except BaseException:
            self._marks.pop(ident, None)
            raise
        await fut

    async def kill_all(self) -> None:
        """SIGKILL every process of the sandbox but its init; returns once none is left."""
        await self.mark(next(self._ids), MSG_KILL_ALL)

    async def commands_cgroup(self, procs: str) -> None:
        """Have every command from now on enter the cgroup whose ``cgroup.procs`` is
        ``procs`` (opened here, by the host, for the init to write to)."""
        fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
        ident = next(self._ids)
        fut = self._loop.create_future()
        self._marks[ident] = fut
        try:
            self.send(MSG_CGROUP, ident, fds=[fd])
        except BaseException:
            self._marks.pop(ident, None)
            raise
        finally:
            os.close(fd)
        await fut


class LocalProcess(Process):
    """A command running under the sandbox's init; its pipes are read on the event loop."""

    def __init__(self, channel: InitChannel, ident: int, stdin_fd: int, out_fd: int, err_fd: int,
                 stdout: Sink, stderr: Sink) -> None:
        self._channel, self._id = channel, ident
        self._loop = asyncio.get_running_loop()
        self._stdin: int | None = stdin_fd
        self._readers = {out_fd: stdout, err_fd: stderr}
        for fd in self._readers:
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, self._on_readable, fd)
        self._exit: asyncio.Future[tuple[int | None, str]] = self._loop.create_future()
        self._stdin_task: asyncio.Task[None] | None = None

    def _on_readable(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if data:
            self._readers[fd](data)
        else:
            self._close_reader(fd)

    def _close_reader(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        os.close(fd)
        del self._readers[fd]

    def _drain(self) -> None:
        """After the main process exited, take what is in the pipes; stop at an empty pipe, so a
        daemon that kept the pipe open cannot hold the result."""
        for fd in list(self._readers):
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not data:
                    break
                self._readers[fd](data)
            self._close_reader(fd)

    def _finish(self, code: int | None, why: str) -> None:
        if self._exit.done():
            return
        self._drain()
        self.close_stdin()
        self._exit.set_result((code, why))

    def _feed_stdin(self, data: bytes) -> None:
        if not data:
            self.close_stdin()
        else:
            self._stdin_task = self._loop.create_task(self._write_all(data, close=True))

    async def _write_all(self, data: bytes, *, close: bool) -> None:
        view = memoryview(data)
        try:
            while view and self._stdin is not None:
                try:
                    view = view[os.write(self._stdin, view):]
                except BlockingIOError:
                    fut = self._loop.create_future()
                    self._loop.add_writer(self._stdin, fut.set_result, None)
                    try:
                        await fut
                    finally:
                        if self._stdin is not None:
                            self._loop.remove_writer(self._stdin)
        except (BrokenPipeError, OSError):
            pass  # the command stopped reading; what it read is what it got
        finally:
            if close:
                self.close_stdin()

    async def wait(self) -> tuple[int | None, str]:
        return await asyncio.shield(self._exit)

    async def kill(self, *, since_mark: bool = False) -> None:
        if not self._exit.done() and self._channel.open:
            self._channel.send(MSG_KILL, self._id, signal.SIGKILL, int(since_mark))

    async def mark(self) -> None:
        await self._channel.mark(self._id)

    async def write(self, data: bytes) -> None:
        if self._stdin is None:
            raise SandboxClosedError("the process's stdin is closed")
        os.set_blocking(self._stdin, False)
        await self._write_all(data, close=False)

    def close_stdin(self) -> None:
        if self._stdin is not None:
            with contextlib.suppress(OSError):
                os.close(self._stdin)
            self._stdin = None
