"""``grading.capture``: the directories of the environment a task's grade depends on.

By default a grade depends on the workdir only. A task may name directories of its image too
(``/etc/myapp``, ``/srv/site``): each becomes a writable directory of the agent's sandbox
(``SandboxSpec.writable_dirs``) that starts as the image has it (the pristine tree, read here
once when the task loads), and after the episode the agent's tree there, read within the
limits with links kept as links, is laid into the same directory of a fresh grading sandbox
of the same image. Nothing else the agent changed reaches the grading: the rest of the system
is read-only for it, and the grading sandbox's is the image's.

The verifier's interpreter and tools must come from the pristine image, so a capture that
would let the agent replace them is refused when the task loads, with the path named:

- the system's program and library directories (``/usr``, ``/bin``, ``/lib``...), ``/etc``
  itself and what in it programs read as code or configuration of the loader and shells
  (``/etc/alternatives``, ``/etc/ld.so.conf.d``, ``/etc/profile.d``, ``/etc/python*``);
- any directory on a search path of the sandbox's or the verifier's environment (``PATH``,
  ``PYTHONPATH``, ``LD_LIBRARY_PATH``...);
- any directory that a symbolic link among the image's programs and interpreter libraries
  resolves into (``/usr/local/bin/node -> /opt/node/bin/node`` forbids ``/opt/node``): the
  image itself is asked (``image_problems``), on either backend.
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tempering.errors import SandboxError
from tempering.sandbox import SandboxSpec, create_sandbox
from tempering.tasks.files import FileTree, Limits

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/proc",
          "/dev", "/sys", "/run", "/tmp", "/.tempering", "/logs", "/tests",
          "/etc/alternatives", "/etc/ld.so.conf.d", "/etc/profile.d", "/etc/python",
          "/var/lib/dpkg")
"""Directories no capture may be, lie in or hold (``/etc/python`` also covers
``/etc/python3.12``: Debian's ``sitecustomize`` is there)."""
HOLD_ONLY = ("/", "/etc", "/var")
"""Directories a capture may lie in but not be."""
SEARCH_PATHS = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
                "PYTHONPYCACHEPREFIX", "LD_LIBRARY_PATH", "LD_PRELOAD", "LD_AUDIT", "BASH_ENV",
                "ENV", "PERL5LIB", "PERLLIB", "NODE_PATH", "RUBYLIB", "GEM_PATH", "GEM_HOME",
                "CLASSPATH", "GCONV_PATH", "LOCPATH", "NLSPATH", "TCLLIBPATH", "R_LIBS")
"""Environment variables whose directories a program loads code from."""
PROGRAM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin",
                "/usr/lib/python3*", "/usr/local/lib/python3*", "/usr/lib/python3/dist-packages",
                "/usr/local/lib/python3*/site-packages")
"""Where the links ``image_problems`` follows sit (globs, one level deep)."""


def extra_dirs(capture: list[str], workdir: str) -> tuple[str, ...]:
    """The captured directories other than the workdir."""
    return tuple(path for path in capture if path != workdir)


def check_paths(capture: list[str], spec: SandboxSpec, env: Mapping[str, str]) -> list[str]:
    """What is wrong with ``capture`` (as ``grading.capture``) before the image is asked."""
    problems = []
    for path in capture:
        norm = posixpath.normpath(path) if path.startswith("/") else ""
        if norm != path or path.startswith("//"):
            problems.append(f"grading.capture {path!r} must be a normalised absolute path")
            continue
        if path != spec.workdir and _nests(path, spec.workdir):
            problems.append(f"grading.capture {path!r} and the workdir {spec.workdir} nest: "
                            "the workdir is captured whole or not at all")
            continue
        system = next((d for d in SYSTEM if _nests(path, d) or (
            d == "/etc/python" and path.startswith(d))), None)
        if system is not None or path in HOLD_ONLY:
            problems.append(f"grading.capture {path!r}: {system or path} holds the verifier's "
                            "interpreter, tools or their configuration, which always come from "
                            "the pristine image; capture a directory of the task's own")
            continue
        for name, value in {**spec.env, **env}.items():
            if name not in SEARCH_PATHS:
                continue
            hit = next((d for d in value.split(":") if d.startswith("/")
                        and _nests(path, posixpath.normpath(d))), None)
            if hit is not None:
                problems.append(f"grading.capture {path!r}: {name} names {hit}, so the agent "
                                "could replace what the verifier runs; capture another "
                                "directory or leave it off the search path")
                break
    if len(set(capture)) != len(capture):
        problems.append(f"grading.capture {capture!r} names a directory twice")
    return problems


