"""Harbor (Terminal-Bench 2) task directories, loaded as they are.

    task.toml          version, [metadata], [verifier], [agent], [environment], [solution]
    instruction.md     what the agent is told
    environment/       a Dockerfile (FROM an image built here: nothing is pulled) and its files
    tests/test.sh      the verifier: writes /logs/verifier/reward.txt or reward.json
    solution/solve.sh  the reference: a script run in the agent's environment

``load_task`` takes such a directory (it has ``tests/test.sh`` and no ``[task]`` table) and makes
a ``Task`` of it:

- the environment: ``environment.docker_image``, or the Dockerfile built by the docker backend
  (``recipe``); its ``WORKDIR`` is the sandbox's workdir, and what the image holds there is the
  task's workspace (read from the built image once: the pristine tree the agent's changes are
  taken against). A Dockerfile of ``FROM``, ``WORKDIR``, ``COPY``/``ADD`` of local files into
  the workdir, ``ENV`` and ``LABEL`` only needs no image at all: with ``backend="local"``
  (``load_task(path, backend="local")``) the workspace is the copied files and the sandbox this
  host's system;
- ``cpus``, ``memory_mb`` (or ``memory = "4G"``), ``storage_mb`` (or ``storage``) and
  ``allow_internet`` (default off here) become the sandbox's limits;
- the verifier: ``runner = "script"``, ``bash /tests/test.sh`` with the tests at ``/tests``
  (read-only), ``[verifier] timeout_sec`` and ``env`` (``reward/script.py``);
- the solution: ``solution/`` is run as ``bash solve.sh`` in the agent's sandbox (its files at
  ``/tmp/solution``) by ``tempering tasks validate``, which then grades the sandbox;
- ``[tempering] capture`` (this project's key, which harbor ignores): the directories of the
  image the grade depends on beside the workdir (``grading.capture``, ``tasks/capture.py``);
  ``[tempering] tracing = true``: the verifier's processes may trace one another
  (``grading.tracing``: for a test that attaches to a running process, or LeakSanitizer).

What the format has that this cannot honour is refused with an error that says so: several
containers (``docker-compose.yaml``), an LLM judge, multi-step tasks, GPUs, MCP servers. The
verifier runs as the sandbox's unprivileged user whatever ``[verifier] user`` says, and the
agent's time limit is the rollout's, not ``[agent] timeout_sec`` (both noted in the task's
description so a reader sees them).
"""

from __future__ import annotations

import posixpath
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tempering.errors import ConfigError, SandboxError
from tempering.sandbox import SandboxSpec
from tempering.sandbox.spec import host_cpus
from tempering.tasks.capture import run_to_end
from tempering.tasks.files import FileTree, Limits
from tempering.tasks.task import (
    HARBOR_TESTS,
    GradingConfig,
    Task,
    TaskConfig,
    TaskInfo,
    environment_of,
)

SOLUTION_DIR = "/tmp/solution"
SOLVE_TIMEOUT_S = 600.0
_LOCAL_INSTRUCTIONS = {"FROM", "WORKDIR", "COPY", "ADD", "ENV", "LABEL", "ARG", "USER",
                       "SHELL", "CMD", "ENTRYPOINT"}
_UNSUPPORTED = {
    "environment/docker-compose.yaml": "several containers (docker-compose)",
    "environment/docker-compose.yml": "several containers (docker-compose)",
    "environment/compose.yaml": "several containers (compose)",
}


