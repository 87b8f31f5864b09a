"""``grade(task, sb)``: the reward of an episode, from evidence the agent could not shape.

1. Read the agent's workspace by content through the sandbox's file API (never its git, its
   shell or its tools; links are never followed).
2. Screen the edits (``tamper.py``): what may change how the tests run is dropped and flagged.
3. Static dimensions on the host (``static.py``): tamper patterns, the task's rules, lint.
4. In a fresh grading sandbox: the pristine workspace, the applied edits, then the hidden tests
   last; the launcher runs them and reports through an authenticated channel (``runner.py``).
   The number of tests that ran must equal the number expected; skipped, xfailed, errored,
   missing and timed-out tests fail; the exit code is never evidence. A task whose runner is
   ``script`` runs its own test script there instead, which writes its reward (``script.py``).
5. The task's own verifiers, each in a fresh sandbox of the screened workspace (``verifiers.py``).
6. The weighted mean of the components is the reward; any tamper flag makes it 0.

A ``Grader`` can keep launchers started ahead of time (``warm``): grading sandboxes that have
already imported pytest, waiting for files. They are never reused: each grades once.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from importlib.util import MAGIC_NUMBER
from types import TracebackType
from typing import Self

from tempering import syntax
from tempering.errors import SandboxError, VerifierError
from tempering.reward.inside_guard import RAN_HERE
from tempering.reward.isolation import by_syntax, exchanges_data, ran_here
from tempering.reward.kept import Kept
from tempering.reward.result import TAMPER, RewardResult, TestResult, listed_passed
from tempering.reward.runner import (
    LAUNCHER_DIR,
    SEPARATE,
    ZYGOTE_DIR,
    Launcher,
    RunPlan,
    TestRun,
    compile_sources,
    hidden_files,
    pytest_args,
    write_launcher,
    zygote_program,
)
from tempering.reward.script import run_script
from tempering.reward.static import analyse, lint, parse_big, python_sources
from tempering.reward.tamper import parents, screen, screen_captured, sealed_paths
from tempering.reward.verifiers import VERIFIERS_DIR, run_verifier
from tempering.sandbox import Sandbox, SandboxSpec, create_sandbox
from tempering.sandbox.files import Storage
from tempering.sandbox.local.zygote import Zygotes, preforks
from tempering.sandbox.stock import Stock
from tempering.tasks.capture import confine_links
from tempering.tasks.files import FileTree, Limits, read_sandbox_tree
from tempering.tasks.setup import prepared
from tempering.tasks.task import GradingConfig, Task, VerifierConfig

GRADING_OUTPUT_LIMIT = 8 << 20
KEPT = 1024  # tasks whose canary imports and compiled tests are remembered
GATED = ("lint", "rules")  # components scaled by the tests' score


def grading_spec(task: Task) -> SandboxSpec:
    """The agent's spec without network, with room for the report, on memory storage (a
    grading sandbox lives for one run and is never forked), its processes kept out of one
    another unless the task says otherwise (``grading.tracing``)."""
    spec = task.sandbox
    return spec.model_copy(update={
        "network": False, "storage": "memory", "tracing": task.config.grading.tracing,
        "output_limit_bytes": max(spec.output_limit_bytes, GRADING_OUTPUT_LIMIT)})


class Grader:
    """Grades episodes; ``warm`` launchers per grading spec are kept started ahead of time."""

    def __init__(self, *, warm: int = 0, limits: Limits | None = None,
                 zygote: bool = True) -> None:
        self.warm, self.limits, self.use_zygote = warm, limits or Limits(), zygote
        self._stock: Stock[Launcher] = Stock(warm)  # by SandboxSpec.key() and runner
        self._expected: dict[str, int] = {}
        self._counting: dict[tuple[int, str], asyncio.Lock] = {}
        self._trying: dict[tuple[int, str], asyncio.Lock] = {}
        self._isolations: dict[str, tuple[str, str]] = {}  # by task digest
        self._zygotes = Zygotes(zygote_program)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._stock.close()
        await self._zygotes.close()

    # ---- launchers ----

    async def _fresh(self, spec: SandboxSpec, runner: str) -> Launcher:
        sb = await create_sandbox(spec)
        try:
            return await Launcher.start(sb, runner)
        except BaseException:
            await sb.close()
            raise

    def prestart(self, task: Task) -> None:
        """Start now, before the first grading of tasks like ``task``, what grades them: the
        grading zygote where it does (``_forks``), else ``warm`` launchers (a launcher started
        for a task the zygote grades is never used: a sandbox and a pytest import spent)."""
        if task.config.grading.runner == "script":
            return  # a test script needs no launcher
        if self._forks(task):
            self._stock.background(self._prestart_zygote(task))
            return
        spec, runner = grading_spec(task), task.config.grading.runner
        self._stock.fill(spec.key() + runner, lambda: self._fresh(spec, runner))

    async def _prestart_zygote(self, task: Task) -> None:
        with contextlib.suppress(SandboxError, OSError):  # the first grading reports it
            await self._zygotes.get(grading_spec(task))

    async def _launcher(self, spec: SandboxSpec, runner: str) -> Launcher:
        return await self._stock.take(spec.key() + runner, lambda: self._fresh(spec, runner))

    # ---- grading ----

    async def grade(self, task: Task, sb: Sandbox) -> RewardResult:
        """Grade the agent's final workspace, and the task's other captured directories, in
        ``sb`` (which is left as it was)."""
        start = time.perf_counter()
        task = await prepared(task)  # what its setup step made is pristine, not the agent's
        # Fitted to the grading sandbox's disk, which is the task's, whatever ``sb`` has.
        final = (await read_sandbox_tree(sb, self.limits, spec=task.sandbox)
                 if task.captures_workdir else task.workspace)
        captured = {d: await read_sandbox_tree(sb, self.limits, spec=task.sandbox, src=d,
                                               links=True) for d in task.captured}
        return await self.grade_files(task, final, start=start, captured=captured)

    async def grade_files(self, task: Task, final: FileTree, *, start: float | None = None,
                          captured: Mapping[str, FileTree] | None = None) -> RewardResult:
        """Grade a workspace given as files (``tempering grade --workspace DIR``), with the
        task's other captured directories as ``captured`` has them (default: as its image
        does)."""
        start = time.perf_counter() if start is None else start
        task = await prepared(task)
        # a directory the mapping lacks is as the image has it, never empty
        captured = {**task.environment, **(captured or {})}
        screened = screen(task, final)
        sources = python_sources(screened)  # decoded once, for both
        found = await asyncio.to_thread(analyse, task, screened, sources,
                                        await parse_big(sources[0]))
        flags, details = set(screened.flags) | found.flags, screened.details + found.details
        components = dict(found.components)
        if task.config.reward.get("lint", 0) > 0:
            try:
                components["lint"], findings = await lint(task.config.lint, screened,
                                                          found.unreadable)
                details += findings
            except OSError as exc:
                components["lint"] = 0.0
                flags.add("lint_unavailable")
                details.append(f"lint_unavailable: {exc}")
        # The captured directories are laid as the agent left them (links as links) beside
        # the screened workspace, in every grading sandbox: the tests', the verifiers'.
        confined = _screen_captured(task, captured, flags, details)
        tree = task.workspace.overlay(screened.applied, screened.modes).with_beside(confined)
        changed = list(screened.changed)
        for where, now in sorted(confined.items()):
            changed += [f"{where}/{p}" for p in changes(task.environment.get(where), now)]
        if task.config.grading.runner == "script":
            tests, log, scores = await self._run_script(task, tree, flags, details)
            expected = len(tests)  # what its JUnit report lists, for the report only
        else:
            tests, log, scores = await self._run_tests(task, tree, flags, details)
            expected = await self.expected_tests(task)
        components.update(scores)
        passed = sum(t.outcome == "passed" for t in tests)
        # Lint and rules judge working code: scaled by the tests' score, a clean change that
        # solves nothing earns nothing on them (red team, round thirty-three: a constant stub
        # took the example's lint and rules, a fifth of its reward).
        for name in GATED:
            if name in components:
                components[name] *= components["tests"]
        weights = task.config.reward
        total = sum(weights.values())
        reward = sum(w * components.get(name, 0.0) for name, w in weights.items()) / total
        if flags & TAMPER.keys():
            reward = 0.0
        return RewardResult(
            reward=min(1.0, max(0.0, reward)), components=components, tests_passed=passed,
            tests_total=expected, flags=sorted(flags), details=details, tests=tests,
            changed_files=changed, duration_s=time.perf_counter() - start, log=log)

    async def _run_tests(self, task: Task, tree: FileTree, flags: set[str], details: list[str]
                         ) -> tuple[list[TestResult], str, dict[str, float]]:
        """The hidden tests under the launcher (and the verifiers): per-test results, the
        run's log, and the components they give."""
        expected = await self.expected_tests(task)
        run, scores = await self._run(task, tree, flags, details)
        tests = _test_results(run, expected)
        passed = sum(t.outcome == "passed" for t in tests)
        _judge(run, tests, expected, flags, details, _counted(task.config.grading))
        scoring = task.config.grading.scoring
        listed = listed_components(task.config.grading, tests)
        scores.update(listed)
        whole = all(v == 1.0 for v in listed.values())  # resolved: SWE-bench's test
        scores["tests"] = float(
            passed / expected if scoring == "fraction" else
            whole if scoring == "listed" else passed == expected and whole)
        return tests, run.log, scores

    async def _run_script(self, task: Task, tree: FileTree, flags: set[str],
                          details: list[str]) -> tuple[list[TestResult], str, dict[str, float]]:
        """The task's test script (``script.py``) in a fresh grading sandbox of the screened
        workspace, the hidden tests read-only at ``tests_dir`` (and the protected paths, as
        for the tests), then the verifiers: per-test results from its JUnit report, its
        log, and the components."""
        grading, spec = task.config.grading, grading_spec(task)
        sb = await create_sandbox(spec)
        try:
            await tree.write_into(sb)
            await task.tests.write_into(sb, grading.tests_dir)
            sealed = [grading.tests_dir, *sealed_paths(task, tree)]
            # (harbor's /tests is a mount point of its own: nothing renames it away)
            await sb.make_readonly(*sealed, pin=parents([p for p in sealed
                                                         if not p.startswith("/")]))
            run = await run_script(sb, grading, spec.output_limit_bytes)
        finally:
            await sb.close()
        for flag, detail in run.notes:
            flags.add(flag)
            details.append(f"{flag}: {detail}")
        if run.timed_out:
            flags.add("timeout")
        elif run.oom:
            flags.add("oom")
        scores = dict(run.scores)
        scores.update(await self._verifiers(task, tree, spec, flags, details))
        return run.tests, run.log, scores

    def _forks(self, task: Task) -> bool:
        """Whether ``task`` is graded by the zygote (``_run_forked``)."""
        return (self.use_zygote and task.config.grading.runner == "plain"
                and not task.config.verifiers and not task.captured
                and not task.config.grading.tracing
                and preforks(grading_spec(task)))

    async def isolation(self, task: Task) -> tuple[str, str]:
        """(``process`` or ``shared``, why): how ``task``'s gradings run the tested code
        (``grading.isolation``; ``reward/isolation.py``). For ``auto``, a task whose hidden
        tests' syntax allows the boundary is graded across it only once its reference
        solution, graded so here once, passed every test with nothing but data crossing."""
        chosen, why = by_syntax(task, hides_tests=self._forks(task))
        if task.config.grading.isolation != "auto" or chosen == "shared":
            return chosen, why
        if task.solution is None:
            return "shared", "no reference solution shows that the tests take data only"
        loop = asyncio.get_running_loop()
        lock = self._trying.setdefault((id(loop), task.digest), asyncio.Lock())
        async with lock:  # concurrent first gradings of a task try its reference once
            if task.digest not in self._isolations:
                expected = await self.expected_tests(task)
                tree = task.workspace.overlay(dict(task.solution.files)).with_beside(
                    task.environment)
                run, _ = await self._run(task, tree, set(), [], isolation="data")
                problem = exchanges_data(run, expected)
                self._isolations[task.digest] = (
                    ("shared", f"the reference solution across the boundary: {problem}")
                    if problem else
                    ("data", "the reference solution passed every test with data only"))
        return self._isolations[task.digest]

    async def _run(self, task: Task, tree: FileTree, flags: set[str], details: list[str],
                   isolation: str | None = None) -> tuple[TestRun, dict[str, float]]:
        grading = task.config.grading
        spec = grading_spec(task)
        if isolation is None:
            isolation = (await self.isolation(task))[0]
        if self._forks(task):
            run = await self._run_forked(task, tree, spec, isolation)
            return await self._again_in_one_process(task, tree, flags, details, isolation,
                                                    run, {})
        launcher = await self._launcher(spec, grading.runner)
        try:
            await tree.write_into(launcher.sb)
            run = await launcher.run(pytest_args(grading.command), task.tests,
                                     grading.tests_dir, grading.timeout_s, canary_imports(task),
                                     isolation=isolation, sealed=sealed_paths(task, tree))
        finally:
            await launcher.sb.close()
        scores = await self._verifiers(task, tree, spec, flags, details)
        return await self._again_in_one_process(task, tree, flags, details, isolation, run,
                                                scores)

    async def _verifiers(self, task: Task, tree: FileTree, spec: SandboxSpec, flags: set[str],
                         details: list[str]) -> dict[str, float]:
        """Every verifier of the task, each in a sandbox of its own: their components."""
        scores: dict[str, float] = {}
        for verifier in task.config.verifiers:
            got, problem, audit = await self._verify(task, tree, spec, verifier)
            for flag, detail, where in audit:  # as for the tests: the guard's word
                if flag != RAN_HERE:
                    flags.add(flag)
                    details.append(f"{flag}: {detail} (from {where}, in verifier "
                                   f"{verifier.name})")
            scores.update(got)
            if problem:
                flags.add("verifier_error")
                details.append(f"verifier_error: {verifier.name}: {problem}")
        return scores

    async def _verify(self, task: Task, tree: FileTree, spec: SandboxSpec,
                      verifier: VerifierConfig
                      ) -> tuple[dict[str, float], str, list[tuple[str, str, str]]]:
        """One verifier (``run_verifier``), in a fresh sandbox of its own that holds the
        screened workspace (its protected files read-only, as for the tests), the launcher
        and the task's verifier files, and nothing else:
        what the tested code wrote while the tests ran (a ``json.py`` in the workdir that a
        command verifier's ``python3 -c`` imported), or while an earlier verifier ran it,
        never reaches it, and the verifier files are never where the tests' run could read
        them (round thirty-three). A function verifier's own file is there as an empty
        placeholder: the launcher has its text as hidden code, and the tested code it calls
        reads nothing of it."""
        entry = (verifier.function or "").partition(":")[0]
        source = task.verifiers.get(entry) if verifier.function else None
        files = task.verifiers if source is None else task.verifiers.overlay({entry: b""})
        sb = await create_sandbox(spec)
        try:
            await tree.write_into(sb)
            if source is not None:  # only a function verifier runs the launcher
                await write_launcher(sb)
            await files.write_into(sb, VERIFIERS_DIR)
            sealed = sealed_paths(task, tree)  # the task's protected files, as for the tests
            await sb.make_readonly(LAUNCHER_DIR, *sealed, pin=parents(sealed))
            return await run_verifier(sb, verifier, source)
        finally:
            await sb.close()

    async def _again_in_one_process(self, task: Task, tree: FileTree, flags: set[str],
                                    details: list[str], isolation: str, run: TestRun,
                                    scores: dict[str, float]
                                    ) -> tuple[TestRun, dict[str, float]]:
        """``run``, unless the tests ran the tested code in their own process across the
        boundary, where nothing watched it (``isolation.ran_here``): then the grading in one
        process, under the whole guard."""
        here = ran_here(run) if isolation in SEPARATE else ""
        if not here:
            return run, scores
        # This grading only: what one episode did never sets how the task's others run (a
        # false trigger, or a true one, would move them all into one process; round 32).
        details.append(f"isolation: graded in one process: {here}")
        return await self._run(task, tree, flags, details, isolation="shared")

    async def _run_forked(self, task: Task, tree: FileTree, spec: SandboxSpec,
                          isolation: str) -> TestRun:
        """The plain runner in a fresh sandbox forked by the grading zygote
        (``inside_zygote.py``, ``sandbox/local/zygote.py``): the same checks, without a new
        interpreter per grading."""
        grading = task.config.grading
        separate = isolation in SEPARATE
        solver = f"{spec.workdir.rstrip('/')}/{grading.tests_dir}" if separate else None
        data = any(not path.endswith(".py") for path in task.tests)
        zygote, forked = await self._zygotes.fork(spec, solver=solver, hide=data)
        try:
            placeholders, sources = hidden_files(task.tests, grading.tests_dir, spec.workdir)
            plan = RunPlan(pytest_args(grading.command), grading.tests_dir, spec.workdir,
                           canary_imports(task), runner="plain", launcher_dir=ZYGOTE_DIR,
                           sources=sources, isolation=isolation)
            if zygote.greeting == MAGIC_NUMBER.hex():  # it reads this interpreter's bytecode
                plan.precompile(compiled_tests(task, spec.workdir, sources, not separate))
            files = [(p, tree[p], tree.mode(p)) for p in tree]
            files += placeholders  # last: the hidden tests win any clash
            files.append((plan.canary_path, b"", 0o644))
            await asyncio.to_thread(_write_all, forked.storage, files)
            # The tests directory is read-only even where it holds only placeholders: it is
            # on the launcher's sys.path, and a module the tested code wrote there (from the
            # solver too) was imported by the tests' process, unwatched (round thirty-one).
            workdir, sealed = spec.workdir.rstrip("/"), sealed_paths(task, tree)
            await forked.seal([f"{workdir}/{path}" for path in [grading.tests_dir, *sealed]],
                              pin=[f"{workdir}/{path}"
                                   for path in parents([grading.tests_dir, *sealed])])
            report = await forked.run(plan.config, grading.timeout_s, spec.output_limit_bytes)
            run = plan.read(report.text)
            run.timed_out, run.oom = report.timed_out, report.oom_killed
            run.exit_code, run.truncated = report.exit_code, report.truncated
            if report.truncated:
                run.log = (f"tempering: the report went over {spec.output_limit_bytes} bytes; "
                           "the grading was stopped there\n")
            return run
        finally:
            await asyncio.to_thread(forked.close)

    async def expected_tests(self, task: Task) -> int:
        """How many hidden tests must run: from task.toml, or collected once (with the
        reference solution where there is one) and remembered by the task's digest."""
        if task.config.grading.expected_tests is not None:
            return task.config.grading.expected_tests
        loop = asyncio.get_running_loop()  # the default grader may outlive an event loop
        lock = self._counting.setdefault((id(loop), task.digest), asyncio.Lock())
        async with lock:  # concurrent first gradings of a task count its tests once
            return await self._count_expected(task)

    async def _count_expected(self, task: Task) -> int:
        if task.digest not in self._expected:
            tree = task.workspace.overlay(dict(task.solution.files) if task.solution else {}
                                          ).with_beside(task.environment)
            grading = task.config.grading
            launcher = await self._fresh(grading_spec(task), grading.runner)
            try:
                await tree.write_into(launcher.sb)
                run = await launcher.run(pytest_args(grading.command), task.tests,
                                         grading.tests_dir, grading.timeout_s,
                                         collect_only=True)
            finally:
                await launcher.sb.close()
            if not run.collected:
                errors = "; ".join(run.collect_errors)[:500] or run.log[-500:]
                raise VerifierError(f"task {task.id}: no hidden test could be collected "
                                    f"({errors}); fix the tests or set grading.expected_tests")
            self._expected[task.digest] = len(run.collected)
        return self._expected[task.digest]


