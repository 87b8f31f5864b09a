"""File trees held in memory: a task's workspace, hidden tests and solution, an agent's edits.

A tree maps POSIX paths relative to its root to contents and modes. Reading one from disk or
from a sandbox never follows a symbolic link; what is left out (links, devices, files past the
limits) is listed, so a grader can say what it did not take instead of crashing on it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import posixpath
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tempering.errors import ConfigError
from tempering.sandbox import Sandbox

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """The most a tree read from outside may hold; past these, files are left out (listed)."""

    max_files: int = 10_000
    max_file_bytes: int = 16 * MiB
    max_total_bytes: int = 256 * MiB


@dataclass(frozen=True)
class FileTree(Mapping[str, bytes]):
    """Immutable ``{relative path: bytes}`` with each file's mode, and what reading left out."""

    files: Mapping[str, bytes] = field(default_factory=dict)
    modes: Mapping[str, int] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()  # "path (why)" for every entry not taken

    def __getitem__(self, path: str) -> bytes:
        return self.files[path]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.files))

    def __len__(self) -> int:
        return len(self.files)

    def __hash__(self) -> int:
        return hash(self.digest())

    def mode(self, path: str) -> int:
        return self.modes.get(path, 0o644)

    def digest(self) -> str:
        h = hashlib.sha256()
        for path in self:
            h.update(f"{path}\0{self.mode(path):o}\0{len(self.files[path])}\0".encode())
            h.update(self.files[path])
        return h.hexdigest()

    @classmethod
    def of(cls, files: Mapping[str, str | bytes]) -> FileTree:
        """A tree from literal contents (strings are UTF-8); paths are checked."""
        return cls({check_path(p): (d.encode() if isinstance(d, str) else bytes(d))
                    for p, d in files.items()})

    @classmethod
    def read(cls, root: Path | str, limits: Limits | None = None) -> FileTree:
        """Read every regular file under ``root`` (symbolic links and special files are left
        out, never followed); an absent root is an empty tree."""
        limits = limits or Limits()
        files: dict[str, bytes] = {}
        modes: dict[str, int] = {}
        left_out: list[str] = []
        total = 0
        root = Path(root)
        if not root.is_dir():
            return cls()
        for top, dirs, names in os.walk(root):
            dirs.sort()
            rel_top = os.path.relpath(top, root)
            for name in [*sorted(names), *[d for d in dirs if os.path.islink(Path(top, d))]]:
                rel = name if rel_top == "." else posixpath.join(rel_top, name)
                info = os.lstat(Path(top, name))
                if stat.S_ISLNK(info.st_mode):
                    left_out.append(f"{rel} (symbolic link)")
                elif not stat.S_ISREG(info.st_mode):
                    left_out.append(f"{rel} (not a regular file)")
                elif len(files) >= limits.max_files:
                    left_out.append(f"{rel} (more than {limits.max_files} files)")
                elif info.st_size > limits.max_file_bytes:
                    left_out.append(f"{rel} ({info.st_size} bytes, over "
                                    f"{limits.max_file_bytes})")
                elif total + info.st_size > limits.max_total_bytes:
                    left_out.append(f"{rel} (past {limits.max_total_bytes} bytes in all)")
                else:
                    files[rel] = Path(top, name).read_bytes()
                    modes[rel] = 0o755 if info.st_mode & 0o111 else 0o644
                    total += len(files[rel])
        return cls(files, modes, tuple(left_out))

    def overlay(self, changes: Mapping[str, bytes | None],
                modes: Mapping[str, int] | None = None) -> FileTree:
        """This tree with ``changes`` applied (None deletes a path)."""
        files = dict(self.files)
        new_modes = dict(self.modes)
        for path, data in changes.items():
            if data is None:
                files.pop(path, None)
                new_modes.pop(path, None)
            else:
                files[path] = data
                new_modes[path] = (modes or {}).get(path, self.mode(path))
        return FileTree(files, new_modes)

    async def write_into(self, sb: Sandbox, dest: str = ".") -> None:
        """Write every file into ``sb`` under ``dest`` (relative to its workdir)."""
        for path in self:
            target = path if dest in (".", "") else posixpath.join(dest, path)
            await sb.write_file(target, self.files[path], self.mode(path))


async def read_sandbox_tree(sb: Sandbox, scratch: Path, limits: Limits | None = None) -> FileTree:
    """The files in a sandbox's workdir, by content: copied out through the sandbox's file API
    (links and special files are left behind, never followed), then read with ``limits``."""
    skipped = await sb.download(".", scratch)
    tree = await asyncio.to_thread(FileTree.read, scratch, limits)
    links = tuple(f"{p.removeprefix('./')} (symbolic link or special file)" for p in skipped)
    return FileTree(tree.files, tree.modes, tree.left_out + links)


def check_path(path: str) -> str:
    """A normalised relative POSIX path, or ConfigError naming the path."""
    norm = posixpath.normpath(path)
    if path == "" or norm.startswith(("/", "../")) or norm in (".", ".."):
        raise ConfigError(f"path {path!r} must be relative and stay inside its tree")
    return norm


def matches(path: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """Whether ``path`` matches a glob pattern or lies under a directory pattern (``docs/``)."""
    from fnmatch import fnmatchcase

    for pattern in patterns:
        pattern = pattern.rstrip("/")
        if fnmatchcase(path, pattern) or path.startswith(pattern + "/"):
            return True
    return False
