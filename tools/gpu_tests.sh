#!/bin/sh
# gpu_tests.sh - run on the GPU machine: build the test binary, run the jit, gpu and nccl groups
# with the machine's NVRTC and, when an NVRTC 11.8 archive is carried, with it too (compute_70 PTX,
# the V100 code path, JIT-compiled by the driver for the local GPU).  Logs go to $OUT (or build/).
#
# Then the long-context request of issue 6 (tools/long_context: one request of LONG_TOKENS prompt
# tokens through the scheduler on a tiny random model, speed and memory against the formula of
# docs/SERVING.md), bounded by `timeout LONG_TIMEOUT`; its output goes to $OUT/long_context.txt.
#
#   make nvrtc118-archive                       # here: build/nvrtc-sm70.tar.xz (16 MB)
#   sh tools/gpu_tests.sh [build/nvrtc-sm70.tar.xz]
#
# Environment: LONG_TOKENS (default 262144; 0 skips the long run), LONG_CHUNK (default 8192),
# LONG_GEN (default 32), LONG_TIMEOUT (seconds, default 420), SKIP_TESTS=1 (only the long run),
# SKIP_DEFAULT=1 (not the groups with the machine's NVRTC: the build, then NVRTC 11.8's run alone).  In s90 on
# an H100, one 500 s call (the build, two kernel timelines, the machine's NVRTC run) ended inside NVRTC 11.8's run;
# that run alone then took 285 s with the kernel cache warm: give the two runs a call each.
set -u
out=${OUT:-build}
mkdir -p "$out"
make -j16 tests/test_qsa tools/make_tiny_model tools/long_context models/tiny/config.json > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; exit 1; }
nvidia-smi -L
if [ "${SKIP_TESTS:-0}" != 1 ]; then
if [ "${SKIP_DEFAULT:-0}" != 1 ]; then
echo "=== the machine's NVRTC"
./tests/test_qsa --group jit --group gpu --group nccl -v > "$out/gpu_default.txt" 2>&1; echo "rc=$?"
grep -E "FAIL|CHECK|passed|GPU:|physical-order|greedy tokens|held to|kernels: cold" "$out/gpu_default.txt" | head -60
fi
if [ $# -ge 1 ] && [ -f "$1" ]; then
    mkdir -p /tmp/qsa-nvrtc118 && tar -C /tmp/qsa-nvrtc118 -xJf "$1"
    lib=/tmp/qsa-nvrtc118/.nvrtc-sm70/libnvrtc.so.11.2
    echo "=== NVRTC 11.8 ($lib): compute_70"
    QSA_NVRTC_LIB=$lib LD_LIBRARY_PATH=/tmp/qsa-nvrtc118/.nvrtc-sm70 ./tests/test_qsa --group jit --group gpu --group nccl \
        > "$out/gpu_sm70.txt" 2>&1; echo "rc=$?"
    grep -E "FAIL|CHECK|passed" "$out/gpu_sm70.txt" | head -30
fi
fi
long=${LONG_TOKENS:-262144}
if [ "$long" -gt 0 ]; then
    echo "=== long context: $long prompt tokens, chunk ${LONG_CHUNK:-8192}, ${LONG_GEN:-32} generated (timeout ${LONG_TIMEOUT:-420} s)"
    timeout "${LONG_TIMEOUT:-420}" ./tools/long_context --backend cuda --tokens "$long" --chunk "${LONG_CHUNK:-8192}" \
        --gen "${LONG_GEN:-32}" > "$out/long_context.txt" 2>&1
    rc=$?
    echo "rc=$rc$([ $rc = 124 ] && echo ' (timed out: the last prefill line shows how far it got)')"
    grep -vE "^  prefill [0-9]+ / " "$out/long_context.txt" | head -40
    grep -E "^  prefill [0-9]+ / " "$out/long_context.txt" | tail -3
fi
