#!/usr/bin/env bash
# ncu looks at decode attention (long and short contexts) and the 35B-A3B MoE step: per-kernel
# times of one decode step (B = 1, 8) and the SOL / warp-state / scheduler sections of the
# attention and MoE kernels. Logs under $OUT/ncu (run after bench/session_call.sh, which sets
# up PYTHONPATH via bench/device_env.sh).
set -u
cd "$(dirname "$0")/.."
. bench/device_env.sh
L=${OUT:-/tmp/ncu_out}/ncu; mkdir -p "$L"; device_env "$L"
export NINFER_KERNEL_CACHE=/tmp/nk
for c in "1 32768" "8 8192" "1 1024"; do
  set -- $c
  timeout 120 ncu --clock-control none --profile-from-start off $NCU_SECTIONS \
    python3 bench/profile_attention.py --shape 9b --batch $1 --context $2 --launches 1 \
    > "$L/attn_b$1_c$2.txt" 2>&1
  echo "attn B=$1 ctx=$2 rc=$?"
done
timeout 150 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
  --csv python3 bench/profile_decode.py --shape 35b-a3b --batch 1,8 > "$L/moe_step.csv" 2>&1
echo "moe step rc=$?"
python3 bench/profile_decode.py --summarize "$L/moe_step.csv" --batch 1,8 > "$L/moe_step.txt" 2>&1
timeout 150 ncu --clock-control none --profile-from-start off --kernel-name regex:moe $NCU_SECTIONS \
  --launch-count 8 python3 bench/profile_decode.py --shape 35b-a3b --batch 8 \
  > "$L/moe_b8_sections.txt" 2>&1
echo "moe sections rc=$?"
