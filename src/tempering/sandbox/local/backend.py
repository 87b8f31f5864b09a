"""The ``local`` backend: Linux namespaces through bubblewrap, cgroup limits, seccomp.

Starting a sandbox is one bubblewrap process, forked by this process's spawner (``host.py``,
``spawner.c``): new user, pid, mount, net, ipc, uts and cgroup namespaces, a read-only system
(``rootfs.py``), run as an unprivileged host uid that no other live sandbox has
(``uids.py``: sandboxes share no per-user kernel counter). Its first
process is ``init.c``, a fork server that mounts the size-limited storage, drops every capability
and installs seccomp. The host moves it into the sandbox's cgroups (``cgroup.py``) before the
first command, then talks to it over one SOCK_SEQPACKET socket: a command costs a fork inside
the running sandbox, and its stdin/stdout/stderr are host pipes passed over that socket, read
here with the event loop (no thread per sandbox). Closing the socket ends PID 1, and the kernel
kills everything else in the sandbox with it; bubblewrap then exits and the cgroups go.

The workdir, /tmp and /dev/shm are a tmpfs the init mounts (``storage="memory"``) or a
copy-on-write btrfs volume bound in by bubblewrap (``storage="volume"``, ``volumes.py``), which
makes ``fork`` a snapshot; nothing else is writable (``/`` and ``/dev`` are read-only), so all a
sandbox writes counts in its one disk budget; ``auto``, the default, is ``volume`` on hosts that
can make volumes. Files are read and written from the host (through ``/proc/<init>/root`` or
the volume) with kernel-confined path resolution (``files.py``), without starting a process
inside.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import itertools
import json
import logging
import math
import os
import secrets
import signal
import socket
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache

from tempering.errors import (
    SandboxError,
    SandboxStartError,
)
from tempering.sandbox import cgroup
from tempering.sandbox.base import ensure_open
from tempering.sandbox.files import Storage
from tempering.sandbox.forkserver import InitChannel
from tempering.sandbox.host import (
    HARBOR_DIRS,
    chown_volume,
    disk_dirs,
    host,
    idmapped_volume,
    make_volume,
    make_writable_dirs,
    reclaim,
    spare_volumes,
    spawner,
    storage_for,
    volumes,
)
from tempering.sandbox.hosted import InitSandbox
from tempering.sandbox.local.egress import Egress, Stack, egress, start_stack
from tempering.sandbox.local.rootfs import system_args
from tempering.sandbox.spec import SandboxSpec, SandboxUsage, memory_disk_bytes
from tempering.sandbox.uids import UidLease, lease_uid

__all__ = ["LocalSandbox", "host", "spawner", "volumes"]

START_TIMEOUT_S = 30.0


log = logging.getLogger(__name__)
_live: weakref.WeakSet[LocalSandbox] = weakref.WeakSet()


@cache
def _reaper() -> ThreadPoolExecutor:
    """The one thread that does housekeeping off the start and close paths: removing closed
    sandboxes' cgroups (0.7 ms of rmdir each) and volumes, making spare volumes."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tempering-reaper")


_next_cpu = itertools.count()


def _close_all_at_exit() -> None:
    """Nothing outlives the harness: kill what callers forgot to close, remove the cgroups."""
    for sb in list(_live):
        sb._kill_now()
    _reaper().shutdown(wait=True)
    spare_volumes().destroy_all()
    h = host()
    for path in h.hierarchy.owner_dirs(h.tag).values():
        with contextlib.suppress(OSError):
            cgroup.remove_cgroup(path, timeout=2.0)


