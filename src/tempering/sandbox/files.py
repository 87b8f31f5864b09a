"""Host-side file access to a sandbox's writable storage that no planted path can escape.

The host reads and writes a sandbox's files directly (no process inside is needed), which is
fast but runs with the host's privileges, so every path is resolved by the kernel with
``openat2(RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS)`` against a directory
descriptor of the storage root: ``..``, absolute symlinks and links into other mounts all fail
with EXDEV/ELOOP instead of reaching a host file, atomically, with no check-then-use window.
Files are opened non-blocking and must be regular, so a planted FIFO cannot hang the host.

Every operation runs with the filesystem uid and gid of the sandbox's user (``setfsuid`` is per
thread), which drops the host's file capabilities: the host touches the sandbox's files with
exactly the rights of the user inside, and what it creates is owned by that user.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import ctypes
import errno
import os
import posixpath
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Concatenate, ParamSpec, Self, TypeVar

from tempering.errors import (
    SandboxClosedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxPathError,
)
from tempering.sandbox.base import Process, Sandbox, Sink, ensure_open
from tempering.sandbox.forkserver import InitChannel
from tempering.sandbox.spec import SandboxSpec

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS
_NO_LINKS = _RESOLVE | RESOLVE_NO_SYMLINKS


P = ParamSpec("P")
R = TypeVar("R")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = _RESOLVE) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC | os.O_LARGEFILE, mode, resolve)
    fd: int = _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how),
                            ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


@contextlib.contextmanager
def as_user(uid: int, gid: int) -> Iterator[None]:
    """Run the block with this thread's filesystem ids set to ``uid``/``gid``."""
    old_gid = _libc.setfsgid(gid)
    old_uid = _libc.setfsuid(uid)
    try:
        yield
    finally:
        _libc.setfsuid(old_uid)
        _libc.setfsgid(old_gid)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


_CAP_DAC_READ_SEARCH = 2


