"""The file copy behind ``fork`` where storage cannot be snapshotted (memory storage): the
tree under one directory descriptor into another, files, directories, symbolic links (as
links, never followed) and FIFOs, with modes and times, resolved beneath each root with
``openat2`` and without recursion, however deep the agent nested its directories."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

from tempering.sandbox.resolve import NO_LINKS, openat2


def replicate(src: int, dst: int) -> None:
    """Copy the tree under directory fd ``src`` into directory fd ``dst``: files, directories,
    symbolic links (as links, never followed) and FIFOs, with modes and times. Iterative (a
    stack of open directories), so no nesting depth can exhaust the interpreter's stack."""
    # Each frame: source and copy directory fds, the names left to copy, and (for all but the
    # root) where to set the directory's own mode and times once its contents are in.
    Frame = tuple[int, int, Iterator[str], tuple[int, str, os.stat_result] | None]
    stack: list[Frame] = [(src, dst, _listing(src), None)]
    try:
        while stack:
            sfd, dfd, names, parent = stack[-1]
            name = next(names, None)
            if name is None:  # this directory is complete
                stack.pop()
                times = os.fstat(sfd)
                os.utime(dfd, ns=(times.st_atime_ns, times.st_mtime_ns))
                if parent is not None:
                    os.close(sfd)
                    os.close(dfd)
                    _finish(*parent)
                continue
            info = os.stat(name, dir_fd=sfd, follow_symlinks=False)
            mode = info.st_mode
            if stat.S_ISDIR(mode):
                os.mkdir(name, 0o700, dir_fd=dfd)
                child = openat2(sfd, name, os.O_RDONLY | os.O_DIRECTORY, resolve=NO_LINKS)
                try:
                    copy = openat2(dfd, name, os.O_RDONLY | os.O_DIRECTORY, resolve=NO_LINKS)
                except BaseException:
                    os.close(child)
                    raise
                stack.append((child, copy, _listing(child), (dfd, name, info)))
                continue
            if stat.S_ISREG(mode):
                _replicate_file(sfd, dfd, name, info.st_size)
            elif stat.S_ISLNK(mode):
                os.symlink(os.readlink(name, dir_fd=sfd), name, dir_fd=dfd)
            elif stat.S_ISFIFO(mode):
                os.mkfifo(name, 0o600, dir_fd=dfd)
            else:
                continue  # sockets and devices are not copied
            _finish(dfd, name, info)
    finally:
        for sfd, dfd, _, parent in stack:
            if parent is not None:
                os.close(sfd)
                os.close(dfd)


def _listing(dirfd: int) -> Iterator[str]:
    with os.scandir(dirfd) as entries:
        return iter([e.name for e in entries])


def _replicate_file(src: int, dst: int, name: str, size: int) -> None:
    sfd = openat2(src, name, os.O_RDONLY | os.O_NONBLOCK, resolve=NO_LINKS)
    try:
        dfd = openat2(dst, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, resolve=NO_LINKS)
        try:
            remaining = size
            while remaining > 0:
                copied = os.sendfile(dfd, sfd, None, min(remaining, 1 << 30))
                if copied == 0:
                    break
                remaining -= copied
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _finish(dirfd: int, name: str, info: os.stat_result) -> None:
    """Give a copied entry its source's mode and times."""
    if not stat.S_ISLNK(info.st_mode):
        os.chmod(name, stat.S_IMODE(info.st_mode), dir_fd=dirfd)
    os.utime(name, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=dirfd, follow_symlinks=False)
