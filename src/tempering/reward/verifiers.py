"""A task's own verifiers: scoring commands or Python functions run in the grading sandbox.

Teams encode what "good" means for their business here (a latency budget, a format, a domain
check). A verifier runs after the hidden tests, in a fresh sandbox of its own holding the
screened workspace (``Grader._verify``: nothing the tested code did while the tests or an
earlier verifier ran reaches it), with the task's ``verifiers/`` files at
``/tmp/.tempering/verifiers`` (``$TEMPERING_VERIFIERS``), which the agent never saw and the
tests' run never held. Its scores become named components of the reward.

- ``command``: a shell command run in the workdir; the last line of its stdout is a JSON object
  ``{component: score}`` or one number (for a verifier with one component), taken only when
  the command exits with 0.
- ``function``: ``file.py:function`` called as ``function(workdir)`` by the launcher, which
  reports the returned dict (or number) on its authenticated channel. The file is compiled
  as hidden code, under the guard as the tests are, and the agent's modules it imports run
  in a process of their own (``isolation = "data"``, the default; ``"shared"``: in one).
  What the guard sees there raises its flags, as in the tests.

A verifier that fails (a command's non-zero exit too), times out or prints no scores gives 0 to
its components and raises the ``verifier_error`` note; scores are clamped to [0, 1].
"""

from __future__ import annotations

import json
import math
import secrets

from tempering.errors import VerifierError
from tempering.reward.inside_guard import RAN_HERE
from tempering.reward.runner import (
    LAUNCHER_DIR,
    NOT_NESTED,
    SEPARATE,
    encode_config,
    nest_env,
    parse_report_records,
)
from tempering.sandbox import Sandbox
from tempering.tasks.task import VerifierConfig

VERIFIERS_DIR = f"{LAUNCHER_DIR}/verifiers"


async def run_verifier(sb: Sandbox, verifier: VerifierConfig, source: bytes | None = None
                       ) -> tuple[dict[str, float], str, list[tuple[str, str, str]]]:
    """(scores by component, problem or "", what the guard saw: (flag, detail, where));
    every declared component gets a score. ``source``: a function verifier's file."""
    names = verifier.component_names
    # PYTHONSAFEPATH: no Python a command verifier starts puts its working directory (the
    # workdir) on sys.path by itself; `python3 -m pytest` imported the agent's `attr.py`
    # there, and `python3 -c` its `json.py` (red team, rounds thirty-three and thirty-four).
    env = {"TEMPERING_VERIFIERS": VERIFIERS_DIR, "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1"}
    audit: list[tuple[str, str, str]] = []
    if verifier.command is not None:
        result = await sb.exec(verifier.command, timeout=verifier.timeout_s, env=env)
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        raw: object = None
        if result.timed_out:
            problem = f"timed out after {verifier.timeout_s} s"
        elif result.exit_code != 0:  # a checker that crashed vouches for nothing it printed
            problem = f"exited with {result.exit_code}: {result.stderr.strip()[-300:]}"
        elif not lines:
            problem = f"printed nothing (exit {result.exit_code}): {result.stderr[-300:]}"
        else:
            try:
                raw, problem = json.loads(lines[-1]), ""
            except ValueError:
                problem = f"last line is not JSON: {lines[-1][:200]!r}"
    else:
        raw, problem, audit = await _call_function(sb, verifier, source, env,
                                                   verifier.isolation)
        if verifier.isolation != "shared" and any(f == RAN_HERE for f, _, _ in audit):
            # the verifier ran the agent's code in its own process: again, under the guard
            raw, problem, audit = await _call_function(sb, verifier, source, env, "shared")
    scores, shape_problem = _scores(raw, names) if not problem else ({}, "")
    problem = problem or shape_problem
    return {name: scores.get(name, 0.0) for name in names}, problem, audit


async def _call_function(sb: Sandbox, verifier: VerifierConfig, source: bytes | None,
                         env: dict[str, str], isolation: str
                         ) -> tuple[object, str, list[tuple[str, str, str]]]:
    """A function verifier, called by the launcher (``inside_launcher.py verifier``) with its file
    compiled as hidden code (the guard's, as the tests'), under ``isolation``: with ``data``
    the agent's modules run in the solver (``inside_boundary.py``), and only data comes back
    (round thirty: in one process, an always-equal result and a walk up the verifier's frames
    to its table each won the verifier's score)."""
    file, _, function = (verifier.function or "").partition(":")
    path = f"{VERIFIERS_DIR}/{file}"
    key = secrets.token_bytes(32)
    config = {"key": key.hex(), "workspace": sb.spec.workdir, "file": path,
              "function": function, "isolation": isolation,
              "sources": {path: source} if source is not None else {}}
    first = f"process {sb.spec.workdir}" if isolation in SEPARATE else "shared"
    result = await sb.exec(["python3", "-I", "-B", f"{LAUNCHER_DIR}/inside_launcher.py",
                            "verifier"],
                           stdin=first.encode() + b"\n" + encode_config(config),
                           timeout=verifier.timeout_s, env={**env, **nest_env(LAUNCHER_DIR)})
    if result.exit_code == NOT_NESTED and not result.stdout:
        raise VerifierError(f"the grading sandbox cannot run the verifier: "
                            f"{result.stderr.strip()[-300:]}")
    records = parse_report_records(result.stdout, key)
    audit = [(str(r.get("flag")), str(r.get("detail")), str(r.get("where")))
             for r in records if r.get("event") == "audit"]
    scored = [r for r in records if r.get("event") == "scores"]
    raw = scored[-1].get("scores") if scored else None
    problem = "" if scored else (
        f"timed out after {verifier.timeout_s} s" if result.timed_out
        else f"returned no scores: {result.stderr.strip()[-300:]}")
    return raw, problem, audit


def _scores(raw: object, names: list[str]) -> tuple[dict[str, float], str]:
    if isinstance(raw, bool) or raw is None:
        return {}, f"scores must be numbers, got {raw!r}"
    if isinstance(raw, int | float):
        raw = {names[0]: raw} if len(names) == 1 else raw
    if not isinstance(raw, dict):
        return {}, f"scores must be a JSON object or a number, got {str(raw)[:100]!r}"
    scores, problems = {}, []
    for name in names:
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            problems.append(f"no numeric score for {name!r}")
            continue
        scores[name] = min(1.0, max(0.0, float(value)))
    return scores, "; ".join(problems)
