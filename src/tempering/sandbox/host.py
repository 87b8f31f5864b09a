"""What every local sandbox on this host shares, set up once per process.

``host()`` checks that this host can run local sandboxes (and says exactly what is missing if
not), builds the two C programs and prepares this process's cgroup directories. ``spawner()``
and ``volumes()`` start the spawner and mount the copy-on-write volume pool on first use.
``reclaim()`` cleans what crashed processes left behind. Each sandbox runs as a host uid of its
own, leased from ``uids.py``; the volumes it gets are owned by that uid.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import logging
import os
import shutil
import signal
import subprocess
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tempering.errors import SandboxError, SandboxUnavailableError
from tempering.sandbox import cgroup
from tempering.sandbox.files import as_user
from tempering.sandbox.forkserver import Spawner
from tempering.sandbox.native import home, native_binary
from tempering.sandbox.spec import SandboxSpec
from tempering.sandbox.uids import UidRange, reclaim_uids, uid_range
from tempering.sandbox.volumes import BtrfsPool


@dataclass(frozen=True)
class Host:
    """What every local sandbox on this host shares, checked once per process."""

    bwrap: str
    init: str
    spawner: str
    hierarchy: cgroup.Hierarchy
    tag: str
    uids: UidRange


log = logging.getLogger(__name__)


@cache
def host() -> Host:
    """Check that this host can run local sandboxes; say exactly what is missing if not."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError(
            "bubblewrap (bwrap) is not installed; install it with `apt-get install -y bubblewrap`")
    bwrap = os.path.realpath(bwrap)  # the sandbox uid runs it: no links through private dirs
    if os.geteuid() != 0:
        raise SandboxUnavailableError(
            "the local backend needs root on the host to set cgroup limits "
            f"(running as uid {os.geteuid()}); run as root")
    with contextlib.suppress(OSError):
        with open("/proc/sys/user/max_user_namespaces") as f:
            if int(f.read()) == 0:
                raise SandboxUnavailableError(
                    "user namespaces are disabled (user.max_user_namespaces = 0); enable them "
                    "with `sysctl -w user.max_user_namespaces=15000`")
    # Debian's older kernels and Ubuntu's AppArmor can forbid what bubblewrap needs.
    for knob, bad, good in (("kernel.unprivileged_userns_clone", "0", "1"),
                            ("kernel.apparmor_restrict_unprivileged_userns", "1", "0")):
        with contextlib.suppress(OSError), open("/proc/sys/" + knob.replace(".", "/")) as f:
            if f.read().strip() == bad:
                raise SandboxUnavailableError(
                    f"unprivileged user namespaces are restricted ({knob} = {bad}); bubblewrap "
                    f"needs them: `sysctl -w {knob}={good}`")
    unbounded_file_table()
    uids = uid_range()
    hierarchy = cgroup.Hierarchy.detect()
    tag = cgroup.owner_tag()
    hierarchy.prepare(tag)
    return Host(bwrap, str(native_binary("init")), str(native_binary("spawner")), hierarchy,
                tag, uids)


FILE_MAX = (1 << 63) - 1  # what systemd sets: the kernel's largest


@cache
def unbounded_file_table() -> None:
    """Make the kernel's open-file table as large as systemd does (``fs.file-max``), so that
    what bounds a sandbox's open files is its memory limit (each file is charged to its memory
    cgroup). The kernel's default is sized at a tenth of RAM for 1 KiB a file, while a file
    costs a fifth of that: one sandbox of 512 MiB filled the table (2.4 million files on a
    24 GiB host), and every other sandbox, and every process on the host but root's, got
    ENFILE. Needs root; said once if it cannot be done."""
    path = "/proc/sys/fs/file-max"
    try:
        with open(path) as f:
            now = int(f.read())
        if now < FILE_MAX >> 1:
            with open(path, "w") as f:
                f.write(str(FILE_MAX))
            log.info("raised fs.file-max from %d to %d: sandboxes' open files are bounded by "
                     "their memory limits", now, FILE_MAX)
    except (OSError, ValueError) as exc:
        log.warning("could not raise fs.file-max (%s): one sandbox can fill the machine's "
                    "open-file table", exc)


_spawner: Spawner | None = None


def spawner() -> Spawner:
    """This process's spawner, started on first use (again if it died)."""
    global _spawner
    if _spawner is None or not _spawner.alive:
        h = host()
        _spawner = Spawner(h.spawner, h.uids)
    return _spawner


_volumes: BtrfsPool | None = None


