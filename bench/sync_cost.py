"""What one dependency boundary between decode ops costs on the GPU: a chain of S dependent
steps, each "read the whole previous vector in every block, write this block's slice of the
next" (the shape of a GEMV reading x that the previous op wrote), run as

- `launch`: S kernel launches captured in a CUDA graph;
- `pdl`: the same with programmatic dependent launch (griddepcontrol.wait, then
  launch_dependents: the prologue of ninfer's small kernels);
- `grid_sync`: one persistent kernel with a grid-wide barrier between steps (the counter scheme
  of moe.cu's moe_grid_sync: the top bit flips once every block has arrived);
- `no_sync`: the persistent kernel without barriers (the steps' own work: a floor, its results
  are racy and unused).

    python3 -m bench.sync_cost [--steps 256] [--width 4096] [--blocks 0 (= SMs)] [--json OUT]

Prints us per step for each; a persistent per-layer kernel pays off only where `grid_sync` is
well under `pdl`.
"""
from __future__ import annotations

import argparse
import json
import sys

SOURCE = r"""
__device__ __forceinline__ float block_sum(float s) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = s;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += part[w];
  return t;
}

// one step: every block sums prev[0, width) (coherent loads), then writes its slice of cur
__device__ __forceinline__ void one_step(float* buf, int width, int step) {
  const float* prev = buf + (step & 1) * width;
  float* cur = buf + ((step + 1) & 1) * width;
  float s = 0.0f;
  for (int i = threadIdx.x; i < width; i += blockDim.x) s += __ldcg(prev + i);
  s = block_sum(s);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x)
    cur[i] = s * 1e-6f + (float)i;
}

extern "C" __global__ void step_kernel(float* buf, int width, int step, int pdl) {
  if (pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  one_step(buf, width, step);
}

extern "C" __global__ void persistent_kernel(float* buf, int width, int steps,
                                             unsigned* arrived, int sync) {
  for (int step = 0; step < steps; ++step) {
    one_step(buf, width, step);
    if (!sync) continue;
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned nb = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
      __threadfence();
      const unsigned old = atomicAdd(arrived, nb);
      unsigned cur;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(cur) : "l"(arrived) : "memory");
      } while (((old ^ cur) & 0x80000000u) == 0u);
    }
    __syncthreads();
  }
}
"""


def run(steps: int, width: int, blocks: int, repeat: int) -> dict:
    import cupy as cp
    import numpy as np

    from ninfer.core.cuda.graph import CudaGraph
    from ninfer.core.cuda.timing import median_ms, time_device
    from ninfer.kernels_cuda._loader import current_device, launch

    module = cp.RawModule(code=SOURCE, options=("--std=c++17",))
    step_fn = module.get_function("step_kernel")
    persist_fn = module.get_function("persistent_kernel")
    sms = current_device().sm_count
    grid = blocks or sms
    if grid > sms:
        raise SystemExit(f"sync_cost: --blocks {grid} > {sms} SMs (the barrier needs every "
                         "block resident)")
    buf = cp.random.standard_normal(2 * width, dtype=np.float32)
    arrived = cp.zeros(1, dtype=np.uint32)
    stream = cp.cuda.Stream(non_blocking=True)
    results = {}

    def chain(pdl: bool):
        for s in range(steps):
            launch(step_fn, (grid,), (256,), (buf, np.int32(width), np.int32(s), np.int32(pdl)),
                   pdl=pdl)

    def persistent(sync: bool):
        launch(persist_fn, (grid,), (256,),
               (buf, np.int32(width), np.int32(steps), arrived, np.int32(sync)))

    variants = {"launch": lambda: chain(False), "pdl": lambda: chain(True),
                "grid_sync": lambda: persistent(True), "no_sync": lambda: persistent(False)}
    with stream:
        for name, body in variants.items():
            graph = CudaGraph(f"sync_cost_{name}")
            body()  # warm-up (compiles, loads) outside the capture
            stream.synchronize()
            with graph.capture(stream):
                body()
            times = time_device(lambda i: graph.launch(stream), warmup=3, repeat=repeat,
                                stream=stream)
            results[name] = median_ms(times) * 1e3 / steps
            stream.synchronize()
            graph.destroy()
    low = int(cp.asnumpy(arrived)[0]) & 0x7FFFFFFF
    if low != 0:
        raise SystemExit(f"sync_cost: barrier counter low bits {low:#x} after the runs "
                         "(expected 0)")
    return {"steps": steps, "width": width, "blocks": grid, "us_per_step": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sync_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--width", type=int, default=4096, help="floats per step's vector")
    parser.add_argument("--blocks", type=int, nargs="+", default=[0],
                        help="grid sizes (0: one block per SM)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.width < 1 or any(b < 0 for b in args.blocks):
        parser.error("--steps and --width must be >= 1, --blocks >= 0")
    rows = [run(args.steps, args.width, b, args.repeat) for b in args.blocks]
    print(f"{'blocks':>6} {'launch':>8} {'pdl':>8} {'grid_sync':>10} {'no_sync':>8}  "
          f"(us per step, {args.steps} steps, width {args.width})")
    for r in rows:
        u = r["us_per_step"]
        print(f"{r['blocks']:6d} {u['launch']:8.2f} {u['pdl']:8.2f} {u['grid_sync']:10.2f} "
              f"{u['no_sync']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