def _screen_captured(task: Task, captured: Mapping[str, FileTree], flags: set[str],
                     details: list[str]) -> dict[str, FileTree]:
    """Each captured tree with the links that could lead out of it left out and the edits
    the workspace's screen drops dropped (``flags`` and ``details`` say so): what is laid."""
    confined = {}
    for where, now in captured.items():
        pristine = task.environment.get(where)
        linked, left = confine_links(where, pristine, now)
        confined[where], dropped, why = screen_captured(task, where, pristine, linked)
        flags |= dropped
        details += why + [f"capture_left_out: {entry}" for entry in
                          [*(f"{where}/{e}" for e in now.left_out), *left]]
    return confined


def changes(before: FileTree | None, after: FileTree) -> list[str]:
    """The paths added, modified (content, mode or link target) or deleted from ``before`` to
    ``after``, sorted."""
    before = FileTree() if before is None else before
    paths = {*before.files, *before.links, *after.files, *after.links}
    return sorted(p for p in paths
                  if (before.files.get(p), before.links.get(p), before.mode(p))
                  != (after.files.get(p), after.links.get(p), after.mode(p)))


def _write_all(storage: Storage, files: list[tuple[str, bytes, int]]) -> None:
    for path, data, mode in files:
        storage.write(path, data, mode)


