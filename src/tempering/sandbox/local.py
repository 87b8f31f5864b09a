"""The ``local`` backend: Linux namespaces through bubblewrap, cgroup limits, seccomp.

Starting a sandbox is one bubblewrap process: new user, pid, mount, net, ipc, uts and cgroup
namespaces, a read-only system (``rootfs.py``), run as an unprivileged host uid. Its first
process is ``init.c``, a fork server that mounts the size-limited storage, drops every capability
and installs seccomp. The host moves it into the sandbox's cgroups (``cgroup.py``) before the
first command, then talks to it over one SOCK_SEQPACKET socket: a command costs a fork inside
the running sandbox, and its stdin/stdout/stderr are host pipes passed over that socket, read
here with the event loop (no thread per sandbox). Closing the socket ends PID 1, and the kernel
kills everything else in the sandbox with it; bubblewrap then exits and the cgroups go.

Files are read and written from the host through ``/proc/<init>/root`` with kernel-confined path
resolution (``files.py``), without starting a process inside.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import contextlib
import itertools
import json
import math
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from tempering.errors import (SandboxClosedError, SandboxError, SandboxStartError,
                              SandboxUnavailableError)
from tempering.sandbox import cgroup
from tempering.sandbox.base import PIPE, Process, Sandbox, Sink, ensure_open
from tempering.sandbox.files import Storage
from tempering.sandbox.native import init_binary
from tempering.sandbox.rootfs import system_args
from tempering.sandbox.spec import SandboxSpec

MSG_EXEC, MSG_KILL, MSG_MARK = 1, 2, 3
MSG_READY, MSG_EXIT, MSG_MARKED, MSG_FAIL = 100, 101, 102, 103
_HEADER = struct.Struct("=IIII")
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Host:
    """What every local sandbox on this host shares, checked once per process."""

    bwrap: str
    init: str
    hierarchy: cgroup.Hierarchy
    tag: str
    uid: int
    gid: int


@cache
def host() -> Host:
    """Check that this host can run local sandboxes; say exactly what is missing if not."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError(
            "bubblewrap (bwrap) is not installed; install it with `apt-get install -y bubblewrap`")
    if os.geteuid() != 0:
        raise SandboxUnavailableError(
            "the local backend needs root on the host to set cgroup limits "
            f"(running as uid {os.geteuid()}); run as root")
    with contextlib.suppress(OSError):
        with open("/proc/sys/user/max_user_namespaces") as f:
            if int(f.read()) == 0:
                raise SandboxUnavailableError(
                    "user namespaces are disabled (user.max_user_namespaces = 0); enable them "
                    "with `sysctl -w user.max_user_namespaces=15000`")
    for knob in ("kernel/unprivileged_userns_clone", "kernel/apparmor_restrict_unprivileged_userns"):
        with contextlib.suppress(OSError), open(f"/proc/sys/{knob}") as f:
            value = f.read().strip()
            if (knob.endswith("clone") and value == "0") or (knob.endswith("userns") and value == "1"):
                raise SandboxUnavailableError(
                    f"unprivileged user namespaces are restricted ({knob.replace('/', '.')} = "
                    f"{value}); bubblewrap needs them: `sysctl -w {knob.replace('/', '.')}="
                    f"{'1' if value == '0' else '0'}`")
    uid = int(os.environ.get("TEMPERING_SANDBOX_UID", "64000"))
    hierarchy = cgroup.Hierarchy.detect()
    tag = cgroup.owner_tag()
    cgroup.reclaim(hierarchy)
    hierarchy.prepare(tag)
    atexit.register(_close_all_at_exit)
    return Host(bwrap, str(init_binary()), hierarchy, tag, uid, uid)


_live: weakref.WeakSet[LocalSandbox] = weakref.WeakSet()
_next_cpu = itertools.count()


def _close_all_at_exit() -> None:
    """Nothing outlives the harness: kill what callers forgot to close, remove the cgroups."""
    for sb in list(_live):
        sb._kill_now()
    h = host()
    for path in h.hierarchy.owner_dirs(h.tag).values():
        with contextlib.suppress(OSError):
            cgroup.remove_cgroup(path, timeout=2.0)


