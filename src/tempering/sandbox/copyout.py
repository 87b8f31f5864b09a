"""Copying a directory tree out of a sandbox with every limit applied while it is read.

Everything in a sandbox was shaped by the agent, so no size is believed before it is paid for:
a sparse file's apparent size is not what it cost the sandbox's disk, and N hard links of one
file are N files to a naive copy; a directory can be nested deeper than any recursion or hold
more names than memory. So the walk here is iterative and breadth-first (entries nearest the
root are taken first; within a directory the smaller files first, then by name, so what a byte
budget leaves out is the largest files, not the source beside them), and every entry is
charged against ``CopyLimits`` before it is taken, never after:

- bytes: a file costs the larger of its apparent size (``st_size``) and its allocated size
  (``st_blocks * 512``), rounded up to a 4 KiB page, per file and in total; a read stops one
  byte past what was allowed, so a file that grows while it is read is left out, not followed;
- entries: files taken, and every entry looked at: a directory's names are read only as far as
  the budget goes, so a million empty files cost the host nothing past it;
- depth: a directory deeper than ``max_depth`` is not opened;
- hard links: a file with several names is taken once; its other names become links to it (a
  download) or are left out (a tree read into memory), so links cannot multiply the bytes;
- cancellation: a ``threading.Event`` checked between entries and between chunks stops the walk.

What is not taken is listed as ``(path, why)``: callers report it instead of failing on it.
Everything is opened with ``openat2`` beneath the walk's root directory without following any
link; ``opening`` supplies the sandbox user's filesystem ids for the opens (``files.py``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace

from tempering.sandbox.resolve import NO_LINKS, openat2
from tempering.sandbox.spec import INODE_SPACING, SandboxSpec, memory_disk_bytes

MiB = 1 << 20
PAGE = 4096
CHUNK = 1 << 20
LISTED = 100  # left-out entries named one by one in a TreeCopy; the rest are counted
READ_FILE_LIMIT = 16 * MiB
"""What ``Sandbox.read_file`` loads at most unless the caller passes ``limit=``."""


@dataclass(frozen=True)
class CopyLimits:
    """The most a tree copied out of a sandbox may hold; past these, entries are left out
    (listed with the reason), never copied first and checked after."""

    max_files: int = 10_000
    """Regular files taken."""
    max_entries: int = 50_000
    """Entries looked at in all (files, directories, links, specials): bounds the walk itself."""
    max_depth: int = 64
    """Directory levels below the root that are opened."""
    max_file_bytes: int = 16 * MiB
    """Per file, by the larger of its apparent and its allocated size."""
    max_total_bytes: int = 256 * MiB
    """All files together, counted the same way (a hard-linked file once)."""

    def fitting_dir(self, spec: SandboxSpec) -> CopyLimits:
        """These limits, lowered so that what they admit can be written back into one of the
        ``writable_dirs`` of a grading sandbox of ``spec`` with memory storage, the smaller:
        on the docker backend they share 7/64 of ``memory_disk_bytes`` (a tmpfs each), and a
        quarter is left; with the workdir's share (``fitting``) they stay within one disk."""
        room = (memory_disk_bytes(spec) * 7 // 64 // max(len(spec.writable_dirs), 1)
                * 3 // 4)
        inodes = max(room // INODE_SPACING, 16)
        return replace(self, max_total_bytes=min(self.max_total_bytes, room),
                       max_file_bytes=min(self.max_file_bytes, room),
                       max_files=min(self.max_files, inodes),
                       max_entries=min(self.max_entries, inodes))

    def fitting(self, spec: SandboxSpec) -> CopyLimits:
        """These limits, lowered so that what they admit can be written back into the workdir
        of a grading sandbox of ``spec`` with memory storage, the smaller: its workdir holds
        7/16 of ``memory_disk_bytes`` on the docker backend (/dev/shm an eighth, /tmp half of
        the rest), with one inode per ``INODE_SPACING`` bytes, and a quarter of both is left
        for the hidden tests and the run itself."""
        room = memory_disk_bytes(spec) * 7 // 16 * 3 // 4
        inodes = max(room // INODE_SPACING, 64)
        return replace(self, max_total_bytes=min(self.max_total_bytes, room),
                       max_file_bytes=min(self.max_file_bytes, room),
                       max_files=min(self.max_files, inodes),
                       max_entries=min(self.max_entries, inodes))


def download_limits(disk_mb: int) -> CopyLimits:
    """``Sandbox.download``'s defaults: what a sandbox of ``disk_mb`` could honestly hold (no
    file and no total larger than its disk), 100,000 files, 64 levels."""
    return CopyLimits(max_files=100_000, max_entries=200_000, max_file_bytes=disk_mb * MiB,
                      max_total_bytes=disk_mb * MiB)


@dataclass(frozen=True)
class TreeCopy:
    """A tree read into memory: ``{relative POSIX path: bytes}``, each file's permission bits,
    and ``"path (why)"`` for what was left out (the first ``LISTED`` by name, then a count)."""

    files: dict[str, bytes] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()
    left_out_paths: frozenset[str] = frozenset()
    """Every path left out, listed or counted: what a caller decides on, never the text."""
    links: dict[str, str] = field(default_factory=dict)
    """Symbolic links by path and target, where the walk was asked to keep them (never
    followed: the target is text, charged as a file's bytes)."""


class Stopped(Exception):
    """The walk was asked to stop (its caller was cancelled)."""


@dataclass
class Entry:
    """A directory or a regular file the walk took, open for reading while it is yielded."""

    path: str
    fd: int
    info: os.stat_result
    allowed: int = 0  # bytes a read may return (files)
    link_of: str | None = None  # the path this file was taken under first (a hard link)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.info.st_mode)


def cost(info: os.stat_result) -> int:
    """What a file costs the budget: its apparent or allocated size, whichever is larger."""
    size = max(info.st_size, info.st_blocks * 512)
    return -(-size // PAGE) * PAGE


def over(info: os.stat_result, limit: int) -> bool:
    """Whether the file holds more than ``limit`` bytes, or allocates more than the pages
    that many bytes need (a preallocated or oddly sparse file)."""
    return info.st_size > limit or info.st_blocks * 512 > -(-limit // PAGE) * PAGE


def describe(info: os.stat_result) -> str:
    return f"{info.st_size} bytes, {info.st_blocks * 512} allocated"


class Walk:
    """One bounded walk of the tree under the directory descriptor ``rootfd`` (not closed).

    Iterate ``entries()``; take each file with ``read`` or ``copy`` (which charge it); what was
    not taken is in ``left_out``."""

    def __init__(self, rootfd: int, limits: CopyLimits, stop: threading.Event | None = None,
                 opening: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
                 *, links: bool = False) -> None:
        self.rootfd, self.limits, self.stop, self.opening = rootfd, limits, stop, opening
        self.keep_links = links
        self.links: dict[str, str] = {}  # taken symbolic links (``links=True``): their targets
        self.left_out: list[tuple[str, str]] = []
        self.files = self.examined = self.total = 0
        self._seen: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) -> first path taken

    def leave(self, path: str, why: str) -> None:
        self.left_out.append((path, why))

    def check(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise Stopped("the copy was cancelled")

    def _open(self, dirfd: int, name: str, flags: int) -> int | str:
        """A descriptor, or why ``name`` cannot be taken; never follows a link."""
        try:
            with self.opening():
                return openat2(dirfd, name, flags | os.O_RDONLY | os.O_NONBLOCK,
                               resolve=NO_LINKS)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "symbolic link"
            if exc.errno == errno.EXDEV:
                return "another mount"
            if exc.errno == errno.ENXIO:
                return "not a regular file"
            return f"cannot be opened: {exc.strerror}"

    def _names(self, dirfd: int, path: str) -> list[tuple[str, str]]:
        """(name, kind) of the directory's entries, read only as far as the budget goes: the
        regular files first, smallest first (so a byte budget leaves out the largest files,
        not the source beside them), then the rest by name."""
        budget = self.limits.max_entries - self.examined
        files: list[tuple[int, str]] = []
        others: list[tuple[str, str]] = []
        with self.opening(), os.scandir(dirfd) as it:
            for e in it:
                if len(files) + len(others) >= budget:
                    self.leave(path or ".", f"more than {self.limits.max_entries} entries in "
                                            "all: the rest of this directory was not read")
                    break
                if e.is_symlink():
                    others.append((e.name, "link"))
                elif e.is_dir(follow_symlinks=False):
                    others.append((e.name, "dir"))
                elif e.is_file(follow_symlinks=False):
                    try:
                        files.append((cost(e.stat(follow_symlinks=False)), e.name))
                    except OSError:  # gone, or not ours to see: opening it will say which
                        files.append((0, e.name))
                else:
                    others.append((e.name, "special"))
        files.sort()
        others.sort()
        return [(name, "file") for _, name in files] + others

    def entries(self) -> Iterator[Entry]:
        """Directories (below the root) and the regular files within the limits, breadth
        first; each descriptor is closed once the consumer moves on."""
        limits = self.limits
        queue: deque[tuple[str, int]] = deque([("", 0)])
        while queue:
            rel, depth = queue.popleft()
            self.check()
            fd = os.dup(self.rootfd) if not rel else self._open(self.rootfd, rel, os.O_DIRECTORY)
            if isinstance(fd, str):
                self.leave(rel, fd)
                continue
            try:
                if rel:
                    yield Entry(rel, fd, os.fstat(fd))
                for name, kind in self._names(fd, rel):
                    self.check()
                    self.examined += 1
                    path = posixpath.join(rel, name) if rel else name
                    if kind == "dir":
                        if depth + 1 > limits.max_depth:
                            self.leave(path, f"deeper than {limits.max_depth} directories")
                        else:
                            queue.append((path, depth + 1))
                    elif kind == "link" and self.keep_links:
                        self._link(fd, name, path)
                    elif kind == "link":
                        self.leave(path, "symbolic link")
                    elif kind == "special":
                        self.leave(path, "not a regular file")
                    elif self.files >= limits.max_files:
                        self.leave(path, f"more than {limits.max_files} files")
                    else:
                        yield from self._file(fd, name, path)
            finally:
                os.close(fd)

    def _link(self, dirfd: int, name: str, path: str) -> None:
        """Keep a symbolic link as its target, charged as a file of that many bytes."""
        limits = self.limits
        if self.files >= limits.max_files:
            self.leave(path, f"more than {limits.max_files} files")
            return
        try:
            with self.opening():
                target = os.readlink(name, dir_fd=dirfd)
        except OSError as exc:
            self.leave(path, f"cannot be read: {exc.strerror}")
            return
        size = -(-len(os.fsencode(target)) // PAGE) * PAGE
        if self.total + size > limits.max_total_bytes:
            self.leave(path, f"past {limits.max_total_bytes} bytes in all")
            return
        if not utf8(target):
            self.leave(path, "link target is not UTF-8")
            return
        self.files += 1
        self.total += size
        self.links[path] = target

    def _file(self, dirfd: int, name: str, path: str) -> Iterator[Entry]:
        limits = self.limits
        fd = self._open(dirfd, name, 0)
        if isinstance(fd, str):
            self.leave(path, fd)
            return
        try:
            info = os.fstat(fd)
            key = (info.st_dev, info.st_ino)
            if not stat.S_ISREG(info.st_mode):  # replaced since it was listed
                self.leave(path, "not a regular file")
            elif info.st_nlink > 1 and key in self._seen:
                yield Entry(path, fd, info, link_of=self._seen[key])
            elif over(info, limits.max_file_bytes):
                self.leave(path, f"{describe(info)}, over {limits.max_file_bytes} per file")
            elif self.total + cost(info) > limits.max_total_bytes:
                self.leave(path, f"{describe(info)}, past {limits.max_total_bytes} in all")
            else:
                allowed = min(limits.max_file_bytes, limits.max_total_bytes - self.total)
                yield Entry(path, fd, info, allowed=allowed)
        finally:
            os.close(fd)

    def _taken(self, entry: Entry, got: int) -> None:
        self.files += 1
        self.total += max(cost(entry.info), -(-got // PAGE) * PAGE)
        if entry.info.st_nlink > 1:
            self._seen[(entry.info.st_dev, entry.info.st_ino)] = entry.path

    def _grew(self, entry: Entry) -> None:
        self.leave(entry.path, f"grew past {entry.allowed} bytes while it was read")

    def read(self, entry: Entry) -> bytes | None:
        """The file's bytes, or None (left out) if it holds more than it was allowed."""
        data = read_at_most(entry.fd, entry.allowed, self.check)
        if data is None:
            self._grew(entry)
        else:
            self._taken(entry, len(data))
        return data

    def copy(self, entry: Entry, out: int) -> bool:
        """Copy the file to the descriptor ``out``; False (left out) past what was allowed."""
        os.set_blocking(entry.fd, True)
        got = 0
        while copied := os.sendfile(out, entry.fd, None, min(CHUNK, entry.allowed + 1 - got)):
            got += copied
            if got > entry.allowed:
                self._grew(entry)
                return False
            self.check()
        self._taken(entry, got)
        return True


def read_at_most(fd: int, limit: int, check: Callable[[], None] | None = None) -> bytes | None:
    """The rest of the file ``fd`` if it holds at most ``limit`` bytes, else None; never reads
    more than one byte past ``limit``, however the file grows meanwhile."""
    os.set_blocking(fd, True)
    chunks: list[bytes] = []
    got = 0
    while chunk := os.read(fd, min(CHUNK, limit + 1 - got)):
        got += len(chunk)
        if got > limit:
            return None
        chunks.append(chunk)
        if check is not None:
            check()
    return b"".join(chunks)


def read_tree(walk: Walk) -> TreeCopy:
    """Every file the walk takes, read into memory; hard links of a taken file left out."""
    files: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    for entry in walk.entries():
        if not utf8(entry.path):  # no tree, report or trajectory could hold its name
            walk.leave(printable(entry.path), "name is not UTF-8")
            continue
        if entry.is_dir:
            continue
        if entry.link_of is not None:
            walk.leave(entry.path, f"hard link of {entry.link_of}, taken once")
            continue
        data = walk.read(entry)
        if data is not None:
            files[entry.path] = data
            # A captured directory's tree (``links``) keeps its permission bits; a
            # workspace's is code, where only the executable bit means anything.
            modes[entry.path] = (entry.info.st_mode & 0o777 if walk.keep_links else
                                 0o755 if entry.info.st_mode & 0o111 else 0o644)
    links = {path: target for path, target in walk.links.items() if utf8(path)}
    for path in walk.links.keys() - links.keys():
        walk.leave(printable(path), "name is not UTF-8")
    return TreeCopy(files, modes, summary(walk.left_out),
                    frozenset(path for path, _ in walk.left_out), links)


def utf8(name: str) -> bool:
    """Whether a name read from the filesystem is text (no byte undecodable as UTF-8)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def printable(name: str) -> str:
    """A filesystem name as text: each byte that is not UTF-8 as ``\\xNN``."""
    return name.encode(errors="surrogateescape").decode(errors="backslashreplace")


def summary(left_out: list[tuple[str, str]]) -> tuple[str, ...]:
    """``"path (why)"`` for the first ``LISTED`` entries, then one line counting the rest."""
    listed = tuple(f"{path} ({why})" for path, why in left_out[:LISTED])
    rest = len(left_out) - LISTED
    return listed + ((f"... ({rest} more entries left out)",) if rest > 0 else ())


def download_tree(walk: Walk, local: str, label: str) -> list[str]:
    """Copy what the walk takes under the host directory ``local`` (hard links as links);
    returns the paths left behind, each prefixed with ``label``."""
    os.makedirs(local, exist_ok=True)
    for entry in walk.entries():
        target = os.path.join(local, entry.path)
        try:
            if entry.is_dir:
                os.makedirs(target, exist_ok=True)
            elif entry.link_of is not None:
                os.link(os.path.join(local, entry.link_of), target, follow_symlinks=False)
                walk.files += 1
            else:
                copy_file(walk, entry, target)
        except OSError as exc:
            walk.leave(entry.path, f"cannot be written on the host: {exc.strerror}")
    return [posixpath.join(label, path) if label not in ("", ".") else path
            for path, _ in walk.left_out]


def copy_file(walk: Walk, entry: Entry, target: str) -> bool:
    """Copy one file the walk took to the host path ``target``; False (nothing left there)
    if it held more than it was allowed."""
    mode = 0o755 if entry.info.st_mode & 0o111 else 0o644
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                  mode)
    try:
        ok = walk.copy(entry, out)
    finally:
        os.close(out)
    if not ok:
        os.unlink(target)
    return ok
