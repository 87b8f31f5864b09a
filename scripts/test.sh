#!/usr/bin/env bash
# Set up (if needed), lint, type-check and run the test suite. Extra arguments go to pytest
# instead of the default `-m "not slow"`, e.g. `-m slow` or a path.
# Fails when no test ran (pytest exit code 5), so a broken collection cannot pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# Lint and type-check first: cheap, and a failure here is as real as a failing test.
.venv/bin/ruff check src tests benchmarks || exit 1
.venv/bin/mypy || exit 1
# With no arguments, the default run leaves out the tests marked slow (about seven minutes:
# training runs, the Ray cluster tests, kill -9 resumes, the tiny model's episodes, the
# slowest attacks and the sweep of every earlier attack across the process boundary);
# `bash scripts/test.sh -m slow` runs those, and CI runs both.
if [ $# -eq 0 ]; then
    set -- -m "not slow"
fi
.venv/bin/python -m pytest "$@"
code=$?
if [ $code -eq 5 ]; then
    echo "test: no tests were collected; that is a failure" >&2
    exit 1
fi
exit $code
