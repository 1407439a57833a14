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

// mma_step_x8 with x already split: hi[q] / lo[q] = split_bf16x2(x[2q], x[2q + 1]).
__device__ __forceinline__ void mma_step_split8(float (&c)[4], const uint4& w0, const uint4& w1,
                                                const unsigned (&hi)[4], const unsigned (&lo)[4]) {
  mma_bf16_16816(c, w0.x, w1.x, w0.y, w1.y, hi[0], hi[1]);
  mma_bf16_16816(c, w0.x, w1.x, w0.y, w1.y, lo[0], lo[1]);
  mma_bf16_16816(c, w0.z, w1.z, w0.w, w1.w, hi[2], hi[3]);
  mma_bf16_16816(c, w0.z, w1.z, w0.w, w1.w, lo[2], lo[3]);
}

// mma_step_split8 for an x of bf16 values: hi[q] = their bits (x[2q] low, x[2q + 1] high), the
// lo products (all exactly 0: lo = bf16(x - hi) = 0) not issued. Bitwise mma_step_x8 on an f32
// x holding the same values: a zero product adds +0 to each accumulator, which leaves every
// value but -0 unchanged.
__device__ __forceinline__ void mma_step_bf16x8(float (&c)[4], const uint4& w0, const uint4& w1,
                                                const unsigned (&hi)[4]) {
  mma_bf16_16816(c, w0.x, w1.x, w0.y, w1.y, hi[0], hi[1]);
  mma_bf16_16816(c, w0.z, w1.z, w0.w, w1.w, hi[2], hi[3]);
}

