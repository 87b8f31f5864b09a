"""Linux cgroups for sandbox limits: memory, pids and cpu, on cgroup v1 or v2.

Every sandbox gets one cgroup per controller (v1) or one cgroup (v2) below a directory that
names the owning process (``tempering/<pid>-<start time>``), so that cgroups left by a process
that crashed can be found, emptied and removed by the next one (``reclaim``). On v1 the tree sits
below this process's own cgroup, so any limit around the harness (a test guard, a container)
also bounds its sandboxes; v2 forbids processes in inner nodes, so there it sits at the root,
or below ``$TEMPERING_CGROUP_PARENT`` (a cgroup without processes, such as the test guard).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tempering.errors import SandboxUnavailableError

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of each cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if rfields and rfields[0] in ("cgroup", "cgroup2"):
                found.append((fields[4], rfields[0], set(rfields[2].split(",")) if len(rfields) > 2
                              else set()))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" for v2."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for ctrl in ctrls.split(",") if ctrls else [""]:
                paths[ctrl] = path
    return paths


def process_start_time(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_tag(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{process_start_time(pid)}"


def owner_alive(tag: str) -> bool:
    pid, _, start = tag.partition("-")
    if not pid.isdigit():
        return True  # not ours to judge
    return str(process_start_time(int(pid))) == start


@dataclass(frozen=True)
class Hierarchy:
    """Where sandbox cgroups go: one base directory per controller (v1) or one (v2)."""

    version: int
    bases: dict[str, Path]  # controller -> <...>/tempering

    @classmethod
    def detect(cls) -> Hierarchy:
        mounts = _mounts()
        own = _own_paths()
        v1 = {}
        for point, fstype, opts in mounts:
            if fstype == "cgroup":
                for ctrl in CONTROLLERS:
                    if ctrl in opts and ctrl not in v1:
                        v1[ctrl] = Path(point) / own.get(ctrl, "/").lstrip("/") / "tempering"
        if len(v1) == len(CONTROLLERS):
            return cls(1, v1)
        for point, fstype, _ in mounts:
            if fstype != "cgroup2":
                continue
            available = (Path(point) / "cgroup.controllers").read_text().split()
            if all(c in available for c in CONTROLLERS):
                parent = Path(os.environ.get("TEMPERING_CGROUP_PARENT", point))
                return cls(2, {"": parent / "tempering"})
        missing = [c for c in CONTROLLERS if c not in v1]
        raise SandboxUnavailableError(
            f"the cgroup controllers {', '.join(missing)} are not available here; the local "
            "backend needs memory, pids and cpu cgroups (mount them, or run as root on a host "
            "that has them)")

    def owner_dirs(self, tag: str) -> dict[str, Path]:
        return {ctrl: base / tag for ctrl, base in self.bases.items()}

    def prepare(self, tag: str) -> None:
        """Create this owner's directories (and, on v2, enable the controllers down to them)."""
        for ctrl, base in self.bases.items():
            if self.version == 2:
                _enable_controllers(base.parent)
                base.mkdir(exist_ok=True)
                _enable_controllers(base)
                (base / tag).mkdir(exist_ok=True)
                _enable_controllers(base / tag)
            else:
                (base / tag).mkdir(parents=True, exist_ok=True)
                if ctrl == "memory":  # v1: children inherit hierarchical accounting
                    with contextlib.suppress(OSError):
                        (base / "memory.use_hierarchy").write_text("1")


def _enable_controllers(path: Path) -> None:
    wanted = " ".join(f"+{c}" for c in CONTROLLERS)
    with contextlib.suppress(OSError):
        (path / "cgroup.subtree_control").write_text(wanted)


# The init (and bubblewrap, and a network stack) hold this much beside the commands' memory
# limit, in the sandbox's memory cgroup; the commands are in a child of it that has the limit.
INIT_RESERVE_MB = 16
COMMANDS = "commands"


