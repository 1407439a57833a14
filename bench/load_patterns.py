"""`ninfer-bench kernels --op gemv_loads`: how fast the decode GEMV's weight-read patterns stream.

Pure loads (no math beyond an XOR that keeps them alive) over a bf16 [M, 4096] matrix bigger
than L2, one pattern per kernel, so the pattern's own rate can be compared with the copy rate:
- `rows512`: the f32-FMA GEMV's pattern: a warp's load instruction reads 512 contiguous bytes of
  one row (2 rows, 4 instructions each in flight; 4 warps split K);
- `mma16x64`: the tensor-core GEMV's fragment-direct pattern: an instruction reads 64 bytes from
  each of 8 rows (lane g*4+t: row g, bytes 16t..), rows g and g+8, 4 steps in flight, 8 warps
  split K of a 16-row tile;
- `staged256`: the pattern a shared-memory-staged GEMV would use for the same 16-row tile: an
  instruction reads 256 contiguous bytes from each of 2 rows, 8 instructions in flight.
"""
from __future__ import annotations

from bench.harness import BenchContext, Measure

K = 4096
ROW_U4 = K * 2 // 16  # 16-byte units per row

_SOURCE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ uint4 ld16(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// grid M/2, 4 warps: warp s reads units [128 s, 128 s + 128) of rows 2b, 2b+1
extern "C" __global__ void rows512(const uint4* w, unsigned* out) {
  const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
  const uint4* r0 = w + (u64)(2 * blockIdx.x) * ROW_U4;
  const uint4* r1 = r0 + ROW_U4;
  uint4 v[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = ld16(r0 + s * 128 + lane + 32 * i);
    v[2 * i + 1] = ld16(r1 + s * 128 + lane + 32 * i);
  }
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc ^= fold(v[i]);
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// grid M/16, 8 warps: warp s covers units [64 s, 64 s + 64) of the tile's 16 rows
extern "C" __global__ void mma16x64(const uint4* w, unsigned* out) {
  const int lane = threadIdx.x & 31, s = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const uint4* r0 = w + (u64)(16 * blockIdx.x + g) * ROW_U4 + s * 64;
  const uint4* r1 = r0 + 8 * ROW_U4;
  unsigned acc = 0;
  for (int step = 0; step < 16; step += 4) {
    uint4 v[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = ld16(r0 + 4 * (step + i) + t);
      v[2 * i + 1] = ld16(r1 + 4 * (step + i) + t);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) acc ^= fold(v[i]);
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// grid M/16, 8 warps, same tile and K split; instruction j: rows 2(j%8), 2(j%8)+1, 16 units each
extern "C" __global__ void staged256(const uint4* w, unsigned* out) {
  const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
  const uint4* tile = w + (u64)(16 * blockIdx.x) * ROW_U4 + s * 64;
  unsigned acc = 0;
  for (int j0 = 0; j0 < 32; j0 += 8) {
    uint4 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int j = j0 + i;
      const int row = 2 * (j % 8) + (lane >> 4);
      v[i] = ld16(tile + (u64)row * ROW_U4 + 16 * (j / 8) + (lane & 15));
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) acc ^= fold(v[i]);
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}
""".replace("ROW_U4", str(ROW_U4))

# pattern -> (rows per block, threads per block)
PATTERNS = {"rows512": (2, 128), "mma16x64": (16, 256), "staged256": (16, 256)}


def gemv_loads(ctx: BenchContext, cp) -> list[Measure]:
    module = cp.RawModule(code=_SOURCE, options=("-std=c++17",))
    m = 65536  # 512 MiB of bf16 weights: well beyond L2
    w = cp.random.randint(1, 2**31, size=(m, K // 2), dtype=cp.int32)
    out = cp.zeros(m, dtype=cp.uint32)
    result = []
    for name, (rows, threads) in PATTERNS.items():
        fn = module.get_function(name)
        ms = ctx.time(lambda i: fn((m // rows,), (threads,), (w, out)))
        result.append(Measure("gemv_loads", f"{name} [{m}x{K}] bf16", ms, bytes=m * K * 2))
    return result
