#!/usr/bin/env bash
# One-call GPU check for the lead's H200 session (~8 min budget):
#   versions -> GPU kernel tests (one pytest process per file, --maxfail=3 so one call surfaces
#   several independent problems, NINFER_CUDA_SYNC=1 so a fault is pinned to its launch; a sticky
#   CUDA error then spoils only its own file) -> kernel
#   microbenchmarks at the 9B and 35B-A3B shapes -> a short summary table.
# Logs and JSON land in $OUT (default ./device_out). Run from the repository root; nothing is
# installed: PYTHONPATH is the checkout (plus /tmp/site if .whl/ wheels, e.g. FLA, are carried).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NINFER_KERNEL_CACHE="${NINFER_KERNEL_CACHE:-/tmp/ninfer_kernel_cache}"
PY="${PYTHON:-python3}"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }

if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install --quiet --no-index --no-deps --target /tmp/site .whl/*.whl \
    > "$OUT/wheels.log" 2>&1 && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi

{
  echo "== versions ($(date -u +%FT%TZ))"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  nvcc --version 2>&1 | tail -1
  "$PY" - <<'PYEOF'
import importlib, platform
print("python", platform.python_version())
for m in ("numpy", "cupy", "cuda.bindings", "torch", "triton", "transformers", "fla"):
    try:
        mod = importlib.import_module(m)
        print(f"{m:14s}", getattr(mod, "__version__", "?"))
    except Exception as exc:
        print(f"{m:14s} not available ({type(exc).__name__})")
PYEOF
} 2>&1 | tee "$OUT/versions.log"

echo "== GPU tests (log: $OUT/gpu_tests.log)"
: > "$OUT/gpu_tests.log"
: > "$OUT/summary_tests.txt"
# The loader test first: it compiles every module (one test per .cu) and fills the kernel cache.
for name in test_cuda_loader test_cuda_basic test_cuda_linear test_cuda_attention test_cuda_gdn \
            test_cuda_moe test_cuda_sampling test_cuda_graph; do
  f="tests/cuda/$name.py"
  if [ "$(elapsed)" -gt 300 ]; then
    echo "$name: SKIPPED (time budget)" | tee -a "$OUT/summary_tests.txt"; continue
  fi
  NINFER_CUDA_SYNC=1 timeout 240 "$PY" -m pytest -m gpu "$f" --maxfail=3 -q -p no:cacheprovider \
    > "$OUT/$name.log" 2>&1
  rc=$?
  { echo "---- $f (rc=$rc)"; cat "$OUT/$name.log"; } >> "$OUT/gpu_tests.log"
  last=$(grep -E "passed|failed|error|skipped|no tests ran" "$OUT/$name.log" | tail -1)
  echo "$name: rc=$rc ${last:-<no pytest summary: timeout or crash>}" | tee -a "$OUT/summary_tests.txt"
done

echo "== kernel benchmarks"
for shape in qwen3.5-9b qwen3.5-35b-a3b; do
  left=$(( 470 - $(elapsed) ))
  if [ "$left" -lt 30 ]; then echo "$shape: SKIPPED (time budget)"; continue; fi
  timeout "$left" "$PY" -m bench.cli kernels --shape "$shape" --repeat 15 \
    --json "$OUT/kernels_${shape}.json" > "$OUT/kernels_${shape}.log" 2>&1
  echo "$shape: rc=$? (log: $OUT/kernels_${shape}.log)"
done

echo
echo "================ summary ($(elapsed) s) ================"
cat "$OUT/summary_tests.txt"
for shape in qwen3.5-9b qwen3.5-35b-a3b; do
  [ -f "$OUT/kernels_${shape}.log" ] || continue
  echo "-- $shape"
  grep -E "^(ceilings|compile|FAILED)" "$OUT/kernels_${shape}.log"
  "$PY" - "$OUT/kernels_${shape}.json" <<'PYEOF' 2>/dev/null || tail -25 "$OUT/kernels_${shape}.log"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    roof = f"{r['roofline']:.2f}" if r.get("roofline") is not None else "-"
    peer = f" peer {r['peer_ms']:.3f} ms" if r.get("peer_ms") else ""
    print(f"{r['op'][:18]:18s} {r['variant'][:40]:40s} {r['time_ms']:8.3f} ms roof {roof}{peer}")
PYEOF
done