class LocalSandbox(Sandbox):
    """A sandbox made of Linux namespaces on this host."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.id = f"sbx-{secrets.token_hex(6)}"
        self._host = host()
        self._cgroup = cgroup.SandboxCgroup(self._host.hierarchy, self._host.tag, self.id)
        self._ctl: socket.socket | None = None
        self._bwrap: subprocess.Popen[bytes] | None = None
        self._init_pid = 0
        self._ready: asyncio.Future[None] | None = None
        self._jobs: dict[int, LocalProcess] = {}
        self._marks: dict[int, asyncio.Future[None]] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._dead: str | None = None
        self._storage: Storage | None = None

    # ---- lifecycle ----

    @classmethod
    def reclaim(cls) -> int:
        """Remove what crashed earlier processes left (cgroups, processes); returns the count."""
        return cgroup.reclaim(host().hierarchy)

    @classmethod
    async def create(cls, spec: SandboxSpec) -> LocalSandbox:
        sb = cls(spec)
        try:
            await sb._start()
        except BaseException:
            await sb.close()
            raise
        return sb

    async def _start(self) -> None:
        h, spec, loop = self._host, self.spec, asyncio.get_running_loop()
        self._cgroup.create(memory_mb=spec.memory_mb, pids=spec.pids, cpus=spec.cpus)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_r, info_w = os.pipe()
        args = [h.bwrap, "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid",
                "--unshare-ipc", "--unshare-uts", "--unshare-cgroup", "--hostname", "sandbox",
                "--die-with-parent", "--new-session", "--as-pid-1",
                "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETFCAP", "--clearenv",
                *system_args(spec, 1000, 1000), "--proc", "/proc", "--dev", "/dev",
                "--dir", "/tmp", "--dir", spec.workdir, "--dir", "/.tempering/disk",
                "--ro-bind", h.init, "/.tempering/init", "--remount-ro", "/",
                "--info-fd", str(info_w)]
        if not spec.network:
            args.append("--unshare-net")
        args += ["/.tempering/init", str(theirs.fileno()), str(spec.disk_mb << 20),
                 spec.workdir, "1000", "1000"]
        try:
            self._bwrap = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(), info_w), user=h.uid, group=h.gid, extra_groups=[],
                env={}, cwd="/")
        finally:
            theirs.close()
            os.close(info_w)
        self._ctl = ours
        ours.setblocking(False)
        self._ready = loop.create_future()
        loop.add_reader(ours.fileno(), self._on_control)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                self._init_pid = await _read_child_pid(info_r)
                self._cgroup.attach(self._init_pid)
                cpus = sorted(os.sched_getaffinity(0))
                want = min(math.ceil(spec.cpus), len(cpus))
                first = next(_next_cpu)
                os.sched_setaffinity(self._init_pid,
                                     {cpus[(first + i) % len(cpus)] for i in range(want)})
                await self._ready
        except (OSError, TimeoutError, SandboxError) as exc:
            raise SandboxStartError(f"sandbox {self.id} failed to start: {self._why(exc)}") from None
        finally:
            os.close(info_r)
        _live.add(self)
        root = f"/proc/{self._init_pid}/root"
        self._storage = Storage({spec.workdir: root + spec.workdir, "/tmp": root + "/tmp"},
                                spec.workdir, h.uid, h.gid)

    def _why(self, exc: BaseException) -> str:
        detail = ""
        if self._bwrap is not None and self._bwrap.stderr is not None:
            with contextlib.suppress(OSError):
                os.set_blocking(self._bwrap.stderr.fileno(), False)
                detail = (self._bwrap.stderr.read() or b"").decode(errors="replace").strip()
        return detail or str(exc) or type(exc).__name__

    @property
    def closed(self) -> bool:
        return self._closed or self._dead is not None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        self._shutdown_control("sandbox closed")
        if self._bwrap is not None:
            await _wait_exit(self._bwrap, self._init_pid)
            if self._bwrap.stderr is not None:
                self._bwrap.stderr.close()
        self._cgroup.remove()

    def _kill_now(self) -> None:
        """Synchronous last resort (interpreter exit)."""
        self._closed = True
        with contextlib.suppress(OSError):
            if self._ctl is not None:
                self._ctl.close()
        if self._init_pid:
            with contextlib.suppress(OSError):
                os.kill(self._init_pid, signal.SIGKILL)
        if self._bwrap is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._bwrap.wait(timeout=2.0)
        with contextlib.suppress(OSError):
            self._cgroup.remove(timeout=2.0)

    def _shutdown_control(self, why: str) -> None:
        if self._ctl is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._ctl.fileno())
            self._ctl.close()
            self._ctl = None
        error = SandboxClosedError(f"sandbox {self.id}: {why}")
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
        for proc in list(self._jobs.values()):
            proc._finish(None, why)
        self._jobs.clear()
        for fut in self._marks.values():
            if not fut.done():
                fut.set_result(None)

    # ---- control channel ----

    def _on_control(self) -> None:
        while self._ctl is not None:
            try:
                msg = self._ctl.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                msg = b""
            if not msg:
                self._dead = "the sandbox's init exited (sandbox died)"
                self._shutdown_control(self._dead)
                return
            kind, ident, value, _ = _HEADER.unpack_from(msg)
            text = msg[_HEADER.size:].decode(errors="replace")
            if kind == MSG_READY:
                if value:
                    self._ready.set_exception(SandboxStartError(text))
                else:
                    self._ready.set_result(None)
            elif kind == MSG_EXIT and ident in self._jobs:
                status = struct.unpack("=i", struct.pack("=I", value))[0]
                self._jobs.pop(ident)._finish(os.waitstatus_to_exitcode(status), "")
            elif kind == MSG_FAIL and ident in self._jobs:
                self._jobs.pop(ident)._finish(None, text)
            elif kind == MSG_MARKED and ident in self._marks:
                fut = self._marks.pop(ident)
                if not fut.done():
                    fut.set_result(None)

    def _send(self, kind: int, ident: int, a: int = 0, b: int = 0, payload: bytes = b"",
              fds: Sequence[int] = ()) -> None:
        if self._ctl is None:
            raise SandboxClosedError(f"sandbox {self.id} is closed ({self._dead or 'closed'})")
        data = _HEADER.pack(kind, ident, a, b) + payload
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            self._ctl.sendmsg([data], anc)
        except BlockingIOError:  # the init is busy: a short blocking send is the simplest fix
            self._ctl.setblocking(True)
            try:
                self._ctl.sendmsg([data], anc)
            finally:
                self._ctl.setblocking(False)

    # ---- Sandbox primitives ----

    async def _spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str,
                     stdout: Sink, stderr: Sink, stdin: bytes | object | None) -> Process:
        ensure_open(self)
        ident = next(self._ids)
        env_items = [f"{k}={v}" for k, v in env.items()]
        payload = b"".join(s.encode() + b"\0" for s in [cwd, *argv, *env_items])
        pipes = [os.pipe() for _ in range(3)]
        try:
            self._send(MSG_EXEC, ident, len(argv), len(env_items), payload,
                       (pipes[0][0], pipes[1][1], pipes[2][1]))
        except BaseException:
            for r, w in pipes:
                os.close(r)
                os.close(w)
            raise
        for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
            os.close(fd)
        proc = LocalProcess(self, ident, pipes[0][1], pipes[1][0], pipes[2][0], stdout, stderr)
        self._jobs[ident] = proc
        if stdin is not PIPE:
            proc._feed_stdin(stdin if isinstance(stdin, bytes) else b"")
        return proc

    async def _oom_kills(self) -> int | None:
        return None if self.closed else self._cgroup.oom_kills()

    def _files(self) -> Storage:
        ensure_open(self)
        assert self._storage is not None
        return self._storage

    async def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if len(raw) > 1 << 20:
            await asyncio.to_thread(self._files().write, path, raw, mode)
        else:
            self._files().write(path, raw, mode)

    async def read_file(self, path: str) -> bytes:
        return self._files().read(path)

    async def list(self, path: str = ".") -> list[str]:
        return self._files().list(path)

    async def upload(self, local_path: str | os.PathLike[str], dest: str) -> None:
        await asyncio.to_thread(self._files().upload, os.fspath(local_path), dest)

    async def download(self, src: str, local_path: str | os.PathLike[str]) -> None:
        await asyncio.to_thread(self._files().download, src, os.fspath(local_path))

    async def fork(self) -> LocalSandbox:
        """A new sandbox whose workdir and /tmp are a copy of this one's (processes are not)."""
        ensure_open(self)
        child = await LocalSandbox.create(self.spec)
        try:
            await asyncio.to_thread(self._files().copy_into, child._files())
        except OSError as exc:
            await child.close()
            raise SandboxError(f"fork of {self.id} failed copying its files: {exc}") from None
        except BaseException:
            await child.close()
            raise
        return child


