"""One grading forked from a grading zygote, as the grader runs it: the hidden tests' Python
files reach the launcher, not the disk (placeholders there), the tests directory is sealed
read-only, then the configuration goes and the capped report comes back."""

from __future__ import annotations

from tempering.reward.runner import ZYGOTE_DIR, RunPlan, TestRun
from tempering.sandbox.local.zygote import Zygote


async def run_in_zygote(zygote: Zygote, files: dict[str, str], timeout: float = 10.0
                        ) -> tuple[TestRun, bool, bool, int | None]:
    """(the checked report, timed out, OOM-killed, exit code) of a grading of ``files``
    (workdir-relative; ``tests/*.py`` are the hidden tests)."""
    forked = await zygote.fork()
    try:
        sources = {}
        for path, text in files.items():
            hidden = path.startswith("tests/") and path.endswith(".py")
            forked.storage.write(path, b"" if hidden else text.encode(), 0o644)
            if hidden:
                sources[f"/workspace/{path}"] = text.encode()
        plan = RunPlan(["tests"], "tests", "/workspace", "", runner="plain",
                       launcher_dir=ZYGOTE_DIR, sources=sources)
        forked.storage.write(plan.canary_path, b"", 0o644)
        await forked.seal(["/workspace/tests"])
        report = await forked.run(plan.config, timeout, 1 << 20)
        return plan.read(report.text), report.timed_out, report.oom_killed, report.exit_code
    finally:
        forked.close()