class LocalSandbox(InitSandbox):
    """A sandbox made of Linux namespaces on this host."""

    preforks = True  # the grading zygote (``sandbox/local/zygote.py``)

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.id = f"sbx-{secrets.token_hex(6)}"
        self._host = host()
        self._cgroup = cgroup.SandboxCgroup(self._host.hierarchy, self._host.tag, self.id)
        self._channel: InitChannel | None = None
        self._bwrap_pid = 0
        self._bwrap_exit: asyncio.Future[int] | None = None
        self._bwrap_stderr = -1
        self._init_pid = 0
        self._closed = False
        self._dead: str | None = None
        self._storage: Storage | None = None
        self._volume: str | None = None  # set once this sandbox owns a volume
        self._stack: Stack | None = None  # the network stack of a sandbox with network
        self._uid: UidLease | None = None  # the host uid it runs as, held until it is gone
        # Who owns its volume's files on disk: its own uid, or for a fork the uid that owned
        # its parent's (an idmapped mount shows them to it as its own).
        self._disk_uid: int | None = None
        self.storage = storage_for(spec.storage)
        """The storage it runs on: ``memory`` or ``volume`` (``auto`` resolved)."""

    @property
    def volume_name(self) -> str:
        return f"{self._host.tag}.{self.id}"

    # ---- lifecycle ----

    @classmethod
    def reclaim(cls) -> int:
        """Remove what crashed earlier processes left (cgroups, volumes, processes); returns
        how many sandboxes were cleaned up."""
        return reclaim()

    @classmethod
    async def _prepare_host(cls) -> None:
        await asyncio.to_thread(cls.reclaim)
        await asyncio.to_thread(storage_for, "auto")  # may mount the volume pool
        atexit.register(_close_all_at_exit)

    def _new_volume(self, snapshot_of: str | None, uid: int) -> str:
        """Create (or snapshot) this sandbox's volume, with a workdir and /tmp of its user."""
        pool, name, size = volumes(), self.volume_name, self.spec.disk_mb << 20
        if snapshot_of is None:
            spare = spare_volumes().take(size, _reaper(), uid, uid)
            if spare is not None:
                os.rename(pool.path(spare), pool.path(name))
            else:
                make_volume(name, size, uid, uid)
            self._volume = name
            make_writable_dirs(pool.path(name), self.spec, uid, uid)
        else:
            pool.snapshot(snapshot_of, name, size)
            self._volume = name
        return name

    async def _forked_volume(self, source: str, uid: int) -> tuple[list[str], str, list[int]]:
        """Snapshot ``source`` for this fork: (bubblewrap arguments, the init's disk argument,
        fds for the init). The snapshot keeps its parent's owner on disk and the init attaches
        it idmapped, so that it is this sandbox's uid's in here; the spawner makes the mapping
        while a thread makes the snapshot (which may write data back first). Where the kernel
        cannot idmap the volume (before 5.15), it is chowned instead, one inode at a time."""
        assert self._disk_uid is not None
        name, userns = await asyncio.gather(asyncio.to_thread(self._new_volume, source, uid),
                                            spawner().userns(self._disk_uid, uid),
                                            return_exceptions=True)
        if isinstance(name, BaseException):
            if not isinstance(userns, BaseException):
                os.close(userns)
            raise name
        try:
            if isinstance(userns, BaseException):
                raise userns
            try:
                return [], "mount:5", [idmapped_volume(name, userns)]
            finally:
                os.close(userns)
        except SandboxError as exc:
            log.warning("a fork's volume cannot be idmapped, chowning it instead: %s", exc)
        await asyncio.to_thread(chown_volume, name, uid, uid)
        self._disk_uid = uid
        return _bind_volume(name, self.spec), "0", []

    async def _start(self, snapshot_of: str | None = None) -> None:
        spec = self.spec
        self._uid = lease_uid()
        uid = self._uid.uid
        if self._disk_uid is None:
            self._disk_uid = uid
        storage: list[str] = []
        disk = str(memory_disk_bytes(spec))
        tree: list[int] = []  # a fork's idmapped volume, for the init to attach (its fd 5)
        if self.storage == "volume" and snapshot_of is None:  # one quick ioctl, or a rename
            storage = _bind_volume(self._new_volume(None, uid), spec)
            disk = "0"  # the init mounts no tmpfs
        elif self.storage == "volume" and snapshot_of is not None:
            storage, disk, tree = await self._forked_volume(snapshot_of, uid)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_r, info_w = os.pipe()
        err_r, err_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        # fds in the new process: 0, 1 /dev/null, 2 stderr pipe, 3 init's socket, 4 info pipe,
        # 5 a fork's volume
        init = ["/.tempering/init", "3", disk, spec.workdir, "1000", "1000",
                ":".join(spec.writable_dirs) or "-", "-" if spec.tracing else "notrace"]
        wiring = egress() if spec.network else None
        if wiring is not None:
            init.append(wiring.init_rules)
        args = bwrap_argv(spec, storage, init, wiring)
        self._bwrap_stderr = err_r
        try:
            started, self._bwrap_exit = spawner().request(
                args, [devnull, devnull, err_w, theirs.fileno(), info_w, *tree], uid, uid)
        except BaseException:
            ours.close()
            os.close(info_r)
            raise
        finally:
            for fd in (devnull, err_w, info_w, *tree):
                os.close(fd)
            theirs.close()
        self._channel = InitChannel(ours, f"sandbox {self.id}", self._on_death)
        try:
            # While the spawner forks bubblewrap and it builds the namespaces (another core),
            # make the cgroups; the init is moved into them before it runs any command.
            self._cgroup.create(memory_mb=spec.memory_mb, pids=spec.pids, cpus=spec.cpus)
            self._bwrap_pid = await started
        except BaseException:
            os.close(info_r)
            raise
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                self._init_pid = await read_child_pid(info_r)
                await cgroup.in_thread(functools.partial(self._cgroup.attach, self._init_pid))
                cpus = sorted(os.sched_getaffinity(0))
                want = min(math.ceil(spec.cpus), len(cpus))
                first = next(_next_cpu)
                os.sched_setaffinity(self._init_pid,
                                     {cpus[(first + i) % len(cpus)] for i in range(want)})
                await self._channel.ready
                await self._channel.commands_cgroup(str(self._cgroup.commands / "cgroup.procs"))
                if wiring is not None:
                    # Once PID 1 runs, bubblewrap has mapped the sandbox uid to root in the
                    # namespace's owner, which the stack joins to attach itself.
                    self._stack = await start_stack(spawner(), self._init_pid, wiring, uid)
                    self._cgroup.attach_to_commands(self._stack.pid)
        except (OSError, TimeoutError, SandboxError) as exc:
            why = self._why(exc)
            raise SandboxStartError(f"sandbox {self.id} failed to start: {why}") from None
        finally:
            os.close(info_r)
        _live.add(self)
        if self._volume is not None:
            volume = volumes().path(self._volume)
            roots = {"/tmp": str(volume / "tmp"),
                     **{d: str(volume / on_disk) for d, on_disk in disk_dirs(spec).items()}}
        else:
            root = f"/proc/{self._init_pid}/root"
            roots = {"/tmp": root + "/tmp", **{d: root + d for d in disk_dirs(spec)}}
        owner = self._disk_uid if self._volume is not None else uid  # as the files are stored
        self._storage = Storage(roots, spec.workdir, owner, owner)

    def _why(self, exc: BaseException) -> str:
        detail = b""
        if self._bwrap_stderr >= 0:
            with contextlib.suppress(OSError):
                os.set_blocking(self._bwrap_stderr, False)
                detail = os.read(self._bwrap_stderr, 65536)
        text = detail.decode(errors="replace").strip() or str(exc) or type(exc).__name__
        missing = [d for d in self.spec.writable_dirs if f"Can't mkdir {d}:" in text]
        if missing:
            text += (f" (writable dir {missing[0]} is not in the root filesystem, and its "
                     "parent there is read-only: use a root filesystem that has it)")
        return text

    async def close(self) -> None:
        if not self._closing():
            return
        _live.discard(self)
        if self._bwrap_exit is not None:
            await _wait_exit(self._bwrap_exit, self._bwrap_pid, self._init_pid)
        if self._stack is not None:  # after the sandbox: it has nothing left to carry
            await self._stack.close()
            self._stack = None
        if self._uid is not None:  # nothing runs as it now (the pid namespace is gone)
            self._uid.release()
            self._uid = None
        if self._bwrap_stderr >= 0:
            os.close(self._bwrap_stderr)
            self._bwrap_stderr = -1
        # Every process is gone: the empty cgroups are removed off the caller's path by one
        # worker thread (joined at exit); a failure is left for reclaim().
        removal = asyncio.get_running_loop().run_in_executor(_reaper(), self._cgroup.remove)
        removal.add_done_callback(_report_failure)
        if self._volume is not None:  # after every process is gone: nothing writes to it now
            destroy = asyncio.get_running_loop().run_in_executor(
                _reaper(), volumes().destroy, self._volume)
            destroy.add_done_callback(_report_failure)
            self._volume = None

    def _kill_now(self) -> None:
        """Synchronous last resort (interpreter exit)."""
        self._closed = True
        if self._channel is not None:
            self._channel.close_now()
        for pid in (self._init_pid, self._bwrap_pid):
            if pid > 0:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if self._stack is not None:
            self._stack.kill_now()
        with contextlib.suppress(OSError):
            self._cgroup.remove(timeout=2.0)
        if self._volume is not None:
            with contextlib.suppress(OSError, SandboxError):
                volumes().destroy(self._volume)

    # ---- Sandbox primitives ----

    async def _oom_kills(self) -> int | None:
        return None if self.closed else self._cgroup.oom_kills()

    def _command_finished(self) -> None:
        if self._volume is not None:  # what it wrote goes to disk while the sandbox idles
            volumes().writeback().poke()

    async def usage(self) -> SandboxUsage:
        ensure_open(self)
        return SandboxUsage(self._cgroup.memory_peak(), self._cgroup.pids_peak(),
                            self._cgroup.oom_kills())

    async def fork(self) -> LocalSandbox:
        """A new sandbox whose workdir and /tmp are a copy of this one's (processes are not).

        With ``storage="volume"`` the copy is a btrfs snapshot (it first writes back data not yet
        on disk); with ``memory`` it is a file copy."""
        ensure_open(self)
        child = LocalSandbox(self.spec)
        try:
            if self._volume is not None:
                child._disk_uid = self._disk_uid  # its snapshot's files stay as they are
                await child._start(snapshot_of=self._volume)
            else:
                await child._start()
                await asyncio.to_thread(self._files().copy_into, child._files())
        except OSError as exc:
            await child.close()
            raise SandboxError(f"fork of {self.id} failed copying its files: {exc}") from None
        except BaseException:
            await child.close()
            raise
        return child