class LocalProcess(Process):
    """A command running under the sandbox's init; its pipes are read on the event loop."""

    def __init__(self, sb: LocalSandbox, ident: int, stdin_fd: int, out_fd: int, err_fd: int,
                 stdout: Sink, stderr: Sink) -> None:
        self._sb, self._id = sb, ident
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
        if not self._exit.done() and not self._sb.closed:
            self._sb._send(MSG_KILL, self._id, signal.SIGKILL, int(since_mark))

    async def mark(self) -> None:
        fut = self._loop.create_future()
        self._sb._marks[self._id] = fut
        self._sb._send(MSG_MARK, self._id)
        await fut

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


async def _read_child_pid(fd: int) -> int:
    """bubblewrap writes {"child-pid": N, ...} to its info fd once the sandbox's PID 1 exists."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    buf = b""
    while True:
        ready = loop.create_future()
        loop.add_reader(fd, ready.set_result, None)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            continue
        if not chunk:
            raise SandboxStartError("bubblewrap exited before starting the sandbox")
        buf += chunk
        with contextlib.suppress(ValueError):
            return int(json.loads(buf)["child-pid"])


async def _wait_exit(proc: subprocess.Popen[bytes], init_pid: int) -> None:
    """Wait for bubblewrap to exit (it does once PID 1 is gone), without blocking the loop."""
    if proc.poll() is not None:
        return
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:
        await asyncio.to_thread(proc.wait)
        return
    try:
        for attempt in range(2):
            done = loop.create_future()
            loop.add_reader(pidfd, lambda: done.done() or done.set_result(None))
            try:
                await asyncio.wait_for(done, 5.0)
                break
            except TimeoutError:  # PID 1 should be gone: force it, then bubblewrap
                with contextlib.suppress(OSError):
                    os.kill(init_pid if attempt == 0 else proc.pid, signal.SIGKILL)
            finally:
                loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)
    proc.wait()
