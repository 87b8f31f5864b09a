"""A pre-forked sandbox factory (local backend): fresh sandboxes forked from one started once.

Starting a sandbox pays for bubblewrap, a fresh interpreter and its imports every time. A
``Zygote`` pays once: it starts one bubblewrap sandbox whose PID 1 is a program the caller
supplies (``ZygoteProgram``: its files, bound read-only at ``program.dir``, and its command),
and ``fork()`` asks that program for a process in fresh namespaces with fresh storage. The
host learns that process's pid from the kernel (SCM_CREDENTIALS), moves it into a cgroup of
its own with the spec's limits, writes the files through ``/proc/<pid>/root`` with the same
confined file API as the local backend (``Forked.storage``), has the program seal paths
read-only, and then hands it a configuration; what it reports comes back on the same socket.
A timeout SIGKILLs it, which ends its pid namespace and everything in it; so does a report
over its byte limit, which is never buffered whole here.

The program speaks this protocol (the grading zygote, ``reward/inside_zygote.py``, is the one
in use): it gets its control socket as fd 3 and says ``ready TEXT`` on it once started
(``Zygote.greeting`` is ``TEXT``) or ``error WHY``; each fork request is a marshalled dict
(``disk``, ``workdir``, ``uid``, ``gid`` and the caller's options) with two sockets passed
along: the forked process's channel (``ready``, then ``seal PATHS``/``none``, then the
configuration, a length and its bytes, and its report) and its exit status (one int). Its
directory also holds ``seccomp.bpf``, the ``notrace`` filter of a sandbox's init, for the
program to install in what it forks.

``Zygotes`` keeps one started zygote per spec for a program, replacing one that died. Only the
local backend forks (``preforks``); a caller grades elsewhere in a sandbox of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import marshal
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tempering.errors import SandboxStartError
from tempering.sandbox import cgroup
from tempering.sandbox.files import Storage
from tempering.sandbox.host import host, spawner
from tempering.sandbox.local.backend import bwrap_argv, read_child_pid
from tempering.sandbox.native import home
from tempering.sandbox.spec import SandboxSpec
from tempering.sandbox.uids import UidLease, lease_uid

START_TIMEOUT_S = 30.0
SEAL_LIMIT = 60_000  # bytes of one seal request (the zygote reads 64 KiB)
SECCOMP_FILE = "seccomp.bpf"


def preforks(spec: SandboxSpec) -> bool:
    """Whether sandboxes of ``spec`` can be forked from a zygote (its backend's word)."""
    from tempering.sandbox import backend_class

    return bool(backend_class(spec.backend).preforks)


@dataclass(frozen=True)
class ZygoteProgram:
    """What runs as a zygote's PID 1 (see the module docstring for what it must speak)."""

    dir: str
    """Where its files are, read-only, in the sandbox (absolute)."""
    files: Mapping[str, bytes]
    """File name -> contents (names may be in subdirectories, ``__pycache__/x.pyc``)."""
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def _bundle(program: ZygoteProgram) -> Path:
    """The program's files, plus the seccomp program of a sandbox's init (its ``notrace``
    one), in a directory the sandbox user can read (named by their digest)."""
    files = dict(program.files)
    seccomp = subprocess.run([host().init, "--seccomp-filter", "notrace"], capture_output=True,
                             check=True).stdout
    files[SECCOMP_FILE] = seccomp
    digest = hashlib.sha256(b"".join(files.values())).hexdigest()[:16]
    dest = home() / "zygote" / digest
    if not dest.exists():
        tmp = dest.with_name(f".tmp-{secrets.token_hex(4)}")
        (tmp / "__pycache__").mkdir(parents=True, mode=0o755)
        os.chmod(tmp, 0o755)
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        os.chmod(dest.parent, 0o755)
        try:
            tmp.rename(dest)
        except OSError:  # another process published it first
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


async def _send_config(loop: asyncio.AbstractEventLoop, channel: socket.socket,
                       data: bytes) -> None:
    """A length, then the configuration in datagrams a SOCK_SEQPACKET socket takes."""
    await loop.sock_sendall(channel, struct.pack("=I", len(data)))
    for start in range(0, len(data), 1 << 16):
        await loop.sock_sendall(channel, data[start:start + (1 << 16)])


@dataclass(frozen=True)
class Report:
    """What one forked process sent and how it ended."""

    text: str
    """The report channel's bytes, decoded; cut at the last full line when ``truncated``."""
    timed_out: bool
    oom_killed: bool
    exit_code: int | None
    """The forked process's exit code as its parent saw it (None: never told)."""
    truncated: bool
    """It sent more than the limit: it was killed there, and the rest was never read."""


class Forked:
    """One process in its own fresh sandbox, forked by the zygote."""

    def __init__(self, channel: socket.socket, status: socket.socket, pid: int,
                 group: cgroup.SandboxCgroup, storage: Storage) -> None:
        self.channel, self.status, self.pid = channel, status, pid
        self.group, self.storage = group, storage
        self.sealed = False  # told the process what to seal (or that nothing is)

    async def run(self, config: dict[str, object], timeout: float, limit: int) -> Report:
        """Send the configuration and collect the report, at most ``limit`` bytes of it: what
        runs in the sandbox holds the channel too, and whatever it sends lands in this
        process. Past the limit the process is killed and the report ends there, truncated."""
        if not self.sealed:
            await self.seal([])
        loop = asyncio.get_running_loop()
        ooms = self.group.oom_kills()
        await _send_config(loop, self.channel, marshal.dumps(config))
        received = bytearray()
        timed_out = truncated = False
        try:
            async with asyncio.timeout(timeout):
                while record := await loop.sock_recv(self.channel, 1 << 16):
                    received += record[:limit - len(received)]
                    if len(received) >= limit:
                        truncated = True
                        break
        except TimeoutError:
            timed_out = True
        self.kill()
        oom = self.group.oom_kills() > ooms
        code: int | None = None
        with contextlib.suppress(TimeoutError, OSError, struct.error):
            async with asyncio.timeout(2.0):
                code = struct.unpack("i", await loop.sock_recv(self.status, 4))[0]
        if truncated:  # a line cut at the limit is no report line, nor a forged one
            del received[received.rfind(b"\n") + 1:]
        text = received.decode("utf-8", errors="replace")
        return Report(text, timed_out, oom, code, truncated)

    async def seal(self, paths: list[str], pin: list[str] | None = None) -> None:
        """Make ``paths`` (directories or files, absolute in the sandbox) read-only for the
        forked process, after the files are written and before the configuration is sent;
        with none, tell the zygote there is nothing to seal. ``pin``: directories bound onto
        themselves, writable, so that no rename of a parent moves a sealed file away."""
        loop = asyncio.get_running_loop()
        self.sealed = True
        if not paths:
            await loop.sock_sendall(self.channel, b"none")
            return
        message = b"seal " + b"\0".join([p.encode() for p in paths]
                                        + [b"+" + p.encode() for p in pin or ()])
        if len(message) > SEAL_LIMIT:
            raise SandboxStartError(f"{len(paths)} paths to seal take {len(message)} bytes, "
                                    f"over {SEAL_LIMIT}: protect their directories instead")
        await loop.sock_sendall(self.channel, message)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                answer = await loop.sock_recv(self.channel, 4096)
        except TimeoutError:
            answer = b"no answer"
        if answer != b"sealed":
            raise SandboxStartError(f"the forked sandbox could not seal {', '.join(paths)[:300]}: "
                                    f"{answer.decode(errors='replace')}")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        self.channel.close()
        self.status.close()
        with contextlib.suppress(OSError):
            self.group.remove(timeout=2.0)


class Zygote:
    """One zygote sandbox running ``program``; ``fork()`` gives fresh sandboxes of ``spec``'s
    limits."""

    def __init__(self, spec: SandboxSpec, program: ZygoteProgram) -> None:
        if not preforks(spec):
            raise SandboxStartError(f"the {spec.backend} backend forks no sandbox from a "
                                    "zygote (only local does)")
        self.spec, self.program = spec, program
        self._control: socket.socket | None = None
        self._pid = 0
        self._exit: asyncio.Future[int] | None = None
        self._group = cgroup.SandboxCgroup(host().hierarchy, host().tag,
                                           f"zyg-{secrets.token_hex(6)}", commands=False)
        self._lock = asyncio.Lock()
        self.greeting = ""  # what the program said when it was ready
        # A host uid of its own (no other sandbox's or zygote's), shared by what it forks.
        self._uid: UidLease | None = None

    async def start(self) -> None:
        program = self.program
        bundle = await asyncio.to_thread(_bundle, program)
        self._uid = lease_uid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_r, info_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        env = [arg for name, value in program.env.items() for arg in ("--setenv", name, value)]
        args = bwrap_argv(self.spec, ["--ro-bind", str(bundle), program.dir, *env],
                          list(program.argv))
        try:
            started, self._exit = spawner().request(
                args, [devnull, devnull, devnull, theirs.fileno(), info_w], self._uid.uid,
                self._uid.gid)
        finally:
            for fd in (devnull, info_w):
                os.close(fd)
            theirs.close()
        self._control = ours
        ours.setblocking(False)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await started
                self._pid = await read_child_pid(info_r)
                self._group.create(memory_mb=1024, pids=4096, cpus=self.spec.cpus)
                self._group.attach(self._pid)
                ready = await asyncio.get_running_loop().sock_recv(ours, 512)
                if not ready.startswith(b"ready "):
                    why = ready[6:].decode(errors="replace") if ready.startswith(b"error ") \
                        else "no word from it"
                    raise SandboxStartError(f"the zygote did not start: {why}")
                self.greeting = ready[6:].decode(errors="replace")
        except (OSError, TimeoutError) as exc:
            raise SandboxStartError(f"the zygote did not start: {exc}") from None
        finally:
            os.close(info_r)

    @property
    def alive(self) -> bool:
        return self._control is not None and self._exit is not None and not self._exit.done()

    async def fork(self, **options: object) -> Forked:
        """A process in fresh namespaces, in a cgroup of its own, waiting for files;
        ``options`` go to the program with the request (the grading zygote's: ``solver``,
        ``hide``)."""
        if not self.alive or self._control is None or self._uid is None:
            raise SandboxStartError("the zygote is not running")
        h, spec = host(), self.spec
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        status, their_status = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        ours.setblocking(False)
        status.setblocking(False)
        request = {**options, "disk": spec.disk_mb << 20, "workdir": spec.workdir, "uid": 1000,
                   "gid": 1000}
        try:
            async with self._lock:
                socket.send_fds(self._control, [marshal.dumps(request)],
                                [theirs.fileno(), their_status.fileno()])
        except OSError as exc:
            for sock in (ours, theirs, status, their_status):
                sock.close()
            raise SandboxStartError(f"the zygote is gone: {exc}") from None
        theirs.close()
        their_status.close()
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(ours.fileno(), lambda: None if ready.done() else ready.set_result(None))
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await ready
        except TimeoutError:
            ours.close()
            status.close()
            raise SandboxStartError("a process of the zygote never started") from None
        finally:
            loop.remove_reader(ours.fileno())
        message, ancillary, _, _ = ours.recvmsg(64, socket.CMSG_SPACE(12))
        pid = next((struct.unpack("3i", data)[0] for level, kind, data in ancillary
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), 0)
        if message != b"ready" or pid <= 0:
            ours.close()
            status.close()
            raise SandboxStartError("a process of the zygote failed to start")
        group = cgroup.SandboxCgroup(h.hierarchy, h.tag, f"grd-{secrets.token_hex(6)}",
                                     commands=False)
        forked = Forked(ours, status, pid, group, Storage(
            {spec.workdir: f"/proc/{pid}/root{spec.workdir}", "/tmp": f"/proc/{pid}/root/tmp"},
            spec.workdir, self._uid.uid, self._uid.gid))

        def join() -> None:
            group.create(memory_mb=spec.memory_mb, pids=spec.pids, cpus=spec.cpus)
            group.attach(pid)

        try:
            await cgroup.in_thread(join)
        except BaseException:  # failed or cancelled: once the thread is done, nothing is left
            await asyncio.to_thread(forked.close)
            raise
        return forked

    async def close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
        if self._exit is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._exit), 5.0)
        with contextlib.suppress(OSError):
            self._group.remove(timeout=2.0)
        if self._uid is not None and (self._exit is None or self._exit.done()):
            self._uid.release()  # else this process's exit (or reclaim) frees it
            self._uid = None


