"""What a sandbox is asked to be (``SandboxSpec``) and what a command returns (``ExecResult``).

Both cross the sandbox boundary, so both are frozen. The spec validates itself: a bad value is
rejected with the field, the value and what to do, before any backend is touched.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Backends by name, imported on use ("module:Class"). A new backend is a new file and a line here.
BACKENDS: dict[str, str] = {
    "local": "tempering.sandbox.local.backend:LocalSandbox",
    "docker": "tempering.sandbox.docker.backend:DockerSandbox",
}

MAX_WRITABLE_DIRS = 16
_MOUNTED = ("/proc", "/dev", "/sys", "/tmp", "/.tempering", "/logs", "/tests")
_SYSTEM_DIRS = {"/", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/proc", "/dev", "/sys",
                "/tmp", "/run", "/var", "/.tempering"}


def host_cpus() -> int:
    """CPUs this process may use (its affinity), which is what a sandbox can be given."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


class SandboxSpec(BaseModel):
    """An isolated environment: its backend, its limits and its view of the world."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    backend: str = "local"
    """Which backend runs the sandbox: ``local`` (bubblewrap namespaces, cgroups, seccomp) or
    ``docker`` (a container on the local Docker engine)."""
    cpus: Annotated[float, Field(gt=0)] = 1.0
    """CPU quota in cores (fractions allowed); ``nproc`` inside reports it rounded up."""
    memory_mb: Annotated[int, Field(ge=16)] = 512
    """Memory limit for everything inside, files in the workdir and /tmp included."""
    pids: Annotated[int, Field(ge=8)] = 128
    """Most processes and threads alive at once; a fork bomb stops here."""
    disk_mb: Annotated[int, Field(ge=1)] = 256
    """Size of the writable storage shared by the workdir and /tmp."""
    storage: Literal["auto", "memory", "volume"] = "auto"
    """Where the workdir and /tmp live: ``volume`` (a copy-on-write btrfs volume of disk_mb on
    the host's disk; fork is a snapshot, whose cost does not grow with the files at rest),
    ``memory`` (a tmpfs, counted in memory_mb too, so at most two thirds of memory_mb less 16:
    its inodes are memory too; fork copies the files) or ``auto`` (volume where the host can
    make volumes, else memory; ``tempering doctor`` says which)."""
    network: bool = False
    """Egress through a network namespace of its own: the internet, but not this host, its LAN,
    private ranges or link-local (metadata); without it there is only loopback."""
    tracing: bool = True
    """Whether a process may reach into another of the sandbox (ptrace attach, pidfd_getfd,
    process_vm_readv/writev, writing /proc/PID/mem). Grading sandboxes turn it off
    (``grading.tracing``): the tested code, started by a test runner, could otherwise take the
    runner's stdout or rewrite its verdict in memory. Off, a debugger still runs a program
    (the child asks to be traced), but attaching to a running process fails, LeakSanitizer's
    leak check with it (``ASAN_OPTIONS=detect_leaks=0``), and nothing writes below /proc."""
    workdir: str = "/workspace"
    """Writable working directory; relative file-API paths and commands start here."""
    writable_dirs: tuple[str, ...] = ()
    """More directories bound from the same disk as the workdir (each counted in ``disk_mb``,
    forked with it, reached by the file API at its absolute path). Like the workdir, each
    starts empty and hides what the image has there: a task writes its pristine content in
    (``grading.capture``). Their mount points must exist in the image or be creatable."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for every command, on top of a minimal default (PATH, HOME, LANG)."""
    rootfs: str | None = None
    """Directory holding another root filesystem, mounted read-only; default: this host's system."""
    image: str | None = None
    """Container image of the docker backend; default: tempering/python:latest, which
    ``tempering image build`` makes from this host's packages (no registry is used)."""
    recipe: str | None = None
    """Directory with a Dockerfile that starts FROM a local image: the docker backend builds it
    on first use (cached by its content) and runs that image instead of ``image``."""
    timeout_s: Annotated[float, Field(gt=0)] = 60.0
    """Wall-clock limit of a command when ``exec`` is given no timeout."""
    output_limit_bytes: Annotated[int, Field(ge=1024)] = 1 << 20
    """Per stream, the most output kept of one command: head and tail, the middle is dropped."""

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in BACKENDS:
            known = ", ".join(sorted(BACKENDS))
            raise ValueError(f"unknown backend {value!r}: choose one of {known}")
        return value

    @field_validator("cpus")
    @classmethod
    def _fits_host(cls, value: float) -> float:
        available = host_cpus()
        if value > available:
            raise ValueError(
                f"cpus={value} is more than the {available} CPU(s) this host can give; "
                f"ask for at most {available}"
            )
        return value

    @field_validator("workdir")
    @classmethod
    def _valid_workdir(cls, value: str) -> str:
        norm = posixpath.normpath(value)
        if not value.startswith("/") or norm.startswith("//"):
            raise ValueError(f"workdir {value!r} must be an absolute path such as /workspace")
        if norm in _SYSTEM_DIRS or any(norm.startswith(d + "/") for d in ("/proc", "/dev", "/sys",
                                                                       "/tmp", "/.tempering")):
            raise ValueError(f"workdir {value!r} collides with a system directory; "
                             "use a path of its own such as /workspace")
        return norm

    @field_validator("writable_dirs")
    @classmethod
    def _valid_writable_dirs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) > MAX_WRITABLE_DIRS:
            raise ValueError(f"writable_dirs names {len(value)} directories; at most "
                             f"{MAX_WRITABLE_DIRS}")
        for path in value:
            norm = posixpath.normpath(path) if isinstance(path, str) else ""
            if not path.startswith("/") or norm != path or norm.startswith("//"):
                raise ValueError(f"writable dir {path!r} must be a normalised absolute path "
                                 "such as /etc/myapp")
            if len(path.encode()) > 200 or ":" in path or "," in path or any(
                    ord(c) < 32 for c in path):
                raise ValueError(f"writable dir {path!r}: at most 200 bytes, without ':', ',' "
                                 "or control characters")
            under = [d for d in _MOUNTED if path.startswith(d + "/")]
            if path in _SYSTEM_DIRS or path in _MOUNTED or under:
                where = f"lies in {under[0]}" if under else "is a system directory"
                raise ValueError(f"writable dir {path!r} {where}, which the sandbox mounts "
                                 "itself; name one of the image's own, such as /etc/myapp")
        for a in value:
            for b in value:
                if a != b and (b + "/").startswith(a + "/"):
                    raise ValueError(f"writable dirs {a!r} and {b!r} nest; name the outer one")
        if len(set(value)) != len(value):
            raise ValueError(f"writable_dirs {list(value)!r} names a directory twice")
        return value

    @field_validator("env")
    @classmethod
    def _valid_env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"environment variable name {key!r} is not valid")
        for key, val in value.items():
            if "\0" in val:
                raise ValueError(f"environment variable {key} holds a NUL byte")
        return value

    @field_validator("rootfs")
    @classmethod
    def _valid_rootfs(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not os.path.isabs(value) or not os.path.isdir(value):
            raise ValueError(f"rootfs {value!r} is not an existing absolute directory")
        if not os.path.exists(os.path.join(value, "bin", "sh")):
            raise ValueError(f"rootfs {value!r} has no bin/sh; point it at a root filesystem")
        return os.path.realpath(value)

    @model_validator(mode="after")
    def _backend_options(self) -> SandboxSpec:
        if self.image is not None and self.backend != "docker":
            raise ValueError(f"image={self.image!r} is for the docker backend; the "
                             f"{self.backend} backend takes a root filesystem (rootfs)")
        if self.recipe is not None and self.backend != "docker":
            raise ValueError(f"recipe={self.recipe!r} is for the docker backend")
        if self.recipe is not None and not os.path.isfile(os.path.join(self.recipe,
                                                                       "Dockerfile")):
            raise ValueError(f"recipe {self.recipe!r} is not a directory with a Dockerfile")
        if self.rootfs is not None and self.backend == "docker":
            raise ValueError("rootfs is for the local backend; the docker backend takes an image")
        for path in self.writable_dirs:
            if path == self.workdir or (path + "/").startswith(self.workdir + "/") or (
                    self.workdir + "/").startswith(path + "/"):
                raise ValueError(f"writable dir {path!r} and the workdir {self.workdir!r} "
                                 "nest; the workdir is writable already")
        return self

    def key(self) -> str:
        """A stable text key: equal specs give equal keys (pools group warm sandboxes by it)."""
        return self.model_dump_json()


# What memory storage leaves the sandbox's processes: files in a tmpfs belong to no process,
# so a tmpfs as large as the memory limit lets a full disk make the OOM killer take the init
# (the sandbox dies: an infra error of the agent's making, round twenty-five; round
# twenty-nine on the docker backend). Nor is a file only its data: each inode pins an inode
# and a dentry (1.24 KB with a 200-character name, measured) that no ``size=`` counts, so
# empty files past a full disk took the init too (round thirty). The data and the inodes
# together stay below the memory limit less a reserve for the processes.
MEMORY_RESERVE_MB = 16
INODE_SPACING = 4096
"""A memory-storage tmpfs has one inode per 4 KiB of its size (init.c and docker.py)."""
INODE_MEMORY = 2048
"""What one tmpfs inode is counted to pin beside its data."""


def memory_disk_bytes(spec: SandboxSpec) -> int:
    """What a memory-storage sandbox's tmpfs hold in all: ``disk_mb``, but never so much that
    their data and their inodes could fill the memory limit less ``MEMORY_RESERVE_MB`` (a
    full disk, of bytes or of files, then says so: ENOSPC)."""
    room = (spec.memory_mb - MEMORY_RESERVE_MB) << 20
    most = room * INODE_SPACING // (INODE_SPACING + INODE_MEMORY)
    return max(1 << 20, min(spec.disk_mb << 20, most))


@dataclass(frozen=True, slots=True)
class SandboxUsage:
    """The most a sandbox has used of its limits so far (None where the backend cannot tell)."""

    memory_peak_bytes: int | None
    pids_peak: int | None
    oom_kills: int | None


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What one command did."""

    exit_code: int | None
    """Exit status; negative for a signal (-9: SIGKILL); None when it never finished or started."""
    stdout: str
    stderr: str
    timed_out: bool = False
    """The command outran its timeout and everything it started was killed."""
    oom_killed: bool = False
    """The kernel's OOM killer killed a process of this sandbox while the command ran."""
    truncated: bool = False
    """Output went over the spec's ``output_limit_bytes``; the middle was dropped."""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Exited with status 0, in time."""
        return self.exit_code == 0 and not self.timed_out
