#!/bin/sh
# target_bench.sh - run on the GPU machine: the bench of issue 9's targets (docs/PERFORMANCE.md, "Where it
# stands"), as one command whose logs and JSON land under $OUT (or build/).  It builds tools/bench when
# none was carried.
#
#   sh tools/target_bench.sh [full|short]
#
# full (default): the sixtieth session's command, whose numbers are the table of "Where it stands" (the
#   ceilings, JIT cold/warm, the 8,192-token prefill, decode at batch 1, 8, 32 and 128 at 8,192 and the
#   long context, CUDA graphs), without its rows of draws and with --max-seconds 240 so that it fits one
#   call (~400 s on an H200 with the machine's start).
# short: the ceilings, the prefill, and decode at batch 1 and 32 at 8,192 only: the two unmet targets
#   (~150 s of bench).
# Environment: MAX_SECONDS (the bench's --max-seconds: full 240, short 100).
set -u
out=${OUT:-build}
mode=${1:-full}
mkdir -p "$out"
case "$mode" in
full) max=${MAX_SECONDS:-240}; set -- --batches 1,8,32,128 --gemv-shapes 16480x2560,2560x6144,10240x320,320x10240,62080x2560 \
          --gemv-m 1,32 ;;
short) max=${MAX_SECONDS:-100}; set -- --batches 1,32 --no-long ;;
*) echo "usage: sh tools/target_bench.sh [full|short]" >&2; exit 2 ;;
esac
if [ ! -x tools/bench ]; then
    make -j16 tools/bench > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; exit 1; }
fi
{
    date -u +%Y-%m-%dT%H:%M:%SZ
    git log --oneline -1 2>/dev/null
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
echo "=== tools/bench --graphs --no-sampled $* --prefill 8192 --chunk 2048 --prefill-reps 1 --settle-ms 2000 --max-seconds $max"
./tools/bench --graphs --no-sampled "$@" --prefill 8192 --chunk 2048 --prefill-reps 1 --settle-ms 2000 --max-seconds "$max" \
    --out "$out/$mode.json" > "$out/$mode.log" 2>&1
rc=$?
echo "rc=$rc"
cat "$out/$mode.log"
exit $rc
