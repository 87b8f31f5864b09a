"""Host files the local backend needs: its two C programs, and the sandboxes' /etc.

``init.c`` (PID 1 of each sandbox) and ``spawner.c`` (starts bubblewrap) ship as source and are
compiled once per machine (and per change of the source) into ``$TEMPERING_HOME/bin`` (default
``/var/lib/tempering``): static binaries, so the init also runs inside a sandbox whose root
filesystem has another libc. Builds are atomic (write, then rename), so
concurrent processes can race safely. The directory must be readable by the unprivileged
sandbox uid, which is why it is not under ``~/.cache``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path

from tempering.errors import SandboxUnavailableError

# included by the C programs: part of what a build depends on
HEADERS = ("wire.h", "domains.h", "exec_hooks.h")


def home() -> Path:
    return Path(os.environ.get("TEMPERING_HOME", "/var/lib/tempering"))


def _publish(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


@cache
def native_binary(name: str) -> Path:
    """Path of the compiled ``<name>.c`` shipped with this package, building it if needed."""
    return _build(name, [["-static"], []], "")  # static when libc.a is there, else dynamic


@cache
def native_library(name: str) -> Path:
    """Path of ``<name>.c`` built as a shared library (for LD_PRELOAD: ``execguard.c``,
    ``nestguard.c``)."""
    return _build(name, [["-shared", "-fPIC"]], ".so")


def _build(name: str, variants: list[list[str]], suffix: str) -> Path:
    package = resources.files("tempering.sandbox")
    source = package.joinpath(f"{name}.c").read_bytes()
    headers = {h: package.joinpath(h).read_bytes() for h in HEADERS}
    digest = hashlib.sha256(source + b"".join(headers.values())).hexdigest()[:16]
    dest = home() / "bin" / f"tempering-{name}-{digest}{suffix}"
    if dest.exists():
        return dest
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise SandboxUnavailableError(
            f"no C compiler found to build the sandbox {name}; install one with "
            "`apt-get install -y gcc libc6-dev` (or set CC)")
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    os.chmod(home(), 0o755)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / f"{name}.c", Path(tmp) / name
        src.write_bytes(source)
        for header, text in headers.items():
            (Path(tmp) / header).write_bytes(text)
        errors = ""
        for extra in variants:
            proc = subprocess.run([compiler, "-O2", "-Wall", *extra, "-o", str(out), str(src)],
                                  capture_output=True, text=True)
            if proc.returncode == 0:
                break
            errors = proc.stderr
        else:
            raise SandboxUnavailableError(f"building the sandbox {name} failed:\n{errors}")
        _publish(dest, out.read_bytes(), 0o755)
    return dest


def synthetic_etc(uid: int, gid: int) -> dict[str, str]:
    """Files every sandbox gets instead of the host's."""
    return {
        "passwd": f"root:x:0:0:root:/root:/bin/sh\nuser:x:{uid}:{gid}:sandbox user:/tmp:/bin/sh\n"
                  "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nuser:x:{gid}:\nnogroup:x:65534:\n",
        "hostname": "sandbox\n",
        "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "resolv.conf": "",  # a mount point: sandboxes with network get their stack's over it
    }


@cache
def etc_files(uid: int, gid: int) -> dict[str, Path]:
    """The synthetic /etc files as host paths (for a root filesystem of the user's own)."""
    out = {}
    for name, text in synthetic_etc(uid, gid).items():
        path = home() / "etc" / f"{uid}-{gid}" / name
        if not path.exists() or path.read_text() != text:
            _publish(path, text.encode(), 0o644)
        out[name] = path
    return out


@cache
def etc_view(entries: tuple[str, ...], uid: int, gid: int) -> Path:
    """A directory to mount as a sandbox's /etc: copies of the host's ``entries`` (those that
    exist, links kept as links) and the synthetic files.

    One bind mount of this directory replaces dozens of per-file mounts, which were most of a
    sandbox's start time. The directory is named by a digest of what it copies, so a change on
    the host (a new ld.so.cache after an install) makes the next process build a new one.
    """
    digest = hashlib.sha256(repr((uid, gid, sorted(synthetic_etc(uid, gid).items()))).encode())
    present = [e for e in entries if os.path.lexists(f"/etc/{e}")]
    for entry in present:
        for top, dirs, files in os.walk(f"/etc/{entry}") if os.path.isdir(f"/etc/{entry}") else [
                ("/etc", [], [entry])]:
            dirs.sort()
            for name in sorted(files) + dirs:
                info = os.lstat(os.path.join(top, name))
                digest.update(f"{top}/{name}:{info.st_mtime_ns}:{info.st_size}\n".encode())
    dest = home() / "etc-view" / digest.hexdigest()[:16]
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".tmp-"))
    for entry in present:
        src = Path("/etc") / entry
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, tmp / entry, symlinks=True, ignore_dangling_symlinks=True)
        elif src.is_file():  # follows a link such as /etc/os-release -> ../usr/lib/os-release
            shutil.copy2(src, tmp / entry)
    for name, text in synthetic_etc(uid, gid).items():
        (tmp / name).write_text(text)
    for path in [tmp, *tmp.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        tmp.rename(dest)
    except OSError:  # another process built the same view first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


@cache
def empty_dir() -> Path:
    """An empty directory, mounted over host paths a sandbox must not see (/usr/local)."""
    path = home() / "empty"
    path.mkdir(parents=True, exist_ok=True, mode=0o755)
    return path
