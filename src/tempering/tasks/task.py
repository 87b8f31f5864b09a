"""The task format: a directory with ``task.toml``, and the ``Task`` it loads into.

    task.toml        id, sandbox limits, grading command, protected paths, reward weights
    instruction.md   what the agent is told
    workspace/       the files the agent starts with
    tests/           hidden tests: they exist only inside the grading sandbox
    verifiers/       optional, hidden too: files the task's own verifiers run
    solution/        optional reference files; a task whose solution does not score 1 is invalid

Loading validates everything and reports every bad field at once, each named by its path in
``task.toml`` (``grading.timeout_s``), so an author fixes a task in one pass. A ``Task`` holds
its files in memory: the grader copies them into fresh sandboxes and never reads the task
directory again, so editing a task directory mid-run changes nothing already loaded.
"""

from __future__ import annotations

import functools
import keyword
import posixpath
import shlex
import tomllib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tempering.errors import ConfigError, SandboxError
from tempering.sandbox import Sandbox, SandboxSpec
from tempering.tasks.capture import check_paths, extra_dirs, image_problems, pristine_trees
from tempering.tasks.files import FileTree, Limits, check_path

BUILTIN_COMPONENTS = ("tests", "lint", "rules", "fail_to_pass", "pass_to_pass")
HARBOR_TESTS = "/tests"  # where a harbor task's verifier finds its tests (sandbox/host.py)
SCRIPT_SHELLS = ("bash", "sh", "python3", "python")  # what a test script's command may start


