#!/bin/sh
# gpu_tests.sh - run on the GPU machine: build the test binary, run the jit, gpu and nccl groups
# with the machine's NVRTC and, when an NVRTC 11.8 archive is carried, with it too (compute_70 PTX,
# the V100 code path, JIT-compiled by the driver for the local GPU).  Logs go to $OUT (or build/).
#
#   make nvrtc118-archive                       # here: build/nvrtc-sm70.tar.xz (16 MB)
#   sh tools/gpu_tests.sh [build/nvrtc-sm70.tar.xz]
set -u
out=${OUT:-build}
mkdir -p "$out"
make -j16 tests/test_qsa > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; exit 1; }
nvidia-smi -L
echo "=== the machine's NVRTC"
./tests/test_qsa --group jit --group gpu --group nccl -v > "$out/gpu_default.txt" 2>&1; echo "rc=$?"
grep -E "FAIL|CHECK|passed|GPU:|physical-order|greedy tokens|held to|kernels: cold" "$out/gpu_default.txt" | head -60
if [ $# -ge 1 ] && [ -f "$1" ]; then
    mkdir -p /tmp/qsa-nvrtc118 && tar -C /tmp/qsa-nvrtc118 -xJf "$1"
    lib=/tmp/qsa-nvrtc118/.nvrtc-sm70/libnvrtc.so.11.2
    echo "=== NVRTC 11.8 ($lib): compute_70"
    QSA_NVRTC_LIB=$lib LD_LIBRARY_PATH=/tmp/qsa-nvrtc118/.nvrtc-sm70 ./tests/test_qsa --group jit --group gpu --group nccl \
        > "$out/gpu_sm70.txt" 2>&1; echo "rc=$?"
    grep -E "FAIL|CHECK|passed" "$out/gpu_sm70.txt" | head -30
fi
