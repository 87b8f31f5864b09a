#!/usr/bin/env bash
# Bundle what a machine with no network (a lent GPU host: Python 3.12 with PyTorch, no
# bubblewrap, no registry) needs to run Tempering's benchmarks from this checkout, into
# .offline/ (git-ignored): the wheels of this project's dependencies for its Python, pytest for
# the sandboxes' python3, bubblewrap and the libraries it links, the sandbox's two static
# binaries, and the tiny models warmed up for seeds 0..N-1 (so no warm-up runs there). Run here,
# after scripts/setup.sh; then copy .offline/ there with the checkout and run
# scripts/offline/run.sh. Safe to run again.
#
#   bash scripts/offline/bundle.sh [SEEDS] [PYTHON_VERSION]     # defaults: 3, 3.12
set -euo pipefail
cd "$(dirname "$0")/../.."
seeds=${1:-3}
pyver=${2:-3.12}
out=.offline
mkdir -p $out/whl $out/sandbox-whl $out/bin $out/lib $out/tempering-bin $out/cache
[ -x .venv/bin/python ] || bash scripts/setup.sh

# The dependencies the target's image lacks (it has torch, transformers, numpy, pyarrow, httpx,
# rich, yaml), at the versions this venv holds, for the target's Python.
pins=$(.venv/bin/python -m pip freeze 2>/dev/null | grep -iE \
    '^(pydantic|pydantic[-_]core|annotated[-_]types|typing[-_]inspection|duckdb|ruff|human[-_]eval|fire|termcolor)==')
fetch() {  # dir, requirements...
    local dir=$1; shift
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$dir" "$@" 2>&1 | grep -v '^WARNING' || true
}
# shellcheck disable=SC2086
fetch $out/whl $pins
fetch $out/sandbox-whl pytest==8.4.2 pluggy==1.6.0 iniconfig==2.1.0 packaging==25.0 pygments==2.19.2

# bubblewrap and what it links (the target may not have libselinux), the sandbox binaries
bwrap=$(command -v bwrap)
cp "$bwrap" $out/bin/
for lib in $(ldd "$bwrap" | awk '/=> \//{print $3}' | grep -v -E 'libc\.so|ld-linux'); do
    cp -L "$lib" $out/lib/
done
.venv/bin/tempering doctor >/dev/null 2>&1 || true  # builds the sandbox binaries if missing
cp "${TEMPERING_HOME:-/var/lib/tempering}"/bin/tempering-* $out/tempering-bin/

# The warmed-up tiny models of the async-vs-sync benchmark's seeds
TEMPERING_CACHE=$PWD/$out/cache .venv/bin/python - "$seeds" <<'PY'
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "benchmarks")
from async_vs_sync import config_for  # noqa: E402

from tempering.train.run import load_tasks, prepare_model  # noqa: E402

for seed in range(int(sys.argv[1])):
    config = config_for("sync", Path(tempfile.mkdtemp()), 16, f"seed={seed}",
                        f"model.tiny.seed={seed}")
    print(f"seed {seed}:", prepare_model(config, load_tasks(config), print), flush=True)
PY
du -sh $out
