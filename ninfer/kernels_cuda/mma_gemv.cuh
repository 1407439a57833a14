// mma_gemv.cuh: tensor-core core of the skinny GEMM y[n, m] = sum_k x[n, k] w[m, k] for bf16
// weights and f32 activations, N <= 8 per tile (decode).
//
// One warp multiplies an 8-row weight tile by an 8-row activation tile over its K range with
// `mma.sync.m16n8k16` (bf16 inputs, f32 accumulation): the activations' hi and lo terms are the
// A operand's rows 0..7 and 8..15 and the weight rows are the B operand's 8 columns, so a
// block's unit of work is 8 weight rows (fine enough to fill every SM for 4096-row matrices).
// The activations are split into two bf16 terms, x = hi + lo (hi = bf16(x), lo = bf16(x - hi),
// both rounded to nearest), and both are multiplied: the product is exact for the bf16 weights
// and x is represented to about 2^-17 relative, so the result is within fp32-GEMV rounding of
// the f32 product (the f32 CPU kernels and the oracle tests).
//
// The mma's k order is free as long as A and B use the same one, so each lane reads 16
// contiguous bytes per row instead of the ISA's scattered pairs: for a step of 32 k values
// starting at k0, lane (g = lane / 4, t = lane % 4) loads w[m0 + g][k0 + 8t .. +7] (one uint4)
// and x[n0 + g][k0 + 8t .. +7]; mma j (j = 0, 1) takes words 2j, 2j+1 of those as its logical
// k pairs {2t, 2t+1} and {2t+8, 2t+9}.
// Accumulator lane layout (ISA): c0, c1 = (A row g, weight rows 2t, 2t+1), c2, c3 = (A row
// g + 8, same weight rows); A rows 0..7 hold the hi terms, rows 8..15 the lo terms.
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

// The activation row of one lane: f32 (split here) or pre-split hi / lo bf16 rows (written by
// split_bf16_kernel, the same bits). nullptrs read as zeros.
struct MmaX {
  const float* x;
  const bf16raw* hi;
  const bf16raw* lo;
  // hi / lo words of elements [k, k + 8) (elements >= k_end are 0)
  __device__ __forceinline__ void load(int k, int k_end, uint4& h, uint4& l) const {
    if (hi != nullptr && k + 8 <= k_end) {
      h = __ldg(reinterpret_cast<const uint4*>(hi + k));
      l = __ldg(reinterpret_cast<const uint4*>(lo + k));
      return;
    }
    float xv[8];
    if (hi != nullptr) {  // tail of a pre-split row: its values are hi + lo exactly
#pragma unroll
      for (int e = 0; e < 8; ++e) xv[e] = k + e < k_end ? to_f32(hi[k + e]) + to_f32(lo[k + e]) : 0.0f;
    } else if (x == nullptr || k >= k_end) {
#pragma unroll
      for (int e = 0; e < 8; ++e) xv[e] = 0.0f;
    } else if (k + 8 <= k_end) {
      load8_cached(x + k, xv);
    } else {
      load8_guard(x + k, k_end - k, xv);
    }
    split_bf16x2(xv[0], xv[1], h.x, l.x);
    split_bf16x2(xv[2], xv[3], h.y, l.y);
    split_bf16x2(xv[4], xv[5], h.z, l.z);
    split_bf16x2(xv[6], xv[7], h.w, l.w);
  }
};

// Accumulates the warp's K range [k_begin, k_end) (k_begin a multiple of 32) into c.
// wrow: weight row m0 + g (nullptr past M: zeros); xs: activation row n0 + g. The A operand's
// rows 0..7 are the hi terms and rows 8..15 the lo terms of the same activation rows, so one
// mma does both: c0, c1 accumulate hi . w and c2, c3 lo . w; the caller adds c0 + c2, c1 + c3.
// Steps of 32 k, U of them in flight per iteration.
template <int U>
__device__ __forceinline__ void mma_gemv_accumulate(const bf16raw* wrow, const MmaX& xs,
                                                    int k_begin, int k_end, int t,
                                                    float (&c)[4]) {
  for (int k0 = k_begin; k0 < k_end; k0 += 32 * U) {
    uint4 w[U];
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int k = k0 + 32 * i + 8 * t;
      w[i] = k < k_end && wrow ? mma_load_w(wrow, k, k_end) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < U; ++i) {
      if (k0 + 32 * i >= k_end) break;
      uint4 h, l;
      xs.load(k0 + 32 * i + 8 * t, k_end, h, l);
      mma_bf16_16816(c, h.x, l.x, h.y, l.y, w[i].x, w[i].y);
      mma_bf16_16816(c, h.z, l.z, h.w, l.w, w[i].z, w[i].w);
    }
  }
}

__device__ __forceinline__ void mma_cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   (unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}

// mma_gemv_accumulate with the weight tiles streamed through this warp's shared-memory ring
// `ring` (STAGES x STEPS x 32 lanes x 16 B) by cp.async: each lane copies, and later reads, its
// own 16 bytes, so STAGES - 1 stages of STEPS steps are in flight without holding registers.
// Same operands, same mma sequence, same bits as mma_gemv_accumulate.
template <int STEPS, int STAGES>
__device__ __forceinline__ void mma_gemv_accumulate_async(const bf16raw* wrow, const MmaX& xs,
                                                          int k_begin, int k_end, int t,
                                                          int lane, uint4* ring,
                                                          float (&c)[4]) {
  const int nsteps = k_end > k_begin ? (k_end - k_begin + 31) >> 5 : 0;
  const int nst = (nsteps + STEPS - 1) / STEPS;
  auto issue = [&](int s) {
    if (s < nst) {
#pragma unroll
      for (int i = 0; i < STEPS; ++i) {
        const int k = k_begin + 32 * (s * STEPS + i) + 8 * t;
        uint4* dst = ring + ((s % STAGES) * STEPS + i) * 32 + lane;
        if (wrow != nullptr && k + 8 <= k_end) {
          mma_cp_async16(dst, wrow + k);
        } else if (wrow != nullptr && k < k_end) {
          *dst = mma_load_w(wrow, k, k_end);
        } else {
          *dst = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue(s);
  for (int s = 0; s < nst; ++s) {
    issue(s + STAGES - 1);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1) : "memory");
#pragma unroll
    for (int i = 0; i < STEPS; ++i) {
      const int step = s * STEPS + i;
      if (step >= nsteps) break;
      const uint4 w = ring[((s % STAGES) * STEPS + i) * 32 + lane];
      uint4 h, l;
      xs.load(k_begin + 32 * step + 8 * t, k_end, h, l);
      mma_bf16_16816(c, h.x, l.x, h.y, l.y, w.x, w.y);
      mma_bf16_16816(c, h.z, l.z, h.w, l.w, w.z, w.w);
    }
  }
}
