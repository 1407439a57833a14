// linear.cu: out[N, M] = x[N, K] @ w[M, K]^T with fp32 accumulation.
//
// linear_gemv_kernel<WT, NT, R, ALIGNED> (decode / skinny GEMM; the only path usable inside a
// captured graph). Grid (ceil(M / R), ceil(N / NT)); block = `splits` warps (1..8), warp s
// reducing the s-th of `splits` equal ranges of K. Each block computes R output columns for NT
// activation rows; the split count is chosen from K alone and the per-element order is fixed
// (gemv.cuh), so results do not depend on N (batch invariance). R grows with NT so that an
// activation value loaded into a register feeds R FMAs (x traffic / weight traffic = 2*NT/R).
// ALIGNED=1 needs K % 8 == 0 and 16-byte aligned rows of w and x (16-byte vector loads);
// ALIGNED=0 reads the same 8-element units with scalar, bounds-checked loads (same order).
//
// linear_mma_kernel<SWIGLU> (bf16 weights, 16-byte aligned rows of w and x): the tensor-core variant of
// the same contract (mma_gemv.cuh: x split into bf16 hi + lo terms, f32 accumulation). Grid
// (ceil(M / 16), ceil(N / 8)); block = `splits` (1..16) warps, warp s reducing the s-th of `splits`
// ranges of K (whole 32-element steps, the split chosen from K alone); partials summed in split
// order. Each output element's arithmetic is independent of N (batch invariance). Streams the
// weights at the same rate for N = 1 and N = 8 (the f32 FMA kernel is issue-bound at N = 8).
//
// linear_mma_rows_kernel<SWIGLU> (the default; NINFER_GEMV_ROWS=0 selects linear_mma_kernel):
// linear_mma_kernel with the weight tile read row-contiguously and staged through shared memory;
// bitwise the same results.
//
// f32_to_bf16_kernel: x f32 [N, K] (rows strided) -> bf16 [N, K] contiguous, round to nearest
// even; feeds the cuBLAS bf16 prefill path (linear.py).
#include "gemv.cuh"
#include "mma_gemv.cuh"

struct GemvParams {
  const void* w;
  const float* x;
  float* out;
  i64 w_rs, x_rs, out_rs;
  int m, k, n, splits;
};
static_assert(sizeof(GemvParams) == 64, "GemvParams layout is mirrored in linear.py");

