#!/usr/bin/env bash
# Set up (if needed) and run the main job on its embedded default: `tempering train`, which
# trains a tiny model built on this machine with asynchronous RL on the built-in switchboard
# tasks in local sandboxes (about 5 minutes on 2 cores) and writes runs/default/. Extra
# arguments are passed on, e.g. `bash scripts/run.sh --mode sync --name sync-default`.
# Running it again resumes (or, once finished, reports) the same run; --restart starts over.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tempering train "$@"
