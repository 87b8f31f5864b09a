"""File trees held in memory: a task's workspace, hidden tests and solution, an agent's edits.

A tree maps POSIX paths relative to its root to contents and modes. Reading one from disk or
from a sandbox never follows a symbolic link and applies its limits while it reads (sizes by
apparent and allocated bytes, counts, depth, hard links once: ``sandbox/copyout.py``); what is
left out (links, devices, what the limits refused) is listed, so a grader can say what it did
not take instead of crashing on it, whatever shape the agent gave its workspace.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tempering.errors import ConfigError
from tempering.sandbox import Sandbox, SandboxSpec
from tempering.sandbox.copyout import CopyLimits, Walk, read_tree

Limits = CopyLimits
"""The most a tree read from outside may hold; past these, entries are left out (listed)."""


@dataclass(frozen=True)
class FileTree(Mapping[str, bytes]):
    """Immutable ``{relative path: bytes}`` with each file's mode, and what reading left out."""

    files: Mapping[str, bytes] = field(default_factory=dict)
    modes: Mapping[str, int] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()  # "path (why)" for entries not taken (100, then a count)
    left_out_paths: frozenset[str] = frozenset()  # the path of every entry not taken
    links: Mapping[str, str] = field(default_factory=dict)  # symbolic links kept: targets
    beside: Mapping[str, FileTree] = field(default_factory=dict)
    """Trees laid at other absolute paths with this one (a task's captured directories,
    ``grading.capture``): ``write_into`` writes them too."""

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
        for path in sorted(self.links):
            h.update(f"{path}\0->\0{self.links[path]}\0".encode())
        for where in sorted(self.beside):
            h.update(f"{where}\0{self.beside[where].digest()}\0".encode())
        return h.hexdigest()

    @classmethod
    def of(cls, files: Mapping[str, str | bytes]) -> FileTree:
        """A tree from literal contents (strings are UTF-8); paths are checked."""
        return cls({check_path(p): (d.encode() if isinstance(d, str) else bytes(d))
                    for p, d in files.items()})

    @classmethod
    def read(cls, root: Path | str, limits: Limits | None = None, *,
             links: bool = False) -> FileTree:
        """Read every regular file under ``root`` within ``limits`` (symbolic links, unless
        ``links`` keeps them as links, and special files are left out, never followed); an
        absent root is an empty tree."""
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return cls()
        try:
            copy = read_tree(Walk(fd, limits or Limits(), links=links))
        finally:
            os.close(fd)
        return cls(copy.files, copy.modes, copy.left_out, copy.left_out_paths, copy.links)

    def overlay(self, changes: Mapping[str, bytes | None],
                modes: Mapping[str, int] | None = None) -> FileTree:
        """This tree with ``changes`` applied (None deletes a path, link or file)."""
        files = dict(self.files)
        new_modes = dict(self.modes)
        links = dict(self.links)
        for path, data in changes.items():
            links.pop(path, None)
            if data is None:
                files.pop(path, None)
                new_modes.pop(path, None)
            else:
                files[path] = data
                new_modes[path] = (modes or {}).get(path, self.mode(path))
        return FileTree(files, new_modes, links=links, beside=self.beside)

    def with_beside(self, trees: Mapping[str, FileTree]) -> FileTree:
        """This tree with ``trees`` to lay beside it, by absolute path."""
        return FileTree(self.files, self.modes, self.left_out, self.left_out_paths, self.links,
                        dict(trees))

    async def write_into(self, sb: Sandbox, dest: str = ".") -> None:
        """Write every file and link into ``sb`` under ``dest`` (relative to its workdir), and
        the trees ``beside`` it at their paths."""
        for path in self:
            target = path if dest in (".", "") else posixpath.join(dest, path)
            await sb.write_file(target, self.files[path], self.mode(path))
        for path in sorted(self.links):
            target = path if dest in (".", "") else posixpath.join(dest, path)
            await sb.write_link(target, self.links[path])
        for where in sorted(self.beside):
            await self.beside[where].write_into(sb, where)


async def read_sandbox_tree(sb: Sandbox, limits: Limits | None = None, *,
                            spec: SandboxSpec | None = None, src: str = ".",
                            links: bool = False) -> FileTree:
    """The files in a sandbox's workdir (or its writable directory ``src``), by content, read
    straight into memory through the sandbox's file API within ``limits``, lowered so that
    the tree fits back into a grading sandbox of ``spec`` (default: the sandbox's own;
    ``CopyLimits.fitting``, ``fitting_dir``); with ``links``, symbolic links as links and
    permission bits as they are. Never raises for the tree's shape: what is left out is
    listed."""
    limits, spec = limits or Limits(), spec or sb.spec
    fitted = limits.fitting_dir(spec) if src != "." else limits.fitting(spec)
    copy = await sb.read_tree(src, fitted, links=links)
    return FileTree(copy.files, copy.modes, copy.left_out, copy.left_out_paths, copy.links)


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
