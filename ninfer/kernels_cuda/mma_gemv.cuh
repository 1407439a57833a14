// mma_gemv.cuh: tensor-core core of the skinny GEMM y[n, m] = sum_k x[n, k] w[m, k] for bf16
// weights and f32 activations, N <= 8 per tile (decode).
//
// One warp multiplies a 16-row weight tile by an 8-row activation tile over its K range with
// `mma.sync.m16n8k16` (bf16 inputs, f32 accumulation). The activations are split into two bf16
// terms, x = hi + lo (hi = bf16(x), lo = bf16(x - hi)), and both are multiplied: the product is
// exact for the bf16 weights and x is represented to about 2^-17 relative, so the result is
// within fp32-GEMV rounding of the f32 product (the f32 CPU kernels and the oracle tests).
//
// The mma's k order is free as long as A and B use the same one, so each lane reads 16
// contiguous bytes per row instead of the ISA's scattered pairs: for a step of 32 k values
// starting at k0, lane (g = lane / 4, t = lane % 4) loads w[m0 + g][k0 + 8t .. +7] and
// w[m0 + g + 8][k0 + 8t .. +7] (one uint4 each) and x[n0 + g][k0 + 8t .. +7]; mma j (j = 0, 1)
// takes words 2j, 2j+1 of those as its logical k pairs {2t, 2t+1} and {2t+8, 2t+9}.
// Accumulator lane layout (ISA): c0, c1 = (row g, n 2t, 2t+1); c2, c3 = (row g+8, n 2t, 2t+1).
//
// An output element's arithmetic depends on K's split only (never on N, other rows or the
// tile's other columns): batch invariant like gemv.cuh.
#pragma once
#include "common.cuh"

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], unsigned a0, unsigned a1,
                                               unsigned a2, unsigned a3, unsigned b0,
                                               unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// (hi, lo) bf16 pair words of two consecutive floats: low half = the first element. Both
// roundings are to nearest even (cvt.rn.bf16x2.f32 puts its first source in the high half).
__device__ __forceinline__ void split_bf16x2(float a, float b, unsigned& hi, unsigned& lo) {
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(b), "f"(a));
  const float ra = a - __uint_as_float(hi << 16), rb = b - __uint_as_float(hi & 0xffff0000u);
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(rb), "f"(ra));
}

// 8 bf16 of a weight row at [k, k + 8) with elements >= k_end read as 0 (16-byte load when the
// whole unit is inside; rows must then be 16-byte aligned).
__device__ __forceinline__ uint4 mma_load_w(const bf16raw* row, int k, int k_end) {
  if (k + 8 <= k_end) return ld_stream16(row + k);
  unsigned h[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) h[e] = k + e < k_end ? (unsigned)row[k + e] : 0u;
  return make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16),
                    h[6] | (h[7] << 16));
}

// Accumulates the warp's K range [k_begin, k_end) (k_begin a multiple of 32) into c.
// wrow0 / wrow1: weight rows m0 + g and m0 + g + 8 (nullptr past M: zeros); xrow: activation
// row n0 + g (nullptr past N: zeros). Steps of 32 k, U of them in flight per iteration.
template <int U>
__device__ __forceinline__ void mma_gemv_accumulate(const bf16raw* wrow0, const bf16raw* wrow1,
                                                    const float* xrow, int k_begin, int k_end,
                                                    int t, float (&c)[4]) {
  for (int k0 = k_begin; k0 < k_end; k0 += 32 * U) {
    uint4 w0[U], w1[U];
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int k = k0 + 32 * i + 8 * t;
      const bool in = k < k_end;
      w0[i] = in && wrow0 ? mma_load_w(wrow0, k, k_end) : make_uint4(0u, 0u, 0u, 0u);
      w1[i] = in && wrow1 ? mma_load_w(wrow1, k, k_end) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < U; ++i) {
      if (k0 + 32 * i >= k_end) break;
      const int k = k0 + 32 * i + 8 * t;
      float xv[8];
      if (xrow == nullptr || k >= k_end) {
#pragma unroll
        for (int e = 0; e < 8; ++e) xv[e] = 0.0f;
      } else if (k + 8 <= k_end) {
        load8_cached(xrow + k, xv);
      } else {
        load8_guard(xrow + k, k_end - k, xv);
      }
      unsigned hi[4], lo[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) split_bf16x2(xv[2 * q], xv[2 * q + 1], hi[q], lo[q]);
      mma_bf16_16816(c, w0[i].x, w1[i].x, w0[i].y, w1[i].y, hi[0], hi[1]);
      mma_bf16_16816(c, w0[i].x, w1[i].x, w0[i].y, w1[i].y, lo[0], lo[1]);
      mma_bf16_16816(c, w0[i].z, w1[i].z, w0[i].w, w1[i].w, hi[2], hi[3]);
      mma_bf16_16816(c, w0[i].z, w1[i].z, w0[i].w, w1[i].w, lo[2], lo[3]);
    }
  }
}

// The K range [k_begin, k_end) of warp `warp` when `splits` warps split K in 32-k steps: a
// function of K and the split count only (batch invariance).
__device__ __forceinline__ void mma_warp_k_range(int k, int splits, int warp, int& k_begin,
                                                 int& k_end) {
  const int steps = (k + 31) >> 5;
  const int per = (steps + splits - 1) / splits;
  k_begin = min(k, warp * per * 32);
  k_end = min(k, k_begin + per * 32);
}

// Shared-memory partials of a block: red[split][A row][n] for up to S splits of a 16 x 8 tile.
template <int S>
using MmaPartials = float[S][16][8];

// Stores the warp's accumulator fragment c (ISA lane layout above) as partials of split `warp`.
template <int S>
__device__ __forceinline__ void mma_store_partials(MmaPartials<S>& red, int warp, int g, int t,
                                                   const float (&c)[4]) {
  red[warp][g][2 * t] = c[0];
  red[warp][g][2 * t + 1] = c[1];
  red[warp][g + 8][2 * t] = c[2];
  red[warp][g + 8][2 * t + 1] = c[3];
}

// Output (tile row r, column n): the partials summed over the splits in split order; SWIGLU=1:
// silu(gate: A row r) * (up: A row r + 8).
template <int SWIGLU, int S>
__device__ __forceinline__ float mma_reduce_partials(const MmaPartials<S>& red, int splits,
                                                     int r, int n) {
  float s = 0.0f;
  for (int w = 0; w < splits; ++w) s += red[w][r][n];
  if (SWIGLU) {
    float u = 0.0f;
    for (int w = 0; w < splits; ++w) u += red[w][r + 8][n];
    s = silu_f(s) * u;
  }
  return s;
}
