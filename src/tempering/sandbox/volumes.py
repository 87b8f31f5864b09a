"""Copy-on-write sandbox volumes: btrfs subvolumes on one loop-mounted image.

A sandbox's writable storage is a btrfs subvolume, so forking a sandbox is a snapshot, whose cost
does not grow with the data it shares, instead of a copy. Every volume lives in one btrfs
filesystem: a sparse image file loop-mounted once per host, tuned for scratch data (no barriers,
no atime, no compression, async discard so that deleted data frees the host's disk). Mounting is
idempotent and serialised across processes by a file lock; a process finding the filesystem
already mounted reuses it.

Each volume's size is capped by a qgroup limit on referenced bytes: a write past it fails with
EDQUOT, and a snapshot's limit counts the data it shares with its source, like a tmpfs ``size=``.
Only ``BtrfsPool.mount`` runs programs (``mkfs.btrfs``, ``losetup``, ``mount``); volume operations
are single ioctls, each documented with its struct from ``linux/btrfs.h``. They block (a snapshot
commits a transaction and first writes back its source's dirty data), so async callers run them
with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from tempering.errors import SandboxError, SandboxUnavailableError

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
# struct btrfs_ioctl_qgroup_create_args (16): __u64 create; __u64 qgroupid.  create=0 removes.
_QGROUP_CREATE_ARGS = struct.Struct("=QQ")
_QGROUP_CREATE = _ioc(_W, 42, _QGROUP_CREATE_ARGS.size)
# struct btrfs_ioctl_qgroup_limit_args (48): __u64 qgroupid; struct btrfs_qgroup_limit
# { __u64 flags, max_rfer, max_excl, rsv_rfer, rsv_excl; }.  The header declares it _IOR although
# it is an input; the number must match that, not the direction the data flows.
_QGROUP_LIMIT_ARGS = struct.Struct("=QQQQQQ")
_QGROUP_LIMIT = _ioc(_R, 43, _QGROUP_LIMIT_ARGS.size)
_LIMIT_MAX_RFER = 1 << 0
# struct btrfs_ioctl_search_args (4096): struct btrfs_ioctl_search_key (104) { __u64 tree_id,
# min_objectid, max_objectid, min_offset, max_offset, min_transid, max_transid; __u32 min_type,
# max_type, nr_items, unused; __u64 unused1..4; } then char buf[3992] of results, each a
# struct btrfs_ioctl_search_header (32) { __u64 transid, objectid, offset; __u32 type, len; }
# followed by the item.  A qgroup's counters are the item (0, BTRFS_QGROUP_INFO_KEY=242,
# qgroupid) of the quota tree (8): struct btrfs_qgroup_info_item { __le64 generation, rfer,
# rfer_cmpr, excl, excl_cmpr; }.
_SEARCH_KEY = struct.Struct("=7Q4I4Q")
_SEARCH_HEADER = struct.Struct("=3Q2I")
_TREE_SEARCH = _ioc(_RW, 17, 4096)
_QUOTA_TREE, _QGROUP_INFO_KEY = 8, 242
_SUBVOL_ROOT_INO = 256  # BTRFS_FIRST_FREE_OBJECTID: the root directory of every subvolume


def _check_name(name: str) -> bytes:
    raw = os.fsencode(name)
    if not raw or raw in (b".", b"..") or b"/" in raw or b"\0" in raw or len(raw) > 255:
        raise SandboxError(f"invalid volume name {name!r}: use one path component of 1-255 bytes")
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
                 *, image_size: int = 64 << 30, quota: Literal["full", "simple"] = "full",
                 direct_io: bool = False) -> None:
        self.image = Path(image)
        self.root = Path(mountpoint)
        self.image_size = image_size
        self.quota = quota
        self.direct_io = direct_io  # loop I/O bypasses the host page cache (no double caching)

    # -- mounting (runs once per host) -------------------------------------------------------

    def mount(self) -> BtrfsPool:
        """Create the image and mount it unless some process already did; enable quotas."""
        self._require()
        self.image.parent.mkdir(parents=True, exist_ok=True)
        with open(self.image.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fstype = _mounted_fstype(self.root)
            if fstype is None:
                self._format_and_mount()
            elif fstype != "btrfs":
                raise SandboxUnavailableError(
                    f"{self.root} is already a {fstype} mount, not btrfs: unmount it or choose "
                    "another mountpoint for the volume pool")
            with _opened(self.root) as fd:
                cmd = _QUOTA_CTL_ENABLE_SIMPLE if self.quota == "simple" else _QUOTA_CTL_ENABLE
                fcntl.ioctl(fd, _QUOTA_CTL, _QUOTA_CTL_ARGS.pack(cmd, 0))  # no-op when enabled
                fcntl.ioctl(fd, _QUOTA_RESCAN_WAIT)  # a full-quota rescan scans existing data
        return self

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
        for tool, package in (("mkfs.btrfs", "btrfs-progs"), ("losetup", "mount"),
                              ("mount", "mount")):
            if shutil.which(tool) is None:
                raise SandboxUnavailableError(
                    f"{tool} is not installed: run `apt-get install -y {package}`")

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

    def unmount(self, *, remove_image: bool = False) -> None:
        """Unmount the pool (every volume with it); with ``remove_image``, delete its data."""
        with open(self.image.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _mounted_fstype(self.root) == "btrfs":
                _run(["umount", str(self.root)])
            if remove_image:
                self.image.unlink(missing_ok=True)

    # -- volumes (hot path: ioctls only) ------------------------------------------------------

    def path(self, name: str) -> Path:
        _check_name(name)
        return self.root / name

    def create(self, name: str, size_bytes: int) -> Path:
        """A new empty volume holding at most ``size_bytes`` (data and metadata)."""
        args = _VOL_ARGS_V2.pack(0, 0, 0, b"", _check_name(name))
        with _opened(self.root) as root:
            self._ioctl(root, _SUBVOL_CREATE_V2, args, f"create volume {name!r}")
        self._limit(name, size_bytes)
        return self.root / name

    def snapshot(self, src_name: str, new_name: str, size_bytes: int) -> Path:
        """A writable copy-on-write copy of ``src_name``; shared data counts toward its limit."""
        raw = _check_name(new_name)
        with _opened(self.path(src_name)) as src, _opened(self.root) as root:
            self._ioctl(root, _SNAP_CREATE_V2, _VOL_ARGS_V2.pack(src, 0, 0, b"", raw),
                        f"snapshot volume {src_name!r} as {new_name!r}")
        self._limit(new_name, size_bytes)
        return self.root / new_name

    def destroy(self, name: str) -> None:
        """Delete a volume and its qgroup; space is freed in the background by btrfs's cleaner.

        Subvolumes that a sandbox made inside its volume (unprivileged users may) go first.
        """
        raw = _check_name(name)
        try:
            subvol = self.subvolume_id(name)
        except FileNotFoundError:
            return
        with _opened(self.root) as root:
            try:
                fcntl.ioctl(root, _SNAP_DESTROY_V2, bytearray(_VOL_ARGS_V2.pack(0, 0, 0, b"", raw)))
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY:
                    raise SandboxError(f"cannot destroy volume {name!r}: {exc.strerror}") from None
                self._destroy_nested(self.root / name)
                self._ioctl(root, _SNAP_DESTROY_V2, _VOL_ARGS_V2.pack(0, 0, 0, b"", raw),
                            f"destroy volume {name!r}")
            # The kernel refuses while the dropped subvolume still holds extents (EBUSY), and
            # since Linux 6.10 removes a full-mode qgroup by itself once its subvolume is gone.
            with contextlib.suppress(OSError):
                fcntl.ioctl(root, _QGROUP_CREATE, _QGROUP_CREATE_ARGS.pack(0, subvol))

    def _destroy_nested(self, top: Path) -> None:
        """Destroy the subvolumes below ``top``, deepest first (only run on ENOTEMPTY)."""
        for dirpath, dirnames, _ in os.walk(top, topdown=False):
            for d in dirnames:
                sub = Path(dirpath, d)
                if os.lstat(sub).st_ino == _SUBVOL_ROOT_INO:
                    with _opened(dirpath) as parent:
                        self._ioctl(parent, _SNAP_DESTROY_V2,
                                    _VOL_ARGS_V2.pack(0, 0, 0, b"", os.fsencode(d)),
                                    f"destroy nested subvolume {sub}")

    def subvolume_id(self, name: str) -> int:
        """The subvolume id of a volume, which is also its level-0 qgroup id (0/<id>)."""
        with _opened(self.path(name)) as fd:
            buf = bytearray(_INO_LOOKUP_ARGS.pack(0, _SUBVOL_ROOT_INO, b""))
            fcntl.ioctl(fd, _INO_LOOKUP, buf)
        return _INO_LOOKUP_ARGS.unpack(buf)[0]

    def used_bytes(self, name: str) -> int:
        """Bytes the volume references, as of the last transaction commit (up to 30 s old)."""
        qgroup = self.subvolume_id(name)
        key = _SEARCH_KEY.pack(_QUOTA_TREE, 0, 0, qgroup, qgroup, 0, 2**64 - 1,
                               _QGROUP_INFO_KEY, _QGROUP_INFO_KEY, 1, 0, 0, 0, 0, 0)
        buf = bytearray(key.ljust(4096, b"\0"))
        with _opened(self.root) as root:
            fcntl.ioctl(root, _TREE_SEARCH, buf)
        if _SEARCH_KEY.unpack_from(buf)[9] == 0:  # nr_items
            raise SandboxError(f"volume {name!r} has no qgroup: quotas are not enabled on "
                               f"{self.root}; call mount() first")
        return struct.unpack_from("<Q", buf, _SEARCH_KEY.size + _SEARCH_HEADER.size + 8)[0]

    def _limit(self, name: str, size_bytes: int) -> None:
        qgroup = self.subvolume_id(name)  # level 0: the qgroup id is the subvolume id
        with _opened(self.root) as root:
            self._ioctl(root, _QGROUP_LIMIT,
                        _QGROUP_LIMIT_ARGS.pack(qgroup, _LIMIT_MAX_RFER, size_bytes, 0, 0, 0),
                        f"limit volume {name!r} to {size_bytes} bytes")

    @staticmethod
    def _ioctl(fd: int, request: int, args: bytes, what: str) -> None:
        try:
            fcntl.ioctl(fd, request, bytearray(args))  # a bytes argument is capped at 1 KiB
        except OSError as exc:
            hint = {errno.EEXIST: "a volume of that name exists",
                    errno.ENOENT: "quotas are not enabled: call mount() first",
                    errno.ENOTTY: "the pool root is not a btrfs mount: call mount() first",
                    errno.EPERM: "this needs CAP_SYS_ADMIN (run as root)"}.get(exc.errno, "")
            raise SandboxError(f"cannot {what}: {exc.strerror}"
                               + (f" ({hint})" if hint else "")) from None