_imports: Kept[str, str] = Kept(KEPT)  # by task digest
_compiled: Kept[tuple[str, str, bool], dict[str, bytes]] = Kept(KEPT)  # digest, workdir, probes


def compiled_tests(task: Task, workdir: str, sources: dict[str, bytes],
                   probes: bool = True) -> dict[str, bytes]:
    """The task's hidden Python files (``sources``), compiled here for the zygote, once per
    task."""
    return _compiled.get((task.digest, workdir, probes),
                         lambda: compile_sources(sources, probes))


def canary_imports(task: Task) -> str:
    """The hidden tests' top-level imports, each guarded, for the canary file to repeat
    (worked out once per task)."""
    return _imports.get(task.digest, lambda: _canary_imports(task))


def _canary_imports(task: Task) -> str:
    lines: dict[str, None] = {}
    for path in task.tests:
        if not path.endswith(".py"):
            continue
        try:
            tree = syntax.parse(task.tests[path])
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom) and getattr(node, "level", 0) == 0:
                lines[ast.unparse(node)] = None
    # ``from __future__`` must come first, and cannot be guarded (a canary file that does not
    # compile would be taken for a tampered runner).
    future = [line for line in lines if line.startswith("from __future__ ")]
    return "".join(f"{line}\n" for line in future) + "".join(
        f"try:\n    {line}\nexcept BaseException:\n    pass\n" for line in lines
        if line not in future)


