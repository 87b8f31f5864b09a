"""Kernel-confined path resolution, and acting with a sandbox user's filesystem ids.

``openat2`` resolves a path against a directory descriptor with ``RESOLVE_*`` flags, so that
``..``, symbolic links and other mounts are refused by the kernel, atomically, with no
check-then-use window; ``as_user`` sets this thread's filesystem ids (``setfsuid`` is per
thread), which drops the host's file capabilities for the block.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
CONFINED = RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS
NO_LINKS = CONFINED | RESOLVE_NO_SYMLINKS


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = CONFINED) -> int:
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
