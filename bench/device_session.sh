#!/usr/bin/env bash
# The lead's H200 session driver: `bash bench/device_session.sh tests|bench` (logs in $OUT).
#   tests: every GPU kernel test file (one pytest process each, NINFER_CUDA_SYNC=1) then the
#          model-level GPU tests (CUDA backend vs transformers on the GPU), ~7 min.
#   bench: kernel microbenchmarks + whole-model decode/prefill at real shapes, with
#          transformers side by side, ~9 min.
set -u
cd "$(dirname "$0")/.."
MODE="${1:-tests}"
FINAL="${OUT:-$PWD/device_out}"
OUT=/tmp/device_logs  # everything lands here; $OUT gets one archive + the summary
mkdir -p "$OUT" "$FINAL"
trap 'exit 143' TERM
trap 'tar czf "$FINAL/logs.tgz" -C "$OUT" . ; cp "$OUT/summary.txt" "$FINAL/" 2>/dev/null' EXIT
. bench/device_env.sh
device_env "$OUT"
export NINFER_KERNEL_CACHE=/tmp/ninfer_kernels PYTHONUNBUFFERED=1
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
run() {  # run NAME TIMEOUT CMD...: log to $OUT/NAME.log, one summary line
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E "passed|failed|error|rc=|tok/s|ratio" "$OUT/$name.log" | tail -2 | tr '\n' ' ')
  echo "[$(elapsed)s] $name rc=$rc ${last}" | tee -a "$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
