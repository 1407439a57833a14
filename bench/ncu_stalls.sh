#!/usr/bin/env bash
# ncu: per-kernel times of one decode step at STEP_SHAPES (B = 1 and 8 each; summaries
# step_<shape>.txt), then the warp-state and source-level stall sections (where the warps of a
# kernel wait, by SASS line) of the kernels matching STALL_REGEX at STALL_SHAPE, B = STALL_B.
# Logs under $OUT/ncu. Env: STEP_SHAPES="0.8b 9b", STALL_REGEX="moe_tma_gate_up|moe_fused_down",
# STALL_SHAPE=35b-a3b, STALL_B=1, STALL_COUNT=4; STALL_SOURCE=1 also prints the source page (SASS
# lines with their sampled stall reasons, CSV: stalls_source.csv; this option not yet run on a
# GPU).
set -u
cd "$(dirname "$0")/.."
. bench/device_env.sh
L=${OUT:-/tmp/ncu_out}/ncu; mkdir -p "$L"; device_env "$L"
export NINFER_KERNEL_CACHE=/tmp/nk
for s in ${STEP_SHAPES:-}; do
  timeout 200 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
    --csv python3 bench/profile_decode.py --shape "$s" --batch 1,8 > "$L/step_$s.csv" 2>&1
  echo "step $s rc=$?"
  python3 bench/profile_decode.py --summarize "$L/step_$s.csv" --batch 1,8 > "$L/step_$s.txt" 2>&1
done
if [ -n "${STALL_REGEX:-}" ]; then
  timeout 200 ncu --clock-control none --profile-from-start off --section WarpStateStats \
    --section SourceCounters --section SpeedOfLight --kernel-name regex:"$STALL_REGEX" \
    --launch-count "${STALL_COUNT:-4}" python3 bench/profile_decode.py \
    --shape "${STALL_SHAPE:-35b-a3b}" --batch "${STALL_B:-1}" > "$L/stalls.txt" 2>&1
  echo "stalls rc=$?"
  if [ -n "${STALL_SOURCE:-}" ]; then
    timeout 200 ncu --clock-control none --profile-from-start off --section SourceCounters \
      --section WarpStateStats --page source --print-source sass --csv \
      --kernel-name regex:"$STALL_REGEX" --launch-count 1 python3 bench/profile_decode.py \
      --shape "${STALL_SHAPE:-35b-a3b}" --batch "${STALL_B:-1}" > "$L/stalls_source.csv" 2>&1
    echo "stalls source rc=$?"
  fi
fi