def volumes() -> BtrfsPool:
    """The host's pool of copy-on-write volumes (``storage="volume"``), mounted on first use."""
    global _volumes
    if _volumes is None:
        pool = BtrfsPool(home() / "volumes.img", home() / "volumes").mount()
        os.chmod(pool.root, 0o755)  # each sandbox's uid must reach its own volume to bind it
        _volumes = pool
    return _volumes


_no_volumes: str | None = None  # why this host cannot make volumes, once a try failed


def storage_for(requested: str) -> str:
    """The storage a sandbox gets: ``auto`` is ``volume`` where the host can make volumes (the
    first call mounts the pool, so async callers run it in a thread), else ``memory``."""
    global _no_volumes
    if requested != "auto":
        return requested
    if _no_volumes is None and _volumes is None:
        try:
            volumes()
        except SandboxUnavailableError as exc:
            _no_volumes = str(exc)
    return "memory" if _no_volumes is not None else "volume"


def why_no_volumes() -> str | None:
    """Why ``auto`` storage fell back to ``memory`` on this host; None if it did not."""
    storage_for("auto")
    return _no_volumes


class SpareVolumes:
    """Empty volumes made ahead on a worker thread, so a start renames one (microseconds)
    instead of creating it (half a millisecond). Named ``<owner tag>.spare-N``: reclaim()
    removes them with their owner. They belong to the spawner's uid (no sandbox's) until
    ``take`` gives one to the uid of the sandbox that takes it."""

    KEEP = 4  # per size

    def __init__(self) -> None:
        self._ready: dict[int, collections.deque[str]] = collections.defaultdict(
            collections.deque)
        self._making: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def take(self, size: int, worker: Executor, uid: int, gid: int) -> str | None:
        """A spare volume of ``size`` bytes, now owned by ``uid``/``gid`` (None if none is
        ready); ``worker`` makes more."""
        with self._lock:
            ready = self._ready[size]
            name = ready.popleft() if ready else None
            missing = self.KEEP - len(ready) - self._making[size]
            self._making[size] += max(missing, 0)
        for _ in range(missing):
            worker.submit(self._make, size)
        if name is not None:
            path = volumes().path(name)
            for entry in (path, path / "workspace", path / "tmp",  # all a fresh one holds
                          *(path / d.strip("/") for d in HARBOR_DIRS)):
                os.chown(entry, uid, gid)
        return name

    def _make(self, size: int) -> None:
        name = f"{host().tag}.spare-{next(self._ids)}"
        try:
            make_volume(name, size, host().uids.spawner, host().uids.spawner)
        except (OSError, SandboxError) as exc:
            log.warning("making a spare volume failed: %s", exc)
            name = ""
        with self._lock:
            self._making[size] -= 1
            if name:
                self._ready[size].append(name)

    def destroy_all(self) -> None:
        with self._lock:
            names = [n for ready in self._ready.values() for n in ready]
            self._ready.clear()
        for name in names:
            with contextlib.suppress(OSError, SandboxError):
                volumes().destroy(name)


HARBOR_DIRS = ("/logs", "/tests")
"""Directories every sandbox has on its storage beside the workdir, /tmp and /dev/shm, at the
paths harbor's environments have them (init.c binds the same list)."""


def disk_dirs(spec: SandboxSpec) -> dict[str, str]:
    """The sandbox's directories bound from its one disk, but /tmp and /dev/shm: each path in
    the sandbox and where it is on the disk (a spec's ``writable_dirs`` under ``rw/``, as
    init.c lays them out)."""
    return {spec.workdir: "workspace", **{d: d.strip("/") for d in HARBOR_DIRS},
            **{d: "rw" + d for d in spec.writable_dirs}}


def make_writable_dirs(volume: Path, spec: SandboxSpec, uid: int, gid: int) -> None:
    """Give a new volume the spec's ``writable_dirs``, owned by the sandbox user."""
    with as_user(uid, gid):
        for d in spec.writable_dirs:
            os.makedirs(volume / ("rw" + d), 0o755, exist_ok=True)


def make_volume(name: str, size: int, uid: int, gid: int) -> Path:
    """An empty volume with a workdir, /tmp, /dev/shm, /logs and /tests owned by the sandbox
    user (host ids)."""
    path = volumes().create(name, size)
    os.chown(path, uid, gid)
    with as_user(uid, gid):
        for own in ("workspace", *(d.strip("/") for d in HARBOR_DIRS)):
            os.mkdir(path / own, 0o755)
        for shared in ("tmp", "shm"):  # /tmp and /dev/shm
            os.mkdir(path / shared, 0o1777)
            os.chmod(path / shared, 0o1777)
    return path


