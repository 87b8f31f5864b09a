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


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


_CAP_DAC_READ_SEARCH = 2


@contextlib.contextmanager
def reading_all() -> Iterator[None]:
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