class Zygotes:
    """One started zygote per sandbox spec, of the program ``program()`` makes (once, in a
    thread: it may build its files), started on first use and replaced when it has died."""

    def __init__(self, program: Callable[[], ZygoteProgram]) -> None:
        self._make = program
        self._program: ZygoteProgram | None = None
        self._zygotes: dict[str, Zygote] = {}  # by SandboxSpec.key()
        self._lock = asyncio.Lock()

    async def get(self, spec: SandboxSpec, *, replace: bool = False) -> Zygote:
        """The zygote for ``spec``, started now if there is none alive (or ``replace``)."""
        async with self._lock:
            zygote = self._zygotes.get(spec.key())
            if zygote is not None and (replace or not zygote.alive):
                await zygote.close()
                zygote = None
            if zygote is None:
                if self._program is None:
                    self._program = await asyncio.to_thread(self._make)
                zygote = Zygote(spec, self._program)
                try:
                    await zygote.start()
                except BaseException:
                    await zygote.close()
                    raise
                self._zygotes[spec.key()] = zygote
            return zygote

    def of(self, spec: SandboxSpec) -> Zygote | None:
        """The zygote started for ``spec`` (alive or not), if any."""
        return self._zygotes.get(spec.key())

    def started(self) -> list[Zygote]:
        return list(self._zygotes.values())

    async def fork(self, spec: SandboxSpec, **options: object) -> tuple[Zygote, Forked]:
        """A forked sandbox of ``spec`` (and the zygote it came from); a zygote that died
        (killed, out of memory) is replaced, once."""
        try:
            zygote = await self.get(spec)
            return zygote, await zygote.fork(**options)
        except SandboxStartError:
            zygote = await self.get(spec, replace=True)
            return zygote, await zygote.fork(**options)

    async def close(self) -> None:
        for zygote in self._zygotes.values():
            await zygote.close()
        self._zygotes.clear()
