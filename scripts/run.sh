#!/usr/bin/env bash
# Set up (if needed) and run the main job on its default: `tempering demo`. Extra arguments are
# passed on, e.g. `bash scripts/run.sh --episodes 1000`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tempering demo "$@"