template <typename WT, int NT, int R, int ALIGNED>
__global__ void __launch_bounds__(256) linear_gemv_kernel(const GemvParams p) {
  __shared__ float red[8 * R * NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int m0 = blockIdx.x * R;
  const int n0 = blockIdx.y * NT;
  const int units = gemv_units(p.k);
  const int per = (units + p.splits - 1) / p.splits;
  const int u_begin = min(units, warp * per);
  const int u_end = min(units, u_begin + per);
  const WT* wbase = static_cast<const WT*>(p.w);
  const WT* wrow[R];
  const float* xrow[NT];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = m0 + r < p.m ? wbase + (i64)(m0 + r) * p.w_rs : nullptr;
#pragma unroll
  for (int n = 0; n < NT; ++n) xrow[n] = n0 + n < p.n ? p.x + (i64)(n0 + n) * p.x_rs : nullptr;
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[r][n] = 0.0f;
  gemv_warp_accumulate<WT, NT, R, ALIGNED != 0>(wrow, xrow, p.k, u_begin, u_end, lane, acc);
  gemv_store_partials<R, NT>(acc, red);
  for (int t = threadIdx.x; t < R * NT; t += blockDim.x) {
    const int r = t / NT, n = t % NT;
    if (m0 + r < p.m && n0 + n < p.n)
      p.out[(i64)(n0 + n) * p.out_rs + m0 + r] = gemv_sum_splits<R, NT>(red, p.splits, r, n);
  }
}

#define MMA_U 4
// SWIGLU=1: w = [gate; up] ([2M, K], up rows start at M); out[n, m] = silu(gate_m . x_n) *
// (up_m . x_n). A warp's A tile is gate rows m0..m0+7 over up rows m0..m0+7 (8 outputs per
// block), so each value is computed exactly as by the SWIGLU=0 kernel.
template <int SWIGLU>
__global__ void __launch_bounds__(512) linear_mma_kernel(const GemvParams p) {
  __shared__ MmaPartials<16> red;  // [split][A row][n in tile]
  constexpr int TILE = SWIGLU ? 8 : 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * TILE, n0 = blockIdx.y * 8;
  int k_begin, k_end;
  mma_warp_k_range(p.k, p.splits, warp, k_begin, k_end);
  const bf16raw* w = static_cast<const bf16raw*>(p.w);
  const int r1 = SWIGLU ? m0 + g : m0 + g + 8;  // output row of A row g + 8
  const bf16raw* wrow0 = m0 + g < p.m ? w + (i64)(m0 + g) * p.w_rs : nullptr;
  const bf16raw* wrow1 = r1 < p.m ? w + (i64)(SWIGLU ? p.m + r1 : r1) * p.w_rs : nullptr;
  const float* xrow = n0 + g < p.n ? p.x + (i64)(n0 + g) * p.x_rs : nullptr;
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_gemv_accumulate<MMA_U>(wrow0, wrow1, xrow, k_begin, k_end, t, c);
  mma_store_partials(red, warp, g, t, c);
  __syncthreads();
  for (int idx = threadIdx.x; idx < TILE * 8; idx += blockDim.x) {
    const int r = idx >> 3, n = idx & 7;
    if (m0 + r < p.m && n0 + n < p.n) {
      p.out[(i64)(n0 + n) * p.out_rs + m0 + r] = mma_reduce_partials<SWIGLU>(red, p.splits, r, n);
    }
  }
}

// linear_mma_rows_kernel<SWIGLU>: linear_mma_kernel with the weight tile read row-contiguously
// (mma_gemv.cuh, "Row-contiguous staging": a half-warp load reads 256 contiguous bytes of one
// row instead of 64 bytes of each of 8 rows) and handed to the mmas through a 4 KiB per-warp
// shared buffer (stmatrix in, ldmatrix out). Same block, K split, A fragments, x values, mma
// order and reduction order as linear_mma_kernel, so the stored results are bitwise identical.
// Row tiles: block x walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... (gridDim.x = the tile
// count gives linear_mma_kernel's one tile per block; fewer blocks make it persistent). Per
// warp, the 8 x 16-byte global loads of the next batch (registers) are in flight while the
// current batch's fragments are read from the buffer and multiplied, across tile boundaries
// too (the next tile's first batch loads during the current tile's last one). Dynamic shared
// memory (linear.py mma_rows_smem): splits * 4 KiB of staging, then two MmaPartials<16> (the
// tiles alternate, so one barrier per tile suffices), + 256 B of alignment slack. 64 registers
// at 512 threads (2 blocks of 16 warps per SM). PERSIST: 0 one tile per block, 1 persistent.
extern __shared__ uint4 mma_rows_smem[];

// Bit j set: tile row 2j + h (lane half h) of the tile starting at output row m0 is inside M.
template <int SWIGLU>
__device__ __forceinline__ unsigned mma_rows_valid(int m0, int h, int m) {
  unsigned valid = 0u;
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (m0 + (SWIGLU ? 2 * (j & 3) : 2 * j) + h < m) valid |= 1u << j;
  return valid;
}

template <int SWIGLU, int PERSIST>
__global__ void __launch_bounds__(512, 2) linear_mma_rows_kernel(const GemvParams p) {
  constexpr int TILE = SWIGLU ? 8 : 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3, h = lane >> 4;
  const int n0 = blockIdx.y * 8;
  const int tiles = (p.m + TILE - 1) / TILE;
  int k_begin, k_end;
  mma_warp_k_range(p.k, p.splits, warp, k_begin, k_end);
  // tile row 2j + h (j = 0..7) holds output row m0 + 2j + h (SWIGLU: gate row m0 + 2j + h for
  // j < 4, up row M + m0 + 2(j - 4) + h for j >= 4), as A rows g / g + 8 of linear_mma_kernel;
  // rows past M are never read (bit j of `valid` clear: zeros)
  const int ku = 8 * (lane & 15);  // this lane's k offset in a batch (loads)
  const i64 rsb = 2 * p.w_rs, hib = (i64)(SWIGLU ? p.m : 8) * rsb;  // bytes
  // mma_rows_unit(tile): the first batch's unit of tile row h of tile `tile`; xp: x[row][k0 + 8t]
  // (an x row past N reads row N - 1 instead of zeros: it only feeds output columns >= N, which
  // are not stored). Both are recomputed from the parameters per tile (kept live across the K
  // loop, the 64-bit bases spilled at 64 registers).
  const int kofs = k_begin + ku;
  auto mma_rows_unit = [&](int tile_) {
    return reinterpret_cast<const char*>(static_cast<const bf16raw*>(p.w) +
                                         (i64)(tile_ * TILE + h) * p.w_rs + kofs);
  };
  // the buffers start at the first 256-byte boundary of the dynamic shared memory (the launcher
  // adds MMA_ROWS_ALIGN bytes), so the XOR-swizzled addresses stay inside each warp's buffer
  const unsigned s0 = (unsigned)__cvta_generic_to_shared(mma_rows_smem);
  const unsigned pad = (MMA_ROWS_ALIGN - (s0 & (MMA_ROWS_ALIGN - 1))) & (MMA_ROWS_ALIGN - 1);
  char* const base = reinterpret_cast<char*>(mma_rows_smem) + pad;
  const unsigned buf = s0 + pad + warp * (MMA_ROWS_UNITS * 16);
  const unsigned st = buf + mma_rows_store_offset(lane), ld = buf + mma_rows_frag_offset(lane);
  const int span = k_end - k_begin;
  // a batch holds a partial unit iff K % 8 != 0 and it reaches k_end (then k_end = K): whole-unit
  // batches are those with rem >= full
  const int full = (k_end & 7) != 0 ? MMA_ROWS_K : 1;
  int tile = blockIdx.x;
  unsigned valid = mma_rows_valid<SWIGLU>(tile * TILE, h, p.m);
  const char* wp = mma_rows_unit(tile);
  uint4 v[8];
  if (tile >= tiles) return;
  if (span >= full) mma_rows_load(wp, hib, rsb, valid, ku < span, v);
  int parity = 0;
  do {  // PERSIST = 0: one tile, no back edge
    const int next = PERSIST ? tile + gridDim.x : tiles;
    int xo = k_begin + 8 * t;
    asm volatile("mov.b32 %0, %0;" : "+r"(xo));  // per tile, not hoisted (see above)
    const float* xp = p.x + (i64)min(n0 + g, p.n - 1) * p.x_rs + xo;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int rem = span;  // k left from the batch's k0 (linear_mma_kernel's k0 < k_end)
    while (rem >= full) {
      __syncwarp();  // the previous batch's fragments are read
      mma_rows_store(st, buf, lane, v);
      __syncwarp();
      const int rn = rem - MMA_ROWS_K;
      // the next batch's loads (this tile's, else the next tile's first) stay in flight during
      // this batch's mmas
      const bool same = rn >= full;
      if (same || (rn <= 0 && next < tiles)) {
        mma_rows_load(same ? wp + 2 * MMA_ROWS_K : mma_rows_unit(next), hib, rsb,
                      same ? valid : mma_rows_valid<SWIGLU>(next * TILE, h, p.m),
                      ku < (same ? rn : span), v);
      }
      mma_rows_batch<0>(ld, xp, 8 * t, rem, c);
      wp += 2 * MMA_ROWS_K;
      xp += MMA_ROWS_K;
      rem = rn;
    }
    if (rem > 0) {  // the warp's last batch holds a partial unit (K % 8 != 0): read element-wise
      __syncwarp();
      mma_rows_store_partial(reinterpret_cast<bf16raw*>(base + warp * (MMA_ROWS_UNITS * 16)),
                             lane, wp, hib, rsb, valid, rem - ku);
      __syncwarp();
      // here full = MMA_ROWS_K, so span >= full means every lane's unit of the next tile's
      // first batch is whole
      if (next < tiles && span >= full)
        mma_rows_load(mma_rows_unit(next), hib, rsb,
                      mma_rows_valid<SWIGLU>(next * TILE, h, p.m), true, v);
      mma_rows_batch<1>(ld, xp, 8 * t, rem, c);
    }
    MmaPartials<16>& red = reinterpret_cast<MmaPartials<16>*>(
        base + p.splits * (MMA_ROWS_UNITS * 16))[parity];
    mma_store_partials(red, warp, g, t, c);
    __syncthreads();
    const int m0 = tile * TILE;
    for (int idx = threadIdx.x; idx < TILE * 8; idx += blockDim.x) {
      const int r = idx >> 3, n = idx & 7;
      if (m0 + r < p.m && n0 + n < p.n) {
        p.out[(i64)(n0 + n) * p.out_rs + m0 + r] = mma_reduce_partials<SWIGLU>(red, p.splits, r, n);
      }
    }
    valid = mma_rows_valid<SWIGLU>(next * TILE, h, p.m);
    wp = mma_rows_unit(next);
    tile = next;
    parity ^= 1;
  } while (PERSIST && tile < tiles);
}

__global__ void __launch_bounds__(256) f32_to_bf16_kernel(const float* __restrict__ x, i64 x_rs,
                                                          int n, int k, bf16raw* __restrict__ out) {
  // grid: (column blocks, row blocks); 4 elements per thread step with 16-byte loads and 8-byte
  // stores when K, the row stride and both bases allow it (the usual case), else one at a time
  const bool vec = (k % 4 == 0) && (x_rs % 4 == 0) && (((size_t)x & 15) == 0) &&
                   (((size_t)out & 7) == 0);
  const int step = gridDim.x * blockDim.x;
  for (int row = blockIdx.y; row < n; row += gridDim.y) {
    const float* xr = x + (i64)row * x_rs;
    bf16raw* orow = out + (i64)row * k;
    if (vec) {
      for (int c = 4 * (blockIdx.x * blockDim.x + threadIdx.x); c < k; c += 4 * step) {
        const float4 v = *reinterpret_cast<const float4*>(xr + c);
        ushort4 o;
        o.x = f32_to_bf16(v.x);
        o.y = f32_to_bf16(v.y);
        o.z = f32_to_bf16(v.z);
        o.w = f32_to_bf16(v.w);
        *reinterpret_cast<ushort4*>(orow + c) = o;
      }
    } else {
      for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < k; c += step) {
        orow[c] = f32_to_bf16(xr[c]);
      }
    }
  }
}
