#!/usr/bin/env bash
# One-off device session: PDL trigger-first A/B and launch-removal probes (logs in $OUT).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD NINFER_KERNEL_CACHE=/tmp/nk PYTHONUNBUFFERED=1
L=${OUT:-/tmp/probe_out}; mkdir -p "$L"; T0=$(date +%s)
python3 -m bench.precompile > "$L/pre0.log" 2>&1 &
NINFER_PDL_TRIGGER_FIRST=1 python3 -m bench.precompile > "$L/pre1.log" 2>&1 &
wait
echo "[$(( $(date +%s) - T0 ))s] precompiled: $(tail -1 $L/pre0.log) | $(tail -1 $L/pre1.log)" | tee -a "$L/summary.txt"
d() {  # d NAME ENV... -- ARGS: one decode run
  local name=$1; shift
  timeout 200 env "$@" > "$L/$name.log" 2>&1
  echo "[$(( $(date +%s) - T0 ))s] $name rc=$?" >> "$L/summary.txt"
  grep -E "copy .* GB/s|^ *[0-9]+ +[0-9]+\.[0-9]+ " "$L/$name.log" | tail -3 >> "$L/summary.txt"
}
B="python3 -m bench.cli decode --batch 1,8 --shape"
P="python3 -m bench.probe_skip"
for s in ${SHAPES:-9b 35b-a3b 0.8b}; do
  d "${s}_base" X=0 $B $s
  d "${s}_tf" NINFER_PDL_TRIGGER_FIRST=1 $B $s
done
d 9b_skip_norm X=0 $P --skip norm -- decode --batch 1,8 --shape 9b
d 9b_skip_gdn X=0 $P --skip gdn_decode -- decode --batch 1,8 --shape 9b
d 9b_skip_attn X=0 $P --skip attention,attn_prep,sigmoid_mul -- decode --batch 1,8 --shape 9b
d 9b_gemv_only X=0 $P --skip norm,gdn_decode,attention,attn_prep,sigmoid_mul,add -- decode --batch 1,8 --shape 9b
d 35b_skip_moe X=0 $P --skip moe -- decode --batch 1,8 --shape 35b-a3b
cat "$L/summary.txt"