// One 32-k step of lane (g, t): its 8 x values (x[k0 + 8t .. + 7]) split into bf16 hi + lo
// terms, times the A words w0 (row g) and w1 (row g + 8): words x / y, then z / w, the hi
// product first (the order every kernel of the tensor-core GEMV contract uses).
__device__ __forceinline__ void mma_step_x8(float (&c)[4], const uint4& w0, const uint4& w1,
                                            const float (&xv)[8]) {
  unsigned hi[4], lo[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) split_bf16x2(xv[2 * q], xv[2 * q + 1], hi[q], lo[q]);
  mma_step_split8(c, w0, w1, hi, lo);
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
      mma_step_x8(c, w0[i], w1[i], xv);
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
// silu(gate: A row r) * (up: A row r + 8). DIV (linear_tma_kernel's TMA_IO_ROW_NORM): the sums
// divided by `denom` first (for SWIGLU both, before the silu).
template <int SWIGLU, int S, bool DIV = false>
__device__ __forceinline__ float mma_reduce_partials(const MmaPartials<S>& red, int splits,
                                                     int r, int n, float denom = 1.0f) {
  float s = 0.0f;
  for (int w = 0; w < splits; ++w) s += red[w][r][n];
  if (DIV) s = s / denom;
  if (SWIGLU) {
    float u = 0.0f;
    for (int w = 0; w < splits; ++w) u += red[w][r + 8][n];
    if (DIV) u = u / denom;
    s = silu_f(s) * u;
  }
  return s;
}

// Row-contiguous staging (linear_mma_rows_kernel): the warp reads its 16-row A tile 128 k
// (4 steps) at a time with 8 loads in which each half-warp reads 256 contiguous bytes of one row
// (load j: tile rows 2j and 2j + 1; lane: row 2j + h with h = lane / 16, unit u = lane % 16 at
// k0 + 8u), parks them in a 4 KiB per-warp shared buffer with stmatrix and reads back, per step,
// the A fragments of mma_gemv_accumulate's lane (g, t), {w0.x, w1.x, w0.y, w1.y} and
// {w0.z, w1.z, w0.w, w1.w}, with ldmatrix. The units are the same bytes with the same zero fill
// (mma_load_w's guards), so the mmas see the same fragments.
//
// Buffer: 256 rows of 16 bytes; row (r, i, q) holds word q (0..3 = x, y, z, w) of the units
// t = 0..3 of tile row r, step i (a 4 x 4 word transpose of the row's 64 bytes of the step),
// at index r * 16 + 4 (i ^ ((r >> 2) & 1)) + (q ^ (r & 3) ^ (i & 2)) (a permutation of each
// tile row's 16 slots that spreads every 8-row matrix of both instructions over the 8 bank
// groups of 16 bytes). stmatrix.x4 (and ldmatrix.x4): lane L gives the address of row L % 8 of
// matrix L / 8; register q of lane 4 rho + t is word t of row rho of matrix q. Store of load j:
// matrix q, row rho = word q of the units t = 0..3 held by lanes 4 rho .. 4 rho + 3, i.e. of tile
// row 2j + rho / 4, step rho % 4: buffer row (2j + rho / 4, rho % 4, q). Fragment read of step
// i, half p: matrix m, row g = buffer row (g + 8 (m & 1), i, 2p + m / 2), so lane (g, t) gets in
// register m word 2p + m / 2 of unit t of tile row g + 8 (m & 1): the mma register order above.
// tests/cuda/test_mma_rows_layout.py replays both instructions word by word (no GPU needed).
#define MMA_ROWS_UNITS 256  // 16-byte rows per warp buffer (4 KiB)
#define MMA_ROWS_K 128      // k per staged batch
#define MMA_ROWS_ALIGN 256  // alignment of the buffers (bytes; extra dynamic shared memory)

// Byte offset in the warp buffer of this lane's stmatrix row for load 0 (buffer index with
// j = 0); load j uses (offset ^ 16 (4 ((j >> 1) & 1) | 2 (j & 1))) + 512 j (mma_rows_store).
__device__ __forceinline__ unsigned mma_rows_store_offset(int lane) {
  const int b = (lane >> 2) & 1, i = lane & 3, q = lane >> 3;
  return 16u * (unsigned)(16 * b + (4 * i | (q ^ b ^ (i & 2))));
}

// Byte offset in the warp buffer of this lane's ldmatrix row for step 0, half 0; step i, half p
// use offset ^ 16 (4i + (2p ^ (i & 2))) (mma_rows_frag).
__device__ __forceinline__ unsigned mma_rows_frag_offset(int lane) {
  const int m = lane >> 3, rho = lane & 7;
  const int r = rho + 8 * (m & 1);
  return 16u * (unsigned)(16 * r + (4 * ((rho >> 2) & 1) | ((m >> 1) ^ (rho & 3))));
}

// The 16-byte row of the warp buffer that holds word q of the units t = 0..3 of tile row r,
// step i (see above).
__device__ __forceinline__ int mma_rows_buffer_row(int r, int i, int q) {
  return r * 16 + 4 * (i ^ ((r >> 2) & 1)) + (q ^ (r & 3) ^ (i & 2));
}

// v[j] (tile row 2j + h, this lane's unit) into the buffer. st: shared-space address of the warp
// buffer (256-byte aligned, so the XOR only flips offset bits 4..7) + mma_rows_store_offset(lane);
// buf: that buffer, for the pre-sm_90 path (stmatrix needs sm_90), which writes the same bytes
// with 32-bit stores: word q of the lane's unit to word t of buffer row (2j + h, i, q).
__device__ __forceinline__ void mma_rows_store(unsigned st, unsigned buf, int lane,
                                               const uint4 (&v)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned a = (st ^ (16u * (4 * ((j >> 1) & 1) | 2 * (j & 1)))) + 512u * j;
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(a), "r"(v[j].x), "r"(v[j].y), "r"(v[j].z), "r"(v[j].w) : "memory");
#else
    const int r = 2 * j + (lane >> 4), i = (lane >> 2) & 3, t = lane & 3;
    const unsigned w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const unsigned a = buf + 16u * (unsigned)mma_rows_buffer_row(r, i, q) + 4u * t;
      asm volatile("st.shared.b32 [%0], %1;" :: "r"(a), "r"(w[q]) : "memory");
    }