@contextlib.contextmanager
def _reading_all() -> Iterator[None]:
    """Inside ``as_user``: this thread may read and search any file again (the setfsuid to a
    non-root uid dropped CAP_DAC_READ_SEARCH; the setfsuid back to root restores it)."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].effective |= 1 << _CAP_DAC_READ_SEARCH
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset CAP_DAC_READ_SEARCH")
    yield


def _confined(method: Callable[Concatenate[Storage, P], R]) -> Callable[Concatenate[Storage, P], R]:
    """Run a Storage method with the sandbox user's filesystem ids."""
    def wrapper(self: Storage, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with as_user(self.uid, self.gid):
            return method(self, *args, **kwargs)
    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


class Storage:
    """The writable directories of one sandbox (workdir and /tmp), seen from the host.

    ``roots`` maps the sandbox path of each directory (e.g. ``/workspace``) to a host path that
    reaches it; ``uid``/``gid`` are the host ids of the sandbox's user.
    """

    def __init__(self, roots: dict[str, str], workdir: str, uid: int, gid: int) -> None:
        self.roots = roots
        self.workdir = workdir
        self.uid = uid
        self.gid = gid

    # ---- resolution ----

    def split(self, path: str) -> tuple[str, str]:
        """(sandbox root, path relative to it) for a file-API path, or SandboxPathError."""
        if not isinstance(path, str) or "\0" in path:
            raise SandboxPathError(f"invalid path {path!r}")
        full = posixpath.normpath(posixpath.join(self.workdir, path))
        for root in sorted(self.roots, key=len, reverse=True):
            if full == root:
                return root, "."
            if full.startswith(root + "/"):
                return root, full[len(root) + 1:]
        allowed = " or ".join(sorted(self.roots))
        raise SandboxPathError(
            f"path {path!r} resolves to {full}, outside the sandbox's writable storage "
            f"({allowed}); use a path relative to {self.workdir}")

    def _open(self, path: str, flags: int, mode: int = 0) -> int:
        root, rel = self.split(path)
        rootfd = os.open(self.roots[root], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return openat2(rootfd, rel, flags, mode)
        except OSError as exc:
            raise _path_error(path, exc) from None
        finally:
            os.close(rootfd)

    def _dirfd(self, path: str, *, create: bool) -> int:
        """A descriptor of the directory ``path``, creating missing parents when asked."""
        root, rel = self.split(path)
        rootfd = os.open(self.roots[root], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                return openat2(rootfd, rel, os.O_DIRECTORY | os.O_RDONLY)
            except FileNotFoundError:
                if not create:
                    raise
            parts = [p for p in rel.split("/") if p not in ("", ".")]
            fd = os.dup(rootfd)
            try:
                for i, part in enumerate(parts):
                    sub = "/".join(parts[: i + 1])
                    try:
                        new = openat2(rootfd, sub, os.O_DIRECTORY | os.O_RDONLY)
                    except FileNotFoundError:
                        os.mkdir(part, 0o755, dir_fd=fd)
                        new = openat2(rootfd, sub, os.O_DIRECTORY | os.O_RDONLY)
                    os.close(fd)
                    fd = new
                return fd
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            raise _path_error(path, exc) from None
        finally:
            os.close(rootfd)

    # ---- operations ----

    @_confined
    def write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        parent, name = posixpath.split(posixpath.normpath(path))
        if name in ("", ".", ".."):
            raise SandboxPathError(f"path {path!r} does not name a file")
        dirfd = self._dirfd(parent or ".", create=True)
        try:
            try:
                fd = openat2(dirfd, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK,
                             mode & 0o7777)
            except OSError as exc:
                raise _path_error(path, exc) from None
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise SandboxPathError(f"path {path!r} exists and is not a regular file")
                os.fchmod(fd, mode & 0o7777)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise SandboxError(f"sandbox disk is full writing {path!r} "
                                       f"({len(data)} bytes); raise disk_mb") from None
                raise
            finally:
                os.close(fd)
        finally:
            os.close(dirfd)

    @_confined
    def read(self, path: str) -> bytes:
        fd = self._open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxPathError(f"path {path!r} is not a regular file")
            os.set_blocking(fd, True)
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    @_confined
    def listdir(self, path: str) -> list[str]:
        fd = self._dirfd(path or ".", create=False)
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def upload(self, local: str, dest: str) -> None:
        """Host files are read with the caller's rights, sandbox files written as its user."""
        if os.path.isfile(local):
            with open(local, "rb") as f:
                self.write(dest, f.read(), os.stat(local).st_mode & 0o777)
            return
        if not os.path.isdir(local):
            raise SandboxPathError(f"local path {local!r} is neither a file nor a directory")
        for top, dirs, files in os.walk(local):
            rel = os.path.relpath(top, local)
            target = dest if rel == "." else posixpath.join(dest, rel)
            self._mkdirs(target)
            for name in files:
                src = os.path.join(top, name)
                if os.path.islink(src):
                    self._symlink(os.readlink(src), posixpath.join(target, name))
                elif os.path.isfile(src):
                    with open(src, "rb") as f:
                        self.write(posixpath.join(target, name), f.read(),
                                   os.stat(src).st_mode & 0o777)
            for name in dirs:
                src = os.path.join(top, name)
                if os.path.islink(src):
                    self._symlink(os.readlink(src), posixpath.join(target, name))

    @_confined
    def _mkdirs(self, path: str) -> None:
        os.close(self._dirfd(path, create=True))

    @_confined
    def _symlink(self, target: str, path: str) -> None:
        parent, name = posixpath.split(posixpath.normpath(path))
        dirfd = self._dirfd(parent or ".", create=True)
        try:
            os.symlink(target, name, dir_fd=dirfd)
        finally:
            os.close(dirfd)

    def download(self, src: str, local: str) -> list[str]:
        """Copy regular files and directories out; returns the paths skipped (links, devices).

        Sandbox files are opened as its user, host files written with the caller's rights."""
        skipped: list[str] = []
        with as_user(self.uid, self.gid):
            fd = self._open(src, os.O_RDONLY | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode):
                os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
                _copy_out(fd, local)
            elif stat.S_ISDIR(info.st_mode):
                self._copy_tree(fd, local, src, skipped)
            else:
                raise SandboxPathError(f"path {src!r} is neither a regular file nor a directory")
        finally:
            os.close(fd)
        return skipped

    def _copy_tree(self, dirfd: int, local: str, label: str, skipped: list[str]) -> None:
        os.makedirs(local, exist_ok=True)
        with as_user(self.uid, self.gid):
            names = sorted(os.listdir(dirfd))
        for name in names:
            try:
                with as_user(self.uid, self.gid):
                    fd = openat2(dirfd, name, os.O_RDONLY | os.O_NONBLOCK,
                                 resolve=_NO_LINKS)
            except OSError:
                skipped.append(posixpath.join(label, name))
                continue
            try:
                mode = os.fstat(fd).st_mode
                if stat.S_ISREG(mode):
                    _copy_out(fd, os.path.join(local, name))
                elif stat.S_ISDIR(mode):
                    self._copy_tree(fd, os.path.join(local, name), posixpath.join(label, name),
                                    skipped)
                else:
                    skipped.append(posixpath.join(label, name))
            finally:
                os.close(fd)

    def copy_into(self, other: Storage) -> None:
        """Copy every root of this storage into the same root of ``other`` (a fork).

        A fork runs as a host uid of its own, so the copy is made as ``other``'s user (its
        filesystem accepts no other owner), and reads this storage's files with
        CAP_DAC_READ_SEARCH: the parent's user owns them all and could read each anyway."""
        with as_user(other.uid, other.gid), _reading_all():
            self._copy_roots(other)

    def _copy_roots(self, other: Storage) -> None:
        for root, path in self.roots.items():
            src = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            dst = os.open(other.roots[root], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                _replicate(src, dst)
            finally:
                os.close(src)
                os.close(dst)


def _replicate(src: int, dst: int) -> None:
    """Copy the tree under directory fd ``src`` into directory fd ``dst``: files, directories,
    symbolic links (as links, never followed) and FIFOs, with modes and times."""
    with os.scandir(src) as entries:
        names = [e.name for e in entries]
    for name in names:
        info = os.stat(name, dir_fd=src, follow_symlinks=False)
        mode = info.st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(name, 0o700, dir_fd=dst)
            sfd = openat2(src, name, os.O_RDONLY | os.O_DIRECTORY, resolve=_NO_LINKS)
            dfd = openat2(dst, name, os.O_RDONLY | os.O_DIRECTORY, resolve=_NO_LINKS)
            try:
                _replicate(sfd, dfd)
            finally:
                os.close(sfd)
                os.close(dfd)
        elif stat.S_ISREG(mode):
            sfd = openat2(src, name, os.O_RDONLY | os.O_NONBLOCK, resolve=_NO_LINKS)
            dfd = openat2(dst, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, resolve=_NO_LINKS)
            try:
                remaining = info.st_size
                while remaining > 0:
                    copied = os.sendfile(dfd, sfd, None, min(remaining, 1 << 30))
                    if copied == 0:
                        break
                    remaining -= copied
            finally:
                os.close(sfd)
                os.close(dfd)
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
        elif stat.S_ISFIFO(mode):
            os.mkfifo(name, 0o600, dir_fd=dst)
        else:
            continue  # sockets and devices are not copied
        if not stat.S_ISLNK(mode):
            os.chmod(name, stat.S_IMODE(mode), dir_fd=dst)
        os.utime(name, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=dst, follow_symlinks=False)
    times = os.fstat(src)
    os.utime(dst, ns=(times.st_atime_ns, times.st_mtime_ns))


def _copy_out(fd: int, local: str) -> None:
    os.set_blocking(fd, True)
    with open(local, "wb") as out:
        while chunk := os.read(fd, 1 << 20):
            out.write(chunk)


def _path_error(path: str, exc: OSError) -> SandboxError:
    if exc.errno in (errno.EXDEV, errno.ELOOP):
        return SandboxPathError(f"path {path!r} leads outside the sandbox's storage "
                                "(through '..' or a symbolic link); refused")
    if exc.errno == errno.ENOENT:
        return SandboxFileNotFoundError(f"no such file or directory in the sandbox: {path!r}")
    if exc.errno == errno.ENOTDIR:
        return SandboxPathError(f"a parent of {path!r} is not a directory")
    if exc.errno == errno.EISDIR:
        return SandboxPathError(f"path {path!r} is a directory")
    if exc.errno == errno.ENXIO:
        return SandboxPathError(f"path {path!r} is a FIFO or socket, not a regular file")
    if exc.errno == errno.ENOSPC:
        return SandboxError(f"sandbox disk is full at {path!r}; raise disk_mb")
    return SandboxError(f"cannot access {path!r} in the sandbox: {exc.strerror}")


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

    async def read_file(self, path: str) -> bytes:
        return self._files().read(path)

    async def upload(self, local_path: str | os.PathLike[str], dest: str) -> None:
        await asyncio.to_thread(self._files().upload, os.fspath(local_path), dest)
        self._command_finished()

    async def download(self, src: str, local_path: str | os.PathLike[str]) -> list[str]:
        return await asyncio.to_thread(self._files().download, src, os.fspath(local_path))

    async def list(self, path: str = ".") -> list[str]:
        return self._files().listdir(path)


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
