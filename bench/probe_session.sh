#!/usr/bin/env bash
# One device call of launch-cost probes (bench/probe_skip.py): PROBES="shape:groups ..." runs
# the decode benchmark (B = 1, 8) of each shape with those op groups replaced by no-ops ("-": none,
# the baseline), e.g. PROBES="0.8b:- 0.8b:norm 0.8b:gdn_decode". Summary in $OUT/summary.txt.
set -u
cd "$(dirname "$0")/.."
. bench/device_env.sh  # decode_figures
export PYTHONPATH=$PWD NINFER_KERNEL_CACHE=/tmp/nk PYTHONUNBUFFERED=1
L=${OUT:-/tmp/probe_out}; mkdir -p "$L"; T0=$(date +%s)
python3 -m bench.precompile > "$L/precompile.log" 2>&1
echo "[$(( $(date +%s) - T0 ))s] $(tail -1 "$L/precompile.log")" | tee -a "$L/summary.txt"
for spec in ${PROBES:-}; do
  shape=${spec%%:*}; groups=${spec#*:}
  if [ "$groups" = "-" ]; then
    timeout 120 python3 -m bench.cli decode --batch 1,8 --shape "$shape" > "$L/run.log" 2>&1
  else
    timeout 120 python3 -m bench.probe_skip --skip "$groups" -- decode --batch 1,8 \
      --shape "$shape" > "$L/run.log" 2>&1
  fi
  echo "[$(( $(date +%s) - T0 ))s] $shape skip=$groups rc=$? $(decode_figures "$L/run.log")" | tee -a "$L/summary.txt"
done