def snapshot_volume(source: str, name: str, size: int, uid: int, gid: int) -> Path:
    """A snapshot of volume ``source`` whose every file is given to ``uid``/``gid`` (a fork
    runs as a uid of its own, so it must own its copy; one lchown per inode). The docker
    backend's way: the local backend shows a plain snapshot through an idmapped mount."""
    volumes().snapshot(source, name, size)
    return chown_volume(name, uid, gid)


def chown_volume(name: str, uid: int, gid: int) -> Path:
    """Give everything in volume ``name`` to ``uid``/``gid``: links themselves, never what
    they name, and never leaving the volume (a sandbox cannot mount anything into it).
    coreutils' ``chown -R`` walks by directory descriptors, so no depth or path length stops
    it (a walk by path failed past PATH_MAX: round twenty-nine); ~4 us per inode."""
    root = volumes().path(name)
    done = subprocess.run(["chown", "-R", "-P", "-h", f"{uid}:{gid}", "--", os.fspath(root)],
                          capture_output=True, text=True, errors="replace", check=False)
    if done.returncode != 0:
        raise SandboxError(f"could not give volume {name} to uid {uid}: "
                           f"{done.stderr.strip()[-300:]}")
    return root


_libc = ctypes.CDLL(None, use_errno=True)
_SYS_OPEN_TREE, _SYS_MOUNT_SETATTR = 428, 442  # the same numbers on x86_64 and aarch64
_OPEN_TREE_CLONE, _AT_EMPTY_PATH, _MOUNT_ATTR_IDMAP = 1, 0x1000, 0x00100000


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def idmapped_volume(name: str, userns: int) -> int:
    """A detached mount of volume ``name`` whose files are seen through the uid and gid
    mapping of the user namespace ``userns`` (the fd of a new mount, attached by the
    sandbox's init inside its own mount namespace: no host mount is made)."""
    path = os.fsencode(volumes().path(name))
    tree: int = _libc.syscall(_SYS_OPEN_TREE, -100, path, _OPEN_TREE_CLONE | os.O_CLOEXEC)
    if tree < 0:
        err = ctypes.get_errno()
        raise SandboxError(f"cannot clone the mount of volume {name!r}: {os.strerror(err)}")
    attr = _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, userns)
    if _libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr),
                     ctypes.sizeof(attr)) != 0:
        err = ctypes.get_errno()
        os.close(tree)
        raise SandboxError(f"cannot idmap volume {name!r} (kernel 5.15 or later has idmapped "
                           f"btrfs mounts): {os.strerror(err)}")
    return tree


@cache
def spare_volumes() -> SpareVolumes:
    return SpareVolumes()


def reclaim_volumes() -> set[str]:
    """Destroy the volumes of owners that no longer run (named ``<owner tag>.<sandbox id>``);
    returns their names as ``<owner tag>/<sandbox id>``."""
    root = home() / "volumes"
    if not os.path.ismount(root):
        return set()
    dead = [e for e in os.listdir(root) if "." in e and not cgroup.owner_alive(e.split(".")[0])]
    for name in dead:
        volumes().destroy(name)
    return {name.replace(".", "/", 1) for name in dead}


def _stray_bwraps(uids: UidRange) -> list[int]:
    """bubblewrap children stuck before their sandbox started, after the harness died.

    bubblewrap's inner process (PID 1 of the new namespace, before it runs our init) can miss
    the death of its parent and wait forever. It runs as a sandbox uid, in a pid namespace of
    its own, with a parent that is no longer bubblewrap: nothing alive owns it.
    """
    strays = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            with open(f"/proc/{status['PPid'].strip()}/comm") as f:
                parent = f.read().strip()
        except (OSError, KeyError):
            continue
        if (status.get("Name", "").strip() == "bwrap"
                and uids.first <= int(status["Uid"].split()[0]) <= uids.last
                and len(status.get("NSpid", "").split()) > 1 and parent != "bwrap"):
            strays.append(int(entry))
    return strays


def reclaim() -> int:
    """Clean up what crashed processes left: their cgroups (and anything still inside), their
    volumes, their uids (and what still runs as them), and bubblewrap processes stuck
    mid-start. Returns how many sandboxes that was."""
    h = host()
    strays = _stray_bwraps(h.uids)
    for pid in strays:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    reclaim_uids()
    return len(cgroup.reclaim(h.hierarchy) | reclaim_volumes()) + len(strays)