def _test_results(run: TestRun, expected: int) -> list[TestResult]:
    results = [TestResult(id=test_id, outcome=run.outcomes[test_id][0],  # type: ignore[arg-type]
                          message=run.outcomes[test_id][1][-1000:])
               if test_id in run.outcomes else TestResult(id=test_id, outcome="missing")
               for test_id in run.collected]
    results += [TestResult(id=f"<not collected #{i + 1}>", outcome="missing")
                for i in range(max(0, expected - len(results)))]
    return results


def listed_components(grading: GradingConfig, tests: list[TestResult]) -> dict[str, float]:
    """``fail_to_pass`` / ``pass_to_pass``: the fraction of each list's tests that passed
    (those of a task that lists them)."""
    return {name: sum(listed_passed(test_id, tests) for test_id in ids) / len(ids)
            for name, ids in (("fail_to_pass", grading.fail_to_pass),
                              ("pass_to_pass", grading.pass_to_pass)) if ids}


def _counted(grading: GradingConfig) -> Callable[[str], bool]:
    """Whether a test's outcome counts: every test's, except under ``scoring = "listed"``,
    where only the listed tests' do (the repository's own skips elsewhere are no evidence)."""
    if grading.scoring != "listed":
        return lambda test_id: True
    ids = [*grading.fail_to_pass, *grading.pass_to_pass]
    return lambda test_id: any(test_id == i or test_id.startswith(i + "[") for i in ids)