def pytest_args(command: str) -> list[str]:
    """The arguments of a pytest invocation (``python3 -m pytest ARGS`` or ``pytest ARGS``)."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"grading command {command!r} does not parse: {exc}") from None
    if argv[:1] in (["pytest"], ["py.test"]):
        return argv[1:]
    if len(argv) >= 3 and argv[0] in ("python", "python3") and argv[1:3] == ["-m", "pytest"]:
        return argv[3:]
    raise ValueError(f"grading command {command!r} is not a pytest invocation: write it as "
                     "'python3 -m pytest PATHS...'; put other scoring in a [[verifiers]] entry")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class TaskInfo(_Model):
    id: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:/+-]+$")]
    """Unique name of the task (letters, digits and ``_.:/+-``), e.g. ``HumanEval/0``."""
    description: str = ""
    """One line for listings and reports."""
    family: str = ""
    """Group of similar tasks (the scheduler learns durations per family); default: the id."""


class GradingConfig(_Model):
    runner: Literal["pytest", "plain", "script"] = "pytest"
    """``pytest``: the command's pytest, under the grader's launcher. ``plain``: test functions
    and ``Test*`` classes without fixtures are called directly, with the same report and
    checks but without pytest's start-up (about 150 ms of CPU a grading); the command then
    gives paths only. ``script``: the command is the task's own test script (``bash
    tests/test.sh``, any language), run in the workdir; it writes its reward to
    ``$VERIFIER_DIR/reward.txt`` (a number) or ``reward.json`` (``reward`` and named
    components), as harbor's do (``reward/script.py``)."""
    command: str = "python3 -m pytest tests"
    """A pytest invocation (``python3 -m pytest`` or ``pytest``, then paths and options); the
    grader runs it under its own launcher, configuration and report, never the workspace's."""
    timeout_s: Annotated[float, Field(gt=0, le=24 * 3600)] = 60.0
    """Wall-clock limit of the test run; tests not finished by then fail."""
    components: list[str] = []
    """For ``runner = "script"``: the components ``reward.json`` gives beside ``reward`` that
    the task weighs (a name reward.json lacks scores 0)."""
    env: dict[str, str] = {}
    """For ``runner = "script"``: environment variables of the test script (never the
    agent's)."""
    capture: list[str] = []
    """The directories of the environment the grade depends on (absolute paths): the agent's
    tree under each, links as links, is laid into the same directory of the fresh grading
    sandbox; nothing else it changed reaches the grading. Default: the workdir only. Another
    directory of the image (``/etc/myapp``) becomes writable for the agent, starting as the
    image has it (``tasks/capture.py``); one that would let the agent replace the verifier's
    interpreter or tools is refused."""
    tests_dir: str = "tests"
    """Where the hidden tests are placed in the grading sandbox, relative to the workdir; for
    ``runner = "script"`` also ``/tests`` (harbor's place, outside the workdir)."""
    scoring: Literal["fraction", "all", "listed"] = "fraction"
    """``fraction``: the tests component is passed / expected; ``all``: 1 only if all pass;
    ``listed``: 1 only if every test of ``fail_to_pass`` and ``pass_to_pass`` passed (SWE-bench's
    resolved: the outcome of a test neither list names does not count)."""
    expected_tests: Annotated[int, Field(ge=1)] | None = None
    """How many tests must run; default: counted once by collecting the hidden tests against
    the reference solution (or the untouched workspace)."""
    protected: list[str] = []
    """Glob patterns (or directories, ``data/``) the agent may not change: its edits there are
    dropped and flagged. The hidden tests directory is always protected."""
    isolation: Literal["auto", "data", "process", "shared"] = "auto"
    """``data``: the tested code runs in a process of its own, and only data comes back from
    it (``reward/inside_boundary.py``): nothing in it can reach the tests' frames, their
    expected values or the runner, or make an assertion lie; an object of its own classes is
    refused. ``process``: the same process of its own, but its objects come back as handles
    (the tests' operations on them go to it). ``shared``: one process, guarded and probed
    (what tests that patch the tested code, read its logs or warnings, or pass it objects of
    their own need). ``auto``: ``data`` where the hidden tests' syntax allows it and the
    reference solution passes so, else ``shared`` (``reward/isolation.py``)."""
    allow_binaries: bool = False
    """Whether compiled modules the agent leaves (``*.so``, ``*.pyd``: Python imports them
    before a ``.py`` of the same name) reach the grading sandbox. Off, they are dropped with
    the ``binary_dropped`` note; turn it on for tasks that build extensions."""
    tracing: bool = False
    """Whether the grading sandbox's processes may reach into one another (ptrace attach,
    pidfd_getfd, process_vm_readv/writev, writing /proc/PID/mem; ``SandboxSpec.tracing``).
    Off, the default: the tested code, started by a runner (pytest, a script's helper, a
    command verifier), cannot attach to the runner, take its descriptors with pidfd_getfd or
    write its memory (reading it, and reopening its pipes through /proc/PID/fd, stay open:
    docs/rewards.md). Turn it on only for tests that attach to a running process
    (``strace -p``, ``gdb -p``, LeakSanitizer's leak check, which
    ``ASAN_OPTIONS=detect_leaks=0`` also avoids; OpenMPI's CMA transport, py-spy), knowing
    that the tested code can then reach its runner; on, a plain-runner task is graded in a
    sandbox of its own rather than by the grading zygote (slower)."""
    fail_to_pass: list[str] = []
    """Hidden test ids (``tests/test_x.py::test_name``; a parametrized test by its name, then
    every case counts) that fail on the untouched workspace and that the agent's change must
    make pass: SWE-bench's FAIL_TO_PASS. The ``fail_to_pass`` component is the fraction of them
    that passed; a test that did not run counts as failed."""
    pass_to_pass: list[str] = []
    """Hidden test ids that pass on the untouched workspace and must still pass
    (PASS_TO_PASS); the ``pass_to_pass`` component likewise. With either list and ``scoring =
    "all"``, the tests component is 1 only when every test ran, passed, and both lists are
    whole: the instance is resolved."""

    @model_validator(mode="after")
    def _runner_command(self) -> GradingConfig:
        if self.runner == "script":
            if not self.command.strip():
                raise ValueError("grading.command is empty: give the test script's command, "
                                 "e.g. 'bash tests/test.sh'")
            operators = _shell_operators(self.command)
            words = [] if operators else shlex.split(self.command)
            if words and posixpath.basename(words[0]) not in SCRIPT_SHELLS:
                shells = ", ".join(SCRIPT_SHELLS)
                raise ValueError(f"grading.command {self.command!r} starts {words[0]!r}: the "
                                 "program the command starts takes the shell's place and must "
                                 f"be one that loads the grader's guard ({shells}): write it "
                                 "as 'bash tests/test.sh' (a wrapper such as env or timeout "
                                 "would run the script as a program of its own, unable to "
                                 "write its verdict; use grading.timeout_s)")
            if operators:
                raise ValueError(f"grading.command {self.command!r} is not one simple command "
                                 f"({' '.join(operators)}): the shell runs it in its own place, "
                                 "and only that shell can write the verdict; put pipes, "
                                 "redirections and lists inside the script")
            pytest_only = [name for name in ("fail_to_pass", "pass_to_pass", "expected_tests")
                           if getattr(self, name)]
            if pytest_only or self.scoring != "fraction" or self.isolation != "auto":
                raise ValueError(f"grading.{(pytest_only or ['scoring or isolation'])[0]} is for "
                                 "the pytest and plain runners; a test script writes its own "
                                 "reward")
            for name in self.components:
                if not name.isidentifier() or keyword.iskeyword(name) or (
                        name in BUILTIN_COMPONENTS):
                    raise ValueError(f"grading.components: {name!r} must be an identifier "
                                     f"other than {', '.join(BUILTIN_COMPONENTS)}")
            return self
        if self.components or self.env:
            raise ValueError("grading.components and grading.env are for runner 'script'")
        options = [a for a in pytest_args(self.command) if a.startswith("-")]
        if self.runner == "plain" and options:
            raise ValueError(f"runner 'plain' takes test paths only, not {' '.join(options)}: "
                             "use runner = 'pytest' for pytest options")
        return self

    @model_validator(mode="after")
    def _test_lists(self) -> GradingConfig:
        where = self.tests_dir.rstrip("/") + "/"
        for name, ids in (("fail_to_pass", self.fail_to_pass),
                          ("pass_to_pass", self.pass_to_pass)):
            malformed = [i for i in ids if "::" not in i or not i.startswith(where)
                         or not i.split("::")[0].endswith(".py")]
            if malformed:
                raise ValueError(f"grading.{name}: {malformed[:3]} are not test ids; write "
                                 f"them as the grader reports them: {where}test_x.py::test_name")
            doubled = sorted(i for i, n in Counter(ids).items() if n > 1)
            if doubled:
                raise ValueError(f"grading.{name} lists {doubled[:3]} more than once")
        if self.scoring == "listed" and not (self.fail_to_pass or self.pass_to_pass):
            raise ValueError("grading.scoring 'listed' needs grading.fail_to_pass or "
                             "grading.pass_to_pass: the lists are what it scores")
        both = _overlap(self.fail_to_pass, self.pass_to_pass)
        if both:
            raise ValueError(f"{both[:3]} are in both grading.fail_to_pass and "
                             "grading.pass_to_pass (a parametrized test's name covers its "
                             "cases); a test is in one or the other")
        return self

    @field_validator("command")
    @classmethod
    def _pytest(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("runner") != "script":
            pytest_args(value)  # raises ValueError naming what is not a pytest invocation
        return value

    @field_validator("tests_dir")
    @classmethod
    def _relative(cls, value: str, info: ValidationInfo) -> str:
        if value.rstrip("/") == HARBOR_TESTS and info.data.get("runner") == "script":
            return HARBOR_TESTS
        return check_path(value)


def _shell_operators(command: str) -> list[str]:
    """The shell operators of ``command`` (pipes, redirections, lists, background)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return [t for t in lexer if t and all(c in "();<>|&" for c in t)]
    except ValueError:
        return ["(does not parse)"]


def _overlap(first: list[str], second: list[str]) -> list[str]:
    """Ids of one list that the other names too: the same id, or a case (``t.py::a[1]``) of a
    test the other names whole (``t.py::a``)."""
    whole = [{i for i in ids if "[" not in i} for ids in (first, second)]
    return sorted({*(set(first) & set(second)),
                   *(i for i in second if i.split("[")[0] in whole[0]),
                   *(i for i in first if i.split("[")[0] in whole[1])})


class SetupConfig(_Model):
    """A step that readies the environment before any agent acts in it (an install, a compile):
    run once per task per process in a sandbox of the task (``tasks/setup.py``); what it leaves
    in the workdir and the captured directories is the task's pristine tree, which every
    sample starts from and every grading is taken against."""

    command: str = ""
    """A shell command run with ``bash -c`` in the workdir (empty: no setup)."""
    timeout_s: Annotated[float, Field(gt=0, le=24 * 3600)] = 600.0
    """Wall-clock limit of the command; past it the task cannot be prepared."""
    cpus: Annotated[float, Field(gt=0)] | None = None
    """CPU quota of the setup's sandbox (the rest of its spec is the task's); more than this
    host gives is lowered to what it gives. Default: every CPU of this host: the setup runs
    once per task per process, not once per sample, so a build may use the machine
    (``make -j"$(nproc)"``)."""


class LintConfig(_Model):
    select: list[str] = ["E", "F", "W", "B"]
    """ruff rule codes checked on the changed Python files (``# noqa`` comments do not count)."""
    penalty: Annotated[float, Field(ge=0, le=1)] = 0.1
    """What each finding costs: the lint component is ``max(0, 1 - penalty * findings)``."""
    line_length: Annotated[int, Field(ge=40, le=400)] = 100
    """Longest line allowed (rule E501)."""


class RulesConfig(_Model):
    forbidden_imports: list[str] = []
    """Modules the changed code may not import (``subprocess``, ``numpy``...)."""
    forbidden_calls: list[str] = []
    """Calls the changed code may not make, by dotted name (``eval``, ``os.system``)."""
    forbidden_paths: list[str] = []
    """Glob patterns of paths the agent should not touch; unlike ``grading.protected`` the edit
    is applied, and the rule fails."""
    max_changed_files: Annotated[int, Field(ge=0)] | None = None
    """Most files the agent may add, change or delete."""
    max_changed_lines: Annotated[int, Field(ge=0)] | None = None
    """Most lines added plus removed, over every changed text file."""


class VerifierConfig(_Model):
    name: str
    """Name of the verifier; also its component's name unless ``components`` is given."""
    command: str | None = None
    """Shell command run in the grading sandbox's workdir after the tests; its last line of
    stdout is a JSON object ``{component: score in [0, 1]}`` (or one number)."""
    function: str | None = None
    """``file.py:function`` in the task's ``verifiers/`` directory, called inside the grading
    sandbox with the workdir's path; returns a dict of scores (or one number)."""
    components: list[str] = []
    """Component names it reports; default: ``[name]``."""
    timeout_s: Annotated[float, Field(gt=0)] = 60.0
    """Wall-clock limit of the verifier."""
    isolation: Literal["data", "shared"] = "data"
    """Where a ``function`` verifier meets the agent's code: ``data`` (the agent's modules run
    in a process of their own; calls go to them and only plain data comes back, so nothing of
    the agent's can reach the verifier's frames, values or comparisons) or ``shared`` (one
    process, under the grading guard), for a verifier that hands the agent's code more than
    data or keeps its objects."""

    @model_validator(mode="after")
    def _one_way(self) -> VerifierConfig:
        if (self.command is None) == (self.function is None):
            raise ValueError(f"verifier {self.name!r} needs exactly one of command or function")
        if self.function is not None and ":" not in self.function:
            raise ValueError(f"verifier {self.name!r}: function {self.function!r} must be "
                             "'file.py:function'")
        for name in self.component_names:
            if not name.isidentifier() or keyword.iskeyword(name) or name in BUILTIN_COMPONENTS:
                raise ValueError(f"verifier component {name!r} must be an identifier other "
                                 f"than {', '.join(BUILTIN_COMPONENTS)}")
        return self

    @property
    def component_names(self) -> list[str]:
        return self.components or [self.name]


class TaskConfig(_Model):
    """The contents of ``task.toml``."""

    task: TaskInfo
    sandbox: SandboxSpec = SandboxSpec(memory_mb=1024)
    """Limits and backend of the agent's sandbox and of the grading sandbox."""
    grading: GradingConfig = GradingConfig()
    setup: SetupConfig = SetupConfig()
    reward: dict[str, Annotated[float, Field(ge=0)]] = {"tests": 1.0}
    """Weight of each component in ``reward``; components: tests, lint, rules, fail_to_pass and
    pass_to_pass (with those lists), and those of the verifiers. The reward is the weighted
    mean; a tamper flag makes it 0."""
    lint: LintConfig = LintConfig()
    rules: RulesConfig = RulesConfig()
    verifiers: list[VerifierConfig] = []

    @model_validator(mode="after")
    def _capture(self) -> TaskConfig:
        problems = check_paths(self.grading.capture, self.sandbox, self.grading.env)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _known_components(self) -> TaskConfig:
        clash = set(self.grading.components) & {c for v in self.verifiers
                                                for c in v.component_names}
        if clash:
            raise ValueError(f"component {sorted(clash)[0]!r} is both a verifier's and the "
                             "test script's (grading.components)")
        known = [*BUILTIN_COMPONENTS, *(c for v in self.verifiers for c in v.component_names),
                 *self.grading.components]
        for name in self.reward:
            if name not in known:
                raise ValueError(f"reward weight for unknown component {name!r}: choose from "
                                 f"{', '.join(known)}")
        for name in ("fail_to_pass", "pass_to_pass"):
            if self.reward.get(name) and not getattr(self.grading, name):
                raise ValueError(f"reward weight for {name} but grading.{name} lists no test: "
                                 "the component would always be 0")
        if not any(self.reward.values()):
            raise ValueError("reward weights are all 0: give at least one component a weight")
        return self


@dataclass(frozen=True, eq=False)
class Task:
    """A loaded task: configuration, instruction, and its files in memory."""

    config: TaskConfig
    instruction: str
    workspace: FileTree
    tests: FileTree
    solution: FileTree | None = None
    verifiers: FileTree = FileTree()
    root: Path | None = None
    solve: FileTree | None = None
    """A harbor task's ``solution/``: ``solve.sh`` run in the agent's sandbox is the reference
    (``solution`` holds files laid over the workspace instead)."""
    environment: Mapping[str, FileTree] = field(default_factory=dict)
    """The pristine tree of each captured directory other than the workdir (as the image
    holds it), by absolute path (``grading.capture``)."""

    @property
    def id(self) -> str:
        return self.config.task.id

    @property
    def family(self) -> str:
        return self.config.task.family or self.id

    @property
    def captured(self) -> tuple[str, ...]:
        """The captured directories other than the workdir (``grading.capture``)."""
        return extra_dirs(self.config.grading.capture, self.config.sandbox.workdir)

    @property
    def captures_workdir(self) -> bool:
        capture = self.config.grading.capture
        return not capture or self.config.sandbox.workdir in capture

    @cached_property
    def sandbox(self) -> SandboxSpec:
        """The spec of the agent's sandbox (the grading sandbox uses it too): the task's, with
        the captured directories writable."""
        spec = self.config.sandbox
        more = tuple(d for d in self.captured if d not in spec.writable_dirs)
        if not more:
            return spec
        return SandboxSpec.model_validate({**spec.model_dump(),
                                           "writable_dirs": (*spec.writable_dirs, *more)})

    @cached_property
    def digest(self) -> str:
        """Identifies the task's content: configuration and every file."""
        import hashlib

        parts = [self.config.model_dump_json(), self.instruction, self.workspace.digest(),
                 self.tests.digest(), self.verifiers.digest(),
                 self.solution.digest() if self.solution is not None else "-",
                 self.solve.digest() if self.solve is not None else "-",
                 *(f"{d}\0{tree.digest()}" for d, tree in sorted(self.environment.items()))]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    async def prepare(self, sb: Sandbox) -> None:
        """Put the workspace files, and the captured directories as the image has them, into
        the agent's sandbox; never the tests or the solution. A task with a setup step puts
        in the tree its setup left (run once per process: ``tasks/setup.py``)."""
        if self.config.setup.command:
            from tempering.tasks.setup import prepared

            await (await prepared(self)).prepare(sb)
            return
        await self.workspace.write_into(sb)
        for path, tree in self.environment.items():
            await tree.write_into(sb, path)

    def __repr__(self) -> str:
        return f"Task({self.id!r}, {len(self.workspace)} workspace files, {len(self.tests)} tests)"


def load_task(path: str | Path, limits: Limits | None = None, *,
              backend: str | None = None) -> Task:
    """Load and validate a task directory, ours or harbor's (``tasks/harbor.py``: ``backend``
    picks where a harbor task runs, docker by default); ConfigError lists every problem."""
    root = Path(path)
    from tempering.tasks.harbor import is_harbor_task, load_harbor_task

    if is_harbor_task(root):
        return load_harbor_task(root, limits, backend)
    if not (root / "task.toml").is_file():
        raise ConfigError(f"{root}: no task.toml here; a task directory holds task.toml, "
                          "instruction.md, workspace/ and tests/")
    problems: list[str] = []
    config: TaskConfig | None = None
    try:
        raw = tomllib.loads((root / "task.toml").read_text())
        recipe = raw.get("sandbox", {}).get("recipe") if isinstance(raw.get("sandbox"),
                                                                     dict) else None
        if isinstance(recipe, str):  # relative to the task directory
            raw["sandbox"]["recipe"] = str((root / recipe).resolve())
        config = TaskConfig.model_validate(raw)
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"task.toml is not valid TOML: {exc}")
    except UnicodeDecodeError:
        problems.append("task.toml is not UTF-8")
    except ValidationError as exc:
        problems += [f"task.toml {_loc(e['loc'])}: {e['msg']}" + _given(e) for e in exc.errors()]
    instruction = ""
    if not (root / "instruction.md").is_file():
        problems.append("instruction.md is missing: write what the agent is told")
    else:
        instruction = (root / "instruction.md").read_text(errors="replace")
    trees = {name: FileTree.read(root / name, limits)
             for name in ("workspace", "tests", "solution", "verifiers")}
    if not (root / "tests").is_dir() or not trees["tests"]:
        problems.append("tests/ is missing or empty: a task needs hidden tests")
    for name, tree in trees.items():
        problems += [f"{name}/{entry}: left out" for entry in tree.left_out]
    environment: dict[str, FileTree] = {}
    if config is not None:
        problems += _check_files(config, trees)
    if config is not None and not problems:
        environment, found = environment_of(config, trees["tests"], limits)
        problems += found
    if problems or config is None:
        raise ConfigError(f"invalid task {root}:\n" + "\n".join(f"  - {p}" for p in problems))
    return Task(config, instruction, trees["workspace"], trees["tests"],
                trees["solution"] if (root / "solution").is_dir() else None,
                trees["verifiers"], root, environment=environment)