def _bind_volume(name: str, spec: SandboxSpec) -> list[str]:
    vol = volumes().path(name)
    return ["--bind", str(vol / "tmp"), "/tmp", "--bind", str(vol / "shm"), "/dev/shm",
            *(arg for d, on_disk in disk_dirs(spec).items()
              for arg in ("--bind", str(vol / on_disk), d))]


# /dev as bubblewrap's --dev makes it (a tmpfs, the harmless device nodes, the fd links), except
# its devpts: that has no maximum, and every pty in it comes out of the machine's one count. PID 1
# (the init, the grading zygote) mounts a devpts of its own with a maximum at /dev/pts (and a
# second instance would cost as much again: 1.2 ms a start).
_DEV = ["--tmpfs", "/dev",
        *(arg for node in ("null", "zero", "full", "random", "urandom", "tty")
          for arg in ("--dev-bind", f"/dev/{node}", f"/dev/{node}")),
        "--symlink", "/proc/self/fd", "/dev/fd", "--symlink", "/proc/self/fd/0", "/dev/stdin",
        "--symlink", "/proc/self/fd/1", "/dev/stdout", "--symlink", "/proc/self/fd/2",
        "/dev/stderr", "--symlink", "/proc/kcore", "/dev/core", "--dir", "/dev/pts",
        "--symlink", "pts/ptmx", "/dev/ptmx", "--dir", "/dev/shm"]


