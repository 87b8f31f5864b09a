"""The read-only system a local sandbox sees, as bubblewrap arguments.

By default that system is this host's, reduced to what programs need: ``/usr`` (without
``/usr/local``, where site-specific tools and secrets tend to live) and the usual links into it,
and a curated ``/etc`` (no shadow, no ssh, no machine secrets) with synthetic ``passwd``,
``group``, ``hostname`` and ``hosts``. Nothing of ``/home``, ``/root``, ``/run``, ``/var`` or the
host's ``/tmp`` is there, and no engine socket. A spec may instead name another root filesystem
(a directory), whose top-level directories are mounted read-only in the same way.
"""

from __future__ import annotations

import os

from tempering.sandbox.native import etc_files
from tempering.sandbox.spec import SandboxSpec

# /etc entries that programs read and that hold nothing private.
_ETC = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone",
        "mime.types", "nsswitch.conf", "protocols", "services", "ssl", "ca-certificates",
        "ca-certificates.conf", "python3", "python3.11", "python3.12", "python3.13",
        "debian_version", "os-release", "lsb-release", "bash.bashrc", "inputrc", "magic",
        "gai.conf", "host.conf", "login.defs", "shells", "environment", "papersize", "ucf.conf",
        "gitconfig", "vim", "perl", "xdg")
# Top-level entries of a root filesystem that are never mounted from it.
_SKIP_TOP = {"proc", "dev", "sys", "tmp", "run", "home", "root", "boot", "lost+found", "media",
             "mnt", "srv", "var", ".tempering", "workspace"}


def system_args(spec: SandboxSpec, uid: int, gid: int) -> list[str]:
    """bubblewrap arguments that build the sandbox's read-only system."""
    root = spec.rootfs or "/"
    args: list[str] = []
    if spec.rootfs is None:
        tops = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"]
    else:
        tops = sorted(e for e in os.listdir(root) if e not in _SKIP_TOP and e != "etc")
    for top in tops:
        host = os.path.join(root, top)
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), f"/{top}"]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, f"/{top}"]
    if spec.rootfs is None and os.path.isdir("/usr/local"):
        args += ["--tmpfs", "/usr/local", "--remount-ro", "/usr/local"]
    args += _etc_args(root, spec, uid, gid)
    args += ["--dir", "/var", "--symlink", "../tmp", "/var/tmp", "--dir", "/run"]
    return args


def _etc_args(root: str, spec: SandboxSpec, uid: int, gid: int) -> list[str]:
    etc = os.path.join(root, "etc")
    if spec.rootfs is None:
        names = list(_ETC)
    else:
        names = sorted(os.listdir(etc)) if os.path.isdir(etc) else []
    private = {"shadow", "gshadow", "shadow-", "gshadow-", "passwd", "group", "hostname", "hosts",
               "resolv.conf", "ssh", "sudoers", "sudoers.d", "machine-id"}
    args = ["--dir", "/etc"]
    for name in names:
        if name in private:
            continue
        path = os.path.join(etc, name)
        if os.path.exists(path):  # follows links: /etc/os-release -> ../usr/lib/os-release
            args += ["--ro-bind", path, f"/etc/{name}"]
    for name, path in etc_files(uid, gid).items():
        args += ["--ro-bind", str(path), f"/etc/{name}"]
    if spec.network and os.path.exists(os.path.join(etc, "resolv.conf")):
        resolv = os.path.realpath(os.path.join(etc, "resolv.conf"))
        args += ["--ro-bind", resolv, "/etc/resolv.conf"]
    return args