#endif
  }
}

// The A fragment of step I, half P (mma register order). ld: shared-space address of the warp
// buffer (256-byte aligned) + mma_rows_frag_offset(lane).
template <int I, int P>
__device__ __forceinline__ uint4 mma_rows_frag(unsigned ld) {
  const unsigned a = ld ^ (16u * (4 * I + ((2 * P) ^ (I & 2))));
  uint4 f;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(f.x), "=r"(f.y), "=r"(f.z), "=r"(f.w) : "r"(a) : "memory");
  return f;
}

// Byte offset of tile row 2j + h from tile row h (`rsb`: row stride in bytes, `hib`: offset of
// tile row 8 + h): 2 (j % 4) rows (j < 4), hib + 2 (j - 4) rows (j >= 4). Warp-uniform.
__device__ __forceinline__ i64 mma_rows_row_offset(int j, i64 hib, i64 rsb) {
  return (j < 4 ? 0 : hib) + 2 * (j & 3) * rsb;
}

// The `valid` mask of mma_rows_load for the tile starting at output row m0 (M rows): bit j set
// when tile row 2j + h (lane half h) is inside M (SWIGLU: rows j >= 4 are the up rows of the gate
// rows j - 4, valid with them).
template <int SWIGLU>
__device__ __forceinline__ unsigned mma_rows_valid(int m0, int h, int m) {
  unsigned valid = 0u;
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (m0 + (SWIGLU ? 2 * (j & 3) : 2 * j) + h < m) valid |= 1u << j;
  return valid;
}

// A whole-unit batch: v[j] = w[tile row 2j + h][k .. k + 7] (16-byte loads; unit: byte address
// of w[tile row h][k]), zeros when !in (k >= k_end) or bit j of `valid` is clear (row past M).
// Needs k + 8 <= k_end whenever k < k_end. The strides pass through an opaque move so that the
// compiler forms each row address next to its load instead of keeping 7 hoisted 64-bit row
// offsets live across the K loop (which spilled at 64 registers).
__device__ __forceinline__ void mma_rows_load(const char* unit, i64 hib, i64 rsb, unsigned valid,
                                              bool in, uint4 (&v)[8]) {
  i64 hb, rb;
  asm volatile("mov.b64 %0, %1;" : "=l"(hb) : "l"(hib));
  asm volatile("mov.b64 %0, %1;" : "=l"(rb) : "l"(rsb));
#pragma unroll
  for (int j = 0; j < 8; ++j)
    v[j] = in && ((valid >> j) & 1u) ? ld_stream16(unit + mma_rows_row_offset(j, hb, rb))
                                     : make_uint4(0u, 0u, 0u, 0u);
}

// The batch holding a partial unit (K % 8 != 0; at most one per warp, its last): this lane's 8
// units read element-wise (elements >= k_end and rows past M as 0, like mma_load_w) and stored
// one bf16 at a time where mma_rows_store would have put them (same bytes in the buffer).
// sbuf: the warp buffer (generic pointer); n = k_end - k: elements of the unit inside (<= 0: none).
__device__ __forceinline__ void mma_rows_store_partial(bf16raw* sbuf, int lane, const char* unit,
                                                       i64 hib, i64 rsb, unsigned valid, int n) {
  const int h = lane >> 4, i = (lane >> 2) & 3, t = lane & 3;  // unit u = lane % 16 = 4i + t
#pragma unroll 1
  for (int j = 0; j < 8; ++j) {
    const int r = 2 * j + h;
    const bf16raw* src = reinterpret_cast<const bf16raw*>(unit + mma_rows_row_offset(j, hib, rsb));
    const bool ok = (valid >> j) & 1u;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      // element e: word e / 2 of the unit -> buffer row (r, i, e / 2), word t, half e % 2
      const int row = mma_rows_buffer_row(r, i, e >> 1);
      sbuf[row * 8 + 2 * t + (e & 1)] = ok && e < n ? src[e] : (bf16raw)0;
    }
  }
}