def is_harbor_task(root: Path) -> bool:
    """Whether ``root`` is laid out as a harbor task (and not as one of ours)."""
    if not (root / "tests" / "test.sh").is_file() or not (root / "task.toml").is_file():
        return False
    try:
        raw = tomllib.loads((root / "task.toml").read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
        return False
    return "task" not in raw


def load_harbor_task(root: Path, limits: Limits | None = None,
                     backend: str | None = None) -> Task:
    """The ``Task`` of harbor task directory ``root``; ConfigError names every problem."""
    problems: list[str] = []
    raw = tomllib.loads((root / "task.toml").read_text())
    for path, what in _UNSUPPORTED.items():
        if (root / path).exists():
            problems.append(f"{path}: {what} cannot be run here; a task is one sandbox")
    verifier = _table(raw, "verifier", problems)
    environment = _table(raw, "environment", problems)
    agent = _table(raw, "agent", problems)
    ours = _table(raw, "tempering", problems)  # this project's own keys: capture, tracing
    capture = ours.get("capture", [])
    if not isinstance(capture, list) or not all(isinstance(c, str) for c in capture):
        problems.append(f"[tempering] capture must be a list of absolute paths, not {capture!r}")
        capture = []
    tracing = ours.get("tracing", False)
    if not isinstance(tracing, bool):
        problems.append(f"[tempering] tracing must be true or false, not {tracing!r}")
        tracing = False
    unknown = sorted(set(ours) - {"capture", "tracing"})
    if unknown:
        problems.append(f"[tempering] {', '.join(unknown)}: unknown keys (capture, tracing)")
    if verifier.get("type", "test-script") != "test-script" or "judge" in verifier:
        problems.append("[verifier]: an LLM judge is not supported: a grade here comes from "
                        "the task's own test script, never from a model")
    if raw.get("steps"):
        problems.append("[[steps]]: multi-step tasks are not supported")
    if environment.get("gpus") or environment.get("gpu_types"):
        problems.append("[environment] gpus: sandboxes here have no GPU")
    if raw.get("mcp_servers") or environment.get("mcp_servers"):
        problems.append("mcp_servers: MCP servers are not supported")
    instruction = ""
    if not (root / "instruction.md").is_file():
        problems.append("instruction.md is missing")
    else:
        instruction = (root / "instruction.md").read_text(errors="replace")
    tests = FileTree.read(root / "tests", limits)
    problems += [f"tests/{entry}: left out" for entry in tests.left_out]
    solution = FileTree.read(root / "solution", limits) if (root / "solution").is_dir() else None
    if solution is not None and "solve.sh" not in solution:
        problems.append("solution/ has no solve.sh")
    if problems:
        raise ConfigError(f"invalid harbor task {root}:\n" +
                          "\n".join(f"  - {p}" for p in problems))
    sandbox, workspace = _environment(root, environment, limits, backend)
    grading = GradingConfig(runner="script", command=f"bash {HARBOR_TESTS}/test.sh",
                            tests_dir=HARBOR_TESTS, capture=capture, tracing=tracing,
                            timeout_s=float(verifier.get("timeout_sec", 600.0)),
                            env={str(k): str(v) for k, v in
                                 (verifier.get("env") or {}).items()})
    metadata = _table(raw, "metadata", [])
    first = next((line.strip("# ").strip() for line in instruction.splitlines()
                  if line.strip()), "")
    notes = []
    if verifier.get("user") not in (None, "", "agent"):
        notes.append(f"verifier runs unprivileged, not as {verifier['user']}")
    if agent.get("timeout_sec") is not None:
        notes.append(f"agent timeout {agent['timeout_sec']} s is the rollout's to keep")
    info = TaskInfo(id=_task_id(root), family=str(metadata.get("category", "")),
                    description=(first[:120] + (f" ({'; '.join(notes)})" if notes else "")))
    try:
        config = TaskConfig(task=info, sandbox=sandbox, grading=grading)
    except ValidationError as exc:
        raise ConfigError(f"invalid harbor task {root}:\n" + "\n".join(
            f"  - {e['msg'].removeprefix('Value error, ')}" for e in exc.errors())) from None
    environment, problems = environment_of(config, tests, limits)
    if problems:
        raise ConfigError(f"invalid harbor task {root}:\n" +
                          "\n".join(f"  - {p}" for p in problems))
    return Task(config, instruction, workspace, tests, None, FileTree(), root, solve=solution,
                environment=environment)


def _table(raw: dict[str, Any], name: str, problems: list[str]) -> dict[str, Any]:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        problems.append(f"task.toml [{name}] is not a table")
        return {}
    return value


def _task_id(root: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_.:+-]", "-", root.resolve().name).strip("-.") or "task"
    return f"harbor/{name}"


def _environment(root: Path, env: dict[str, Any], limits: Limits | None,
                 backend: str | None) -> tuple[SandboxSpec, FileTree]:
    """The sandbox spec and the pristine workspace of the task's environment."""
    limits = limits or Limits()
    image = env.get("docker_image")
    dockerfile = root / "environment" / "Dockerfile"
    if image is None and not dockerfile.is_file():
        raise ConfigError(f"invalid harbor task {root}: no environment/Dockerfile and no "
                          "[environment] docker_image")
    sized: dict[str, Any] = {
        "cpus": min(float(env.get("cpus", 1)), float(host_cpus())),
        "memory_mb": max(64, _megabytes(env, "memory_mb", "memory", 2048, root)),
        "disk_mb": _megabytes(env, "storage_mb", "storage", 10240, root),
        "network": bool(env.get("allow_internet", False))}
    steps = _dockerfile(dockerfile) if image is None else []
    local_ok = image is None and all(step[0] in _LOCAL_INSTRUCTIONS for step in steps)
    chosen = backend or "docker"
    if chosen == "local" and not local_ok:
        raise ConfigError(f"harbor task {root}: its environment needs its image built "
                          "(RUN steps, or a docker_image): load it with the docker backend")
    if chosen == "local":
        workdir, tree = _local_workspace(root, steps)
        return SandboxSpec(backend="local", workdir=workdir, **sized), tree
    where: dict[str, Any] = ({"image": str(image)} if image is not None else
                             {"recipe": str(dockerfile.parent.resolve())})
    spec = SandboxSpec(backend="docker", **where, **sized)
    workdir, files, modes, left_out = run_to_end(_image_workspace(spec, limits))
    if left_out:
        raise ConfigError(f"harbor task {root}: its image's {workdir} holds what a task cannot "
                          f"carry: {', '.join(left_out[:3])}")
    try:  # the workdir checked as any other (not a system directory)
        spec = SandboxSpec(backend="docker", workdir=workdir, **where, **sized)
    except ValueError as exc:
        raise ConfigError(f"harbor task {root}: {exc}") from None
    return spec, FileTree(files, modes)


async def _image_workspace(spec: SandboxSpec, limits: Limits
                           ) -> tuple[str, dict[str, bytes], dict[str, int], list[str]]:
    from tempering.sandbox.docker.image import build_recipe, image_files

    try:
        ref = spec.image or await build_recipe(spec.recipe or "")
        found = await image_files(ref, max_files=limits.max_files,
                                  max_bytes=limits.max_total_bytes)
    except SandboxError as exc:
        raise ConfigError(f"the task's environment: {exc}") from None
    return found.workdir, found.files, found.modes, found.left_out


def _megabytes(env: dict[str, Any], exact: str, spelled: str, default: int, root: Path) -> int:
    if exact in env:
        return int(env[exact])
    if spelled not in env:
        return default
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(env[spelled]),
                         re.IGNORECASE)
    if match is None:
        raise ConfigError(f"harbor task {root}: [environment] {spelled} = {env[spelled]!r} is "
                          "not a size such as '4G' or '512M'")
    scale = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}
    return int(float(match.group(1)) * scale[match.group(2).upper()])


