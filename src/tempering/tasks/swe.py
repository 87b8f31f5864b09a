"""SWE-bench-style instances as task directories (``tempering tasks import swe``).

An instance is one JSON object per line, with SWE-bench's fields (others are ignored):

    instance_id        the task's id (``owner__name-1234``)
    repo               ``owner/name``: a git repository found under ``--repos`` as
                       ``owner__name``, ``owner/name`` or ``name``
    base_commit        the commit the agent starts from
    problem_statement  the issue to resolve: the instruction
    patch              the gold patch: the reference solution
    test_patch         the tests that decide it: applied to the hidden tests only
    FAIL_TO_PASS       pytest ids the gold patch makes pass (a JSON list, or a string holding
    PASS_TO_PASS       one, as SWE-bench ships them); pytest ids that must still pass
    recipe             optional: a directory (relative to the file) with a Dockerfile that
                       starts FROM a local image; the task then runs on the docker backend in
                       what it builds
    image              optional: a local docker image to run in instead

Each becomes a task directory:

    workspace/   the repository's tree at ``base_commit``, and a ``.git`` holding one commit of
                 that tree and nothing else: ``git diff`` works, and there is no history to
                 mine (no parent, no other ref or reflog entry, no object of another commit)
    tests/       the tests directory after the test patch: hidden, replacing the visible one
                 file by file while grading (a file the test patch deletes leaves both)
    solution/    the files as the gold patch leaves them
    task.toml    pytest over the test files the lists name; ``scoring = "listed"``: the tests
                 component is 1 when every FAIL_TO_PASS and PASS_TO_PASS test passes (SWE-bench's
                 resolved), and each list is a component of its own

The repository is read with git's plumbing (``ls-tree``, ``cat-file``: no checkout, no
``.gitattributes`` filter, no hook), and the patches are applied in a scratch repository, so
the one under ``--repos`` is never written to. An instance the format cannot carry is refused
with the reason: a symbolic link or a submodule in the tree, ids that are not pytest's, test
files in no one directory, a gold patch that touches the tests or deletes a file.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tempering.errors import ConfigError
from tempering.tasks.task import load_task

GRADING_TIMEOUT_S = 300.0
_MODES = {b"100644": 0o644, b"100755": 0o755}
_GIT_IDENTITY = {"GIT_AUTHOR_NAME": "tempering", "GIT_AUTHOR_EMAIL": "tempering@localhost",
                 "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
                 "GIT_COMMITTER_NAME": "tempering", "GIT_COMMITTER_EMAIL": "tempering@localhost",
                 "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000"}

Files = dict[str, tuple[bytes, int]]
"""Paths (relative, ``/``-separated) to (content, mode)."""


class InstanceError(ConfigError):
    """An instance that cannot become a task; the message names it and says why."""


@dataclass(frozen=True)
class Instance:
    id: str
    repo: str
    base_commit: str
    problem: str
    patch: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    recipe: Path | None = None
    image: str | None = None


@dataclass(frozen=True)
class Imported:
    """One line's outcome: the task directory written, or why not."""

    line: int
    instance_id: str
    task_dir: Path | None
    error: str = ""


