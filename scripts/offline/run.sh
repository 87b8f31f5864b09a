#!/usr/bin/env bash
# On a machine with no network, from a checkout with .offline/ (scripts/offline/bundle.sh), as
# root: install the bundle, check the sandbox (`tempering doctor`, then HumanEval's first 8
# reference solutions graded), then run the async-vs-sync benchmark on 3 seeds with the learner
# and, if it works there, the engine on the GPU: the three sync runs at once, and beside them
# the async runs two at a time from the start (`--overlap --jobs 2`). Output, JSON and every
# run's per-step metrics go to $OUT (default ./offline-out). The benchmark gets BUDGET seconds
# from the start (default 585); what is not done 25 s before that is stopped and reported.
#
#   bash scripts/offline/run.sh [check]      # check: install and check only
#   bash scripts/offline/run.sh alone [SECONDS]
#       one async run (seed 1, bound 3) alone on the machine for SECONDS (default 180), its
#       per-step metrics kept and the CPU use of its processes and threads and the GPU's
#       sampled every 10 s: where an async step's time goes when nothing else runs
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
if [ "${1:-}" = alone ]; then
    runs=$(mktemp -d)
    spec='{"label": "alone", "mode": "async", "steps": 40, "runs": "'$runs'", "extra": ["seed=1",
        "model.tiny.seed=1", "learner.device=cuda", "rollout.device=cuda",
        "rollout.max_staleness=3"]}'
    timeout "${2:-180}" python3 benchmarks/async_vs_sync.py --child "$spec" \
        > "$OUT/alone.log" 2>&1 &
    bench=$!
    while kill -0 $bench 2>/dev/null; do
        sleep 10
        { echo "--- $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
          nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
          ps -eo pcpu,rss,comm --sort=-pcpu | head -8
          main=$(pgrep -P $bench | head -1)
          # its threads' CPU over 3 s (the learner's against the event loop's), then every
          # process's since it started
          [ -n "$main" ] && top -b -H -d 3 -n 2 -p "$main" 2>/dev/null \
              | awk '/^top -/ {n++} n == 2 && /^ *[0-9]/ {print $1, $9, $12}' | head -8
        } >> "$OUT/alone-cpu.log" 2>&1
    done
    wait $bench
    echo "offline: alone: rc $? at $(( $(date +%s) - T0 )) s"
    cp "$runs"/alone/async/metrics.jsonl "$OUT/alone-metrics.jsonl" 2>/dev/null
    grep -E " step +[0-9]+/" "$OUT/alone.log" | tail -40
    tail -40 "$OUT/alone-cpu.log"
    exit 0
fi
for engine in cuda cpu; do
    T1=$(date +%s)
    # the 3 syncs at once (mostly waiting on their slowest episode), the 6 async runs 2 at a
    # time beside them; at the deadline the runs still going stop and the table says what was
    # done
    left=$(( ${BUDGET:-585} - (T1 - T0) ))
    timeout $left python3 benchmarks/async_vs_sync.py --seeds 3 --staleness 3,4 --overlap \
        --jobs 2 --deadline $(( left - 25 )) --set learner.device=cuda \
        --set rollout.device=$engine --keep "$OUT/metrics" \
        --json "$OUT/async_vs_sync.json" > "$OUT/async_vs_sync-$engine.log" 2>&1
    rc=$?
    echo "offline: benchmark, engine on $engine: rc $rc at $(( $(date +%s) - T0 )) s"
    grep -v -E "waiting for batch|^(the )?last step| step [0-9]+ " "$OUT/async_vs_sync-$engine.log" \
        | tail -70
    # the engine on cuda failing at once (not a timeout): again with the engine on the CPU
    if [ $rc = 0 ] || [ $rc = 124 ] || [ $(( $(date +%s) - T1 )) -gt 120 ]; then break; fi
done