def _dockerfile(path: Path) -> list[tuple[str, list[str]]]:
    """The Dockerfile's instructions: (INSTRUCTION, arguments), continuation lines joined."""
    steps: list[tuple[str, list[str]]] = []
    logical = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not logical and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        word, _, rest = logical.partition(" ")
        try:
            args = shlex.split(rest)
        except ValueError:
            args = rest.split()
        steps.append((word.upper(), args))
        logical = ""
    return steps


def _local_workspace(root: Path, steps: list[tuple[str, list[str]]]
                     ) -> tuple[str, FileTree]:
    """The workdir and its files, for a Dockerfile that only copies local files into it."""
    workdir = "/"
    files: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    context = (root / "environment").resolve()
    for word, args in steps:
        if word == "WORKDIR" and args:
            workdir = posixpath.normpath(posixpath.join(workdir, args[0]))
        elif word in ("COPY", "ADD"):
            plain = [a for a in args if not a.startswith("--")]
            if len(plain) < 2:
                continue
            *sources, dest = plain
            target = posixpath.normpath(posixpath.join(workdir, dest))
            if target != workdir and not target.startswith(workdir.rstrip("/") + "/"):
                raise ConfigError(f"harbor task {root}: {word} {' '.join(args)} copies outside "
                                  f"the workdir {workdir}: load it with the docker backend")
            inside = target[len(workdir):].strip("/")
            into_dir = dest.endswith("/") or len(sources) > 1
            for source in sources:
                origin = (context / source).resolve()
                if not origin.is_relative_to(context) or not origin.exists():
                    raise ConfigError(f"harbor task {root}: {word} source {source!r} is not in "
                                      "environment/")
                if origin.is_dir():
                    tree = FileTree.read(origin)
                    for name in tree:
                        path = posixpath.join(inside, name) if inside else name
                        files[path], modes[path] = tree[name], tree.mode(name)
                else:
                    path = posixpath.join(inside, origin.name) if into_dir or not inside else (
                        inside)
                    files[path] = origin.read_bytes()
                    modes[path] = 0o755 if origin.stat().st_mode & 0o111 else 0o644
    if workdir == "/":
        raise ConfigError(f"harbor task {root}: the Dockerfile sets no WORKDIR: the agent's "
                          "work is taken from its working directory")
    return workdir, FileTree(files, modes)
