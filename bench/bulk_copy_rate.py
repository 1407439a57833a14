"""How fast one SM's bulk copies (cp.async.bulk, bulk_copy.cuh) stream global memory into a
shared-memory ring, by copy size, ring depth and blocks per SM (GPU, sm_90).

    python3 -m bench.bulk_copy_rate [--total-mib 2048]

Each block streams its own contiguous slice of a buffer larger than L2 through a ring of
`stages` slots of `copies` copies of `copy` bytes each (one producer warp, as the decode
attention and MoE kernels issue them: lane j copies piece j of a slot, `pitch` bytes apart in
shared memory), and 4 consumer warps wait for a slot's `full` barrier, spend `work` cycles on it
(emulated compute) and release it (slot i is consumer i % 4's). Prints per configuration the
device time and the rate in total and per active SM, next to the same run's device-to-device
copy rate. The copies' destinations are
16-byte aligned; pitch = copy + 16 is the attention kernel's bank-conflict shift.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KERNEL = r"""
extern "C" __global__ void __launch_bounds__(160) bulk_rate_kernel(
    const unsigned char* src, long long per_block, int copy_bytes, int copies, int pitch,
    int stages, int work, unsigned long long* sink) {
#if BULK_COPY_OK
  extern __shared__ __align__(128) unsigned char smem[];
  mbar_t* full = reinterpret_cast<mbar_t*>(smem);
  mbar_t* empty = full + stages;
  unsigned char* ring = smem + 256;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int stage_bytes = copies * pitch;
  const int n = (int)(per_block / ((long long)copy_bytes * copies));
  if (tid == 0) {
    for (int i = 0; i < stages; ++i) {
      mbar_init(full + i, 1);
      mbar_init(empty + i, 1);
    }
    mbar_init_fence();
  }
  __syncthreads();
  const unsigned char* base = src + blockIdx.x * per_block;
  if (warp == 4) {
    const unsigned long long policy = l2_evict_first_policy();
    int slot = 0;
    unsigned phase = 0;
    for (int i = 0; i < n; ++i) {
      if (lane == 0) {
        mbar_wait(empty + slot, phase ^ 1u);
        mbar_arrive_expect_tx(full + slot, (unsigned)(copies * copy_bytes));
      }
      __syncwarp();
      if (lane < copies)
        bulk_copy_g2s(ring + slot * stage_bytes + lane * pitch,
                      base + ((long long)i * copies + lane) * copy_bytes, (unsigned)copy_bytes,
                      full + slot, policy);
      if (++slot == stages) {
        slot = 0;
        phase ^= 1u;
      }
    }
  } else {
    unsigned acc = 0;
    for (int i = warp; i < n; i += 4) {
      const int slot = i % stages;
      mbar_wait(full + slot, (unsigned)(i / stages) & 1u);
      acc += ring[slot * stage_bytes + lane * 4];
      const long long t0 = clock64();  // the slot's compute, emulated
      while (clock64() - t0 < work) {
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + slot);
    }
    if (acc == 0xdeadbeefu) sink[0] = acc;
  }
#endif
}
"""


@dataclasses.dataclass(frozen=True)
class Config:
    copy: int       # bytes per copy
    copies: int     # copies per ring slot (<= 32)
    stages: int     # ring slots (a multiple of the 4 consumers)
    blocks_per_sm: int
    shift: bool = True   # pitch = copy + 16 (the attention kernel's layout), else copy
    sms: int = 0         # 0: every SM; else only this many blocks in all (light load)
    work: int = 0        # cycles a consumer spends on a slot before releasing it

    @property
    def pitch(self) -> int:
        return self.copy + (16 if self.shift else 0)

    def label(self) -> str:
        where = f"{self.sms} blocks" if self.sms else f"{self.blocks_per_sm}/SM"
        return (f"copy {self.copy // 1024:>2} KiB x {self.copies:>2} per slot, "
                f"{self.stages:>2} slots ({self.stages * self.copies * self.copy // 1024:>3} KiB"
                f" in flight), {'shift' if self.shift else 'align'}, {where}"
                + (f", {self.work} cycles a slot" if self.work else ""))


CONFIGS = (
    # 16 KiB slots of 1..16 KiB copies: one block on each of 32 SMs (the producer alone), one
    # and two blocks on every SM
    [Config(copy, 16384 // copy, 4, 1, sms=32) for copy in (1024, 2048, 4096, 8192, 16384)]
    + [Config(copy, 16384 // copy, 4, 1) for copy in (1024, 2048, 4096, 8192, 16384)]
    + [Config(copy, 16384 // copy, 4, 2) for copy in (1024, 4096, 16384)]
    # deeper rings, aligned pitch, 32-piece slots
    + [Config(1024, 16, 8, 1), Config(1024, 16, 8, 1, sms=32), Config(1024, 16, 4, 1, False),
       Config(1024, 32, 4, 1, sms=32), Config(2048, 16, 4, 1, sms=32)]
    # consumers that compute on each slot (the attention kernel's ~0.3-1 us per 16-key tile)
    + [Config(copy, 16384 // copy, stages, 1, sms=32, work=work) for copy in (1024, 8192)
       for stages in (4, 8) for work in (600, 1200, 2400)]
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--total-mib", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import cupy as cp

    import numpy as np

    from bench.harness import BenchContext, measure_copy_gbps
    from ninfer.kernels_cuda._loader import PACKAGE_DIR, current_device, expand_source

    sms = current_device().sm_count
    code = expand_source(PACKAGE_DIR / "bulk_copy.cuh") + KERNEL
    fn = cp.RawModule(code=code, options=("-std=c++17", "-arch=sm_90")).get_function(
        "bulk_rate_kernel")
    fn.max_dynamic_shared_size_bytes = 227 * 1024
    total = args.total_mib << 20
    src = cp.random.randint(0, 255, total, dtype=cp.uint8)
    sink = cp.zeros(1, dtype=cp.uint64)
    copy = measure_copy_gbps(BenchContext(None, np.random.default_rng(0), 0))
    print(f"copy rate (read + write): {copy:.0f} GB/s; {sms} SMs")
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for c in CONFIGS:
        blocks = c.sms or sms * c.blocks_per_sm
        slot = c.copy * c.copies
        per_block = (total // blocks) // slot * slot
        smem = 256 + c.stages * c.copies * c.pitch
        argv = (src, cp.int64(per_block), cp.int32(c.copy), cp.int32(c.copies),
                cp.int32(c.pitch), cp.int32(c.stages), cp.int32(c.work), sink)
        fn((blocks,), (160,), argv, shared_mem=smem)  # warm-up
        times = []
        for _ in range(args.repeat):
            start.record()
            fn((blocks,), (160,), argv, shared_mem=smem)
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
        ms = sorted(times)[len(times) // 2]
        gbps = blocks * per_block / ms / 1e6
        active = min(blocks, sms)
        print(f"{c.label():<72} {ms:8.3f} ms {gbps:7.0f} GB/s {gbps / active:6.1f} GB/s per SM")


if __name__ == "__main__":
    main()