def bwrap_argv(spec: SandboxSpec, extra: Sequence[str], command: Sequence[str],
               wiring: Egress | None = None) -> list[str]:
    """bubblewrap's command line for a sandbox of ``spec`` whose PID 1 runs ``command`` with
    CAP_SYS_ADMIN and CAP_SETFCAP in its user namespace (the init, or the grading zygote);
    ``extra`` adds mounts. Expects fd 3 to be its control socket and fd 4 the info pipe.

    The network namespace is always new: with ``wiring`` (a sandbox with network) PID 1 also
    gets CAP_NET_ADMIN, to install the refusing rules before it drops every capability, and
    /etc/resolv.conf names the stack's DNS; without, there is only ``lo``."""
    h = host()
    caps = ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETFCAP"]
    if wiring is not None:
        caps += ["--cap-add", "CAP_NET_ADMIN"]
    resolv = str(wiring.resolv_conf) if wiring is not None else None
    args = [h.bwrap, "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup", "--unshare-net",
            "--hostname", "sandbox", "--die-with-parent", "--new-session", "--as-pid-1",
            *caps, "--clearenv", *system_args(spec, 1000, 1000, resolv), "--proc", "/proc",
            *_DEV, "--dir", "/tmp", "--dir", spec.workdir,
            *(arg for d in (*HARBOR_DIRS, *spec.writable_dirs) for arg in ("--dir", d)),
            "--dir", "/.tempering/disk",
            *extra, "--ro-bind", h.init, "/.tempering/init", "--remount-ro", "/",
            # /dev is bubblewrap's own tmpfs, outside the disk limit and (for the zygote)
            # shared by every grading: read-only, its nodes still usable; the storage puts
            # /dev/shm in the disk budget.
            "--remount-ro", "/dev", "--info-fd", "4"]
    return [*args, *command]


async def read_child_pid(fd: int) -> int:
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


async def _wait_exit(exited: asyncio.Future[int], bwrap_pid: int, init_pid: int) -> None:
    """Wait for bubblewrap to exit, which it does once the sandbox's PID 1 is gone; force it
    if it does not. Never signals pid 0 (this process group) for a start that got nowhere."""
    for victim in (init_pid, bwrap_pid, 0):
        try:
            await asyncio.wait_for(asyncio.shield(exited), 5.0)
            return
        except TimeoutError:
            if victim > 0:
                with contextlib.suppress(OSError):
                    os.kill(victim, signal.SIGKILL)
        except SandboxError:
            return  # the spawner died, and bubblewrap with it


def _report_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("removing a closed sandbox's cgroups or volume failed (reclaim() will "
                    "retry): %s", fut.exception())
