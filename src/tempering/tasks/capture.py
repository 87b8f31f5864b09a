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
  ``PYTHONPATH``, ``LD_LIBRARY_PATH``, ``HOME``...), as written and as resolved in the image;
- what the image itself says the verifier's programs use (``image_problems``, asked of a
  sandbox of the image on either backend, every path resolved there): a link among its
  programs and libraries that resolves into the capture (``/usr/bin/node -> /opt/node/...``
  forbids ``/opt/node``), a library of the loader's cache, a directory of the loader's
  configuration or of ``python3``'s ``sys.path``, an interpreter's environment (a venv);
- a program the hidden tests name by its path, and a file they ``source``: the verifier
  would run the agent's code as its own (red team, round forty-six, found the venv a test
  script activates, a library linked into the capture and a ``PATH`` through a link).
"""

from __future__ import annotations

import asyncio
import posixpath
import re
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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
SEARCH_PATHS = ("PATH", "HOME", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
                "PYTHONPYCACHEPREFIX", "LD_LIBRARY_PATH", "LD_PRELOAD", "LD_AUDIT", "BASH_ENV",
                "ENV", "PERL5LIB", "PERLLIB", "NODE_PATH", "RUBYLIB", "GEM_PATH", "GEM_HOME",
                "CLASSPATH", "GCONV_PATH", "LOCPATH", "NLSPATH", "TCLLIBPATH", "R_LIBS")
"""Environment variables whose directories a program loads code from."""
PROGRAM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin",
                "/usr/lib/python3*", "/usr/local/lib/python3*", "/usr/lib/python3/dist-packages",
                "/usr/local/lib/python3*/site-packages")
"""Where the links ``image_problems`` follows sit (globs, one level deep)."""
LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")
"""Where the loader's libraries and their links sit (two levels: the multiarch directories)."""


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
            hit = next((d for d in value.replace(" ", ":").split(":") if d.startswith("/")
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


# Asked of a sandbox of the image: "sh -c IMAGE_SCRIPT sh uses|- DIR... --search PATH...
# --tokens PATH...". Each line it prints is a kind, a tab and what was found; "uses" first: also
# what the image's programs use (links, the loader's cache, search paths of its interpreters).
IMAGE_SCRIPT = r"""
uses=$1; shift
mode=dirs
for a; do
  case "$a" in --search) mode=search; continue;; --tokens) mode=tokens; continue;; esac
  case $mode in
  dirs)
    if [ -L "$a" ] || { [ -e "$a" ] && [ ! -d "$a" ]; }; then printf 'notdir\t%s\n' "$a"
    elif [ "$(readlink -m "$a")" != "$a" ]; then
      printf 'moved\t%s\t%s\n' "$a" "$(readlink -m "$a")"
    elif [ -d "$a" ]; then
      p=$(find "$a" -maxdepth 4 \( -name pyvenv.cfg -o -path '*/bin/activate' \
        -o -path '*/bin/python*' \) 2>/dev/null | head -n 1)
      if [ -n "$p" ]; then printf 'interp\t%s\t%s\n' "$a" "$p"; fi
    fi;;
  search) printf 'search\t%s\t%s\n' "$a" "$(readlink -m "$a")";;
  tokens) if [ -f "$a" ] && [ -x "$a" ]; then printf 'exec\t%s\n' "$a"; fi;;
  esac
done
[ "$uses" = uses ] || exit 0
t=$(mktemp -d)
{ find PROGRAM_DIRS -maxdepth 1 -type l 2>/dev/null
  find LIB_DIRS -maxdepth 2 -type l 2>/dev/null
  for c in ldconfig /sbin/ldconfig /usr/sbin/ldconfig; do
    if command -v "$c" >/dev/null 2>&1; then "$c" -p 2>/dev/null | sed -n 's/.*=> //p'; break; fi
  done
  cat /etc/ld.so.conf /etc/ld.so.conf.d/*.conf 2>/dev/null | grep '^/'
  if command -v python3 >/dev/null 2>&1; then
    python3 -I -c 'import sys; [print(p) for p in sys.path if p.startswith("/")]' 2>/dev/null
  fi
  if command -v perl >/dev/null 2>&1; then perl -e 'print "$_\n" for @INC' 2>/dev/null; fi
  if command -v ruby >/dev/null 2>&1; then ruby -e 'puts $LOAD_PATH' 2>/dev/null; fi
  if command -v node >/dev/null 2>&1; then
    node -e 'console.log(require("module").globalPaths.join("\n"))' 2>/dev/null
  fi
} > "$t/names"
xargs -d '\n' readlink -m < "$t/names" > "$t/targets" 2>/dev/null
paste "$t/names" "$t/targets" | sed 's/^/uses\t/'
rm -rf "$t"
true
"""


@dataclass
class _ImageFacts:
    """What one image was found to hold, by the path asked about, so that each path is asked
    of a sandbox of the image once per process (a task set of thousands sharing an image and
    its captured directories starts one sandbox, not one per task)."""

    uses: list[tuple[str, str]] | None = None  # (a name the image's programs use, its target)
    dirs: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)  # kind, 1st, 2nd
    search: dict[str, str] = field(default_factory=dict)  # entry -> as resolved there
    executable: dict[str, bool] = field(default_factory=dict)  # path -> an executable file


_facts: dict[tuple[str, ...], _ImageFacts] = {}  # by _IMAGE_FIELDS of the spec
_IMAGE_FIELDS = ("backend", "image", "recipe", "rootfs", "workdir")
"""What of a spec names what its sandbox's filesystem holds (not its sizes or limits), with
its environment. A name is taken to mean one content for the life of the process, as
``environment_of`` takes it: a recipe's image is tagged by its directory's digest."""


def _image_facts(spec: SandboxSpec, dirs: Iterable[str], search: Iterable[str],
                 tokens: Iterable[str]) -> _ImageFacts:
    """The facts of ``spec``'s image about these paths: what is not known yet, asked."""
    bare = spec.model_copy(update={"writable_dirs": (), "network": False})
    key = (*(str(getattr(spec, name)) for name in _IMAGE_FIELDS), str(sorted(spec.env.items())))
    facts = _facts.setdefault(key, _ImageFacts())
    new_dirs = sorted(set(dirs) - set(facts.dirs))
    new_search = sorted(set(search) - set(facts.search))
    new_tokens = sorted(set(tokens) - set(facts.executable))
    if facts.uses is not None and not (new_dirs or new_search or new_tokens):
        return facts
    script = (IMAGE_SCRIPT.replace("PROGRAM_DIRS", " ".join(PROGRAM_DIRS))
              .replace("LIB_DIRS", " ".join(LIB_DIRS)))
    argv = ["sh", "-c", script, "sh", "uses" if facts.uses is None else "-", *new_dirs,
            "--search", *new_search, "--tokens", *new_tokens]
    uses: list[tuple[str, str]] = []
    found: dict[str, list[tuple[str, str, str]]] = {d: [] for d in new_dirs}
    for line in run_to_end(_exec(bare, argv)).splitlines():
        kind, _, rest = line.partition("\t")
        first, _, second = rest.partition("\t")
        if kind in ("notdir", "moved"):
            found[first].append((kind, first, second))
        elif kind == "interp":
            found[first].append((kind, second, ""))
        elif kind == "search":
            facts.search[first] = second
        elif kind == "exec":
            facts.executable[first] = True
        elif kind == "uses":
            uses.append((first, second))
    facts.dirs.update(found)
    facts.executable.update({t: facts.executable.get(t, False) for t in new_tokens})
    if facts.uses is None:
        facts.uses = uses
    return facts


def image_problems(spec: SandboxSpec, dirs: tuple[str, ...], env: Mapping[str, str],
                   tests: FileTree) -> list[str]:
    """What is wrong with capturing ``dirs`` in the image itself, asked of a sandbox of it
    (without the captured directories, so it sees what the image has; once per image and
    path per process: ``_image_facts``), each path resolved there, through the image's links:

    - a path there that is not a directory (a link is not one), or lies behind a link (its
      mount would land elsewhere, in the system perhaps);
    - one holding an interpreter's environment (a venv's ``pyvenv.cfg``, ``bin/activate``,
      ``bin/python*``);
    - one that the verifier's programs and libraries reach: a link among the image's
      programs and libraries, a library the loader's cache names, a directory the loader's
      configuration or an interpreter of the image searches (``python3``'s ``sys.path``,
      ``perl``'s ``@INC``, ``ruby``'s and ``node``'s), an entry of a search path of the
      environment (``PATH``...);
    - one holding a program the hidden tests name by path (``/opt/tool/bin/check``), or a
      file they ``source``: the verifier would run the agent's code as its own."""
    search = [entry for name, value in env.items() if name in SEARCH_PATHS
              for entry in value.replace(" ", ":").split(":") if entry.startswith("/")]
    named, sourced = named_paths(tests)
    tokens = sorted(t for t in named if any(_nests(t, d) for d in dirs))
    problems = [f"grading.capture {d!r}: the hidden tests source {t}, which the agent could "
                "write: the verifier's shell would run its code" for t in sorted(sourced)
                for d in dirs if _nests(t, d)]
    facts = _image_facts(spec, dirs, search, tokens)
    for kind, first, second in (f for d in dirs for f in facts.dirs[d]):
        if kind == "notdir":
            problems.append(f"grading.capture {first!r} is not a directory in the image (a "
                            "link or a file): capture the directory it lies in, or its target")
        elif kind == "moved":
            problems.append(f"grading.capture {first!r} lies behind a link in the image (it is "
                            f"{second} there): capture the directory by its own path")
        elif kind == "interp":
            problems.append(f"grading.capture: {first} is an interpreter's environment, which "
                            "the verifier's programs would run from; capture another directory")
    problems += [f"grading.capture: the hidden tests run {t}, a program the agent could "
                 "replace; capture another directory" for t in tokens if facts.executable[t]]
    used = [*(facts.uses or []), *((entry, facts.search[entry]) for entry in search)]
    for name, target in used:
        for d in dirs:
            if target.startswith("/") and _nests(target, d) and target != "/":
                problems.append(f"grading.capture {d!r}: the image's {name} is {target}, "
                                "which the verifier's programs use (a program, a library or a "
                                "search path); capture another directory")
    return sorted(set(problems))


def tree_problems(trees: Mapping[str, FileTree], tests: FileTree) -> list[str]:
    """``image_problems``' rules on captured trees as a setup step left them (its venv, its
    programs), which the image could not be asked about (red team, round forty-seven: a venv
    the setup made in a captured directory loaded, and its python was the agent's)."""
    named, _ = named_paths(tests)
    problems = []
    for where, tree in sorted(trees.items()):
        for path in sorted({*tree.files, *tree.links}):
            parts = path.split("/")
            if parts[-1] == "pyvenv.cfg" or (len(parts) > 1 and parts[-2] == "bin" and (
                    parts[-1] == "activate" or parts[-1].startswith("python"))):
                problems.append(f"grading.capture: {where}/{path} is an interpreter's "
                                "environment, which the verifier's programs would run from; "
                                "capture another directory")
                break
        for token in sorted(named):
            rel = posixpath.relpath(token, where) if _nests(token, where) else None
            if rel and rel in tree.files and tree.mode(rel) & 0o111:
                problems.append(f"grading.capture: the hidden tests run {token}, a program "
                                "the agent could replace; capture another directory")
    return problems


def named_paths(tests: FileTree) -> tuple[set[str], set[str]]:
    """The absolute paths the hidden tests' text names, and those it ``source``s or ``.``s."""
    named: set[str] = set()
    sourced: set[str] = set()
    for path in tests:
        text = tests[path].decode(errors="replace")
        named.update(posixpath.normpath(p) for p in PATH_TOKEN.findall(text))
        sourced.update(posixpath.normpath(p) for p in SOURCED.findall(text))
    return named, sourced


PATH_TOKEN = re.compile(r"(?<![\w.$~])(/[A-Za-z0-9._+@%-]+(?:/[A-Za-z0-9._+@%-]+)*)")
SOURCED = re.compile(r"(?:^|[;&|(\s])(?:source|\.)\s+[\"']?(/[^\s\"';&|)]+)", re.MULTILINE)


async def _exec(spec: SandboxSpec, argv: list[str]) -> str:
    try:
        sb = await create_sandbox(spec)
    except SandboxError as exc:
        raise SandboxError(f"cannot start the task's environment to check grading.capture: "
                           f"{exc}") from None
    try:
        result = await sb.exec(argv, timeout=120)
    finally:
        await sb.close()
    if result.exit_code != 0 or result.truncated:
        why = "its output was cut" if result.exit_code == 0 else result.stderr[-500:]
        raise SandboxError(f"checking grading.capture in the task's environment failed: {why}")
    return result.stdout


def pristine_trees(spec: SandboxSpec, dirs: tuple[str, ...], limits: Limits | None = None
                   ) -> tuple[dict[str, FileTree], list[str]]:
    """What the image holds at each of ``dirs`` (links as links), and what is wrong: a path
    that is not a directory there, or holds more than ``limits``."""
    # what a grading sandbox can hold there: the agent's tree is read within the same
    limits = (limits or Limits()).fitting_dir(spec.model_copy(update={"writable_dirs": dirs}))
    trees: dict[str, FileTree] = {}
    problems: list[str] = []
    for d in dirs:
        if spec.backend == "docker":
            tree, why = run_to_end(_image_tree(spec, d, limits))
        else:
            tree, why = _rootfs_tree(spec, d, limits)
        if why:
            problems.append(f"grading.capture {d!r}: {why}")
        elif tree.left_out:
            problems.append(f"grading.capture {d!r}: the image's files there are past what a "
                            f"grading sandbox of this size holds for a captured directory "
                            f"({limits.max_total_bytes >> 20} MiB, {limits.max_files} files; "
                            f"raise storage or memory): {', '.join(tree.left_out[:3])}")
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
    from tempering.sandbox.docker.api import DockerAPIError
    from tempering.sandbox.docker.backend import default_image
    from tempering.sandbox.docker.image import build_recipe, image_files

    try:
        ref = spec.image or (await build_recipe(spec.recipe) if spec.recipe else
                             default_image())
        found = await image_files(ref, path, max_files=limits.max_files,
                                  max_bytes=limits.max_total_bytes, links=True)
    except DockerAPIError as exc:
        if exc.status == 404:  # no such path: the engine makes the mount point
            return FileTree(), ""
        raise
    return FileTree(found.files, found.modes, tuple(found.left_out), links=found.links), ""


def run_to_end(coroutine: Any) -> Any:
    """Run ``coroutine`` to its end from synchronous code, inside an event loop or not (a
    task loads synchronously, and may be loaded from within a running loop)."""
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