def read_instances(path: Path) -> Iterator[tuple[int, Instance | InstanceError]]:
    """Each non-blank line of ``path`` with its number, parsed, or the error that names it."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the instances: {exc}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield number, parse_instance(json.loads(line), path.parent)
            except json.JSONDecodeError as exc:
                yield number, InstanceError(f"line {number} is not JSON: {exc}")
            except InstanceError as exc:
                yield number, exc


def parse_instance(raw: object, base: Path) -> Instance:
    """An instance from one decoded line; ``base`` resolves a relative ``recipe``."""
    if not isinstance(raw, dict):
        raise InstanceError(f"an instance is a JSON object, not {type(raw).__name__}")
    name = raw.get("instance_id")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:+-]*", name):
        raise InstanceError(f"instance_id {name!r} is missing or not a name (letters, digits "
                            "and _.:+-)")

    def text(key: str, required: bool = True) -> str:
        value = raw.get(key, None if required else "")
        if not isinstance(value, str) or (required and not value.strip()):
            raise InstanceError(f"{name}: {key} is missing or not a string (given "
                                f"{str(value)[:60]!r})")
        return value

    recipe, image = raw.get("recipe"), raw.get("image")
    if recipe is not None and image is not None:
        raise InstanceError(f"{name}: give recipe or image, not both")
    if recipe is not None:
        if not isinstance(recipe, str) or not (base / recipe / "Dockerfile").is_file():
            raise InstanceError(f"{name}: recipe {recipe!r} is not a directory with a "
                                f"Dockerfile (relative to {base})")
        recipe = (base / recipe).resolve()
    if image is not None and not isinstance(image, str):
        raise InstanceError(f"{name}: image {image!r} is not an image name")
    commit = text("base_commit")
    if not re.fullmatch(r"[0-9a-fA-F]{7,64}", commit):
        raise InstanceError(f"{name}: base_commit {commit!r} is not a commit id")
    return Instance(name, text("repo"), commit, text("problem_statement"), text("patch"),
                    text("test_patch"), _ids(raw, "FAIL_TO_PASS", name),
                    _ids(raw, "PASS_TO_PASS", name), recipe, image)


def _ids(raw: dict[str, object], key: str, name: str) -> list[str]:
    value = raw.get(key, [])
    if isinstance(value, str):  # SWE-bench ships the lists as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise InstanceError(f"{name}: {key} is a string but not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise InstanceError(f"{name}: {key} must be a list of test ids")
    bad = [i for i in value if "::" not in i or not i.split("::")[0].endswith(".py")]
    if bad:
        raise InstanceError(f"{name}: {key} id {bad[0]!r} is not a pytest id "
                            "(path/test_x.py::test_name): only pytest instances import")
    return value


def find_repo(repos: Path, repo: str) -> Path:
    """The git repository of ``owner/name`` under ``repos``."""
    owner, _, short = repo.rpartition("/")
    candidates = [repos / f"{owner}__{short}", repos / repo, repos / short] if owner else [
        repos / repo]
    for path in candidates:
        if path.is_dir() and _git_ok(path, "rev-parse", "--git-dir"):
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise InstanceError(f"repository {repo!r} is not under {repos} (looked for a git "
                        f"repository at {tried})")


def import_instances(path: Path, repos: Path, out: Path, *,
                     timeout_s: float = GRADING_TIMEOUT_S,
                     on_done: Callable[[Imported], None] | None = None) -> list[Imported]:
    """Write a task directory under ``out`` for each instance of ``path``; an instance that
    cannot become one is reported and the others go on. A task directory already there is
    replaced whole, once its successor loads."""
    if not repos.is_dir():
        raise ConfigError(f"--repos {repos}: not a directory")
    out.mkdir(parents=True, exist_ok=True)
    done, seen = [], set()
    for number, parsed in read_instances(path):
        if isinstance(parsed, InstanceError):
            result = Imported(number, "", None, str(parsed))
        elif parsed.id in seen:
            result = Imported(number, parsed.id, None, f"{parsed.id} appears twice in {path}")
        else:
            seen.add(parsed.id)
            try:
                result = Imported(number, parsed.id, write_task(
                    parsed, find_repo(repos, parsed.repo), out, timeout_s))
            except InstanceError as exc:
                result = Imported(number, parsed.id, None, str(exc))
        done.append(result)
        if on_done is not None:
            on_done(result)
    if not done:
        raise ConfigError(f"{path}: no instance in it (one JSON object per line)")
    return done


def write_task(instance: Instance, repo: Path, out: Path,
               timeout_s: float = GRADING_TIMEOUT_S) -> Path:
    """The task directory of ``instance`` (``out/<instance_id>``), loaded once to check it."""
    name = instance.id
    base = tree_at(repo, instance.base_commit, name)
    with tempfile.TemporaryDirectory(prefix="tempering-swe-") as scratch:
        tests_changed = apply_patch(base, instance.test_patch, Path(scratch) / "tests",
                                    f"{name}: test_patch")
        gold = apply_patch(base, instance.patch, Path(scratch) / "gold", f"{name}: patch")
    files = sorted({i.split("::")[0] for i in [*instance.fail_to_pass, *instance.pass_to_pass]})
    if not files:
        raise InstanceError(f"{name}: FAIL_TO_PASS and PASS_TO_PASS are both empty: nothing "
                            "would decide the task")
    after = {p: v for p, v in {**base, **tests_changed}.items() if v is not None}
    missing = [f for f in files if f not in after]
    if missing:
        raise InstanceError(f"{name}: the lists name {missing[0]}, which is not in the "
                            "repository after the test patch")
    tests_dir = _common_dir([*files, *tests_changed])
    if not tests_dir:
        raise InstanceError(f"{name}: the test files ({', '.join([*files, *tests_changed][:4])}) "
                            "share no directory: the hidden tests are one directory")
    inside = [p for p in gold if p == tests_dir or p.startswith(tests_dir + "/")]
    if inside:
        raise InstanceError(f"{name}: the gold patch changes {inside[0]}, in the tests "
                            f"directory {tests_dir}/ that grading replaces")
    deleted = [p for p, v in gold.items() if v is None]
    if deleted:
        raise InstanceError(f"{name}: the gold patch deletes {deleted[0]}; a solution here "
                            "holds files, not deletions")
    hidden = {p.removeprefix(tests_dir + "/"): v for p, v in after.items()
              if p.startswith(tests_dir + "/")}
    # A file the test patch deletes stays visible and hidden alike (load_task asks every
    # visible file in the tests directory for its hidden counterpart).
    hidden |= {p.removeprefix(tests_dir + "/"): base[p] for p, v in tests_changed.items()
               if v is None and p.startswith(tests_dir + "/")}
    target = out / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out))
    try:
        _write_files(staging / "workspace", base)
        one_commit_repository(staging / "workspace", f"{instance.repo} at "
                              f"{instance.base_commit[:12]}")
        _write_files(staging / "tests", hidden)
        _write_files(staging / "solution", {p: v for p, v in gold.items() if v is not None})
        if instance.recipe is not None:
            shutil.copytree(instance.recipe, staging / "environment", symlinks=True)
        (staging / "instruction.md").write_text(_instruction(instance, tests_dir))
        (staging / "task.toml").write_text(_task_toml(instance, tests_dir, files, timeout_s))
        try:
            load_task(staging)
        except ConfigError as exc:
            raise InstanceError(f"{name}: the task written does not load: {exc}") from None
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def tree_at(repo: Path, commit: str, name: str) -> Files:
    """Every file of ``commit`` in ``repo``, as git stores it (no filter, no checkout)."""
    if not _git_ok(repo, "cat-file", "-e", f"{commit}^{{commit}}"):
        raise InstanceError(f"{name}: base_commit {commit} is not a commit of {repo}")
    listing = _git(repo, "ls-tree", "-r", "-z", "--full-tree", commit)
    entries: list[tuple[str, int, bytes]] = []
    odd: list[str] = []
    for record in filter(None, listing.split(b"\0")):
        meta, _, raw_path = record.partition(b"\t")
        mode, _, sha = meta.split(b" ")
        try:
            path = raw_path.decode()
        except UnicodeDecodeError:
            raise InstanceError(f"{name}: the path {raw_path!r} is not UTF-8") from None
        if mode not in _MODES:
            odd.append(f"{path} ({'symbolic link' if mode == b'120000' else 'submodule'})")
        else:
            entries.append((path, _MODES[mode], sha))
    if odd:
        raise InstanceError(f"{name}: the tree holds what a task cannot carry: "
                            f"{', '.join(odd[:3])}")
    blobs = _git(repo, "cat-file", "--batch", data=b"".join(s + b"\n" for _, _, s in entries))
    files: Files = {}
    at = 0
    for path, perm, _ in entries:
        header_end = blobs.index(b"\n", at)
        size = int(blobs[at:header_end].split()[2])
        files[path] = (blobs[header_end + 1:header_end + 1 + size], perm)
        at = header_end + 2 + size
    return files


def apply_patch(base: Files, patch: str, scratch: Path, what: str) -> dict[str, tuple[
        bytes, int] | None]:
    """What ``patch`` changes in ``base``: each path's new (content, mode), or None where it
    deletes the file. Applied by ``git apply`` in a scratch repository of ``base``."""
    _write_files(scratch, base)
    _git(scratch, "init", "-q", "--template=")
    check = _run(scratch, "apply", "--check", "--binary", "-", data=patch.encode())
    if check.returncode != 0:
        raise InstanceError(f"{what} does not apply to base_commit: "
                            f"{_last_line(check.stderr)}")
    _git(scratch, "apply", "--binary", "-", data=patch.encode())
    after: Files = {}
    for where in scratch.rglob("*"):
        path = where.relative_to(scratch).as_posix()
        if path == ".git" or path.startswith(".git/"):
            continue
        if where.is_symlink():
            raise InstanceError(f"{what} makes {path} a symbolic link")
        if where.is_file():
            after[path] = (where.read_bytes(), 0o755 if where.stat().st_mode & 0o111 else 0o644)
    changed: dict[str, tuple[bytes, int] | None] = {p: None for p in base if p not in after}
    changed |= {p: v for p, v in after.items() if base.get(p) != v}
    return changed


def one_commit_repository(workdir: Path, message: str) -> None:
    """``workdir``'s files as the one commit of a new repository on ``main``, packed: no
    parent, no other ref, no object that commit does not hold."""
    _git(workdir, "init", "-q", "--template=", "--initial-branch=main")
    _git(workdir, "add", "--all", "--force")
    _git(workdir, "commit", "-q", "--no-verify", "--no-gpg-sign", "-m", message)
    _git(workdir, "repack", "-a", "-d", "-q")
    _git(workdir, "prune-packed")


def _common_dir(paths: list[str]) -> str:
    dirs = [posixpath.dirname(p) for p in paths]
    if any(not d for d in dirs):
        return ""
    return posixpath.commonpath(dirs)


def _write_files(root: Path, files: dict[str, tuple[bytes, int]]) -> None:
    for path, (data, mode) in files.items():
        where = root / path
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_bytes(data)
        where.chmod(mode)
    root.mkdir(parents=True, exist_ok=True)


def _instruction(instance: Instance, tests_dir: str) -> str:
    return (f"The repository {instance.repo} is checked out in the working directory (commit "
            f"{instance.base_commit[:12]}). Resolve the issue below by changing its code. Its "
            f"tests are in {tests_dir}/ and run with `python3 -m pytest`; more tests will run "
            "when you submit, and changes to the tests are not taken.\n\n"
            f"{instance.problem.strip()}\n")


def _task_toml(instance: Instance, tests_dir: str, files: list[str], timeout_s: float) -> str:
    first = instance.problem.strip().splitlines()[0] if instance.problem.strip() else ""
    lines = ["[task]", f"id = {_toml(instance.id)}", f"family = {_toml(instance.repo)}",
             f"description = {_toml(f'{instance.repo}: {first}'[:160])}", ""]
    lines += ["[sandbox]", "memory_mb = 1024"]
    if instance.recipe is not None:
        lines += ['backend = "docker"', 'recipe = "environment"']
    elif instance.image is not None:
        lines += ['backend = "docker"', f"image = {_toml(instance.image)}"]
    lines += ["", "[grading]",
              f"command = {_toml(' '.join(['python3', '-m', 'pytest', *files]))}",
              f"timeout_s = {float(timeout_s)}", f"tests_dir = {_toml(tests_dir)}",
              'scoring = "listed"',
              f"fail_to_pass = [{', '.join(map(_toml, instance.fail_to_pass))}]",
              f"pass_to_pass = [{', '.join(map(_toml, instance.pass_to_pass))}]", "",
              "[reward]", "tests = 1.0", ""]
    return "\n".join(lines)


def _toml(value: str) -> str:
    """A TOML basic string."""
    escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7f
                      else "\\" + c if c in '"\\' else c for c in value)
    return f'"{escaped}"'


def _git_env() -> dict[str, str]:
    # No configuration but ours: a user's global config could add filters, hooks or signing.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0", "HOME": os.devnull, **_GIT_IDENTITY}


def _run(cwd: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True,
                              env=_git_env(), check=False)
    except FileNotFoundError:
        raise ConfigError("git is not installed: importing instances needs it") from None


def _git(cwd: Path, *args: str, data: bytes | None = None) -> bytes:
    done = _run(cwd, *args, data=data)
    if done.returncode != 0:
        raise InstanceError(f"git {args[0]} in {cwd} failed: {_last_line(done.stderr)}")
    return done.stdout


def _git_ok(cwd: Path, *args: str) -> bool:
    return _run(cwd, *args).returncode == 0


def _last_line(stderr: bytes) -> str:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "(no message)"