if [ "$MODE" = dev ]; then
  # dev: pick the steps with variables (all optional):
  #   TESTS="test_cuda_linear ..."  kernel test files;  MODEL=1  the exact model oracle;
  #   DECODE="9b 35b-a3b"  decode benchmarks;  PREFILL=1  9B prefill 8192 with transformers;
  #   PREFILL_HF=1 adds transformers to the prefill run;  KERNELS="linear paged_attention ..."  kernel microbenchmarks (9B shape);
  #   SERVE="9b"  serve-sim at C=1,4,8 (a shape may repeat; SERVE_CHUNK=N sets --prefill-chunk,
  #   SERVE_ROUNDS=R --rounds);  PREFILL_ENVS="..."  the 9B prefills once more per variable;
  #   PROFILE=1  ncu breakdown of the decode step (B=1 and 8; PROFILE_SHAPES="9b 35b-a3b", default 9b);
  #   DECODE_ENVS="NINFER_GEMV_ROWS=1 A=1+B=2 ..."  the decode once more per entry ('+' joins
  #   variables; shapes DECODE_ENV_SHAPES, default 9b) (A/B of a flag);
  #   KERNEL_ENVS="..."  the kernel benchmarks once more per variable;
  #   PREFILL_SMALL=1  9B prefill of 1024 tokens in 512- and 1024-token chunks (host launch time);
  #   PROFILE_PREFILL=1  host vs GPU of prefill chunks (bench/profile_prefill.py, gate method),
  #   PROFILE_PREFILL_NCU=1 adds its ncu kernel breakdown.
  for f in ${TESTS:-}; do
    run "$f" 200 env NINFER_CUDA_SYNC=1 python3 -m pytest -m gpu "tests/cuda/$f.py" \
      --maxfail=5 -q -p no:cacheprovider
  done
  if [ -n "${MODEL:-}" ]; then
    run model_gpu 300 env PYTHONPATH="$PWD" python3 -m pytest -m gpu tests/models/test_qwen35_gpu.py -q \
      -p no:cacheprovider --maxfail=6
  fi
  for s in ${DECODE:-}; do
    run "decode_$s" 200 python3 -m bench.cli decode --shape "$s" --batch 1,8 ${HF:+--hf} --json "$OUT/decode_$s.json"
  done
  for e in ${DECODE_ENVS:-}; do  # e.g. NINFER_GEMV_TMA=1+NINFER_GEMV_TMA_SK=2048 ('+' joins)
    for s in ${DECODE_ENV_SHAPES:-9b}; do
      run "decode_${s}_$e" 200 env ${e//+/ } python3 -m bench.cli decode --shape "$s" --batch 1,8 --json "$OUT/decode_${s}_$e.json"
    done
  done
  if [ -n "${PREFILL_SMALL:-}" ]; then  # serve-sim's prompt chunks: 1024 tokens in 512s, one 1024
    run prefill_9b_c512 120 python3 -m bench.cli prefill --shape 9b --tokens 1024 --chunk 512 --json "$OUT/prefill_9b_c512.json"
    run prefill_9b_c1024 120 python3 -m bench.cli prefill --shape 9b --tokens 1024 --chunk 1024 --json "$OUT/prefill_9b_c1024.json"
  fi
  if [ -n "${PREFILL:-}" ]; then
    run prefill_9b 200 python3 -m bench.cli prefill --shape 9b --tokens 8192 --chunk 2048 ${PREFILL_HF:+--hf} --json "$OUT/prefill_9b.json"
  fi
  for e in ${PREFILL_ENVS:-}; do  # the 9B prefills once more per variable (A/B of a flag)
    run "prefill_9b_c1024_$e" 120 env "$e" python3 -m bench.cli prefill --shape 9b --tokens 1024 --chunk 1024 --json "$OUT/prefill_9b_c1024_$e.json"
    run "prefill_9b_$e" 200 env "$e" python3 -m bench.cli prefill --shape 9b --tokens 8192 --chunk 2048 --json "$OUT/prefill_9b_$e.json"
  done
  if [ -n "${KERNELS:-}" ]; then
    run kernels_9b 200 python3 -m bench.cli kernels --shape 9b --repeat 10 --op ${KERNELS} --json "$OUT/kernels_9b.json"
  fi
  for e in ${KERNEL_ENVS:-}; do
    run "kernels_9b_$e" 200 env "$e" python3 -m bench.cli kernels --shape 9b --repeat 10 --op ${KERNELS:-linear} --json "$OUT/kernels_9b_$e.json"
  done
  i=0
  for s in ${SERVE:-}; do
    i=$((i + 1))
    run "serve_${s}_$i" 300 python3 -m bench.cli serve-sim --shape "$s" --concurrency 1,4,8 --prompt 1024 --output 256 ${SERVE_CHUNK:+--prefill-chunk $SERVE_CHUNK} --rounds "${SERVE_ROUNDS:-1}" --json "$OUT/serve_${s}_$i.json"
  done
  if [ -n "${PROFILE_PREFILL:-}" ]; then  # host vs GPU of eager prefill chunks + ncu breakdown
    run prefill_gate_512 150 python3 bench/profile_prefill.py --shape 9b --tokens 1024 --chunk 512 --cprofile
    run prefill_gate_2048 150 python3 bench/profile_prefill.py --shape 9b --tokens 4096 --chunk 2048
    [ -n "${PROFILE_PREFILL_NCU:-}" ] && run prefill_ncu 200 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
      --csv python3 bench/profile_prefill.py --shape 9b --tokens 1024 --chunk 512 --ncu
    [ -n "${PROFILE_PREFILL_NCU:-}" ] && python3 bench/profile_decode.py --summarize "$OUT/prefill_ncu.log" > "$OUT/prefill_ncu_summary.txt" 2>&1
  fi
  if [ -n "${PROFILE:-}" ]; then
    for s in ${PROFILE_SHAPES:-9b}; do
      run "profile_$s" 240 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
        --csv python3 bench/profile_decode.py --shape "$s" --batch 1,8
      python3 bench/profile_decode.py --summarize "$OUT/profile_$s.log" --batch 1,8 > "$OUT/profile_${s}_summary.txt" 2>&1
    done
  fi
elif [ "$MODE" = oracle ]; then
  run model_gpu 300 env PYTHONPATH="$PWD" python3 -m pytest -m gpu tests/models/test_qwen35_gpu.py -q \
    -p no:cacheprovider --maxfail=6
elif [ "$MODE" = final ]; then
  # without the FLA wheels: transformers then uses its fp32 torch GDN path (an exact oracle)
  run model_gpu 300 env PYTHONPATH="$PWD" python3 -m pytest -m gpu tests/models/test_qwen35_gpu.py -q \
    -p no:cacheprovider --maxfail=6
  run decode_35b 150 python3 -m bench.cli decode --shape 35b-a3b --batch 1,8 --hf --json "$OUT/decode_35b.json"
  run prefill_9b 150 python3 -m bench.cli prefill --shape 9b --tokens 8192 --chunk 2048 --hf --json "$OUT/prefill_9b.json"
elif [ "$MODE" = tests ]; then
  # every GPU kernel test file (files without gpu-marked tests deselect everything: rc 5)
  for path in tests/cuda/test_cuda_*.py; do
    f=$(basename "$path" .py)
    run "$f" 150 env NINFER_CUDA_SYNC=1 python3 -m pytest -m gpu "tests/cuda/$f.py" \
      --maxfail=5 -q -p no:cacheprovider -x
  done
  run model_gpu 240 python3 -m pytest -m gpu tests/models/test_qwen35_gpu.py -q \
    -p no:cacheprovider --maxfail=6
else
  run decode_9b 200 python3 -m bench.cli decode --shape 9b --batch 1,8 --hf --json "$OUT/decode_9b.json"
  run decode_35b 200 python3 -m bench.cli decode --shape 35b-a3b --batch 1,8 --hf --json "$OUT/decode_35b.json"
  run prefill_9b 150 python3 -m bench.cli prefill --shape 9b --tokens 8192 --chunk 2048 --hf --json "$OUT/prefill_9b.json"
  run kernels_9b 100 python3 -m bench.cli kernels --shape 9b --repeat 10 --json "$OUT/kernels_9b.json"
fi
echo "== done in $(elapsed)s"; cat "$OUT/summary.txt"
