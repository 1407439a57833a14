#!/usr/bin/env bash
# One device call: decode A/B of this checkout against another tree on the same machine (a
# worktree of the branch, carried in the run's `carry`): both precompile in parallel (one shared
# kernel cache, so only the modules that differ compile twice), then for each shape in AB_SHAPES
# the two trees' `ninfer-bench decode --batch 1,8` runs alternate AB_ROUNDS times (A, B, A, B).
# Optional AB_TESTS="file[::expr] ..." runs those GPU test files (expr: their -k expression, no
# spaces) in the other tree first.
# Env: AB_TREE (required: the other tree, relative to this checkout), AB_SHAPES (default 9b),
# AB_ROUNDS (2), AB_SIDES (the runs of a round, default "a b"; a side may add settings:
# "a a:NINFER_X=0+NINFER_Y=1 b"), DECODE_LIMIT (120 s per run), TEST_LIMIT (200 s per file).
# Logs: $OUT/ab_logs.tgz + $OUT/ab_summary.txt.
set -u
cd "$(dirname "$0")/.."
A=$PWD
B=$A/${AB_TREE:?AB_TREE: the other tree (a worktree inside this checkout)}
[ -d "$B/ninfer" ] || { echo "ab_call: $B is not a checkout"; exit 2; }
FINAL=${OUT:-/tmp/ab_out}; L=$(mktemp -d /tmp/ab_logs.XXXX); mkdir -p "$FINAL"
trap 'tar czf "$FINAL/ab_logs.tgz" -C "$L" . ; cp "$L/ab_summary.txt" "$FINAL/" 2>/dev/null' EXIT
. bench/device_env.sh
device_env "$L"
SITE=""  # the carried wheels' site, when device_env installed them
case "${PYTHONPATH:-}" in /tmp/site:*) SITE=/tmp/site ;; esac
export NINFER_KERNEL_CACHE=/tmp/nk PYTHONUNBUFFERED=1
T0=$(date +%s)
note() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$L/ab_summary.txt"; }
py() {  # py TREE args...: python3 with TREE's packages first
  local tree=$1; shift
  (cd "$tree" && PYTHONPATH="$tree${SITE:+:$SITE}" python3 "$@")
}
py "$A" -m bench.precompile > "$L/precompile_a.log" 2>&1 &
py "$B" -m bench.precompile > "$L/precompile_b.log" 2>&1 &
wait
note "A: $(tail -1 "$L/precompile_a.log")"
note "B: $(tail -1 "$L/precompile_b.log")"
for spec in ${AB_TESTS:-}; do
  f=${spec%%::*}; k=""; [ "$spec" != "$f" ] && k=${spec#*::}
  (cd "$B" && timeout "${TEST_LIMIT:-200}" env NINFER_CUDA_SYNC=1 PYTHONPATH="$B${SITE:+:$SITE}" \
    python3 -m pytest -m gpu "tests/cuda/$f.py" ${k:+-k "$k"} --maxfail=5 -q \
    -p no:cacheprovider) > "$L/test_b_$f.log" 2>&1
  note "B test $f rc=$? $(tail -1 "$L/test_b_$f.log")"
done
for shape in ${AB_SHAPES:-9b}; do
  for r in $(seq 1 "${AB_ROUNDS:-2}"); do
    i=0
    for spec in ${AB_SIDES:-a b}; do  # a | b, optionally :ENV=1+ENV2=0
      i=$((i + 1)); side=${spec%%:*}; envs=""; [ "$spec" != "$side" ] && envs=${spec#*:}
      tree=$A; [ "$side" = b ] && tree=$B
      log="$L/decode_${shape}_${i}${side}$r.log"
      timeout "${DECODE_LIMIT:-120}" bash -c "cd '$tree' && env X=0 ${envs//+/ } \
        PYTHONPATH='$tree${SITE:+:$SITE}' python3 -m bench.cli decode --batch 1,8 \
        --shape '$shape'" > "$log" 2>&1
      note "$shape ${spec}#$r rc=$? $(decode_figures "$log")"
    done
  done
done