// Half a 32-k step: the two mmas of one k16 half of mma_gemv_accumulate's step (f: that half's A
// fragment) with x[k .. k + 3] (xk = &x[row][k], o = k - k0, rem = k_end - k0; zeros at
// k >= k_end, elements past k_end read as 0): the same x values, the same hi/lo split and the
// same mma order as there, with only 4 x values live at a time. PARTIAL = 0: the caller
// guarantees that k < k_end implies k + 4 <= k_end (whole-unit batches).
// XT = bf16raw: x holds bf16 bits (8-byte aligned units); the 4 values' bits are the hi words
// and the lo mma (all products 0) is not issued: bitwise the f32 x of the same values.
template <int PARTIAL, typename XT>
__device__ __forceinline__ void mma_rows_half(const uint4& f, const XT* xk, int o, int rem,
                                              float (&c)[4]) {
  if constexpr (sizeof(XT) == 2) {
    unsigned hi[2] = {0u, 0u};
    if (o + 4 <= rem || (!PARTIAL && o < rem)) {
      const uint2 a = __ldg(reinterpret_cast<const uint2*>(xk));
      hi[0] = a.x;
      hi[1] = a.y;
    } else if (PARTIAL) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (o + e < rem) hi[e >> 1] |= (unsigned)xk[e] << (16 * (e & 1));
    }
    mma_bf16_16816(c, f.x, f.y, f.z, f.w, hi[0], hi[1]);
    return;
  }
  float xv[4];
  if (o + 4 <= rem || (!PARTIAL && o < rem)) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(xk));
    xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
  } else if (!PARTIAL) {
#pragma unroll
    for (int e = 0; e < 4; ++e) xv[e] = 0.0f;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) xv[e] = o + e < rem ? xk[e] : 0.0f;
  }
  unsigned hi[2], lo[2];
  split_bf16x2(xv[0], xv[1], hi[0], lo[0]);
  split_bf16x2(xv[2], xv[3], hi[1], lo[1]);
  mma_bf16_16816(c, f.x, f.y, f.z, f.w, hi[0], hi[1]);
  mma_bf16_16816(c, f.x, f.y, f.z, f.w, lo[0], lo[1]);
}

// The mmas of one staged batch from the buffer, in mma_gemv_accumulate's order: steps
// i = 0..3 while k0 + 32 i < k_end (rem = k_end - k0 > 0), each as two halves. ld: see
// mma_rows_frag; xk: &x[row][k0 + 8t]; o: 8t. PARTIAL: the batch holds a partial unit.
template <int PARTIAL, typename XT>
__device__ __forceinline__ void mma_rows_batch(unsigned ld, const XT* xk, int o, int rem,
                                               float (&c)[4]) {
  mma_rows_half<PARTIAL>(mma_rows_frag<0, 0>(ld), xk, o, rem, c);
  mma_rows_half<PARTIAL>(mma_rows_frag<0, 1>(ld), xk + 4, o + 4, rem, c);
  if (rem <= 32) return;
  mma_rows_half<PARTIAL>(mma_rows_frag<1, 0>(ld), xk + 32, o + 32, rem, c);
  mma_rows_half<PARTIAL>(mma_rows_frag<1, 1>(ld), xk + 36, o + 36, rem, c);
  if (rem <= 64) return;
  mma_rows_half<PARTIAL>(mma_rows_frag<2, 0>(ld), xk + 64, o + 64, rem, c);
  mma_rows_half<PARTIAL>(mma_rows_frag<2, 1>(ld), xk + 68, o + 68, rem, c);
  if (rem <= 96) return;
  mma_rows_half<PARTIAL>(mma_rows_frag<3, 0>(ld), xk + 96, o + 96, rem, c);
  mma_rows_half<PARTIAL>(mma_rows_frag<3, 1>(ld), xk + 100, o + 100, rem, c);
}
