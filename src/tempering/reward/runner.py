"""Running the hidden tests in a grading sandbox, and reading their authenticated report.

The launcher (``inside_launcher.py``) is written to ``/tmp/.tempering`` in the grading sandbox and
started before the workspace is filled, so it has imported pytest by the time the files are
there; it then gets one line of configuration on stdin with a fresh key. Its report lines are
checked here: a line whose MAC does not verify, or whose sequence number is out of order, is
dropped and raises ``forged_report``. Two canary tests run among the hidden tests, in a file
named after a hidden test file, beside it, with test names taken from the hidden tests' and
the hidden tests' imports; one must pass and one must fail, or the runner was tampered with.

The hidden tests' Python files never reach the grading sandbox's disk as they are: the
sandbox gets empty placeholders (so pytest still finds them) and the launcher gets their text
in its configuration, which only its guard holds (``hidden_files``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import marshal
import py_compile
import secrets
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import CodeType

from tempering import syntax
from tempering.errors import VerifierError
from tempering.reward import canary, inside_compile
from tempering.reward.kept import Kept
from tempering.reward.tamper import parents
from tempering.sandbox import Sandbox
from tempering.sandbox.base import BASE_ENV, Command
from tempering.sandbox.local.zygote import SECCOMP_FILE, ZygoteProgram
from tempering.sandbox.native import native_library
from tempering.tasks.files import FileTree
from tempering.tasks.task import pytest_args

__all__ = ["Launcher", "TestRun", "hidden_files", "parse_report", "parse_report_records",
           "pytest_args"]

LAUNCHER_DIR = "/tmp/.tempering"
LAUNCHER_FILES = ("inside_launcher.py", "inside_boundary.py", "inside_compile.py",
                  "inside_guard.py")
ZYGOTE_DIR = "/.tempering/reward"  # the launcher and the grading zygote, in a zygote's sandbox
NEST_GUARD = "nestguard.so"  # sandbox/nestguard.c, preloaded into the launcher
NOT_NESTED = 86  # the launcher's exit status when its interpreter did not load it
PREFIX = "@@tempering "
INI = """[pytest]
addopts =
python_files = test_*.py *_test.py
python_classes = Test*
python_functions = test*
"""


@dataclass
class TestRun:
    """What the report of one test run said, checked."""

    collected: list[str] = field(default_factory=list)
    outcomes: dict[str, tuple[str, str]] = field(default_factory=dict)  # id: (outcome, message)
    audit: list[tuple[str, str, str]] = field(default_factory=list)  # (flag, detail, where)
    collect_errors: list[str] = field(default_factory=list)
    canary_collect_error: bool = False  # the canary file failed to import (as the tests may)
    canaries: dict[str, str] = field(default_factory=dict)  # "pass"/"fail": outcome seen
    canary_expected: bool = True  # False when the task's own arguments select tests
    canary_mutant_of: str | None = None  # the hidden test the failing canary is a mutant of
    started: bool = False
    finished: bool = False
    forged: int = 0
    exit_code: int | None = None
    timed_out: bool = False
    oom: bool = False
    truncated: bool = False  # the report went over the output limit: what followed is lost
    crossed: dict[str, int] | None = None  # across the process boundary: what was not data
    log: str = ""


class Launcher:
    """One launcher process in one grading sandbox, started ahead of its configuration."""

    def __init__(self, sb: Sandbox, command: Command, runner: str) -> None:
        self.sb, self.command, self.runner = sb, command, runner

    @classmethod
    async def start(cls, sb: Sandbox, runner: str = "pytest") -> Launcher:
        """Start the launcher for ``runner`` (``pytest`` or ``plain``) in ``sb``."""
        await write_launcher(sb)
        command = await sb.start(["python3", "-I", "-B", "-c",
                                  run_module(LAUNCHER_DIR, "inside_launcher"), runner],
                                 env={"PYTHONDONTWRITEBYTECODE": "1",
                                      "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                                      **nest_env(LAUNCHER_DIR)})
        return cls(sb, command, runner)

    async def run(self, args: list[str], tests: FileTree, tests_dir: str, timeout: float,
                  canary_imports: str = "", *, collect_only: bool = False,
                  isolation: str = "shared", sealed: list[str] | None = None) -> TestRun:
        """Write the hidden ``tests`` (``hidden_files``: placeholders on the disk, the Python
        files' text for the launcher) and the canaries last, seal them, configure the
        launcher, and collect its checked report. ``isolation="process"`` or ``"data"``: the tested
        code runs in a process of its own (``inside_boundary.py``), forked before the
        configuration is read. The tests directory, the launcher's own directory (with the
        task's verifiers) and ``sealed`` (workdir paths: the task's protected files) are made
        read-only before any tested code runs."""
        workdir = self.sb.spec.workdir
        placeholders, sources = hidden_files(tests, tests_dir, workdir)
        for path, data, mode in placeholders:  # after the workspace: they win any clash
            await self.sb.write_file(path, data, mode)
        plan = RunPlan(args, tests_dir, workdir, canary_imports, collect_only=collect_only,
                       runner=self.runner, sources=sources, isolation=isolation)
        await self.sb.write_file(plan.canary_path, b"")
        # The tests' data files, the protected files the tests may read, the launcher and the
        # verifiers: nothing the tested code starts may change them.
        await self.sb.make_readonly(tests_dir, LAUNCHER_DIR, *(sealed or ()),
                                    pin=parents([tests_dir, *(sealed or ())]))
        first = f"process {workdir}" if isolation in SEPARATE else "shared"
        await self.command.write(first.encode() + b"\n" + encode_config(plan.config))
        self.command.close_stdin()
        result = await self.command.result(timeout)
        if result.exit_code == NOT_NESTED and not result.stdout:
            raise VerifierError(f"the grading sandbox cannot run the hidden tests: "
                                f"{result.stderr.strip()[-300:]}")
        run = plan.read(result.stdout)
        run.exit_code, run.timed_out = result.exit_code, result.timed_out
        run.oom, run.truncated = result.oom_killed, result.truncated
        run.log = (_human_log(result.stdout, plan.tag) + result.stderr)[-4000:]
        return run


async def write_launcher(sb: Sandbox) -> None:
    """The launcher's files (and their bytecode) into ``LAUNCHER_DIR`` of ``sb``."""
    for name, data in launcher_files(LAUNCHER_FILES).items():
        await sb.write_file(f"{LAUNCHER_DIR}/{name}", data)
    await sb.write_file(f"{LAUNCHER_DIR}/pytest.ini", INI)


