#!/usr/bin/env bash
# ncu sections (SOL, warp states, scheduler, memory, occupancy, launch) of a few decode GEMVs
# (linear_tma_kernel launches of one eager decode step) at B = 1 and B = 8, to see what a
# GEMV's extra time at B = 8 is spent on. SHAPE (default 0.8b), SKIP (launches of the kernel
# skipped first, default 24), COUNT (default 4). Logs under $OUT/ncu_gemv.
set -u
cd "$(dirname "$0")/.."
. bench/device_env.sh
L=${OUT:-/tmp/ncu_out}/ncu_gemv; mkdir -p "$L"; device_env "$L"
export NINFER_KERNEL_CACHE=/tmp/nk
for b in 1 8; do
  timeout 150 ncu --clock-control none --profile-from-start off --kernel-name regex:linear_tma \
    --launch-skip "${SKIP:-24}" --launch-count "${COUNT:-4}" $NCU_SECTIONS \
    python3 bench/profile_decode.py --shape "${SHAPE:-0.8b}" --batch "$b" > "$L/gemv_b$b.txt" 2>&1
  echo "gemv B=$b rc=$?"
done
