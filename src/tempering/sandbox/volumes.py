"""Copy-on-write sandbox volumes: btrfs subvolumes on one loop-mounted image.

A sandbox's writable storage is a btrfs subvolume, so forking a sandbox is a snapshot, whose cost
does not grow with the data it shares. All volumes live in one btrfs filesystem: a sparse image
loop-mounted once per host and tuned for scratch data (no barriers, atime or compression; async
discard, so deleted data frees the host's disk). Mounting is idempotent, serialised across
processes by a file lock, and reuses a mount that another process made.

Each volume's size is capped by a qgroup limit: a write past it fails with EDQUOT. The default
``simple`` quotas (Linux >= 6.7) charge each extent to the volume that wrote it, so a fork's limit
caps what the fork itself writes, not the data it shares with its source; ``full`` quotas cap the
referenced total, like a tmpfs ``size=``, but their backref walks at every commit make forks
several times slower once many snapshots share data. A snapshot commits a transaction and first
writes back its source's dirty data, so a fork is O(1) only when the source is clean: write it
back (``syncfs``) in the background when a sandbox goes idle, not when it is forked.

Only ``mount``, ``unmount`` and ``sweep`` run programs (``mkfs.btrfs``, ``losetup``, ``mount``,
``btrfs``); volume operations are single ioctls, each documented with its struct from
``linux/btrfs.h``. They block, so async callers run them with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from tempering.errors import ConfigError, SandboxError, SandboxUnavailableError

DEFAULT_IMAGE = Path("/var/lib/tempering/volumes.img")
DEFAULT_MOUNT = Path("/var/lib/tempering/volumes")
MOUNT_OPTIONS = "noatime,nobarrier,compress=no,space_cache=v2,discard=async"


def _ioc(direction: int, nr: int, size: int) -> int:
    """_IOC() of asm-generic/ioctl.h (x86_64, aarch64): dir:2 | size:14 | type:8 | nr:8."""
    return direction << 30 | size << 16 | 0x94 << 8 | nr  # 0x94 = BTRFS_IOCTL_MAGIC


_W, _R, _RW = 1, 2, 3
# struct btrfs_ioctl_vol_args_v2 (4096 bytes): __s64 fd; __u64 transid; __u64 flags;
# union { struct { __u64 size; struct btrfs_qgroup_inherit *qgroup_inherit; }; __u64 unused[4]; };
# union { char name[BTRFS_SUBVOL_NAME_MAX + 1 = 4040]; __u64 devid; __u64 subvolid; };
_VOL_ARGS_V2 = struct.Struct("=qQQ32s4040s")
_SNAP_CREATE_V2 = _ioc(_W, 23, _VOL_ARGS_V2.size)  # fd: source subvolume, name: new entry
_SUBVOL_CREATE_V2 = _ioc(_W, 24, _VOL_ARGS_V2.size)
_SNAP_DESTROY_V2 = _ioc(_W, 63, _VOL_ARGS_V2.size)  # flags 0: by name, relative to the ioctl fd
# struct btrfs_ioctl_ino_lookup_args (4096): __u64 treeid; __u64 objectid; char name[4080].
# treeid 0 means "the tree of the fd"; the kernel writes that tree's id (the subvolume id) back.
_INO_LOOKUP_ARGS = struct.Struct("=QQ4080s")
_INO_LOOKUP = _ioc(_RW, 18, _INO_LOOKUP_ARGS.size)
# struct btrfs_ioctl_quota_ctl_args (16): __u64 cmd; __u64 status.
_QUOTA_CTL_ARGS = struct.Struct("=QQ")
_QUOTA_CTL = _ioc(_RW, 40, _QUOTA_CTL_ARGS.size)
_QUOTA_CTL_ENABLE, _QUOTA_CTL_ENABLE_SIMPLE = 1, 4  # 4: simple quotas, Linux >= 6.7
_QUOTA_RESCAN_WAIT = _ioc(0, 46, 0)
_QUOTA_MODES = {"full": "qgroup", "simple": "squota"}  # /sys/fs/btrfs/<fsid>/qgroups/mode
# struct btrfs_ioctl_fs_info_args (1024): __u64 max_id; __u64 num_devices; __u8 fsid[16]; ...
_FS_INFO = _ioc(_R, 31, 1024)
# struct btrfs_ioctl_qgroup_limit_args (48): __u64 qgroupid; struct btrfs_qgroup_limit
# { __u64 flags, max_rfer, max_excl, rsv_rfer, rsv_excl; }.  The header declares it _IOR although
# it is an input; the number must match that, not the direction the data flows.
_QGROUP_LIMIT_ARGS = struct.Struct("=QQQQQQ")
_QGROUP_LIMIT = _ioc(_R, 43, _QGROUP_LIMIT_ARGS.size)
_LIMIT_MAX_RFER = 1 << 0
# struct btrfs_ioctl_search_args (4096): struct btrfs_ioctl_search_key (104) { __u64 tree_id,
# min/max_objectid, min/max_offset, min/max_transid; __u32 min/max_type, nr_items, unused; __u64
# unused1..4; } then buf[3992]: per item a struct btrfs_ioctl_search_header (32) { __u64 transid,
# objectid, offset; __u32 type, len; } and the item, here (0, QGROUP_INFO_KEY=242, qgroupid) of
# the quota tree (8): struct btrfs_qgroup_info_item { __le64 generation, rfer, rfer_cmpr, ... }.
_SEARCH_KEY = struct.Struct("=7Q4I4Q")
_SEARCH_HEADER = struct.Struct("=3Q2I")
_TREE_SEARCH = _ioc(_RW, 17, 4096)
_QUOTA_TREE, _QGROUP_INFO_KEY = 8, 242
_SUBVOL_ROOT_INO = 256  # BTRFS_FIRST_FREE_OBJECTID: the root directory of every subvolume


def _check_name(name: str) -> bytes:
    raw = os.fsencode(name)
    if not raw or raw in (b".", b"..") or b"/" in raw or b"\0" in raw or len(raw) > 255:
        raise ConfigError(f"invalid volume name {name!r}: use one path component of 1-255 bytes")
    return raw


@contextlib.contextmanager
def _opened(path: Path | str) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise SandboxUnavailableError(
            f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def _mounted_fstype(path: Path) -> str | None:
    """The type of the filesystem mounted at ``path`` (the topmost one), or None."""
    target, found = str(path.resolve()), None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = left.split()[4].encode().decode("unicode_escape")  # "\040" is a space
            if point == target:
                found = right.split()[0]
    return found


class BtrfsPool:
    """One btrfs filesystem whose subvolumes are the sandboxes' volumes, named by the caller."""

    def __init__(self, image: Path | str = DEFAULT_IMAGE, mountpoint: Path | str = DEFAULT_MOUNT,
                 *, image_size: int = 64 << 30, quota: Literal["full", "simple"] = "simple",
                 direct_io: bool = True) -> None:
        self.image, self.root, self.image_size = Path(image), Path(mountpoint), image_size
        self.quota = quota
        self._writeback: Writeback | None = None
        # Direct loop I/O skips the host page cache: no double caching, no dirty throttling of
        self.direct_io = direct_io  # the loop worker (writeback, so dirty forks, 4x slower)

    # -- mounting (runs once per host) -------------------------------------------------------

    def mount(self) -> BtrfsPool:
        """Create the image and mount it unless some process already did; enable quotas."""
        self._require()
        self.image.parent.mkdir(parents=True, exist_ok=True)
        with open(self.image.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (fstype := _mounted_fstype(self.root)) is None:
                self._format_and_mount()
            elif fstype != "btrfs":
                raise SandboxUnavailableError(
                    f"{self.root} is already a {fstype} mount, not btrfs: unmount it or choose "
                    "another mountpoint for the volume pool")
            with _opened(self.root) as fd:
                self._enable_quota(fd)
        return self

    def _enable_quota(self, fd: int) -> None:
        cmd = _QUOTA_CTL_ENABLE_SIMPLE if self.quota == "simple" else _QUOTA_CTL_ENABLE
        self._ioctl(fd, _QUOTA_CTL, _QUOTA_CTL_ARGS.pack(cmd, 0),  # a no-op once enabled
                    f"enable {self.quota} quotas on {self.root} (simple ones need Linux >= 6.7)")
        fcntl.ioctl(fd, _QUOTA_RESCAN_WAIT)  # enabling full quotas rescans the existing data
        fcntl.ioctl(fd, _FS_INFO, info := bytearray(1024))
        mode_file = Path("/sys/fs/btrfs", str(uuid.UUID(bytes=bytes(info[16:32]))), "qgroups/mode")
        mode = mode_file.read_text().strip() if mode_file.exists() else "qgroup"  # before 6.7
        if mode != _QUOTA_MODES[self.quota]:
            raise SandboxUnavailableError(
                f"the volume pool at {self.root} uses {mode!r} quotas, so quota={self.quota!r}"
                " cannot apply: pass the quota it was made with, or unmount it and delete "
                f"{self.image} to start over")

    def sweep(self) -> None:
        """Drop the qgroups of gone volumes that btrfs keeps (simple quotas: a volume destroyed
        while forks shared its data); it runs ``btrfs``, so call it off the hot path."""
        _run(["btrfs", "qgroup", "clear-stale", str(self.root)])

    def _require(self) -> None:
        with open("/proc/filesystems") as f:
            if not any(line.split()[-1:] == ["btrfs"] for line in f):
                raise SandboxUnavailableError(
                    "the kernel has no btrfs (not in /proc/filesystems): run `modprobe btrfs` "
                    "on the host, or use a kernel built with CONFIG_BTRFS_FS")
        if not os.path.exists("/dev/loop-control"):
            raise SandboxUnavailableError(
                "no loop devices (/dev/loop-control is missing): run `modprobe loop`, or give "
                "the container access to /dev/loop-control and /dev/loop*")
        for tool, package in (("mkfs.btrfs", "btrfs-progs"), ("losetup", "mount")):
            if shutil.which(tool) is None:
                raise SandboxUnavailableError(f"{tool} is missing: `apt-get install -y {package}`")

    def _format_and_mount(self) -> None:
        if not self.image.exists():
            fresh = self.image.with_suffix(".img.new")
            with open(fresh, "wb") as f:
                f.truncate(self.image_size)  # sparse: disk is used only as data is written
            _run(["mkfs.btrfs", "-q", "-f", "-m", "single", "-d", "single",
                  "-L", "tempering-volumes", str(fresh)])
            fresh.rename(self.image)  # a crash mid-mkfs leaves no half-made image behind
        self.root.mkdir(parents=True, exist_ok=True)
        direct_io = "on" if self.direct_io else "off"
        device = _run(["losetup", "--find", "--show", f"--direct-io={direct_io}", str(self.image)])
        try:
            _run(["mount", "-t", "btrfs", "-o", MOUNT_OPTIONS, device, str(self.root)])
        finally:
            # Detaching a mounted loop device only marks it autoclear: it goes with the unmount.
            subprocess.run(["losetup", "--detach", device], capture_output=True)

    def writeback(self) -> Writeback:
        """This pool's background writeback (started on first use)."""
        if self._writeback is None:
            self._writeback = Writeback(self.root)
        return self._writeback

    def unmount(self, *, remove_image: bool = False) -> None:
        """Unmount the pool (every volume with it); with ``remove_image``, delete its data."""
        if self._writeback is not None:
            self._writeback.stop()
            self._writeback = None
        with open(self.image.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _mounted_fstype(self.root) == "btrfs":
                _run(["umount", str(self.root)])
            if remove_image:
                self.image.unlink(missing_ok=True)

    # -- volumes (hot path: ioctls only) ------------------------------------------------------

    def path(self, name: str) -> Path:
        return self.root / os.fsdecode(_check_name(name))  # a volume's mountable directory

    def create(self, name: str, size_bytes: int) -> Path:
        """A new empty volume holding at most ``size_bytes`` (data and metadata)."""
        args = _VOL_ARGS_V2.pack(0, 0, 0, b"", _check_name(name))
        with _opened(self.root) as root:
            self._ioctl(root, _SUBVOL_CREATE_V2, args, f"create volume {name!r}")
            self._limit(root, name, size_bytes)
        return self.root / name

    def snapshot(self, src_name: str, new_name: str, size_bytes: int) -> Path:
        """A writable copy-on-write copy of ``src_name``, limited like ``create`` (module doc)."""
        raw = _check_name(new_name)
        try:
            src = os.open(self.path(src_name), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SandboxError(f"no volume {src_name!r} in {self.root} to snapshot") from None
        try:
            with _opened(self.root) as root:
                self._ioctl(root, _SNAP_CREATE_V2, _VOL_ARGS_V2.pack(src, 0, 0, b"", raw),
                            f"snapshot volume {src_name!r} as {new_name!r}")
                self._limit(root, new_name, size_bytes)
        finally:
            os.close(src)
        return self.root / new_name

    def destroy(self, name: str) -> None:
        """Delete a volume (no-op if absent); btrfs's cleaner frees its data in the background.

        Subvolumes that a sandbox made inside its volume (unprivileged users may) go first.
        """
        args = _VOL_ARGS_V2.pack(0, 0, 0, b"", _check_name(name))
        with _opened(self.root) as root:
            try:
                fcntl.ioctl(root, _SNAP_DESTROY_V2, bytearray(args))
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return
                if exc.errno != errno.ENOTEMPTY:
                    raise SandboxError(f"cannot destroy volume {name!r}: {exc.strerror}") from None
                self._destroy_nested(self.root / name)
                self._ioctl(root, _SNAP_DESTROY_V2, args, f"destroy volume {name!r}")

    def _destroy_nested(self, top: Path) -> None:
        """Destroy the subvolumes below ``top``, deepest first (only run on ENOTEMPTY)."""
        for dirpath, dirnames, _ in os.walk(top, topdown=False):
            for d in dirnames:
                if os.lstat(Path(dirpath, d)).st_ino == _SUBVOL_ROOT_INO:
                    with _opened(dirpath) as parent:
                        self._ioctl(parent, _SNAP_DESTROY_V2, _VOL_ARGS_V2.pack(
                            0, 0, 0, b"", os.fsencode(d)), f"destroy {dirpath}/{d}")

    def subvolume_id(self, name: str) -> int:
        """The subvolume id of a volume, which is also its level-0 qgroup id (0/<id>)."""
        with _opened(self.path(name)) as fd:
            buf = bytearray(_INO_LOOKUP_ARGS.pack(0, _SUBVOL_ROOT_INO, b""))
            fcntl.ioctl(fd, _INO_LOOKUP, buf)
        return int(_INO_LOOKUP_ARGS.unpack(buf)[0])

    def used_bytes(self, name: str) -> int:
        """Bytes charged to the volume as of the last commit (up to 30 s old): with simple
        quotas what it wrote itself, with full quotas all it references."""
        qgroup = self.subvolume_id(name)
        key = _SEARCH_KEY.pack(_QUOTA_TREE, 0, 0, qgroup, qgroup, 0, 2**64 - 1,
                               _QGROUP_INFO_KEY, _QGROUP_INFO_KEY, 1, 0, 0, 0, 0, 0)
        buf = bytearray(key.ljust(4096, b"\0"))
        with _opened(self.root) as root:
            fcntl.ioctl(root, _TREE_SEARCH, buf)
        if _SEARCH_KEY.unpack_from(buf)[9] == 0:  # nr_items
            raise SandboxError(f"volume {name!r} has no qgroup: call mount() to enable quotas")
        rfer = _SEARCH_KEY.size + _SEARCH_HEADER.size + 8  # after the item's generation
        return int.from_bytes(buf[rfer:rfer + 8], "little")

    def _limit(self, root: int, name: str, size_bytes: int) -> None:
        qgroup = self.subvolume_id(name)  # level 0: the qgroup id is the subvolume id
        args = _QGROUP_LIMIT_ARGS.pack(qgroup, _LIMIT_MAX_RFER, size_bytes, 0, 0, 0)
        self._ioctl(root, _QGROUP_LIMIT, args, f"limit volume {name!r} to {size_bytes} bytes")

    @staticmethod
    def _ioctl(fd: int, request: int, args: bytes, what: str) -> None:
        try:
            fcntl.ioctl(fd, request, bytearray(args))  # a bytes argument is capped at 1 KiB
        except OSError as exc:
            hint = {errno.ENOENT: " (or quotas are off: call mount() first)",
                    errno.ENOTTY: " (the pool is not mounted: call mount() first)",
                    errno.EPERM: " (this needs CAP_SYS_ADMIN)"}.get(exc.errno or 0, "")
            raise SandboxError(f"cannot {what}: {exc.strerror}{hint}") from None


class Writeback:
    """Writes a pool's dirty data back in the background, so that a later snapshot (a fork) of
    a volume that has been idle for a moment has nothing to flush and costs a metadata commit.

    ``poke()`` is cheap and thread-safe; one daemon thread then runs ``syncfs`` on the pool, at
    most once per ``interval`` seconds, so a burst of commands costs one flush. ``syncfs``
    covers the whole pool: every sandbox's data reaches the disk a little sooner than the
    kernel's own writeback (30 s) would take it there.
    """

    def __init__(self, root: Path, interval: float = 0.5) -> None:
        self._root = root
        self._interval = interval
        self._poked = threading.Event()
        self._stopping = False
        self.flushes = 0
        self._thread = threading.Thread(target=self._run, name="tempering-writeback", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        self._poked.set()

    def stop(self) -> None:
        """End the thread (it holds the pool open, so an unmount needs this first)."""
        self._stopping = True
        self._poked.set()
        self._thread.join()

    def _run(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            while True:
                self._poked.wait()
                if self._stopping:
                    return
                time.sleep(self._interval)  # let the burst finish: one flush for all of it
                self._poked.clear()
                libc.syncfs(fd)
                self.flushes += 1
        finally:
            os.close(fd)
