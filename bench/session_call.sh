#!/usr/bin/env bash
# One device call: precompile, decode A/B runs, GPU test files, the model oracle, kernel
# benchmarks, ncu profiles (env lists: DECODES="name:ENV=1+ENV2=0:shape[:context] ...",
# TESTS="file[::expr] ..." (expr: the -k expression, no spaces),
# MODEL=1, KERNELS="op ...", KERNEL_ENVS="ENV=0 ENV=1+ENV2=1 ...",
# KERNEL_SHAPE=9b, PROFILE_ENVS="ENV=1 ...", PROFILE_SHAPE=9b,
# TIMELINES="name:ENV=1+ENV2=0:shape:batch ..." (bench.timeline per spec; needs the timeline
# build: add NINFER_KERNEL_TIMELINE=1 to PRECOMPILE_ENVS; TIMELINE_ROWS=1: every link too),
# ATTN_TIMELINES="name:ENV=1+ENV2=0:batch:context[:ready] ..." (bench.attn_timeline: one decode
# paged_attention launch's phase marks at the KERNEL_SHAPE shape; "ready": past_kv_ready; the
# timeline build too); PRECOMPILE_ENVS="ENV=1+ENV2=1 ...":
# also precompile the kernels those settings select, in parallel with the default set, so the
# decode runs that use them do not compile inside their time limit; DECODE_LIMIT seconds per
# decode run, default 120). Logs: $OUT/logs.tgz + $OUT/summary.txt.
# Kernel cache across calls (each call is a fresh machine): SAVE_KCACHE=1 also returns the
# compiled modules as $OUT/nk.tgz.00, .01, ... (15 MiB parts, at most 60 MiB, else skipped);
# copy them into .kcache/ (git-ignored) and name .kcache in the next call's `carry`: the
# precompile then compiles only the modules whose source or options changed. Set it on the
# last invocation of a call only (each invocation writes its own parts; at most 8 files and
# 64 MiB come back per call).
set -u
cd "$(dirname "$0")/.."
FINAL=${OUT:-/tmp/session_out}; L=$(mktemp -d /tmp/session_logs.XXXX); mkdir -p "$FINAL"
save_kcache() {
  [ "${SAVE_KCACHE:-0}" = 1 ] && [ -d /tmp/nk ] || return 0
  # carried entries no process read in this call (stale builds) are dropped, where reads update
  # access times (the carried files' atimes were set to 2000 at unpacking, before the marker)
  if [ -f /tmp/nk.marker ] && find /tmp/nk -type f ! -newer /tmp/nk.marker \
      -anewer /tmp/nk.marker | grep -q .; then
    find /tmp/nk -type f ! -newer /tmp/nk.marker ! -anewer /tmp/nk.marker -delete
  fi
  tar czf /tmp/nk.tgz -C /tmp/nk . 2>/dev/null || return 0
  if [ "$(stat -c %s /tmp/nk.tgz)" -le $((60 * 1024 * 1024)) ]; then
    split -b 15m -d /tmp/nk.tgz "$FINAL/nk.tgz."
  else
    echo "kernel cache not saved: $(du -h /tmp/nk.tgz | cut -f1) > 60 MiB" >> "$L/summary.txt"
  fi
}
trap 'save_kcache; tar czf "$FINAL/logs.tgz" -C "$L" . ; cp "$L/summary.txt" "$FINAL/" 2>/dev/null' EXIT
. bench/device_env.sh
device_env "$L"
export NINFER_KERNEL_CACHE=/tmp/nk PYTHONUNBUFFERED=1
T0=$(date +%s)
note() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$L/summary.txt"; }
if ls .kcache/nk.tgz.* >/dev/null 2>&1; then  # carried from an earlier call (SAVE_KCACHE=1)
  mkdir -p /tmp/nk && cat .kcache/nk.tgz.* | tar xzf - -C /tmp/nk \
    && note "kernel cache carried: $(du -sh /tmp/nk | cut -f1)"
  find /tmp/nk -type f -exec touch -a -d 2000-01-01 {} + && touch /tmp/nk.marker
