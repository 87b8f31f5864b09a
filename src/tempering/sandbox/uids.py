"""A host uid (and gid) of its own for every live sandbox, unique across the whole host.

The kernel keeps many counters per user rather than per container: inotify instances and
watches, pipe buffer pages, epoll watches, RLIMIT_NPROC, POSIX message queue bytes, pending
signals, user namespaces (a user namespace's counts are charged up the chain to the host uid
that made it). Sandboxes that share a host uid share all of them, so one could exhaust them and
make the others' ``inotify_init1`` or ``pipe`` fail. Each sandbox therefore runs as a host uid
that no other live sandbox has, taken from a range that is this tool's alone
(``TEMPERING_SANDBOX_UID`` is the spawner's own uid, the sandboxes get the next
``TEMPERING_SANDBOX_UID_COUNT - 1``).

A lease is a lock file per uid under ``$TEMPERING_HOME/uids``, ``flock``-ed for as long as the
sandbox lives, so every Tempering process on the host (local and docker backends alike) sees
the same leases, and a process that dies frees its uids with its file descriptors. A clean
release unlinks the file before unlocking it, so a file that is there and not locked is a
crashed owner's: whoever takes that uid next first kills what still runs as it. A lease costs
an open, a flock, two stats and a write (tens of microseconds).
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import random
import signal
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tempering.errors import SandboxStartError, SandboxUnavailableError
from tempering.sandbox.native import home

DEFAULT_FIRST = 0x7000_0000  # above systemd's container ranges, below its foreign range
DEFAULT_COUNT = 65536


@dataclass(frozen=True)
class UidRange:
    """The spawner's own uid, and the uids sandboxes may run as (``first`` to ``last``)."""

    spawner: int
    first: int
    last: int


@cache
def uid_range() -> UidRange:
    """The host uids this tool owns, from ``TEMPERING_SANDBOX_UID`` and ``..._UID_COUNT``."""
    base = int(os.environ.get("TEMPERING_SANDBOX_UID", str(DEFAULT_FIRST)))
    count = int(os.environ.get("TEMPERING_SANDBOX_UID_COUNT", str(DEFAULT_COUNT)))
    last = base + count - 1
    if base < 1 or count < 2 or last >= 1 << 31 or base <= 65534 <= last or base <= 65535 <= last:
        raise SandboxUnavailableError(
            f"the sandbox uid range {base}-{last} (TEMPERING_SANDBOX_UID={base}, "
            f"TEMPERING_SANDBOX_UID_COUNT={count}) must be at least two uids, above 0, below "
            "2^31 and clear of nobody (65534) and 65535; the default is "
            f"{DEFAULT_FIRST} with {DEFAULT_COUNT} uids")
    for name, ident in [(f"user {u.pw_name}", u.pw_uid) for u in pwd.getpwall()] + [
            (f"group {g.gr_name}", g.gr_gid) for g in grp.getgrall()]:
        if base <= ident <= last:  # a sandbox would own that account's files and processes
            raise SandboxUnavailableError(
                f"the sandbox uid range {base}-{last} holds {name} ({ident}) of this host; "
                "choose a range no account uses with TEMPERING_SANDBOX_UID and "
                "TEMPERING_SANDBOX_UID_COUNT")
    return UidRange(base, base + 1, last)


@cache
def _directory() -> Path:
    path = home() / "uids"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


class UidLease:
    """One uid of the range, held until ``release()`` (or until this process dies)."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = self.gid = uid
        self._fd = fd

    def release(self) -> None:
        """Give the uid back; call it once nothing runs as the uid any more."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.unlink(_directory() / str(self.uid))  # before the unlock: a clean release
        os.close(self._fd)
        self._fd = -1
        with _lock:
            _mine.discard(self.uid)


_lock = threading.Lock()
_mine: set[int] = set()  # leased by this process: skipped without a system call
_cursor = -1


def lease_uid() -> UidLease:
    """A uid no other live sandbox on this host runs as; SandboxStartError if none is free."""
    global _cursor
    r, directory = uid_range(), _directory()
    count = r.last - r.first + 1
    with _lock:
        if _cursor < 0:  # processes start apart, so they rarely try each other's uids
            _cursor = random.randrange(count)
        for step in range(count):
            uid = r.first + (_cursor + step) % count
            if uid in _mine:
                continue
            fd, _ = _try_lock(directory / str(uid), uid)
            if fd is not None:
                _cursor = (_cursor + step + 1) % count
                _mine.add(uid)
                return UidLease(uid, fd)
    raise SandboxStartError(
        f"every sandbox uid ({r.first}-{r.last}) is in use by a live sandbox on this host; "
        "close some, or widen the range with TEMPERING_SANDBOX_UID_COUNT")


def _try_lock(path: Path, uid: int) -> tuple[int | None, bool]:
    """The locked lease file of ``uid`` (None if another holds it) and whether its last owner
    died holding it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = os.fstat(fd)
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = -1
        if current != held.st_ino:  # released (unlinked) between our open and our lock
            os.close(fd)
            return None, False
        if held.st_size:  # its owner died holding it: something may still run as the uid
            evict(uid)
        tag = f"{os.getpid()}\n".encode()
        os.pwrite(fd, tag, 0)
        os.ftruncate(fd, len(tag))
        return fd, held.st_size > 0
    except BlockingIOError:
        os.close(fd)
        return None, False
    except BaseException:
        os.close(fd)
        raise


def evict(uid: int) -> int:
    """SIGKILL every process whose real, effective or saved uid is ``uid`` (for a uid whose
    owner died), until none is left or a second has passed; returns how many were killed."""
    killed = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        found = [pid for pid in _pids_of(uid) if pid != os.getpid()]
        if not found:
            break
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed += len(found)
        time.sleep(0.01)
    return killed


def _pids_of(uid: int) -> list[int]:
    pids = []
    wanted = str(uid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if wanted in line.split()[1:4]:
                            pids.append(int(entry))
                        break
        except OSError:
            continue
    return pids


def reclaim_uids() -> set[int]:
    """Free the uids of owners that died (their lock file is there but unlocked): kill what
    still runs as each, remove its file. Returns those uids."""
    freed = set()
    directory = _directory()
    for entry in os.listdir(directory):
        if not entry.isdigit():
            continue
        uid = int(entry)
        with _lock:
            if uid in _mine:
                continue
            fd, dead_owner = _try_lock(directory / entry, uid)
            if fd is None:
                continue
            _mine.add(uid)
        UidLease(uid, fd).release()
        if dead_owner:
            freed.add(uid)
    return freed