def environment_of(config: TaskConfig, tests: FileTree, limits: Limits | None = None
                   ) -> tuple[dict[str, FileTree], list[str]]:
    """The pristine trees of the task's captured directories beyond the workdir, read from its
    image, and what is wrong with capturing them (``tasks/capture.py``: the image is asked,
    with the hidden ``tests``' text); asked once per process (a task loaded again, in a
    worker, costs nothing more)."""
    dirs = extra_dirs(config.grading.capture, config.sandbox.workdir)
    if not dirs:
        return {}, []
    env = tuple(sorted({**config.sandbox.env, **config.grading.env}.items()))
    try:
        trees, problems = _environment(config.sandbox.key(), dirs, env, tests,
                                       limits or Limits())
    except SandboxError as exc:  # not remembered: the next load asks again
        return {}, [f"grading.capture: {exc}"]
    return dict(trees), list(problems)


@functools.lru_cache(maxsize=64)
def _environment(spec_key: str, dirs: tuple[str, ...], env: tuple[tuple[str, str], ...],
                 tests: FileTree, limits: Limits
                 ) -> tuple[dict[str, FileTree], tuple[str, ...]]:
    spec = SandboxSpec.model_validate_json(spec_key)
    problems = image_problems(spec, dirs, dict(env), tests)
    if problems:
        return {}, tuple(problems)
    trees, found = pristine_trees(spec, dirs, limits)
    return trees, tuple(found)


def _check_files(config: TaskConfig, trees: dict[str, FileTree]) -> list[str]:
    problems = []
    tests_dir = config.grading.tests_dir
    # A repository's visible tests may sit where the hidden ones go, which replace them: each
    # must have its hidden counterpart, or it would run beside them unseen by the author.
    stray = [p for p in trees["workspace"] if p == tests_dir or (
        p.startswith(tests_dir + "/") and p.removeprefix(tests_dir + "/") not in trees["tests"])]
    if stray:
        problems.append(f"workspace/{stray[0]} is in grading.tests_dir, where the hidden tests "
                        f"go, but tests/ has no {stray[0].removeprefix(tests_dir + '/')}: the "
                        "hidden tests replace the visible ones file by file; add it to tests/, "
                        "move it or choose another tests_dir")
    for v in config.verifiers:
        if v.function is not None and v.function.split(":")[0] not in trees["verifiers"]:
            problems.append(f"verifier {v.name!r}: verifiers/{v.function.split(':')[0]} "
                            "does not exist")
    return problems


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _given(error: object) -> str:
    value = error.get("input") if isinstance(error, dict) else None
    if value is None or isinstance(value, dict | list):
        return ""
    return f" (given {value!r})"