def _nests(a: str, b: str) -> bool:
    """Whether one of the absolute paths ``a`` and ``b`` is the other or lies in it."""
    return a == b or (a + "/").startswith(b.rstrip("/") + "/") or (
        b + "/").startswith(a.rstrip("/") + "/")


def image_problems(spec: SandboxSpec, dirs: tuple[str, ...]) -> list[str]:
    """What is wrong with capturing ``dirs`` in the image itself, asked of a sandbox of it
    (without the captured directories, so it sees what the image has): a path that is there
    but not a directory (a link is not one), one that lies behind a link (its mount would
    land elsewhere, in the system perhaps), and a link among the image's programs and
    interpreter libraries that resolves into a captured directory."""
    quoted = " ".join(shlex.quote(d) for d in dirs)
    script = ("for d in " + " ".join(PROGRAM_DIRS) + "; do [ -d \"$d\" ] && "
              "find \"$d\" -maxdepth 1 -type l -exec sh -c "
              "'for l; do printf \"link\\t%s\\t%s\\n\" \"$l\" \"$(readlink -f \"$l\")\"; done' "
              "sh {} +; done; for d in " + quoted + "; do "
              "if [ -L \"$d\" ] || { [ -e \"$d\" ] && [ ! -d \"$d\" ]; }; then "
              "printf \"notdir\\t%s\\n\" \"$d\"; "
              "elif [ \"$(readlink -m \"$d\")\" != \"$d\" ]; then "
              "printf \"moved\\t%s\\t%s\\n\" \"$d\" \"$(readlink -m \"$d\")\"; fi; done; true")
    bare = spec.model_copy(update={"writable_dirs": (), "network": False})
    problems = []
    for line in _run(_exec(bare, script)).splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "notdir":
            problems.append(f"grading.capture {rest!r} is not a directory in the image (a "
                            "link or a file): capture the directory it lies in, or its target")
            continue
        link, _, target = rest.partition("\t")
        if kind == "moved":
            problems.append(f"grading.capture {link!r} lies behind a link in the image (it is "
                            f"{target} there): capture the directory by its own path")
            continue
        for d in dirs:
            if kind == "link" and target.startswith("/") and _nests(target, d):
                problems.append(f"grading.capture {d!r}: the image's {link} resolves to "
                                f"{target}, so the agent could replace a program the verifier "
                                "may run; capture another directory")
    return sorted(set(problems))


async def _exec(spec: SandboxSpec, script: str) -> str:
    try:
        sb = await create_sandbox(spec)
    except SandboxError as exc:
        raise SandboxError(f"cannot start the task's environment to check grading.capture: "
                           f"{exc}") from None
    try:
        result = await sb.exec(["sh", "-c", script], timeout=60)
    finally:
        await sb.close()
    if result.exit_code != 0:
        raise SandboxError(f"checking grading.capture in the task's environment failed: "
                           f"{result.stderr[-500:]}")
    return result.stdout


