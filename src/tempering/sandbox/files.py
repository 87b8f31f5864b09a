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

What comes out is bounded while it is read, never checked after: ``read_file`` refuses a file
over its limit before loading a byte, and ``download`` / ``read_tree`` walk the tree with
``copyout.py`` (sizes by apparent and allocated bytes, counts, depth, hard links once,
cancellable), so no shape an agent gives its files can cost the host more than the limits.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Concatenate, ParamSpec, TypeVar

from tempering.errors import (
    SandboxError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxPathError,
)
from tempering.sandbox.copyout import (
    READ_FILE_LIMIT,
    CopyLimits,
    Entry,
    TreeCopy,
    Walk,
    copy_file,
    describe,
    download_tree,
    over,
    read_at_most,
    read_tree,
)
from tempering.sandbox.replicate import replicate
from tempering.sandbox.resolve import as_user, openat2, reading_all

__all__ = ["Storage", "as_user", "openat2"]

P = ParamSpec("P")
R = TypeVar("R")


def _confined(method: Callable[Concatenate[Storage, P], R]) -> Callable[Concatenate[Storage, P], R]:
    """Run a Storage method with the sandbox user's filesystem ids."""
    def wrapper(self: Storage, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with as_user(self.uid, self.gid):
            try:
                return method(self, *args, **kwargs)
            except SandboxError:
                raise
            except OSError as exc:  # what the sandbox's own files answered: told by errno
                raise _path_error(str(args[0]) if args else ".", exc) from None
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
                raise _path_error(path, exc) from None
            finally:
                os.close(fd)
        finally:
            os.close(dirfd)

    @_confined
    def read(self, path: str, limit: int = READ_FILE_LIMIT) -> bytes:
        """The file's bytes; SandboxFileTooLargeError, with nothing loaded, past ``limit``."""
        fd = self._open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SandboxPathError(f"path {path!r} is not a regular file")
            if over(info, limit):
                raise _too_large(path, describe(info), limit)
            data = read_at_most(fd, limit)
            if data is None:
                raise _too_large(path, "more bytes than that as it was read", limit)
            return data
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
                    self.symlink(os.readlink(src), posixpath.join(target, name))
                elif os.path.isfile(src):
                    with open(src, "rb") as f:
                        self.write(posixpath.join(target, name), f.read(),
                                   os.stat(src).st_mode & 0o777)
            for name in dirs:
                src = os.path.join(top, name)
                if os.path.islink(src):
                    self.symlink(os.readlink(src), posixpath.join(target, name))

    @_confined
    def _mkdirs(self, path: str) -> None:
        os.close(self._dirfd(path, create=True))

    @_confined
    def symlink(self, target: str, path: str) -> None:
        """A symbolic link at ``path`` (parents made) holding ``target``, never resolved here;
        a link or file already there is replaced, a directory is not."""
        parent, name = posixpath.split(posixpath.normpath(path))
        if name in ("", ".", "..") or "\0" in target or not target:
            raise SandboxPathError(f"cannot make link {path!r} -> {target!r}")
        dirfd = self._dirfd(parent or ".", create=True)
        try:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(name, dir_fd=dirfd)
            os.symlink(target, name, dir_fd=dirfd)
        except OSError as exc:
            raise _path_error(path, exc) from None
        finally:
            os.close(dirfd)

    def download(self, src: str, local: str, limits: CopyLimits,
                 stop: threading.Event | None = None) -> list[str]:
        """Copy regular files and directories out within ``limits`` (``copyout.py``); returns
        the paths left behind (links, devices, what the limits left out). A single file over
        the limits is SandboxFileTooLargeError.

        Sandbox files are opened as its user, host files written with the caller's rights."""
        with as_user(self.uid, self.gid):
            fd = self._open(src, os.O_RDONLY | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            walk = Walk(fd, limits, stop, lambda: as_user(self.uid, self.gid))
            if stat.S_ISDIR(info.st_mode):
                return download_tree(walk, local, src)
            if not stat.S_ISREG(info.st_mode):
                raise SandboxPathError(f"path {src!r} is neither a regular file nor a directory")
            if over(info, limits.max_file_bytes):
                raise _too_large(src, describe(info), limits.max_file_bytes)
            os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
            if not copy_file(walk, Entry(src, fd, info, allowed=limits.max_file_bytes), local):
                raise _too_large(src, "more bytes than that as it was read",
                                 limits.max_file_bytes)
            return []
        finally:
            os.close(fd)

    def read_tree(self, src: str, limits: CopyLimits,
                  stop: threading.Event | None = None, *, links: bool = False) -> TreeCopy:
        """The regular files under the directory ``src``, read into memory within ``limits``
        (``copyout.py``), opened as the sandbox's user but past its permission bits: a
        workspace the agent made unreadable (``chmod 000``) is still read, not an error."""
        with self._reading():
            fd = self._open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
        try:
            return read_tree(Walk(fd, limits, stop, self._reading, links=links))
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        with as_user(self.uid, self.gid), reading_all():
            yield

    def copy_into(self, other: Storage) -> None:
        """Copy every root of this storage into the same root of ``other`` (a fork).

        A fork runs as a host uid of its own, so the copy is made as ``other``'s user (its
        filesystem accepts no other owner), and reads this storage's files with
        CAP_DAC_READ_SEARCH: the parent's user owns them all and could read each anyway."""
        with as_user(other.uid, other.gid), reading_all():
            self._copy_roots(other)

    def _copy_roots(self, other: Storage) -> None:
        for root, path in self.roots.items():
            src = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            dst = os.open(other.roots[root], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                replicate(src, dst)
            finally:
                os.close(src)
                os.close(dst)


def _too_large(path: str, size: str, limit: int) -> SandboxFileTooLargeError:
    return SandboxFileTooLargeError(
        f"file {path!r} in the sandbox holds {size}, over the limit of {limit} bytes; nothing "
        "was read: pass a larger limit, or look at part of it with exec (head, tail)")


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
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SandboxPathError(f"the sandbox's disk is full at {path!r} (its disk_mb is "
                                "spent: remove files, or raise disk_mb)")
    if exc.errno in HOST_ERRNOS:
        return SandboxError(f"cannot access {path!r} in the sandbox: {exc.strerror} (the "
                            "host's error, not the sandbox's)")
    # Anything else (permissions, a name too long, a lease, a read-only file...) is what the
    # sandbox's own processes made of its files: the caller's to answer, never the host's
    # failure (an agent that chmods its file to 000 must not turn its episode into an infra
    # error: round twenty-five).
    return SandboxPathError(f"cannot access {path!r} in the sandbox: {exc.strerror}")


# Errors of the host itself (its disk, memory or descriptors), whatever the sandbox did.
HOST_ERRNOS = frozenset({errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.EBADF,
                         errno.ESTALE})