class SandboxCgroup:
    """The cgroup(s) of one sandbox. Its commands' memory is a child cgroup of the sandbox's
    (``commands``), which holds the memory limit: when it is reached, the OOM killer chooses
    among the commands only. Kernel memory a process holds through descriptors (socket and
    pipe buffers) is no part of its RSS, by which the OOM killer chooses, so a holder of a few
    KiB left the init the largest process of one cgroup, and its victim (the sandbox died:
    red team, round thirty-one). The init, outside that child, is never a candidate."""

    def __init__(self, hierarchy: Hierarchy, tag: str, name: str, *,
                 commands: bool = True) -> None:
        self.hierarchy = hierarchy
        self.paths = {ctrl: d / name for ctrl, d in hierarchy.owner_dirs(tag).items()}
        self.memory = self.paths["memory" if hierarchy.version == 1 else ""]
        self.separate = commands
        self.commands = self.memory / COMMANDS if commands else self.memory
        """The commands' memory cgroup (the init enters each command into it); without
        ``commands`` (a grading of the zygote, whose processes are all the tested code's), the
        sandbox's own, which has the limit."""

    def create(self, *, memory_mb: int, pids: int, cpus: float) -> None:
        for path in self.paths.values():
            path.mkdir()
        separate = self.separate
        memory = memory_mb << 20
        outer = memory + (INIT_RESERVE_MB << 20 if separate else 0)
        quota = max(int(cpus * CPU_PERIOD_US), 1000)
        version = self.hierarchy.version
        if version == 1:
            p = self.paths
            limit_memory(p["memory"], outer, version)
            if separate:
                self.commands.mkdir()
                limit_memory(self.commands, memory, version)
            (p["pids"] / "pids.max").write_text(str(pids))
            (p["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (p["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            path = self.paths[""]
            limit_memory(path, outer, version)
            (path / "pids.max").write_text(str(pids))
            (path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            if not separate:
                return
            # No process in an inner node on v2: the init has a leaf of its own.
            (path / "init").mkdir()
            self.commands.mkdir()
            (path / "cgroup.subtree_control").write_text("+memory")
            limit_memory(self.commands, memory, version)

    def attach(self, pid: int) -> None:
        if self.hierarchy.version == 1 or not self.separate:
            for path in self.paths.values():
                (path / "cgroup.procs").write_text(str(pid))
        else:
            (self.paths[""] / "init" / "cgroup.procs").write_text(str(pid))

    def attach_to_commands(self, pid: int) -> None:
        """``pid`` in the sandbox's cgroups, its memory counted with the commands': a network
        stack whose allocations the commands make (a socket a flow), which must not fill the
        init's reserve (red team, round thirty-two)."""
        if self.hierarchy.version == 1:
            for ctrl, path in self.paths.items():
                target = self.commands if ctrl == "memory" else path
                (target / "cgroup.procs").write_text(str(pid))
        else:
            (self.commands / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        """OOM kills among the commands (where the memory limit is)."""
        name = "memory.oom_control" if self.hierarchy.version == 1 else "memory.events"
        try:
            text = (self.commands / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def memory_peak(self) -> int | None:
        path, name = ((self.paths["memory"], "memory.max_usage_in_bytes")
                      if self.hierarchy.version == 1 else (self.paths[""], "memory.peak"))
        return read_int(path / name)

    def pids_peak(self) -> int | None:
        return read_int(self.paths["pids" if self.hierarchy.version == 1 else ""] / "pids.peak")

    def remove(self, *, timeout: float = 5.0) -> None:
        """Kill whatever is left inside and remove the cgroup(s)."""
        for path in self.paths.values():
            remove_cgroup(path, timeout=timeout)


async def in_thread(join: Callable[[], None]) -> None:
    """``join()`` (a cgroup's creation and migrations) in a thread: a migration waits in the
    kernel for an RCU grace period per controller (milliseconds), which on the event loop
    held up every other sandbox's start. Awaited to its end even when cancelled: the caller's
    cleanup then never races a migration still under way."""
    joining = asyncio.ensure_future(asyncio.to_thread(join))
    try:
        await asyncio.shield(joining)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await joining
        raise


def limit_memory(path: Path, limit: int, version: int) -> None:
    """Set the memory cgroup ``path``'s limit to ``limit`` bytes, swap included."""
    if version == 1:
        (path / "memory.limit_in_bytes").write_text(str(limit))
        with contextlib.suppress(OSError):  # absent without swap accounting
            (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        # Socket buffers are charged to a v1 memory cgroup only once this is set (v2 charges
        # them always): unset, a sandbox's queued TCP and UDP data would pin host memory past
        # its limit and press on the machine-wide tcp_mem / udp_mem.
        with contextlib.suppress(OSError):
            (path / "memory.kmem.tcp.limit_in_bytes").write_text(str(limit))
    else:
        (path / "memory.max").write_text(str(limit))
        with contextlib.suppress(OSError):
            (path / "memory.swap.max").write_text("0")


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def remove_cgroup(path: Path, *, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    for child in _subdirs(path):
        remove_cgroup(child, timeout=timeout)
    delay = 0.0005
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        _kill_members(path)
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _subdirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return []


def _kill_members(path: Path) -> None:
    try:
        pids = (path / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def reclaim(hierarchy: Hierarchy) -> set[str]:
    """Remove the sandbox cgroups of owners that no longer run; kill what is inside them.

    Returns the names (``<owner tag>/<sandbox id>``) of the sandboxes cleaned up; each has a
    cgroup per v1 controller.
    """
    removed: set[str] = set()
    for base in hierarchy.bases.values():
        for owner in _subdirs(base):
            if owner_alive(owner.name):
                continue
            for sandbox in _subdirs(owner):
                remove_cgroup(sandbox)
                removed.add(f"{owner.name}/{sandbox.name}")
            with contextlib.suppress(OSError):
                owner.rmdir()
    return removed


def enter_guard(*, pids: int, memory_mb: int) -> Path | None:
    """Move this process into a new cgroup with a pids and memory ceiling (v1 or v2).

    Used by the test suite so that a containment failure cannot take the machine down: the
    sandboxes this process starts nest below the guard too. Guards of processes that have
    exited are removed first. Returns the guard's path, or None where cgroups cannot be written
    (not root).
    """
    if os.geteuid() != 0:
        return None
    name = f"tempering-guard-{os.getpid()}"
    own = _own_paths()
    entered = None
    for point, fstype, opts in _mounts():
        if fstype == "cgroup":
            ctrl = next((c for c in ("pids", "memory") if c in opts), None)
            if ctrl is None:
                continue
            parent = Path(point) / own.get(ctrl, "/").lstrip("/")
            _remove_dead_guards(parent)
            path = parent / name
            path.mkdir(exist_ok=True)
            limit = "pids.max" if ctrl == "pids" else "memory.limit_in_bytes"
            (path / limit).write_text(str(pids if ctrl == "pids" else memory_mb << 20))
            (path / "cgroup.procs").write_text(str(os.getpid()))
            entered = path
        elif fstype == "cgroup2" and entered is None:
            root = Path(point)
            if not all(c in (root / "cgroup.controllers").read_text().split() for c in CONTROLLERS):
                continue
            # v2 allows processes only in leaves: the guard holds this process in guard/harness
            # and the sandboxes in guard/tempering (TEMPERING_CGROUP_PARENT tells Hierarchy).
            _remove_dead_guards(root)
            _enable_controllers(root)
            path = root / name
            path.mkdir(exist_ok=True)
            (path / "pids.max").write_text(str(pids))
            (path / "memory.max").write_text(str(memory_mb << 20))
            _enable_controllers(path)
            (path / "harness").mkdir(exist_ok=True)
            (path / "harness" / "cgroup.procs").write_text(str(os.getpid()))
            os.environ["TEMPERING_CGROUP_PARENT"] = str(path)
            entered = path
    return entered


def _remove_dead_guards(parent: Path) -> None:
    for guard in parent.glob("tempering-guard-*"):
        pid = guard.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                remove_cgroup(guard, timeout=1.0)