def pristine_trees(spec: SandboxSpec, dirs: tuple[str, ...], limits: Limits | None = None
                   ) -> tuple[dict[str, FileTree], list[str]]:
    """What the image holds at each of ``dirs`` (links as links), and what is wrong: a path
    that is not a directory there, or holds more than ``limits``."""
    limits = limits or Limits()
    trees: dict[str, FileTree] = {}
    problems: list[str] = []
    for d in dirs:
        if spec.backend == "docker":
            tree, why = _run(_image_tree(spec, d, limits))
        else:
            tree, why = _rootfs_tree(spec, d, limits)
        if why:
            problems.append(f"grading.capture {d!r}: {why}")
        elif tree.left_out:
            problems.append(f"grading.capture {d!r}: the image's files there are past the "
                            f"limits: {', '.join(tree.left_out[:3])}")
        trees[d] = tree
    return trees, problems


def _rootfs_tree(spec: SandboxSpec, path: str, limits: Limits) -> tuple[FileTree, str]:
    """The local backend: the root filesystem's directory, or nothing where the sandbox's
    view of the host's system has none (``/srv/app``: bubblewrap makes it, empty)."""
    if spec.rootfs is None:
        top = path.strip("/").split("/")[0]
        if top in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc"):
            return FileTree(), (f"the host's system is this sandbox's image, and its /{top} "
                                "cannot take a directory; use a root filesystem (rootfs) that "
                                "has it, or a directory outside the system such as /srv/app")
        return FileTree(), ""
    host = Path(spec.rootfs) / path.lstrip("/")
    if host.is_symlink() or (host.exists() and not host.is_dir()):
        return FileTree(), f"{host} is not a directory in the root filesystem"
    if not host.exists():
        parent = host.parent
        while not parent.exists():
            parent = parent.parent
        if parent != Path(spec.rootfs):
            return FileTree(), (f"the root filesystem has no {path}, and its parent there is "
                                "read-only: add the directory to the root filesystem")
    return FileTree.read(host, limits, links=True), ""


async def _image_tree(spec: SandboxSpec, path: str, limits: Limits) -> tuple[FileTree, str]:
    from tempering.sandbox.docker import default_image
    from tempering.sandbox.engine import EngineError
    from tempering.sandbox.image import build_recipe, image_files

    try:
        ref = spec.image or (await build_recipe(spec.recipe) if spec.recipe else
                             default_image())
        found = await image_files(ref, path, max_files=limits.max_files,
                                  max_bytes=limits.max_total_bytes, links=True)
    except EngineError as exc:
        if exc.status == 404:  # no such path: the engine makes the mount point
            return FileTree(), ""
        raise
    return FileTree(found.files, found.modes, tuple(found.left_out), links=found.links), ""


def _run(coroutine: Any) -> Any:
    """Run ``coroutine`` to its end from synchronous code, inside an event loop or not."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def confine_links(where: str, pristine: FileTree | None, final: FileTree
                  ) -> tuple[FileTree, list[str]]:
    """``final`` (the agent's tree at ``where``) without the links that could lead out of it,
    and ``"path (why)"`` for each left out. A link in the grading sandbox resolves there,
    where /tests holds the hidden tests and /logs the verdict: a link the agent made to what
    it could not read would be content it never wrote. So a link it added or changed is kept
    only when it stays inside ``where`` whatever its components are: relative without ``..``,
    or absolute below ``where`` (whose own path has no link: ``image_problems``). Every link
    in the tree is held to that, so chains of them stay inside too. The image's own links,
    unchanged, are kept as they are."""
    kept: dict[str, str] = {}
    left: list[str] = []
    for path, target in final.links.items():
        if pristine is not None and pristine.links.get(path) == target:
            kept[path] = target
        elif ".." in target.split("/") or not target or (
                target.startswith("/") and not target.startswith(where.rstrip("/") + "/")):
            left.append(f"{where}/{path} (link to {target} leads out of {where})")
        else:
            kept[path] = target
    if not left:
        return final, []
    return FileTree(final.files, final.modes, final.left_out, final.left_out_paths,
                    kept), left