def _judge(run: TestRun, tests: list[TestResult], expected: int, flags: set[str],
           details: list[str], counted: Callable[[str], bool]) -> None:
    """The flags that the test run's evidence raises."""
    if run.forged:
        flags.add("forged_report")
        details.append(f"forged_report: {run.forged} report line(s) failed authentication")
    for flag, detail, where in run.audit:
        flags.add(flag)
        details.append(f"{flag}: {detail} (from {where})")
    if run.collect_errors:
        flags.add("collection_error")
        details += [f"collection_error: {e}" for e in run.collect_errors]
    elif run.finished and len(run.collected) != expected:
        flags.add("test_count_mismatch")
        details.append(f"test_count_mismatch: {len(run.collected)} collected, {expected} expected")
    skipped = [t.id for t in tests if t.outcome in ("skipped", "xfailed") and counted(t.id)]
    if skipped:
        flags.add("tests_skipped")
        details.append(f"tests_skipped: {', '.join(skipped[:10])}")
    if run.timed_out:
        flags.add("timeout")
    elif run.oom:
        flags.add("oom")
    elif not run.finished:
        if run.exit_code == 0:
            flags.add("early_exit")
            details.append("early_exit: the test process exited with status 0 mid-run")
        else:
            flags.add("test_process_died")
            details.append(f"test_process_died: exit status {run.exit_code}")
    if run.canary_collect_error and not run.collect_errors:
        flags.add("runner_tampered")
        details.append("runner_tampered: the canaries failed to import, the hidden tests did not")
    elif (run.finished and run.canary_expected and not run.canary_collect_error
          and run.canaries != {"pass": "passed", "fail": "failed"}):
        original = run.outcomes.get(run.canary_mutant_of or "", ("",))[0]
        if (run.canaries == {"pass": "passed", "fail": "passed"} and run.canary_mutant_of
                and original in ("failed", "error")):
            # The wrong answer equals the mutant's literal: a model failure, not a runner
            # that passes failures (that runner would have passed the original too).
            details.append(f"canary_inconclusive: the mutant of {run.canary_mutant_of} "
                           "passed where that test failed")
        else:
            flags.add("runner_tampered")
            details.append(f"runner_tampered: canaries reported {run.canaries or 'nothing'}")


_default: Grader | None = None


async def grade(task: Task, sb: Sandbox, *, grader: Grader | None = None) -> RewardResult:
    """Grade the agent's work in ``sb`` against ``task`` (see the module docstring)."""
    global _default
    if grader is None:
        _default = _default or Grader()
        grader = _default
    return await grader.grade(task, sb)
