// gemv.cuh: the warp-level core of the bandwidth-bound skinny GEMM (used by linear.cu, moe.cu).
//
// A warp accumulates, for R weight rows and NT activation rows, the dot products over its
// K-range [u_begin, u_end) of 8-element "units". Lane l takes units u_begin + l, +32, +64, ...
// in ascending order and, per unit, elements e = 0..7 in order (fmaf into acc[r][n]). That
// order depends only on K's split (chosen from K alone), never on N, R, U or alignment, so an
// output element is bitwise identical whichever rows share the launch (batch invariance).
//
// Memory-level parallelism: U units of R rows (U*R ~ 8 16-byte loads per lane) are issued
// before any is consumed. Weight loads bypass L1 (read once); activation loads go through
// L1/L2 (re-read by every warp of the launch).
#pragma once
#include "common.cuh"

template <typename WT> struct WVec;

template <> struct WVec<bf16raw> {
  uint4 v;
  __device__ __forceinline__ void load(const bf16raw* p) { v = ld_stream16(p); }
  __device__ __forceinline__ void load_guard(const bf16raw* p, int n) {
    unsigned int h[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = e < n ? (unsigned int)p[e] : 0u;
    v = make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16),
                   h[6] | (h[7] << 16));
  }
  __device__ __forceinline__ void zero() { v = make_uint4(0u, 0u, 0u, 0u); }
  __device__ __forceinline__ void unpack(float out[8]) const { unpack_bf16x8(v, out); }
};

template <> struct WVec<float> {
  uint4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = ld_stream16(p);
    b = ld_stream16(p + 4);
  }
  __device__ __forceinline__ void load_guard(const float* p, int n) {
    float f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = e < n ? p[e] : 0.0f;
    a = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                   __float_as_uint(f[3]));
    b = make_uint4(__float_as_uint(f[4]), __float_as_uint(f[5]), __float_as_uint(f[6]),
                   __float_as_uint(f[7]));
  }
  __device__ __forceinline__ void zero() { a = b = make_uint4(0u, 0u, 0u, 0u); }
  __device__ __forceinline__ void unpack(float out[8]) const {
    out[0] = __uint_as_float(a.x); out[1] = __uint_as_float(a.y);
    out[2] = __uint_as_float(a.z); out[3] = __uint_as_float(a.w);
    out[4] = __uint_as_float(b.x); out[5] = __uint_as_float(b.y);
    out[6] = __uint_as_float(b.z); out[7] = __uint_as_float(b.w);
  }
};

// Units in flight per row per lane.
template <int R> struct GemvUnroll { static constexpr int U = R >= 8 ? 1 : 8 / R; };

// Number of K splits for a reduction of length k (host and device agree: see linear.py).
__host__ __device__ __forceinline__ int gemv_units(int k) { return (k + 7) >> 3; }

template <typename WT, int NT, int R, bool ALIGNED>
__device__ __forceinline__ void gemv_warp_accumulate(const WT* const (&wrow)[R],
                                                     const float* const (&xrow)[NT], int k,
                                                     int u_begin, int u_end, int lane,
                                                     float (&acc)[R][NT]) {
  constexpr int U = GemvUnroll<R>::U;
  for (int u0 = u_begin + lane; u0 < u_end; u0 += 32 * U) {
    WVec<WT> w[U][R];
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int u = u0 + 32 * i;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (u < u_end && wrow[r] != nullptr) {
          if (ALIGNED) w[i][r].load(wrow[r] + (i64)u * 8);
          else w[i][r].load_guard(wrow[r] + (i64)u * 8, k - u * 8);
        } else {
          w[i][r].zero();
        }
      }
    }
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int u = u0 + 32 * i;
      if (u >= u_end) break;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        if (xrow[n] == nullptr) continue;
        float xv[8];
        if (ALIGNED) load8_cached(xrow[n] + (i64)u * 8, xv);
        else load8_guard(xrow[n] + (i64)u * 8, k - u * 8, xv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float wv[8];
          w[i][r].unpack(wv);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][n] = fmaf(wv[e], xv[e], acc[r][n]);
        }
      }
    }
  }
}

// Store each warp's butterfly-reduced partials (lane 0's value) in red[warp][R][NT] and wait
// for the block. The caller then sums the splits in order with gemv_sum_splits.
template <int R, int NT>
__device__ __forceinline__ void gemv_store_partials(float (&acc)[R][NT], float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float v = warp_sum(acc[r][n]);
      if (lane == 0) red[(warp * R + r) * NT + n] = v;
    }
  }
  __syncthreads();
}

// Sum of partials (r, n) over the splits, in split order.
template <int R, int NT>
__device__ __forceinline__ float gemv_sum_splits(const float* red, int splits, int r, int n) {
  float s = 0.0f;
  for (int w = 0; w < splits; ++w) s += red[(w * R + r) * NT + n];
  return s;
}
