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
