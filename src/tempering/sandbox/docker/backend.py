"""The ``docker`` backend: each sandbox is a container on a real Docker engine.

The engine provides the isolation (namespaces, cgroups, its default seccomp profile) and the
image; everything else is the same machinery as the local backend, so the two cannot drift:

- The container's PID 1 is ``init.c``, bound in read-only from the host. It connects back to a
  SOCK_SEQPACKET socket the host listens on in a per-sandbox directory bound into the container
  (the socket is unlinked once the init is connected, so nothing else can connect), and from
  then on it is the same fork server: ``exec`` costs one fork inside the container, timeouts
  kill the command's whole process tree inside, output is read by the event loop. No ``docker``
  CLI runs on any path; the engine is called through its API (``engine.py``) to create, start
  and remove the container only.
- Hardened by default: no network (with ``network=True``, a bridge fenced off from the host
  and private ranges: ``bridge.py``), all capabilities dropped, ``no-new-privileges``, read-only
  root, size-limited storage for the workdir, /tmp and /dev/shm, memory/pids/cpu limits, the
  engine's default seccomp profile with init's own filter on top (which refuses legacy AIO and
  AF_VSOCK: this engine's default profile allows both).
- Each container runs as a host uid of its own (``uids.py``, the same leases as the local
  backend's): without a user namespace a container's uid is the host's, and containers that
  share one share its per-user kernel counters. Its ``/etc/passwd`` and ``/etc/group`` are
  replaced by synthetic ones naming that uid ``user``; the workdir and /tmp are its own.
- Storage is the local backend's: a btrfs volume of the host's pool bound in at the workdir,
  /tmp and /dev/shm (one ``disk_mb`` budget; ``fork`` is a snapshot), or, without volumes,
  a tmpfs each within ``disk_mb`` and below ``memory_mb`` (``fork`` copies). The file API
  works from the host with the same kernel-confined resolution (``files.py``), on the volume
  or through ``/proc/<init>/root``.
- Containers carry the labels ``tempering.owner`` (the owning process's tag) and
  ``tempering.sandbox``; ``reclaim()`` removes those of owners that no longer run.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import os
import secrets
import shutil
import socket
import weakref
from pathlib import Path
from typing import Any

from tempering.errors import SandboxError, SandboxStartError
from tempering.sandbox import cgroup
from tempering.sandbox.base import ensure_open
from tempering.sandbox.docker.api import DockerAPI, DockerAPIError
from tempering.sandbox.docker.bridge import egress_network
from tempering.sandbox.docker.image import REPOSITORY, build_recipe
from tempering.sandbox.files import Storage
from tempering.sandbox.forkserver import InitChannel
from tempering.sandbox.host import (
    HARBOR_DIRS,
    disk_dirs,
    make_volume,
    make_writable_dirs,
    reclaim_volumes,
    snapshot_volume,
    storage_for,
    unbounded_file_table,
    volumes,
)
from tempering.sandbox.hosted import InitSandbox
from tempering.sandbox.native import home, native_binary, synthetic_etc
from tempering.sandbox.spec import INODE_SPACING, SandboxSpec, SandboxUsage, memory_disk_bytes
from tempering.sandbox.uids import UidLease, lease_uid, reclaim_uids

START_TIMEOUT_S = 60.0
OWNER_LABEL, SANDBOX_LABEL = "tempering.owner", "tempering.sandbox"
_building: dict[str, asyncio.Lock] = {}  # one build of a recipe at a time (then it is cached)
_live: weakref.WeakSet[DockerSandbox] = weakref.WeakSet()


def _remove_all_at_exit() -> None:
    """Nothing outlives the harness: remove the containers and volumes callers forgot."""
    left = [sb for sb in list(_live) if not sb._closed]
    if left:
        with contextlib.suppress(Exception):  # at exit, a failure is left for reclaim()
            asyncio.run(_close_all(left))
        for sb in left:  # no new threads at interpreter exit: the volumes go here
            if sb._volume is not None:
                with contextlib.suppress(OSError, SandboxError):
                    volumes().destroy(sb._volume)


async def _close_all(sandboxes: list[DockerSandbox]) -> None:
    for sb in sandboxes:
        sb._channel = None  # its event loop is gone; the container's removal ends the init
    await asyncio.gather(*(sb.close() for sb in sandboxes), return_exceptions=True)


def default_image() -> str:
    return f"{REPOSITORY}:latest"


class DockerSandbox(InitSandbox):
    """A sandbox that is one container on the local Docker engine."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.id = f"sbx-{secrets.token_hex(6)}"
        self.image = spec.image or default_image()
        self.storage = storage_for(spec.storage)
        """``volume`` (a btrfs volume of the host's pool bound in; fork is a snapshot) or
        ``memory`` (tmpfs for the workdir, /tmp and /dev/shm within disk_mb; fork copies)."""
        self._volume: str | None = None
        self._engine = DockerAPI()
        self._tag = cgroup.owner_tag()
        self._container: str | None = None
        self._channel: InitChannel | None = None
        self._init_pid = 0
        self._control_dir = home() / "docker" / f"{self._tag}.{self.id}"
        self._storage: Storage | None = None
        self._closed = False
        self._dead: str | None = None
        self._network = "none"  # with network: the fenced bridge (bridge.py)
        self._uid: UidLease | None = None  # the host uid it runs as, held until it is gone

    @classmethod
    async def _prepare_host(cls) -> None:
        await cls.reclaim_async()
        atexit.register(_remove_all_at_exit)

    @classmethod
    def reclaim(cls) -> int:
        """Blocking ``reclaim_async`` (for ``tempering reclaim`` and a pool's start, which runs
        it in a thread)."""
        return asyncio.run(cls.reclaim_async())

    @classmethod
    async def reclaim_async(cls) -> int:
        """Remove the containers, control directories and volumes of owners that no longer
        run; returns how many containers that was."""
        engine = DockerAPI()
        removed = 0
        for container in await engine.containers(OWNER_LABEL):
            owner = container.get("Labels", {}).get(OWNER_LABEL, "")
            if not cgroup.owner_alive(owner):
                await engine.remove(container["Id"])
                removed += 1
        with contextlib.suppress(SandboxError, OSError):  # unbound now that they are gone
            await asyncio.to_thread(reclaim_volumes)
        await asyncio.to_thread(reclaim_uids)
        base = home() / "docker"
        if base.is_dir():
            for entry in base.iterdir():
                if not cgroup.owner_alive(entry.name.split(".")[0]):
                    shutil.rmtree(entry, ignore_errors=True)
        return removed

    def _config(self, init: Path, uid: int) -> dict[str, Any]:
        spec = self.spec
        # A tmpfs each, together at most disk_mb and never the whole memory limit (as the
        # local backend's one): the files of a tmpfs belong to no process, and a full one
        # must leave the OOM killer a command to take, not the init (round twenty-nine).
        # /dev/shm is one of them: the engine's own is 64 MiB outside every budget.
        total = memory_disk_bytes(spec)
        shm = total // 8
        size = (total - shm) // 2
        harbor = size // 8  # /logs and /tests: out of /tmp's share, the workdir's stays whole
        # the writable dirs, out of /tmp's share too: 7/64 of the disk, a tmpfs each
        # (CopyLimits.fitting_dir fits what a grading lays there to it)
        extra = size // 4 if spec.writable_dirs else 0
        tmpfs = {}
        for mount, bytes_, mode in ((spec.workdir, size, "0755"),
                                    ("/tmp", size - harbor - extra, "1777"),
                                    ("/dev/shm", shm, "1777"),
                                    *((d, harbor // len(HARBOR_DIRS), "0755") for d in HARBOR_DIRS),
                                    *((d, extra // max(len(spec.writable_dirs), 1), "0755")
                                      for d in spec.writable_dirs)):
            inodes = max(bytes_ // INODE_SPACING, 64)  # as local's: their memory is counted
            tmpfs[mount] = (f"rw,exec,nosuid,nodev,size={max(bytes_, 4096)},mode={mode},"
                            f"uid={uid},gid={uid},nr_inodes={inodes}")
        storage: dict[str, Any] = {"Tmpfs": tmpfs}
        etc = self._control_dir / "etc"
        binds = [f"{init}:/.tempering/init:ro", f"{self._control_dir}/socket.d:"
                 "/.tempering/control", f"{etc}/passwd:/etc/passwd:ro",
                 f"{etc}/group:/etc/group:ro"]
        if self._volume is not None:  # one volume, one budget, bound at each
            path = volumes().path(self._volume)
            storage = {}
            binds += [f"{path}/tmp:/tmp", f"{path}/shm:/dev/shm",
                      *(f"{path}/{on_disk}:{d}" for d, on_disk in disk_dirs(spec).items())]
        return {
            "Image": self.image, "User": f"{uid}:{uid}", "WorkingDir": spec.workdir,
            "Hostname": "sandbox", "Env": [], "Labels": {OWNER_LABEL: self._tag,
                                                        SANDBOX_LABEL: self.id},
            "Cmd": ["/.tempering/init", "unix:/.tempering/control/socket", "0", spec.workdir,
                    str(uid), str(uid), "-", "-" if spec.tracing else "notrace"],
            "NetworkDisabled": not spec.network,
            "HostConfig": {
                "NetworkMode": self._network,
                # the commands' limit is a child cgroup's (_commands_cgroup); this one
                # holds the init's reserve beside it
                "Memory": (spec.memory_mb + cgroup.INIT_RESERVE_MB) << 20,
                "MemorySwap": (spec.memory_mb + cgroup.INIT_RESERVE_MB) << 20,
                "PidsLimit": spec.pids, "NanoCpus": int(spec.cpus * 1e9),
                # No ping sockets (the engine allows them to every group): their queues
                # are charged to nothing. The init's filter refuses them too.
                # SysV objects no process holds would be memory of the cgroup no kill frees
                # (init.c's setup_ipc sets the same in a local sandbox).
                "Sysctls": {"net.ipv4.ping_group_range": "1 0",
                            "kernel.shm_rmid_forced": "1", "kernel.msgmni": "16",
                            "kernel.sem": "250 8000 32 32"},
                "CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges:true"],
                "ReadonlyRootfs": True, "Init": False, "Binds": binds, **storage,
            },
        }

    async def _start(self, snapshot_of: str | None = None) -> None:
        unbounded_file_table()  # containers share the machine's open-file table too
        init = native_binary("init")
        if self.spec.network:
            self._network = await egress_network(self._engine)
        if self.spec.recipe is not None:
            async with _building.setdefault(self.spec.recipe, asyncio.Lock()):
                self.image = await build_recipe(self.spec.recipe, engine=self._engine)
        self._uid = lease_uid()
        uid = self._uid.uid
        if self.storage == "volume":
            name, size = f"{self._tag}.{self.id}", self.spec.disk_mb << 20
            if snapshot_of is not None:
                self._volume = name  # destroyed on close even if its chown fails
                await asyncio.to_thread(snapshot_volume, snapshot_of, name, size, uid, uid)
            else:
                path = await asyncio.to_thread(make_volume, name, size, uid, uid)
                await asyncio.to_thread(make_writable_dirs, path, self.spec, uid, uid)
            self._volume = name
        for sub in ("socket.d", "etc"):
            (self._control_dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self._control_dir, 0o755)
        os.chmod(self._control_dir / "socket.d", 0o755)
        os.chmod(self._control_dir / "etc", 0o755)
        for name, text in synthetic_etc(uid, uid).items():
            if name in ("passwd", "group"):
                (self._control_dir / "etc" / name).write_text(text)
                os.chmod(self._control_dir / "etc" / name, 0o644)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        path = self._control_dir / "socket.d" / "socket"
        try:
            listener.bind(str(path))
            os.chmod(path, 0o666)  # the container's user connects to it
            listener.listen(1)
            listener.setblocking(False)
            await self._create_container(init, uid)
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(START_TIMEOUT_S):
                    conn, _ = await loop.sock_accept(listener)
            except TimeoutError:
                raise SandboxStartError(f"sandbox {self.id}: the container's init never "
                                        f"connected ({await self._logs()})") from None
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                path.unlink()  # nothing else can connect now
        self._channel = InitChannel(conn, f"sandbox {self.id}", self._on_death)
        _live.add(self)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await self._channel.ready
        except (TimeoutError, SandboxError) as exc:
            raise SandboxStartError(f"sandbox {self.id} failed to start: {exc}") from None
        info = (await self._engine.request("GET", f"/containers/{self._container}/json",
                                           what=f"inspecting sandbox {self.id}")).json()
        self._init_pid = int(info["State"]["Pid"])
        limit = self.spec.memory_mb << 20
        _limit_sockets(self._init_pid, limit + (cgroup.INIT_RESERVE_MB << 20))
        procs = _commands_cgroup(self._init_pid, limit)
        if procs is None:
            raise SandboxStartError(f"sandbox {self.id}: its container's memory cgroup was "
                                    "not found (no commands' cgroup can be made in it)")
        await self._channel.commands_cgroup(procs)
        await _limit_ptys(init, self._init_pid)
        cpus = sorted(os.sched_getaffinity(0))  # so that nproc inside reports the quota
        want = min(math.ceil(self.spec.cpus), len(cpus))
        first = secrets.randbelow(len(cpus))
        os.sched_setaffinity(self._init_pid, {cpus[(first + i) % len(cpus)] for i in range(want)})
        root = f"/proc/{self._init_pid}/root"
        roots = {"/tmp": root + "/tmp", **{d: root + d for d in disk_dirs(self.spec)}}
        if self._volume is not None:
            volume = volumes().path(self._volume)
            roots = {"/tmp": str(volume / "tmp"),
                     **{d: str(volume / on_disk) for d, on_disk in disk_dirs(self.spec).items()}}
        self._storage = Storage(roots, self.spec.workdir, uid, uid)

    async def _create_container(self, init: Path, uid: int) -> None:
        try:
            created = await self._engine.request(
                "POST", "/containers/create", params={"name": f"tempering-{self.id}"},
                body=self._config(init, uid), what=f"creating sandbox {self.id}")
        except DockerAPIError as exc:
            if exc.status == 404:
                raise SandboxStartError(
                    f"image {self.image} is not on this engine: build the default image with "
                    "`tempering image build` (no registry is used), or name a local image in "
                    "SandboxSpec.image") from None
            raise
        self._container = created.json()["Id"]
        await self._engine.request("POST", f"/containers/{self._container}/start",
                                   what=f"starting sandbox {self.id}")

    async def _logs(self) -> str:
        if self._container is None:
            return "no container"
        with contextlib.suppress(SandboxError):
            raw = (await self._engine.request(
                "GET", f"/containers/{self._container}/logs",
                params={"stdout": 1, "stderr": 1, "tail": 20})).body
            return raw.decode(errors="replace").strip()[-500:] or "no output"
        return "no output"

    async def close(self) -> None:
        if not self._closing():
            return
        _live.discard(self)
        removed = self._container is None
        if self._container is not None:
            with contextlib.suppress(SandboxError):
                await self._engine.remove(self._container)
                removed = True
        if self._uid is not None and removed:  # nothing runs as it now
            self._uid.release()
            self._uid = None  # else reclaim frees it once this process is gone
        shutil.rmtree(self._control_dir, ignore_errors=True)
        if self._volume is not None:  # the container is gone: nothing writes to it now
            with contextlib.suppress(OSError, SandboxError, RuntimeError):
                await asyncio.to_thread(volumes().destroy, self._volume)
                self._volume = None

    # ---- Sandbox primitives ----

    def _command_finished(self) -> None:
        if self._volume is not None:  # written back while idle, so a fork stays O(1)
            volumes().writeback().poke()

    async def _oom_kills(self) -> int | None:
        if self.closed or not self._init_pid:
            return None
        return _oom_kills_of(self._init_pid)

    async def usage(self) -> SandboxUsage:
        """As a local sandbox's: the container's memory and process peaks, read from the
        host's cgroups."""
        ensure_open(self)
        memory, pids = (await asyncio.to_thread(_peaks_of, self._init_pid) if self._init_pid
                        else (None, None))
        return SandboxUsage(memory, pids, await self._oom_kills())

    async def fork(self) -> DockerSandbox:
        """A new container from the same image whose workdir and /tmp are a copy of this
        one's (processes are not copied): a snapshot of its volume, or a file copy."""
        ensure_open(self)
        if self._volume is not None:
            child = DockerSandbox(self.spec)
            try:
                await child._start(snapshot_of=self._volume)
            except BaseException:
                await child.close()
                raise
            return child
        child = await DockerSandbox.create(self.spec)
        try:
            await asyncio.to_thread(self._files().copy_into, child._files())
        except OSError as exc:
            await child.close()
            raise SandboxError(f"fork of {self.id} failed copying its files: {exc}") from None
        return child


def _memory_cgroup(pid: int) -> tuple[Path, int] | None:
    """The memory cgroup directory of ``pid`` on the host, and the hierarchy's version."""
    v1 = _cgroup_of(pid, "memory")
    if v1 is not None:
        return v1, 1
    v2 = _cgroup_of(pid, "")
    return (v2, 2) if v2 is not None else None


def _cgroup_of(pid: int, controller: str) -> Path | None:
    """The directory of ``pid``'s cgroup of ``controller`` on a v1 host ("": the unified
    hierarchy of a v2 host), from /proc/PID/cgroup."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller and controller in controllers.split(","):
            return Path("/sys/fs/cgroup") / controller / path.lstrip("/")
        if not controller and controllers == "":
            return Path("/sys/fs/cgroup") / path.lstrip("/")
    return None


def _commands_cgroup(pid: int, limit: int) -> str | None:
    """As a local sandbox's (``cgroup.SandboxCgroup``): a child of the container's memory
    cgroup (whose limit is the commands' plus the init's reserve) holds the commands and the
    memory limit, so that the OOM killer never chooses the init, whose RSS is larger than a
    process holding the memory through descriptors (round thirty-one). Returns the child's
    ``cgroup.procs``; on v2 the init moves to a leaf of its own first (no process may sit in
    an inner node there). runc removes the container's cgroup with its children."""
    found = _memory_cgroup(pid)
    if found is None:
        return None
    outer, version = found
    commands = outer / cgroup.COMMANDS
    commands.mkdir(exist_ok=True)
    if version == 2:
        (outer / "init").mkdir(exist_ok=True)
        (outer / "init" / "cgroup.procs").write_text(str(pid))
        (outer / "cgroup.subtree_control").write_text("+memory")
    cgroup.limit_memory(commands, limit, version)
    return str(commands / "cgroup.procs")


def _peaks_of(pid: int) -> tuple[int | None, int | None]:
    """(memory peak, pids peak) of the container whose init is ``pid``, as a local sandbox
    has them: of the whole container, init included (the engine's pids limit counts the init
    too). None where the host's cgroups do not say (``pids.peak`` needs Linux 6.1)."""
    found = _memory_cgroup(pid)
    if found is None:
        return None, None
    outer, version = found
    if outer.name == "init":  # v2: the init's own leaf
        outer = outer.parent
    memory = cgroup.read_int(outer / ("memory.max_usage_in_bytes" if version == 1
                                      else "memory.peak"))
    pids_dir = outer if version == 2 else _cgroup_of(pid, "pids")
    return memory, cgroup.read_int(pids_dir / "pids.peak") if pids_dir is not None else None


def _oom_kills_of(pid: int) -> int | None:
    """OOM kills among the commands of the container whose init is ``pid``."""
    found = _memory_cgroup(pid)
    if found is None:
        return None
    outer, version = found
    if outer.name == "init":  # v2: the init's own leaf
        outer = outer.parent
    name = "memory.oom_control" if version == 1 else "memory.events"
    with contextlib.suppress(OSError):
        for entry in (outer / cgroup.COMMANDS / name).read_text().splitlines():
            key, _, value = entry.partition(" ")
            if key == "oom_kill":
                return int(value)
    return None


def _limit_sockets(pid: int, limit: int) -> None:
    """On cgroup v1 a container's socket buffers count against no limit until one is set (v2
    counts them in its memory; the engine's ``KernelMemoryTCP`` is ignored by runc): the
    same budget as the local backend's, set before the first command makes a socket."""
    found = _memory_cgroup(pid)
    if found is None or found[1] != 1:
        return
    with contextlib.suppress(OSError):
        (found[0] / "memory.kmem.tcp.limit_in_bytes").write_text(str(limit))


PTYS = 32  # a container's ptys at most, as a local sandbox's (init.c)


async def _limit_ptys(init: Path, pid: int) -> None:
    """Every container's ptys come out of one machine-wide count (kernel.pty.max less its
    reserve), and the engine mounts its devpts without a maximum: remount it with one, keeping
    the engine's options, before the first command runs."""
    try:
        lines = (await asyncio.to_thread(Path(f"/proc/{pid}/mountinfo").read_text)).splitlines()
    except OSError as exc:
        raise SandboxStartError(f"cannot read the container's mounts: {exc}") from None
    found = [line.split(" - ", 1)[1].split() for line in lines
             if " - " in line and line.split()[4] == "/dev/pts"]
    if not found or found[-1][0] != "devpts":
        raise SandboxStartError("the container has no devpts at /dev/pts")
    kept = [o for o in found[-1][2].split(",") if o not in ("rw", "ro") and
            not o.startswith("max=")]
    proc = await asyncio.create_subprocess_exec(
        str(init), "--limit-ptys", str(pid), ",".join([*kept, f"max={PTYS}"]),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise SandboxStartError(f"cannot limit the container's ptys: {err.decode().strip()}")