fi
settings=(); for e in ${PRECOMPILE_ENVS:-}; do settings+=(--setting "$e"); done
python3 -m bench.precompile "${settings[@]}" > "$L/precompile.log" 2>&1  # attention.cu ~2 min
note "$(tail -1 "$L/precompile.log")"
for spec in ${DECODES:-}; do  # name:ENVS:shape[:context]
  IFS=: read -r name envs shape context <<< "$spec"
  timeout "${DECODE_LIMIT:-120}" env X=0 ${envs//+/ } python3 -m bench.cli decode --batch 1,8 \
    --shape "$shape" ${context:+--context "$context"} \
    > "$L/decode_$name.log" 2>&1
  note "decode $name rc=$? $(decode_figures "$L/decode_$name.log")"
done
for spec in ${TESTS:-}; do  # file or file::expr
  f=${spec%%::*}; k=""; [ "$spec" != "$f" ] && k=${spec#*::}
  timeout "${TEST_LIMIT:-150}" env NINFER_CUDA_SYNC=1 python3 -m pytest -m gpu "tests/cuda/$f.py" \
    ${k:+-k "$k"} --maxfail=5 -q -p no:cacheprovider > "$L/test_$f.log" 2>&1
  note "test $f rc=$? $(tail -1 "$L/test_$f.log")"
done
if [ -n "${MODEL:-}" ]; then
  timeout "${MODEL_LIMIT:-240}" python3 -m pytest -m gpu tests/models/test_qwen35_gpu.py -q \
    -p no:cacheprovider --maxfail=6 ${MODEL_K:+-k "$MODEL_K"} > "$L/model.log" 2>&1
  note "model rc=$? $(tail -1 "$L/model.log")"
fi
if [ -n "${KERNELS:-}" ]; then
  for e in X=0 ${KERNEL_ENVS:-}; do
    timeout 150 env ${e//+/ } python3 -m bench.cli kernels --shape "${KERNEL_SHAPE:-9b}" --repeat 10 \
      --op ${KERNELS} \
      > "$L/kernels_$e.log" 2>&1
    note "kernels $e rc=$?"
  done
fi
for spec in ${TIMELINES:-}; do  # name:ENVS:shape:batch; each link of a step (timeline build)
  IFS=: read -r name envs shape batch <<< "$spec"
  timeout "${TIMELINE_LIMIT:-100}" env X=0 ${envs//+/ } python3 -m bench.timeline \
    --shape "$shape" --batch "${batch:-1}" --top 25 ${TIMELINE_ROWS:+--rows} \
    > "$L/timeline_$name.log" 2>&1
  note "timeline $name rc=$? $(grep -m1 '^step' "$L/timeline_$name.log")"
done
for spec in ${ATTN_TIMELINES:-}; do  # name:ENVS:batch:context[:ready]; one attention launch's phases
  IFS=: read -r name envs batch ctx ready <<< "$spec"
  timeout "${TIMELINE_LIMIT:-100}" env X=0 ${envs//+/ } python3 -m bench.attn_timeline \
    --shape "${KERNEL_SHAPE:-9b}" --batch "$batch" --context "$ctx" ${ready:+--past-kv-ready} \
    > "$L/attn_timeline_$name.log" 2>&1
  note "attn timeline $name rc=$? $(grep -m1 '^mean link' "$L/attn_timeline_$name.log")"
done
for e in ${PROFILE_ENVS:-}; do  # ncu per-kernel breakdown of one decode step at B=1 per env
  timeout 180 env $e ncu --clock-control none --profile-from-start off \
    --metrics gpu__time_duration.sum --csv python3 bench/profile_decode.py \
    --shape "${PROFILE_SHAPE:-9b}" --batch 1 \
    > "$L/profile_$e.log" 2>&1
  note "profile $e rc=$?"
  python3 bench/profile_decode.py --summarize "$L/profile_$e.log" --batch 1 \
    > "$L/profile_${e}_summary.txt" 2>&1
done