def run_module(directory: str, name: str) -> str:
    """``python3 -c`` code that runs module ``name``'s ``main()`` from ``directory`` (a module,
    unlike a script, is loaded from its cached bytecode), leaving ``sys.path`` as it was."""
    return (f"import sys; sys.path.insert(0, {directory!r}); import {name}; del sys.path[0]; "
            f"{name}.main()")


def nest_env(directory: str) -> dict[str, str]:
    """The environment that has the launcher's interpreter, its files in ``directory``, load
    ``nestguard`` (each program it starts in a Landlock domain of its own), and keeps its
    ``subprocess`` from starting programs by ``posix_spawn``, which the guard refuses (Python
    3.13 reads the variable; ``inside_launcher.main`` turns it off in older ones). The programs the
    tests start inherit the rest: no Python of theirs reads the user's site directory, where
    the tested code, which may write $HOME, left a ``.pth`` that ran in a judge the tests
    started later (red team, round fifty-two: 1.0)."""
    return {"LD_PRELOAD": f"{directory}/{NEST_GUARD}", "TEMPERING_NEST": "1",
            "_PYTHON_SUBPROCESS_USE_POSIX_SPAWN": "0", "PYTHONNOUSERSITE": "1"}


@functools.cache
def launcher_files(names: tuple[str, ...]) -> dict[str, bytes]:
    """The launcher's modules ``names`` and their bytecode compiled here, for the grading
    interpreter to load instead of compiling them on every start: under
    ``__pycache__/NAME.<this interpreter's cache tag>.pyc``, which an interpreter of another
    version never reads, and checked against the source's hash when it is read; and the
    library it preloads (``NEST_GUARD``)."""
    package = resources.files("tempering.reward")
    files = {name: package.joinpath(name).read_bytes() for name in names}
    files[NEST_GUARD] = native_library("nestguard").read_bytes()
    tag = sys.implementation.cache_tag
    if tag is None:
        return files
    with tempfile.TemporaryDirectory(prefix="tempering-pyc-") as tmp:
        for name, data in list(files.items()):
            if not name.endswith(".py"):
                continue
            source = Path(tmp, name)
            source.write_bytes(data)
            cached = Path(tmp, f"{name[:-3]}.pyc")
            py_compile.compile(str(source), cfile=str(cached), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            files[f"__pycache__/{name[:-3]}.{tag}.pyc"] = cached.read_bytes()
    return files


def zygote_program() -> ZygoteProgram:
    """The grading zygote (``inside_zygote.py``) as the program of a sandbox zygote: it
    imports the launcher once and forks a fresh grading sandbox per grading, each running
    the plain runner (its interpreter loads ``nestguard`` too), in the environment every
    command of a sandbox starts with (a tested module's ``os.environ.setdefault("HOME", ...)``
    changed nothing under pytest and was a change here; round fifty-four)."""
    return ZygoteProgram(
        ZYGOTE_DIR, launcher_files((*LAUNCHER_FILES, "inside_zygote.py")),
        ("/usr/bin/python3", "-I", "-B", "-c", run_module(ZYGOTE_DIR, "inside_zygote"), "3",
         f"{ZYGOTE_DIR}/{SECCOMP_FILE}"), {**BASE_ENV, **nest_env(ZYGOTE_DIR)})


# The isolations with the tested code in a process of its own (``inside_boundary.py``); the
# launcher has its own copy (``inside_launcher.SEPARATE``), being stdlib only.
SEPARATE = ("process", "data")


class RunPlan:
    """One test run's secrets and canaries (``canary.py``), and how to read its report."""

    def __init__(self, args: list[str], tests_dir: str, workdir: str, canary_imports: str, *,
                 collect_only: bool = False, runner: str = "pytest",
                 launcher_dir: str = LAUNCHER_DIR,
                 sources: Mapping[str, bytes] | None = None, isolation: str = "shared") -> None:
        self.key = secrets.token_bytes(32)
        workdir = workdir.rstrip("/")
        sources = dict(sources or {})
        chosen = canary.make(sources, workdir, tests_dir, canary_imports)
        self.canary_path, self.canary_text, self.holds = chosen.path, chosen.text, chosen.holds
        self.mutant_of, self.canary = chosen.mutant_of, chosen
        self.tag = self.canary_path  # how the canaries' ids are told from the hidden tests'
        sources[f"{workdir}/{self.canary_path}"] = self.canary_text.encode()
        self.sources = sources
        paths = [a for a in args if not a.startswith("-")]
        covered = any(tests_dir == p.rstrip("/") or tests_dir.startswith(p.rstrip("/") + "/")
                      or p in (".", "./") for p in paths)
        self.args = args
        self.config = {
            "key": self.key.hex(), "workspace": workdir, "tests": f"{workdir}/{tests_dir}",
            "launcher_dir": launcher_dir, "ini": f"{launcher_dir}/pytest.ini",
            "args": [*args, "--collect-only"] if collect_only and runner == "pytest" else args,
            "canaries": [] if covered and paths else [self.canary_path],
            "collect_only": collect_only, "sources": sources, "isolation": isolation}

    def precompile(self, compiled: Mapping[str, bytes]) -> None:
        """Give the launcher the hidden files as code compiled here (``compiled``: the task's,
        by path, as marshal data; the canary is compiled now), for a grading interpreter that
        reads this one's bytecode: it loads them instead of compiling them. A file that does
        not compile is left as text, for the launcher to raise its error where it is imported."""
        sources = dict(self.sources)
        codes = {path: compiled[path] for path in sources if path in compiled}
        canary_path = f"{self.config['workspace']}/{self.canary_path}"
        probes = self.config.get("isolation") not in SEPARATE
        filled = canary_code(self.canary, canary_path, probes)
        if filled is not None:
            codes[canary_path] = filled
        rest = {path: text for path, text in sources.items() if path not in codes}
        codes.update(compile_sources(rest, probes))
        self.config["compiled"] = codes
        self.config["sources"] = {p: t for p, t in sources.items() if p not in codes}

    def read(self, stdout: str) -> TestRun:
        run = parse_report(stdout, self.key, self.tag, self.holds)
        run.canary_mutant_of = self.mutant_of
        run.canary_expected = not any(a.startswith(("-k", "-m", "--deselect")) or "::" in a
                                      for a in self.args)
        return run


def hidden_files(tests: FileTree, tests_dir: str,
                 workdir: str) -> tuple[list[tuple[str, bytes, int]], dict[str, bytes]]:
    """What of the hidden tests goes on the grading sandbox's disk (relative paths: empty
    placeholders for the Python files, the other files as they are), and the Python files'
    text by absolute path, for the launcher's guard."""
    files, sources = [], {}
    for path in tests:
        rel = f"{tests_dir}/{path}"
        if path.endswith(".py"):
            sources[f"{workdir.rstrip('/')}/{rel}"] = tests[path]
            files.append((rel, b"", 0o644))
        else:
            files.append((rel, tests[path], tests.mode(path)))
    return files, sources


# What a compiled canary template holds for what each grading draws (``canary_code``): names
# and numbers no hidden test has, random per process (test* names: the instrumentation marks
# the ends of test functions only).
_BREAKS = f"test_tempering_b{secrets.token_hex(8)}"
_HOLDS = f"test_tempering_h{secrets.token_hex(8)}"
_NUMBER, _INT = (1 << 62) + secrets.randbits(40), (1 << 61) + secrets.randbits(40)
_STR = f"\0tempering {secrets.token_hex(8)}"
_templates: Kept[tuple[str, str | None, bool], CodeType | None] = Kept(1024)


def canary_code(made: canary.Canaries, path: str, probes: bool = True) -> bytes | None:
    """The canaries as marshal data, without compiling it: its template is compiled once
    (per literal, where the mutant's literal is the same every time) with stand-ins for what
    each grading draws (test names, the passing test's number, a random int or str literal),
    and the stand-ins are replaced in the code objects' names and constants. None when there
    is nothing to fill in or the template does not compile."""
    if made.parts is None:
        return None
    template, breaks, literal, holds, number = made.parts
    drawn = type(literal) in (int, str)
    code = _templates.get((template, None if drawn else repr(literal), probes),
                          lambda: _template_code(template, literal, probes))
    if code is None:
        return None
    names = {_BREAKS: breaks, _HOLDS: holds}
    consts = {(int, _NUMBER): number, (int, _INT): literal, (str, _STR): literal}
    return marshal.dumps(_fill_code(code, names, consts, path))


def _template_code(template: str, literal: object, probes: bool = True) -> CodeType | None:
    """A mutant's template compiled with the stand-ins (None if it does not compile)."""
    stand_in = {int: _INT, str: _STR}.get(type(literal), literal)
    text = f"{canary.fill(template, _BREAKS, stand_in)}\n\n\n{canary.holding(_HOLDS, _NUMBER)}"
    compiled = _compile_hidden({"<canary>": text.encode()}, rewrite=False,
                              probes=probes)["<canary>"]
    return compiled if isinstance(compiled, CodeType) else None


def _fill_code(code: CodeType, names: dict[str, str], consts: dict[tuple[type, object], object],
               path: str) -> CodeType:
    def const(value: object) -> object:
        if isinstance(value, CodeType):
            return _fill_code(value, names, consts, path)
        if type(value) in (int, str):
            return consts.get((type(value), value), value)
        if type(value) is tuple and all(type(v) is str for v in value):  # BOUND's names
            return tuple(names.get(v, v) for v in value)
        return value

    return code.replace(co_consts=tuple(map(const, code.co_consts)),
                        co_names=tuple(names.get(n, n) for n in code.co_names),
                        co_name=names.get(code.co_name, code.co_name),
                        co_qualname=names.get(code.co_qualname, code.co_qualname),
                        co_filename=path)


def compile_sources(sources: Mapping[str, bytes], probes: bool = True) -> dict[str, bytes]:
    """The hidden Python files that compile, compiled as the plain runner's launcher would
    (``inside_compile.py``), as marshal data by path."""
    return {path: marshal.dumps(code)  # type: ignore[arg-type]  # a code object
            for path, code in _compile_hidden(dict(sources), rewrite=False,
                                             probes=probes).items()
            if not isinstance(code, BaseException)}


def _compile_hidden(sources: dict[str, bytes], *, rewrite: bool,
                     probes: bool) -> dict[str, object]:
    """``inside_compile.compile_hidden`` in this process: its parses and compiles of trees
    one at a time (``tempering.syntax``)."""
    with syntax.LOCK:
        return inside_compile.compile_hidden(sources, rewrite=rewrite, probes=probes)


def _human_log(stdout: str, tag: str) -> str:
    """pytest's own output without the report lines and the canaries' failure section."""
    kept, in_canary = [], False
    for line in stdout.splitlines():
        if line.startswith(("_", "=")):
            in_canary = tag in line
        if line.strip() and not in_canary and not line.startswith(PREFIX) and tag not in line:
            kept.append(line)
    return "\n".join(kept) + "\n"


def encode_config(config: Mapping[str, object]) -> bytes:
    """One line for the launcher's stdin: marshal, which it reads without importing json."""
    return marshal.dumps(dict(config)).hex().encode() + b"\n"


def parse_report(stdout: str, key: bytes, tag: str, holds: str) -> TestRun:
    run = TestRun()
    for record in parse_report_records(stdout, key, forged=run):
        _apply(run, record, tag, holds)
    return run


def parse_report_records(stdout: str, key: bytes,
                         forged: TestRun | None = None) -> list[dict[str, object]]:
    """The report lines whose MAC verifies, in sequence; others count in ``forged.forged``."""
    records: list[dict[str, object]] = []
    for line in stdout.splitlines():
        if not line.startswith(PREFIX):
            continue
        mac, _, body = line[len(PREFIX):].partition(" ")
        good = hashlib.blake2b(body.encode(), key=key, digest_size=16).hexdigest()
        record = None
        if hmac.compare_digest(mac, good):  # nothing the tested code wrote is parsed
            try:
                record = _clean(json.loads(body))
            except (ValueError, RecursionError):
                record = None
        if not isinstance(record, dict) or record.get("seq") != len(records) + 1:
            if forged is not None:
                forged.forged += 1
            continue
        records.append(record)
    return records


def _clean(value: object) -> object:
    """``value`` with no lone surrogate left in its strings (JSON escapes can carry one, and
    the tested code writes the messages): a result that cannot be stored would lose the
    episode."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {str(_clean(k)): _clean(v) for k, v in value.items()}
    return value


def _apply(run: TestRun, record: dict[str, object], tag: str, holds: str) -> None:
    event = record.get("event")
    if event == "start":
        run.started = True
    elif event == "end":
        run.finished = True
        crossed = record.get("crossed")
        if isinstance(crossed, dict):
            run.crossed = {str(k): v for k, v in crossed.items() if type(v) is int}
    elif event == "collected":
        ids = record.get("ids")
        run.collected = [str(i) for i in ids if tag not in str(i)] if isinstance(ids, list) else []
    elif event == "collect_error":
        if tag in str(record.get("id")):
            run.canary_collect_error = True
        else:
            run.collect_errors.append(f"{record.get('id')}: {str(record.get('message'))[-300:]}")
    elif event == "test":
        test_id, outcome = str(record.get("id")), str(record.get("outcome"))
        if tag in test_id:
            run.canaries["pass" if test_id.endswith("::" + holds) else "fail"] = outcome
        else:
            run.outcomes[test_id] = (outcome, str(record.get("message", "")))
    elif event == "audit":
        run.audit.append((str(record.get("flag")), str(record.get("detail")),
                          str(record.get("where"))))
