"""Host files the local backend needs: the compiled sandbox init and a few synthetic /etc files.

``init.c`` ships as source and is compiled once per machine (and per change of the source) into
``$TEMPERING_HOME/bin`` (default ``/var/lib/tempering``): a static binary, so it also runs inside
a sandbox whose root filesystem has another libc. Builds are atomic (write, then rename), so
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
def init_binary() -> Path:
    """Path of the compiled sandbox init, building it if needed."""
    source = resources.files("tempering.sandbox").joinpath("init.c").read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    dest = home() / "bin" / f"tempering-init-{digest}"
    if dest.exists():
        return dest
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise SandboxUnavailableError(
            "no C compiler found to build the sandbox init; install one with "
            "`apt-get install -y gcc libc6-dev` (or set CC)")
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    os.chmod(home(), 0o755)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "init.c", Path(tmp) / "init"
        src.write_bytes(source)
        errors = ""
        for extra in (["-static"], []):  # static when libc.a is there, else dynamic
            proc = subprocess.run([compiler, "-O2", "-Wall", *extra, "-o", str(out), str(src)],
                                  capture_output=True, text=True)
            if proc.returncode == 0:
                break
            errors = proc.stderr
        else:
            raise SandboxUnavailableError(f"building the sandbox init failed:\n{errors}")
        _publish(dest, out.read_bytes(), 0o755)
    return dest


@cache
def etc_files(uid: int, gid: int) -> dict[str, Path]:
    """Synthetic /etc/passwd, group, hostname and hosts for sandboxes (none of the host's)."""
    files = {
        "passwd": f"root:x:0:0:root:/root:/bin/sh\nuser:x:{uid}:{gid}:sandbox user:/tmp:/bin/sh\n"
                  "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nuser:x:{gid}:\nnogroup:x:65534:\n",
        "hostname": "sandbox\n",
        "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    }
    out = {}
    for name, text in files.items():
        path = home() / "etc" / f"{uid}-{gid}" / name
        if not path.exists() or path.read_text() != text:
            _publish(path, text.encode(), 0o644)
        out[name] = path
    return out
