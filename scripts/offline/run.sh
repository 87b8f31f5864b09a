#!/usr/bin/env bash
# On a machine with no network, from a checkout with .offline/ (scripts/offline/bundle.sh), as
# root: install the bundle, check the sandbox (`tempering doctor`, then HumanEval's first 8
# reference solutions graded), then run the async-vs-sync benchmark on 3 seeds, every run side
# by side, with the learner and, if it works there, the engine on the GPU. Output and JSON go
# to $OUT (default ./offline-out). The benchmark gets BUDGET seconds from the start (default
# 585); what is not done 25 s before that is stopped and reported as cut.
#
#   bash scripts/offline/run.sh [check]      # check: install and check only
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
T0=$(date +%s)
OUT=${OUT:-$PWD/offline-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/tempering-site .offline/whl/*.whl || exit 9
export PYTHONPATH=/tmp/tempering-site:$PWD/src
# pytest for the sandboxes' python3: the host's /usr is what a sandbox sees
/usr/bin/python3 -c 'import pytest' 2>/dev/null || python3 -m pip install -q --no-index \
    --no-deps --no-compile --target /usr/lib/python3/dist-packages .offline/sandbox-whl/*.whl \
    || exit 8
command -v bwrap >/dev/null || install -m 755 .offline/bin/bwrap /usr/bin/bwrap
if ldd "$(command -v bwrap)" | grep -q "not found"; then
    cp .offline/lib/* /usr/lib/x86_64-linux-gnu/ && ldconfig
fi
mkdir -p /var/lib/tempering/bin && cp .offline/tempering-bin/* /var/lib/tempering/bin/
chmod 755 /var/lib/tempering /var/lib/tempering/bin
export TEMPERING_CACHE=$PWD/.offline/cache
echo "$(nproc) cpus; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1)"
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
tempering=(python3 -c 'import sys; from tempering.cli import main; sys.argv[0] = "tempering"; sys.exit(main())')
timeout 60 "${tempering[@]}" doctor 2>&1 | tail -30
timeout 120 "${tempering[@]}" tasks validate humaneval:8 > "$OUT/validate.log" 2>&1
rc=$?
tail -3 "$OUT/validate.log"
[ $rc = 0 ] || { echo "offline: grading the reference solutions failed (rc $rc)"; exit 7; }
echo "offline: checked in $(( $(date +%s) - T0 )) s"
[ "${1:-}" = check ] && exit 0
for engine in cuda cpu; do
    T1=$(date +%s)
    # every run at once (3 syncs, then each seed's 2 async runs as soon as its R* is set);
    # at the deadline the runs still going stop and the table says what was done
    left=$(( ${BUDGET:-585} - (T1 - T0) ))
    timeout $left python3 benchmarks/async_vs_sync.py --seeds 3 --jobs 9 --staleness 3,4 \
        --deadline $(( left - 25 )) --set learner.device=cuda --set rollout.device=$engine \
        --json "$OUT/async_vs_sync.json" > "$OUT/async_vs_sync-$engine.log" 2>&1
    rc=$?
    echo "offline: benchmark, engine on $engine: rc $rc at $(( $(date +%s) - T0 )) s"
    grep -v -E "waiting for batch|^(the )?last step| step [0-9]+ " "$OUT/async_vs_sync-$engine.log" \
        | tail -70
    # the engine on cuda failing at once (not a timeout): again with the engine on the CPU
    if [ $rc = 0 ] || [ $rc = 124 ] || [ $(( $(date +%s) - T1 )) -gt 120 ]; then break; fi
done
