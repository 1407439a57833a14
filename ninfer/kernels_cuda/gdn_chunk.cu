// gdn_chunk.cu: chunkwise-parallel gated delta rule (WY/UT form) for prefill; fp32 operands,
// state and workspaces, matrix products on tensor cores in one of two precisions.
//
// Same inputs, outputs and state update as gdn_recurrence (gdn.cu). Chunks of CH = 64 tokens
// start at each segment's first token (so splitting a prompt at multiples of 64 tokens gives
// the same chunks as processing it whole). Within a chunk of L <= 64 tokens, with
// G_i = sum_{s<=i} g_s (spec 4.4):
//   A = strict_tril((beta K) K^T * exp(G_i - G_j))         P = tril((Q K^T) * exp(G_i - G_j))
//   [U | W] = (I + A)^-1 [beta V | beta e^G K]             (forward substitution)
//   V' = U - W S;  O = (Q e^G) S + P V';  S <- e^{G_L} S + (K e^{G_L - G})^T V'
//
// Every mma kernel takes a template argument BF16 that picks the matrix products (Mma<BF16>):
//   false  3xTF32: x = hi + lo with hi = tf32(x), lo = tf32(x - hi), a*b ~ a_lo*b_hi +
//          a_hi*b_lo + a_hi*b_hi (lo*lo dropped), fp32 accumulation (mma.sync.m16n8k8 tf32;
//          equal to gdn_recurrence within fp32 rounding).
//   true   bf16: each operand (as scaled: -W, Q e^G, K e^{G_L - G}, and the fp32 state S where
//          it is an operand) rounded to bf16 (nearest even) as its fragment is read from the
//          fp32 shared tile, one mma.sync.m16n8k16 bf16 per step, fp32 accumulation (FLA's
//          policy; relative error ~1e-2 or less). S itself is carried in fp32 accumulators.
// Only the fragment loads, the k step (8 or 16) and the shared row strides (chosen per policy
// for conflict-free fragment reads) differ; tiles, warp mapping, pipeline and the fp32 parts
// (gates, exp, the forward substitution as fp32 FMAs) are the same. Both modes are
// deterministic, so a prompt split at multiples of 64 tokens gives bitwise the same results.
//
// gdn_chunk_offsets_kernel   one thread: chunk_offsets[g] = first global chunk of segment g.
// gdn_chunk_local_kernel<BF16>
//                            grid (max_chunks, Hv), 256 threads: everything that depends on one
//                            chunk only (G, A, P, U, W), for all chunks in parallel. A and P
//                            (QK^T, KK^T): warp w owns rows 16(w/2).. and columns 32(w%2).. of
//                            both; U, W: thread c solves column c of [beta V | beta e^G K]
//                            (64 registers, fully unrolled).
// gdn_chunk_state_kernel<BF16>
//                            grid (G, Hv, ceil(dv / 32)), 256 threads: walks a segment's chunks
//                            in order carrying a 128 x 32 column tile of S (state columns are
//                            independent) in registers (warp w: rows 16w..16w+15, as mma
//                            accumulators) and a copy in shared memory (B operand), and computes
//                            the output on the way (four products per chunk). Per chunk:
//                            phase A  V' = U - W S and O = (Q e^G) S (warp w: rows 16(w/2)..,
//                                     column tiles 2(w%2)..), V' to shared memory;
//                            phase B  O += P V' (stored); S = e^{G_L} S + K'^T V'.
//                            Operands are prefetched with cp.async into single buffers: K and P
//                            load during phase A, the next chunk's W, Q, U, G during phase B.
// gdn_chunk_local16_kernel, gdn_chunk_state16_kernel<SB>   (bf16 only; SB = 32 or 64)
//                            the bf16-tile path: the local kernel also writes every mma operand
//                            of the state pass as bf16 (-W, K e^{G_L - G}, Q e^G, P; U stays
//                            fp32: it seeds the V' accumulators), each the rounding of the same
//                            fp32 product the fp32-tile kernel rounds per fragment read; the state
//                            pass keeps them as bf16 tiles (ldmatrix fragments), loads chunk c + 1
//                            into a second stage while chunk c computes (two barriers per chunk),
//                            and forms the same products in the same order, so its outputs and
//                            state equal gdn_chunk_state_kernel<true>'s bit for bit.
// gdn_chunk_localpair_kernel<VPB>  (bf16-tile path, NINFER_GDN_CHUNK_LOCAL_PAIR, the default)
//                            the same workspaces as gdn_chunk_local16_kernel for VPB = 2 value heads
//                            of one key head per block (Q, K loaded and K K^T, Q K^T formed once),
//                            with [U | W] = T [beta V | beta e^G K], T = (I + A)^-1 formed once per
//                            chunk and head by 16 x 16 blocks (fp32) and applied with 3xTF32 mma,
//                            instead of the per-column forward substitution (see the kernel).
// dk, dv <= 128 (shorter head dims are zero-padded to 128 in shared memory).
#include "common.cuh"

#define CH 64
#define DMAX 128

struct ChunkParams {
  const float* q;
  const float* k;
  const float* v;
  const float* g;
  const float* beta;
  float* state;
  const int* seg_starts;
  const int* seg_slots;
  float* out;
  int* chunk_offsets;  // [G + 1]
  float* w_ws;         // [N, Hv, 128]
  float* u_ws;         // [N, Hv, 128]
  float* gam_ws;       // [N, Hv]
  float* p_ws;         // [max_chunks, Hv, 64, 64]
  void* reserved;      // unused (the removed split path's per-chunk states): same layout
  i64 q_rs, q_hs, k_rs, k_hs, v_rs, v_hs, g_rs, beta_rs, out_rs, out_hs;
  i64 state_ss;
  int key_heads, value_heads, dk, dv;
  int num_segs, max_chunks;
  int vec_qk;  // q, k base and strides 16-byte aligned: 16-byte cp.async (else 4-byte)
  int vec_v;   // v base and strides 16-byte aligned (gdn_chunk_localpair_kernel's cp.async)
};
static_assert(sizeof(ChunkParams) == 240, "ChunkParams layout is mirrored in gdn_chunk.py");

__global__ void gdn_chunk_offsets_kernel(const ChunkParams p) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int total = 0;
  p.chunk_offsets[0] = 0;
  for (int g = 0; g < p.num_segs; ++g) {
    const int len = p.seg_starts[g + 1] - p.seg_starts[g];
    total += len > 0 ? (len + CH - 1) / CH : 0;
    p.chunk_offsets[g + 1] = total;
  }
}

// ---- cp.async (global -> shared, zero-filled past src_bytes) --------------------------------
__device__ __forceinline__ void cp_async16(float* dst, const float* src, int src_bytes) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src, int src_bytes) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
               "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Rows [0, ROWS) x columns [0, COLS) of a global matrix (row i at src + i * rs; src and rs
// 16-byte aligned; element valid when i < rows and column < cols) into shared dst (row stride
// ld), zeros elsewhere, in 16-byte copies. 256 threads.
template <int ROWS, int COLS>
__device__ __forceinline__ void async_tile(float* dst, int ld, const float* src, i64 rs, int rows,
                                           int cols, int tid) {
  constexpr int V = COLS / 4;  // 16-byte copies per row
  static_assert(ROWS * V % 256 == 0, "whole copies per thread");
#pragma unroll
  for (int r = 0; r < ROWS * V / 256; ++r) {
    const unsigned idx = tid + 256 * r;  // unsigned: / and % are shifts and masks
    const int i = idx / V, c = (idx % V) * 4;
    const int bytes = i < rows ? min(16, max(0, (cols - c) * 4)) : 0;
    cp_async16(dst + i * ld + c, bytes > 0 ? src + i * rs + c : src, bytes);
  }
}

// async_tile<64, 128> for q / k rows (valid: i < L, column < lim); vec false: src or rs not
// 16-byte aligned, 4-byte copies.
__device__ __forceinline__ void async_tile128(float* dst, int ld, const float* src, i64 rs,
                                              int L, int lim, bool vec, int tid) {
  if (vec) {
    async_tile<CH, DMAX>(dst, ld, src, rs, L, lim, tid);
  } else {
#pragma unroll 8
    for (int r = 0; r < 32; ++r) {
      const int idx = tid + 256 * r, i = idx >> 7, c = idx & 127;
      const bool ok = i < L && c < lim;
      cp_async4(dst + i * ld + c, ok ? src + i * rs + c : src, ok ? 4 : 0);
    }
  }
}

// dst[i * rs + j] = src[i * ld + j] (global <- shared) for i < min(ROWS, rows), j < min(COLS,
// cols). 256 threads, consecutive threads on consecutive columns.
template <int ROWS, int COLS>
__device__ __forceinline__ void store_tile(float* dst, i64 rs, const float* src, int ld, int rows,
                                           int cols, int tid) {
  for (unsigned idx = tid; idx < ROWS * COLS; idx += 256) {
    const int i = idx / COLS, j = idx % COLS;
    if (i < rows && j < cols) dst[i * rs + j] = src[i * ld + j];
  }
}

// ---- matrix-product policies --------------------------------------------------------------
// Mma<BF16> forms one tensor-core product step d += A B of a 16 x K A tile and a K x 8 B tile
// from fp32 shared-memory operands (converted per fragment) and names the row strides of the
// shared tiles, chosen per policy so that its fragment reads are free of bank conflicts:
//   QK_LD   [64][128] tiles read as row-major A or as B^T (Q, K in the local kernel, W, Q)
//   KS_LD   [64][128] K tile read as transposed A (the state update)
//   A_LD    [64][64] tiles read as row-major A (A, P)
//   col_ld  [*][cols] tiles read as row-major B (S, U, V'; cols = 32)
// Accumulator fragments (both policies, g = lane / 4, t = lane % 4):
//   C 16x8:  c0 (g, 2t)  c1 (g, 2t+1)  c2 (g+8, 2t)  c3 (g+8, 2t+1)
// Loaders: load_a    A[m][k] = X[m][k] * (m < 8 ? s0 : s1)     (row-major A, rows scaled)
//          load_at   A[m][k] = X[k][m] * sk[k]                 (transposed A, k scaled)
//          load_b    B[k][n] = Y[k][n]                         (row-major B)
//          load_bt   B[k][n] = Y[n][k]                         (transposed B)
template <bool BF16> struct Mma;

// 3xTF32 m16n8k8 (PTX ISA fragments, .tf32): x = hi + lo with hi = tf32(x), lo = tf32(x - hi);
// a*b ~ a_lo*b_hi + a_hi*b_lo + a_hi*b_hi (lo*lo dropped), about fp32 accuracy.
//   A 16x8:  a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)
//   B 8x8:   b0 (k=t, n=g)  b1 (k=t+4, n=g)
template <> struct Mma<false> {
  static constexpr int K = 8;
  static constexpr int QK_LD = 132;  // = 4 mod 32: a (g, t) read hits bank 4g + t
  static constexpr int KS_LD = 136;  // = 8 mod 32: a (t, g) read hits bank 8t + g
  static constexpr int A_LD = 68;
  static constexpr int COL_PAD = 8;  // col_ld = 8 mod 32: (t, g) reads, float2 writes
  struct FragA { unsigned hi[4], lo[4]; };
  struct FragB { unsigned hi[2], lo[2]; };

  static __device__ __forceinline__ void split(float x, unsigned& hi, unsigned& lo) {
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(hi) : "f"(x));
    const float r = x - __uint_as_float(hi);
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(lo) : "f"(r));
  }
  static __device__ __forceinline__ void mma1(float d[4], const unsigned a[4],
                                              const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  // d += a b (small cross terms first)
  static __device__ __forceinline__ void mma(float d[4], const FragA& a, const FragB& b) {
    mma1(d, a.lo, b.hi);
    mma1(d, a.hi, b.lo);
    mma1(d, a.hi, b.hi);
  }
  static __device__ __forceinline__ void load_a(FragA& f, const float* X, int ld, int g, int t,
                                                float s0, float s1) {
    split(X[g * ld + t] * s0, f.hi[0], f.lo[0]);
    split(X[(g + 8) * ld + t] * s1, f.hi[1], f.lo[1]);
    split(X[g * ld + t + 4] * s0, f.hi[2], f.lo[2]);
    split(X[(g + 8) * ld + t + 4] * s1, f.hi[3], f.lo[3]);
  }
  static __device__ __forceinline__ void load_at(FragA& f, const float* X, int ld, int g, int t,
                                                 const float* sk) {
    const float s0 = sk[t], s4 = sk[t + 4];
    split(X[t * ld + g] * s0, f.hi[0], f.lo[0]);
    split(X[t * ld + g + 8] * s0, f.hi[1], f.lo[1]);
    split(X[(t + 4) * ld + g] * s4, f.hi[2], f.lo[2]);
    split(X[(t + 4) * ld + g + 8] * s4, f.hi[3], f.lo[3]);
  }
  static __device__ __forceinline__ void load_b(FragB& f, const float* Y, int ld, int g, int t) {
    split(Y[t * ld + g], f.hi[0], f.lo[0]);
    split(Y[(t + 4) * ld + g], f.hi[1], f.lo[1]);
  }
  static __device__ __forceinline__ void load_bt(FragB& f, const float* Y, int ld, int g, int t) {
    split(Y[g * ld + t], f.hi[0], f.lo[0]);
    split(Y[g * ld + t + 4], f.hi[1], f.lo[1]);
  }
};

// bf16 m16n8k16, fp32 accumulation: operands rounded to bf16 (nearest even) as loaded, one mma
// per step (PTX ISA fragments, .bf16; each register holds two consecutive k, the lower k in the
// low half):
//   A 16x16: a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..2t+9)  a3 (g+8, 2t+8..)
//   B 16x8:  b0 (k=2t..2t+1, n=g)  b1 (k=2t+8..2t+9, n=g)
// Row-major A and B^T reads are float2 at (g, 2t): conflict-free per half warp when the stride
// is 8 mod 32; (2t, g) reads (B, transposed A) when it is 4 mod 16.
template <> struct Mma<true> {
  static constexpr int K = 16;
  static constexpr int QK_LD = 136;  // = 8 mod 32
  static constexpr int KS_LD = 132;  // = 4 mod 32
  static constexpr int A_LD = 72;    // = 8 mod 32
  static constexpr int COL_PAD = 4;  // col_ld = 4 mod 16 (cols a multiple of 16)
  struct FragA { unsigned r[4]; };
  struct FragB { unsigned r[2]; };

  // bf16x2 of (lo, hi): lo in the low half
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    unsigned d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
  }
  static __device__ __forceinline__ unsigned pack2(const float* x, float s) {
    const float2 v = *reinterpret_cast<const float2*>(x);
    return pack(v.x * s, v.y * s);
  }
  static __device__ __forceinline__ void mma(float d[4], const FragA& a, const FragB& b) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  }
  static __device__ __forceinline__ void load_a(FragA& f, const float* X, int ld, int g, int t,
                                                float s0, float s1) {
    f.r[0] = pack2(X + g * ld + 2 * t, s0);
    f.r[1] = pack2(X + (g + 8) * ld + 2 * t, s1);
    f.r[2] = pack2(X + g * ld + 2 * t + 8, s0);
    f.r[3] = pack2(X + (g + 8) * ld + 2 * t + 8, s1);
  }
  static __device__ __forceinline__ void load_at(FragA& f, const float* X, int ld, int g, int t,
                                                 const float* sk) {
    const int k0 = 2 * t, k8 = 2 * t + 8;
    const float s0 = sk[k0], s1 = sk[k0 + 1], s8 = sk[k8], s9 = sk[k8 + 1];
    f.r[0] = pack(X[k0 * ld + g] * s0, X[(k0 + 1) * ld + g] * s1);
    f.r[1] = pack(X[k0 * ld + g + 8] * s0, X[(k0 + 1) * ld + g + 8] * s1);
    f.r[2] = pack(X[k8 * ld + g] * s8, X[(k8 + 1) * ld + g] * s9);
    f.r[3] = pack(X[k8 * ld + g + 8] * s8, X[(k8 + 1) * ld + g + 8] * s9);
  }
  static __device__ __forceinline__ void load_b(FragB& f, const float* Y, int ld, int g, int t) {
    const int k0 = 2 * t, k8 = 2 * t + 8;
    f.r[0] = pack(Y[k0 * ld + g], Y[(k0 + 1) * ld + g]);
    f.r[1] = pack(Y[k8 * ld + g], Y[(k8 + 1) * ld + g]);
  }
  static __device__ __forceinline__ void load_bt(FragB& f, const float* Y, int ld, int g, int t) {
    f.r[0] = pack2(Y + g * ld + 2 * t, 1.0f);
    f.r[1] = pack2(Y + g * ld + 2 * t + 8, 1.0f);
  }
};

// Row stride of the [*][cols] tiles read as B fragments (S, U, V').
template <bool BF16>
__host__ __device__ constexpr int col_ld(int cols) { return cols + Mma<BF16>::COL_PAD; }

// acc[n] += A B[:, 8n..8n+7] for n < NT: A 16 x KD at A (row-major, stride lda; rows 0-7
// scaled by s0, rows 8-15 by s1), B [KD][8NT] at B (row-major, stride ldb); k in ascending order.
template <bool BF16, int NT, int KD>
__device__ __forceinline__ void mma_rows(float (&acc)[NT][4], const float* A, int lda, float s0,
                                         float s1, const float* B, int ldb, int g, int t) {
  using M = Mma<BF16>;
  constexpr int UNROLL = BF16 ? 2 : 4;  // bf16: k steps twice as deep, fewer of them
#pragma unroll UNROLL
  for (int ks = 0; ks < KD / M::K; ++ks) {
    typename M::FragA fa;
    M::load_a(fa, A + M::K * ks, lda, g, t, s0, s1);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      typename M::FragB fb;
      M::load_b(fb, B + M::K * ks * ldb + 8 * n, ldb, g, t);
      M::mma(acc[n], fa, fb);
    }
  }
}

// Output rows cs + r0 (+8), columns col0 + 8n + 2t (+1) from the accumulators of a 16-row tile
// (r0 = its first row + g); rows past L and columns past dv are not written.
template <int NT>
__device__ __forceinline__ void store_o(const ChunkParams& p, const float (&acc)[NT][4], int cs,
                                        int L, int h, int r0, int col0, int t) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = r0 + 8 * (r >> 1), col = col0 + 8 * n + 2 * t + (r & 1);
      if (i < L && col < p.dv)
        p.out[(i64)(cs + i) * p.out_rs + (i64)h * p.out_hs + col] = acc[n][r];
    }
}

// Segment of global chunk b < chunk_offsets[num_segs]: the last g with chunk_offsets[g] <= b.
__device__ __forceinline__ int chunk_segment(const ChunkParams& p, int b) {
  int lo = 0, hi = p.num_segs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.chunk_offsets[mid] <= b) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// bf16 (nearest even) of x, the rounding of Mma<true>::pack
__device__ __forceinline__ bf16raw bf16_rn(float x) {
  bf16raw d;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(d) : "f"(x));
  return d;
}

// The local kernel's body. WS16 (BF16 only; gdn_chunk_local16_kernel): the workspaces of the
// bf16-tile state kernel (gdn_chunk_state16_kernel) instead of fp32 W and P: w_ws as bf16
// [N, Hv, 256] holding -W (columns 0..127) and K e^{G_L - G} (128..255), p_ws as bf16
// [max_chunks, Hv, 64, 64] holding P, qg as bf16 [N, Hv, 128] holding Q e^G; each value the
// bf16 rounding of the fp32 product that Mma<true> rounds as it reads its fragment in
// gdn_chunk_state_kernel<true> (same operands, same fp32 multiplications), and zero in
// the padded columns (d >= dk), so the bf16-tile path forms the same products bit for bit.
// A warp's part of K K^T and Q K^T (the local kernels): rows 16 mt.., column tiles 8 (nt0 + n)..
// (n < NT), summed over DMAX in M::K steps from the row-major tiles Ks, Qs (pitch ld).
template <typename M, int NT>
__device__ __forceinline__ void kkt_qkt(float (&ak)[NT][4], float (&aq)[NT][4], const float* Ks,
                                        const float* Qs, int ld, int mt, int nt0, int g, int t) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) ak[n][r] = aq[n][r] = 0.0f;
#pragma unroll 2
  for (int ks = 0; ks < DMAX / M::K; ++ks) {
    typename M::FragA fk, fq;
    M::load_a(fk, Ks + 16 * mt * ld + M::K * ks, ld, g, t, 1.0f, 1.0f);
    M::load_a(fq, Qs + 16 * mt * ld + M::K * ks, ld, g, t, 1.0f, 1.0f);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      typename M::FragB fb;  // B[k = d][n = j] = K[j][d]
      M::load_bt(fb, Ks + 8 * (nt0 + n) * ld + M::K * ks, ld, g, t);
      M::mma(ak[n], fk, fb);
      M::mma(aq[n], fq, fb);
    }
  }
}

// From kkt_qkt's tiles and the cumulative gates gam / betas bet of one value head: A (strictly
// lower, beta_i e^{g_i - g_j} (K K^T)_ij) into As (pitch a_ld) and P (lower incl. the diagonal,
// e^{g_i - g_j} (Q K^T)_ij) as bf16 pairs (j, j + 1) into pw2 ([CH][CH / 2]).
template <int NT>
__device__ __forceinline__ void decay_tiles_bf16(const float (&ak)[NT][4], const float (&aq)[NT][4],
                                                 const float* gam, const float* bet, float* As,
                                                 int a_ld, unsigned* pw2, int mt, int nt0, int g,
                                                 int t) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int r = 0; r < 4; r += 2) {
      const int i = 16 * mt + g + 8 * (r >> 1), j = 8 * (nt0 + n) + 2 * t;
      const float d0 = j <= i ? expf(gam[i] - gam[j]) : 0.0f;
      const float d1 = j + 1 <= i ? expf(gam[i] - gam[j + 1]) : 0.0f;
      As[i * a_ld + j] = j < i ? bet[i] * d0 * ak[n][r] : 0.0f;
      As[i * a_ld + j + 1] = j + 1 < i ? bet[i] * d1 * ak[n][r + 1] : 0.0f;
      pw2[(i * CH + j) / 2] = Mma<true>::pack(j <= i ? d0 * aq[n][r] : 0.0f,
                                              j + 1 <= i ? d1 * aq[n][r + 1] : 0.0f);
    }
}

template <bool BF16, bool WS16>
__device__ __forceinline__ void local_chunk(const ChunkParams& p, bf16raw* qg) {
  static_assert(BF16 || !WS16, "bf16 workspaces only in bf16 mode");
  using M = Mma<BF16>;
  constexpr int QK_LD = M::QK_LD, A_LD = M::A_LD;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* Ks = smem;                    // [64][QK_LD]
  float* Qs = Ks + CH * QK_LD;         // [64][QK_LD]
  float* As = Qs + CH * QK_LD;         // [64][A_LD]
  float* gam = As + CH * A_LD;         // [64]
  float* bet = gam + CH;               // [64]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.x, h = blockIdx.y;
  if (b >= p.chunk_offsets[p.num_segs]) return;
  const int seg = chunk_segment(p, b);
  const int t_start = p.seg_starts[seg] + (b - p.chunk_offsets[seg]) * CH;
  const int L = min(CH, p.seg_starts[seg + 1] - t_start);
  const int kh = h / (p.value_heads / p.key_heads);

  async_tile128(Ks, QK_LD, p.k + (i64)t_start * p.k_rs + (i64)kh * p.k_hs, p.k_rs, L, p.dk,
                p.vec_qk != 0, tid);
  async_tile128(Qs, QK_LD, p.q + (i64)t_start * p.q_rs + (i64)kh * p.q_hs, p.q_rs, L, p.dk,
                p.vec_qk != 0, tid);
  cp_async_commit();
  if (tid < CH) {
    const i64 row = t_start + tid;
    gam[tid] = tid < L ? p.g[row * p.g_rs + h] : 0.0f;
    bet[tid] = tid < L ? p.beta[row * p.beta_rs + h] : 0.0f;
  }
  __syncthreads();
  if (tid == 0) {
    for (int i = 1; i < CH; ++i) gam[i] += gam[i - 1];
  }
  cp_async_wait<0>();
  __syncthreads();

  {  // A (strict lower) into shared memory, P (lower incl. diagonal) to the workspace.
     // Warp w: rows 16 mt.., column tiles 8 (nt0 + n).. of K K^T and Q K^T.
    const int g = lane >> 2, t = lane & 3;
    const int mt = warp >> 1, nt0 = 4 * (warp & 1);
    float ak[4][4], aq[4][4];
    kkt_qkt<M, 4>(ak, aq, Ks, Qs, QK_LD, mt, nt0, g, t);
    if constexpr (WS16) {  // P as bf16 pairs (j, j + 1)
      unsigned* pw2 = reinterpret_cast<unsigned*>(p.p_ws) +  // [64][32] bf16x2 of chunk b
                      ((i64)b * p.value_heads + h) * CH * CH / 2;
      decay_tiles_bf16<4>(ak, aq, gam, bet, As, A_LD, pw2, mt, nt0, g, t);
    } else {
      float* pw = p.p_ws + ((i64)b * p.value_heads + h) * CH * CH;
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int i = 16 * mt + g + 8 * (r >> 1), j = 8 * (nt0 + n) + 2 * t + (r & 1);
          const float decay = j <= i ? expf(gam[i] - gam[j]) : 0.0f;
          As[i * A_LD + j] = j < i ? bet[i] * decay * ak[n][r] : 0.0f;
          pw[i * CH + j] = j <= i ? decay * aq[n][r] : 0.0f;
        }
    }
  }
  if constexpr (WS16) {  // K e^{G_L - G} and Q e^G (bf16 pairs, rows < L, all 128 columns)
    bf16raw* kw = reinterpret_cast<bf16raw*>(p.w_ws);
    const float g_last = gam[L - 1];
    for (int idx = tid; idx < CH * DMAX / 2; idx += 256) {
      const int i = idx >> 6, d = 2 * (idx & 63);
      if (i < L) {
        const float ek = expf(g_last - gam[i]), eg = expf(gam[i]);
        const i64 row = (i64)(t_start + i) * p.value_heads + h;
        *reinterpret_cast<unsigned*>(kw + row * 2 * DMAX + DMAX + d) =
            Mma<true>::pack(Ks[i * QK_LD + d] * ek, Ks[i * QK_LD + d + 1] * ek);
        *reinterpret_cast<unsigned*>(qg + row * DMAX + d) =
            Mma<true>::pack(Qs[i * QK_LD + d] * eg, Qs[i * QK_LD + d + 1] * eg);
      }
    }
  }
  __syncthreads();

  {  // forward substitution: column c of [beta V | beta e^G K]
    const int c = tid;
    float x[CH];
    if (c < DMAX) {
      const bool ok = c < p.dv;
#pragma unroll
      for (int i = 0; i < CH; ++i)
        x[i] = (ok && i < L) ? bet[i] * p.v[(t_start + i) * p.v_rs + (i64)h * p.v_hs + c] : 0.0f;
    } else {
      const int d = c - DMAX;
#pragma unroll
      for (int i = 0; i < CH; ++i) x[i] = bet[i] * expf(gam[i]) * Ks[i * QK_LD + d];
    }
#pragma unroll
    for (int i = 1; i < CH; ++i) {
      float acc0 = x[i], acc1 = 0.0f;  // two partial sums: half the dependency chain
      const float* arow = As + i * A_LD;
#pragma unroll
      for (int j4 = 0; j4 < CH; j4 += 4) {
        if (j4 < i) {
          const float4 a4 = *reinterpret_cast<const float4*>(arow + j4);
          float& acc = (j4 & 4) ? acc1 : acc0;
          acc = fmaf(-a4.x, x[j4], acc);
          if (j4 + 1 < i) acc = fmaf(-a4.y, x[j4 + 1], acc);
          if (j4 + 2 < i) acc = fmaf(-a4.z, x[j4 + 2], acc);
          if (j4 + 3 < i) acc = fmaf(-a4.w, x[j4 + 3], acc);
        }
      }
      x[i] = acc0 + acc1;
    }
    if (WS16 && c >= DMAX) {  // -W as bf16, -0 in the padded columns (as -1 * a zero fill)
      const int col = c - DMAX;
      bf16raw* dst = reinterpret_cast<bf16raw*>(p.w_ws);
#pragma unroll
      for (int i = 0; i < CH; ++i)
        if (i < L)
          dst[((i64)(t_start + i) * p.value_heads + h) * 2 * DMAX + col] =
              bf16_rn(col < p.dk ? -x[i] : -0.0f);
    } else {
      float* dst = c < DMAX ? p.u_ws : p.w_ws;
      const int col = c < DMAX ? c : c - DMAX;
      const int lim = c < DMAX ? p.dv : p.dk;
      if (col < lim) {
#pragma unroll
        for (int i = 0; i < CH; ++i)
          if (i < L) dst[((i64)(t_start + i) * p.value_heads + h) * DMAX + col] = x[i];
      }
    }
    if (tid < L) p.gam_ws[(i64)(t_start + tid) * p.value_heads + h] = gam[tid];
  }
}

template <bool BF16>
__global__ void __launch_bounds__(256) gdn_chunk_local_kernel(const ChunkParams p) {
  local_chunk<BF16, false>(p, nullptr);
}

// The local kernel of the bf16-tile path: also writes K e^{G_L - G} and Q e^G (qg), all operand
// workspaces in bf16 (local_chunk<true, true>).
__global__ void __launch_bounds__(256) gdn_chunk_local16_kernel(const ChunkParams p,
                                                                bf16raw* qg) {
  local_chunk<true, true>(p, qg);
}

// ---- gdn_chunk_localpair_kernel<VPB>: the bf16-tile path's local kernel, inverse form ----------
// Same workspaces as gdn_chunk_local16_kernel (-W | K e^{G_L - G} and Q e^G bf16, U and G fp32,
// P bf16), computed per chunk for VPB value heads of one key head (VPB = 2: a value-head pair;
// 1 when Hv / Hk is odd): grid (max_chunks, Hv / VPB), 256 VPB threads; thread group v (256
// threads, named barrier 1 + v) owns value head VPB blockIdx.y + v in phases 3 and 4.
//   1  K, Q (once per block) and each head's V (fp32) load with cp.async; G (serial prefix sum,
//      as local_chunk), beta, e^G, e^{G_L - G}, beta e^G per head into shared memory.
//   2  K K^T and Q K^T once per block (bf16 mma from the fp32 tiles, as local_chunk; warp w:
//      rows 16 (w / (2 VPB)).., 8 / (2 VPB) column tiles), then per head A = beta K K^T decay
//      (shared memory) and P (bf16 workspace); K e^{G_L - G} and Q e^G per head (bf16).
//   3  T = (I + A)^-1 in fp32 by 16 x 16 blocks, in place of A, per thread group: the four
//      diagonal blocks by forward substitution (64 threads, one column each), then block rows
//      1..3: M = -sum_{k<i} A_ik T_k (16 x 16i), T_i = D_i M (D_i = T_ii), two barriers each.
//   4  [U | W] = T [diag(beta) V | diag(beta e^G) K] as 3xTF32 mma (Mma<false>, about fp32; the
//      triangle of T above its 16-row blocks skipped): warp w of a group owns 32 columns of
//      U (w < 4) or W (w >= 4) over all 64 rows; U stored fp32, -W as bf16.
// U and W are not the forward substitution's bits (other summation order), so the outputs
// differ from gdn_chunk_local16_kernel's within fp32 rounding of U, W (then bf16 of -W);
// deterministic and chunk-local (a prompt split at multiples of 64 tokens gives the same bits).
#define PLD_T 68   // T / A tile [64][68] fp32: (g, t) tf32 A-fragment reads conflict-free
#define MLD_T 52   // block-row scratch M [16][48]

// Shared memory (floats; mirrored by gdn_chunk.py localpair_launch): K, Q, V[VPB] [64][136];
// A / T [VPB][64][68]; M [VPB][16][52]; six [VPB][64] vectors. VPB = 2: 183808 bytes, one block
// (16 warps) per SM.
__device__ __forceinline__ void group_sync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}

template <int VPB>
__global__ void __launch_bounds__(256 * VPB, 1)
    gdn_chunk_localpair_kernel(const ChunkParams p, bf16raw* qg) {
  static_assert(VPB == 1 || VPB == 2, "value heads per block");
  using M16 = Mma<true>;
  using M32 = Mma<false>;
  constexpr int LD = 136;           // = Mma<true>::QK_LD: K, Q, V rows
  constexpr int NWARP = 8 * VPB;
  constexpr int WPM = NWARP / 4;    // warps per 16-row tile of K K^T, Q K^T
  constexpr int NT = 8 / WPM;       // their column tiles per warp
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* Ks = smem;                          // [64][LD]
  float* Qs = Ks + CH * LD;                  // [64][LD]
  float* Vs = Qs + CH * LD;                  // [VPB][64][LD]
  float* Ts = Vs + VPB * CH * LD;            // [VPB][64][PLD_T] A, then T
  float* Ms = Ts + VPB * CH * PLD_T;         // [VPB][16][MLD_T]
  float* gam = Ms + VPB * 16 * MLD_T;        // [VPB][64] G_i (G_{L-1} past L)
  float* bet = gam + VPB * CH;               // [VPB][64] beta (0 past L)
  float* eg = bet + VPB * CH;                // [VPB][64] e^G (0 past L)
  float* ek = eg + VPB * CH;                 // [VPB][64] e^{G_L - G} (0 past L)
  float* bk = ek + VPB * CH;                 // [VPB][64] beta e^G
  float* graw = bk + VPB * CH;               // [VPB][64] g (0 past L)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int grp = tid >> 8, ltid = tid & 255;  // thread group: value head h0 + grp
  const int b = blockIdx.x, h0 = VPB * blockIdx.y;
  if (b >= p.chunk_offsets[p.num_segs]) return;
  const int seg = chunk_segment(p, b);
  const int cs = p.seg_starts[seg] + (b - p.chunk_offsets[seg]) * CH;
  const int L = min(CH, p.seg_starts[seg + 1] - cs);
  const int kh = h0 / (p.value_heads / p.key_heads);  // VPB = 2: Hv / Hk even, one key head
  const i64 hv = p.value_heads;
  const bool vec_v = p.vec_v != 0;

  // ---- 1: loads ----
  if (VPB == 1 || grp == 0)
    async_tile128(Ks, LD, p.k + (i64)cs * p.k_rs + (i64)kh * p.k_hs, p.k_rs, L, p.dk,
                  p.vec_qk != 0, ltid);
  if (VPB == 1 || grp == 1)
    async_tile128(Qs, LD, p.q + (i64)cs * p.q_rs + (i64)kh * p.q_hs, p.q_rs, L, p.dk,
                  p.vec_qk != 0, ltid);
  cp_async_commit();
  async_tile128(Vs + grp * CH * LD, LD, p.v + (i64)cs * p.v_rs + (i64)(h0 + grp) * p.v_hs,
                p.v_rs, L, p.dv, vec_v, ltid);
  cp_async_commit();
  if (tid < VPB * CH) {
    const int v = tid >> 6, i = tid & 63;
    const i64 row = cs + i;
    graw[tid] = i < L ? p.g[row * p.g_rs + h0 + v] : 0.0f;
    bet[tid] = i < L ? p.beta[row * p.beta_rs + h0 + v] : 0.0f;
  }
  __syncthreads();
  if (tid < VPB * CH && (tid & 63) == 0) {  // G: the serial prefix sum of local_chunk
    float s = 0.0f;
#pragma unroll 8
    for (int i = 0; i < CH; ++i) {
      s = i == 0 ? graw[tid] : s + graw[tid + i];
      gam[tid + i] = s;
    }
  }
  __syncthreads();
  if (tid < VPB * CH) {
    const int v = tid >> 6, i = tid & 63;
    const float e = expf(gam[tid]);
    eg[tid] = i < L ? e : 0.0f;
    ek[tid] = i < L ? expf(gam[v * CH + L - 1] - gam[tid]) : 0.0f;
    bk[tid] = bet[tid] * e;
    if (i < L) p.gam_ws[(i64)(cs + i) * hv + h0 + v] = gam[tid];
  }
  cp_async_wait<1>();  // K, Q
  __syncthreads();

  // ---- 2: K K^T, Q K^T (per key head), A and P per value head ----
  {
    const int mt = warp / WPM, nt0 = NT * (warp % WPM);
    float ak[NT][4], aq[NT][4];
    kkt_qkt<M16, NT>(ak, aq, Ks, Qs, LD, mt, nt0, g, t);
#pragma unroll
    for (int v = 0; v < VPB; ++v) {
      const float* gv = gam + v * CH;
      const float* bv = bet + v * CH;
      float* As = Ts + v * CH * PLD_T;
      unsigned* pw2 = reinterpret_cast<unsigned*>(p.p_ws) +  // [64][32] bf16x2
                      ((i64)b * hv + h0 + v) * CH * CH / 2;
      decay_tiles_bf16<NT>(ak, aq, gv, bv, As, PLD_T, pw2, mt, nt0, g, t);
    }
  }
  {  // K e^{G_L - G} and Q e^G per value head (bf16 pairs, rows < L, all 128 columns)
    bf16raw* kw = reinterpret_cast<bf16raw*>(p.w_ws);
#pragma unroll 4
    for (int idx = tid; idx < VPB * CH * DMAX / 2; idx += 256 * VPB) {
      const int v = idx >> 12, i = (idx >> 6) & 63, d = 2 * (idx & 63);
      if (i < L) {
        const float e1 = ek[v * CH + i], e2 = eg[v * CH + i];
        const float2 k2 = *reinterpret_cast<const float2*>(Ks + i * LD + d);
        const float2 q2 = *reinterpret_cast<const float2*>(Qs + i * LD + d);
        const i64 row = (i64)(cs + i) * hv + h0 + v;
        *reinterpret_cast<unsigned*>(kw + row * 2 * DMAX + DMAX + d) =
            M16::pack(k2.x * e1, k2.y * e1);
        *reinterpret_cast<unsigned*>(qg + row * DMAX + d) = M16::pack(q2.x * e2, q2.y * e2);
      }
    }
  }
  cp_async_wait<0>();  // V
  __syncthreads();     // A, V visible

  // ---- 3: T = (I + A)^-1 in place, per thread group ----
  float* T = Ts + grp * CH * PLD_T;
  float* Mb = Ms + grp * 16 * MLD_T;
  const int bar = 1 + grp;
  {
    float x[16];
    const int db = ltid >> 4, c = ltid & 15;  // diagonal block db, its column c (ltid < 64)
    float* Ab = T + 16 * db * PLD_T + 16 * db;
    if (ltid < CH) {
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        float s = r == c ? 1.0f : 0.0f;
#pragma unroll
        for (int j = 0; j < r; ++j) s = fmaf(-Ab[r * PLD_T + j], x[j], s);
        x[r] = s;
      }
    }
    group_sync(bar);  // every read of the diagonal blocks of A done
    if (ltid < CH) {
#pragma unroll
      for (int r = 0; r < 16; ++r) Ab[r * PLD_T + c] = x[r];
    }
    group_sync(bar);
  }
#pragma unroll 1
  for (int w = 16; w < CH; w += 16) {  // block row w / 16: columns 0..w-1
    for (int e = ltid; e < 16 * w; e += 256) {  // M = -A_i T_{<i}
      const int r = e / w, c = e - r * w;
      const float* arow = T + (w + r) * PLD_T;
      float s = 0.0f;
#pragma unroll 4
      for (int k = c & ~15; k < w; ++k) s = fmaf(-arow[k], T[k * PLD_T + c], s);
      Mb[r * MLD_T + c] = s;
    }
    group_sync(bar);
    for (int e = ltid; e < 16 * w; e += 256) {  // T_i = D_i M (D_i unit lower)
      const int r = e / w, c = e - r * w;
      const float* drow = T + (w + r) * PLD_T + w;
      float s = Mb[r * MLD_T + c];
#pragma unroll 4
      for (int k = 0; k < r; ++k) s = fmaf(drow[k], Mb[k * MLD_T + c], s);
      T[(w + r) * PLD_T + c] = s;
    }
    group_sync(bar);
  }

  // ---- 4: [U | W] = T [diag(beta) V | diag(beta e^G) K] (3xTF32), 16 columns at a time ----
  const int lw = ltid >> 5;                 // warp in the group
  const bool isw = lw >= 4;                 // W columns (else U)
  const float* Y = isw ? Ks : Vs + grp * CH * LD;
  const float* sc = (isw ? bk : bet) + grp * CH;
  const int h = h0 + grp;
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    const int col0 = 32 * (lw & 3) + 16 * half;
    float acc[4][2][4];
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[m][n][r] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < CH / 8; ++ks) {
      M32::FragB fb[2];  // B[k][n] = Y[8ks + k][col0 + 8n + n'] * sc[8ks + k]
      const float s0 = sc[8 * ks + t], s4 = sc[8 * ks + t + 4];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const float* y = Y + (8 * ks + t) * LD + col0 + 8 * n + g;
        M32::split(y[0] * s0, fb[n].hi[0], fb[n].lo[0]);
        M32::split(y[4 * LD] * s4, fb[n].hi[1], fb[n].lo[1]);
      }
#pragma unroll
      for (int m = ks / 2; m < 4; ++m) {  // T[16m.., 8ks..] is zero for ks > 2m + 1
        M32::FragA fa;
        M32::load_a(fa, T + 16 * m * PLD_T + 8 * ks, PLD_T, g, t, 1.0f, 1.0f);
#pragma unroll
        for (int n = 0; n < 2; ++n) M32::mma(acc[m][n], fa, fb[n]);
      }
    }
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int r = 0; r < 4; r += 2) {
        const int i = 16 * m + g + 8 * (r >> 1);
        if (i >= L) continue;
        const i64 row = (i64)(cs + i) * hv + h;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const int col = col0 + 8 * n + 2 * t;
          if (isw) {  // -W as bf16 (all 128 columns; zero K columns give -0 past dk)
            reinterpret_cast<unsigned*>(p.w_ws)[(row * 2 * DMAX + col) / 2] =
                M16::pack(-acc[m][n][r], -acc[m][n][r + 1]);
          } else {
            float* u = p.u_ws + row * DMAX + col;
            if (col + 1 < p.dv) {
              *reinterpret_cast<float2*>(u) = make_float2(acc[m][n][r], acc[m][n][r + 1]);
            } else if (col < p.dv) {
              u[0] = acc[m][n][r];
            }
          }
        }
      }
  }
}

// Phase-A operands of the chunk at token cs (L tokens): W, Q (raw; scaled by e^G on use), the
// SB-column U tile (at column jbase) and G. One cp.async group (committed by the caller).
template <bool BF16, int SB>
__device__ __forceinline__ void load_phase_a(const ChunkParams& p, float* Ws, float* Qs,
                                             float* Us, float* gam, int cs, int L, int h,
                                             int kh, int jbase, int tid) {
  constexpr int QK_LD = Mma<BF16>::QK_LD;
  const i64 hv = p.value_heads;
  async_tile<CH, DMAX>(Ws, QK_LD, p.w_ws + ((i64)cs * hv + h) * DMAX, hv * DMAX, L, p.dk, tid);
  async_tile128(Qs, QK_LD, p.q + (i64)cs * p.q_rs + (i64)kh * p.q_hs, p.q_rs, L, p.dk,
                p.vec_qk != 0, tid);
  async_tile<CH, SB>(Us, col_ld<BF16>(SB), p.u_ws + ((i64)cs * hv + h) * DMAX + jbase,
                     hv * DMAX, L, p.dv - jbase, tid);
  if (tid < CH) {
    const float* g0 = p.gam_ws + (i64)cs * hv + h;
    cp_async4(gam + tid, tid < L ? g0 + tid * hv : g0, tid < L ? 4 : 0);
  }
}

// Phase-B operands: P (64 x 64, all written by the local kernel) and K (raw; scaled on use).
template <bool BF16>
__device__ __forceinline__ void load_phase_b(const ChunkParams& p, float* Ps, float* Ks,
                                             int chunk, int cs, int L, int h, int kh, int tid) {
  async_tile<CH, CH>(Ps, Mma<BF16>::A_LD, p.p_ws + ((i64)chunk * p.value_heads + h) * CH * CH,
                     CH, CH, CH, tid);
  async_tile128(Ks, Mma<BF16>::KS_LD, p.k + (i64)cs * p.k_rs + (i64)kh * p.k_hs, p.k_rs, L,
                p.dk, p.vec_qk != 0, tid);
}

template <bool BF16>
__global__ void __launch_bounds__(256, 1) gdn_chunk_state_kernel(const ChunkParams p) {
  constexpr int SB = 32;       // state (and output) columns per block
  using M = Mma<BF16>;
  constexpr int QK_LD = M::QK_LD, KS_LD = M::KS_LD, A_LD = M::A_LD;
  constexpr int LD = col_ld<BF16>(SB);
  constexpr int NV = SB / 16;  // V' (and O) column tiles per warp
  constexpr int NS = SB / 8;   // S column tiles per warp
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* Ws = smem;                 // [64][QK_LD]  W              (phase A)
  float* Qs = Ws + CH * QK_LD;      // [64][QK_LD]  Q              (phase A)
  float* Us = Qs + CH * QK_LD;      // [64][LD]     U column tile  (phase A)
  float* gam = Us + CH * LD;        // [64]         G_i            (phase A)
  float* Ps = gam + CH;             // [64][A_LD]   P              (phase B)
  float* Ks = Ps + CH * A_LD;       // [64][KS_LD]  K              (phase B)
  float* Ss = Ks + CH * KS_LD;      // [128][LD]    S column tile
  float* Vs = Ss + DMAX * LD;       // [64][LD]     V'
  float* ek = Vs + CH * LD;         // [64]         e^{G_L - G_i} (0 past L)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int seg = blockIdx.x, h = blockIdx.y, jbase = blockIdx.z * SB;
  const int kh = h / (p.value_heads / p.key_heads);
  const int t0 = p.seg_starts[seg], t1 = p.seg_starts[seg + 1];
  if (t1 <= t0) return;
  float* S = p.state + (i64)p.seg_slots[seg] * p.state_ss + (i64)h * p.dk * p.dv;

  load_phase_a<BF16, SB>(p, Ws, Qs, Us, gam, t0, min(CH, t1 - t0), h, kh, jbase, tid);
  cp_async_commit();
  for (unsigned idx = tid; idx < DMAX * SB; idx += 256) {
    const int d = idx / SB, j = idx % SB;
    Ss[d * LD + j] = (d < p.dk && jbase + j < p.dv) ? S[(i64)d * p.dv + jbase + j] : 0.0f;
  }
  __syncthreads();
  // S rows 16 warp + g (+8), columns 8n + 2t (+1): accumulator fragments of NS column tiles
  float sacc[NS][4];
#pragma unroll
  for (int n = 0; n < NS; ++n) {
    const float2 s0 = *reinterpret_cast<const float2*>(Ss + (16 * warp + g) * LD + 8 * n + 2 * t);
    const float2 s1 =
        *reinterpret_cast<const float2*>(Ss + (16 * warp + g + 8) * LD + 8 * n + 2 * t);
    sacc[n][0] = s0.x; sacc[n][1] = s0.y; sacc[n][2] = s1.x; sacc[n][3] = s1.y;
  }
  const int ma = warp >> 1, na = NV * (warp & 1);  // V' / O tile: rows 16 ma.., col tiles na..

  for (int cs = t0; cs < t1; cs += CH) {
    const int L = min(CH, t1 - cs);
    const int chunk = p.chunk_offsets[seg] + (cs - t0) / CH;
    load_phase_b<BF16>(p, Ps, Ks, chunk, cs, L, h, kh, tid);
    cp_async_commit();
    cp_async_wait<1>();  // this chunk's phase-A operands (the group before)
    __syncthreads();

    // ---- phase A: V' = U - W S and O = (Q e^G) S ----
    const float g_last = gam[L - 1];
    if (tid < CH) ek[tid] = tid < L ? expf(g_last - gam[tid]) : 0.0f;
    const int r0 = 16 * ma + g;
    float vacc[NV][4], oacc[NV][4];
#pragma unroll
    for (int n = 0; n < NV; ++n) {
      const int c = 8 * (na + n) + 2 * t;
      const float2 u0 = *reinterpret_cast<const float2*>(Us + r0 * LD + c);
      const float2 u1 = *reinterpret_cast<const float2*>(Us + (r0 + 8) * LD + c);
      vacc[n][0] = u0.x; vacc[n][1] = u0.y; vacc[n][2] = u1.x; vacc[n][3] = u1.y;
#pragma unroll
      for (int r = 0; r < 4; ++r) oacc[n][r] = 0.0f;
    }
    // one pass over S's B fragments for both products
    const float eg0 = r0 < L ? expf(gam[r0]) : 0.0f;
    const float eg1 = r0 + 8 < L ? expf(gam[r0 + 8]) : 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < DMAX / M::K; ++ks) {
      typename M::FragA fw, fq;
      M::load_a(fw, Ws + 16 * ma * QK_LD + M::K * ks, QK_LD, g, t, -1.0f, -1.0f);
      M::load_a(fq, Qs + 16 * ma * QK_LD + M::K * ks, QK_LD, g, t, eg0, eg1);
#pragma unroll
      for (int n = 0; n < NV; ++n) {
        typename M::FragB fs;
        M::load_b(fs, Ss + M::K * ks * LD + 8 * (na + n), LD, g, t);
        M::mma(vacc[n], fw, fs);
        M::mma(oacc[n], fq, fs);
      }
    }
#pragma unroll
    for (int n = 0; n < NV; ++n) {
      const int c = 8 * (na + n) + 2 * t;
      *reinterpret_cast<float2*>(Vs + r0 * LD + c) = make_float2(vacc[n][0], vacc[n][1]);
      *reinterpret_cast<float2*>(Vs + (r0 + 8) * LD + c) = make_float2(vacc[n][2], vacc[n][3]);
    }
    cp_async_wait<0>();  // P, K
    __syncthreads();     // V', ek, K, P visible; W, Q, U, G, S reads done
    if (cs + CH < t1) {  // prefetch the next chunk's phase-A operands during phase B
      load_phase_a<BF16, SB>(p, Ws, Qs, Us, gam, cs + CH, min(CH, t1 - cs - CH), h, kh, jbase,
                             tid);
      cp_async_commit();
    }

    // ---- phase B: O += P V' (stored), then S = e^{G_L} S + (K e^{G_L - G})^T V' ----
    mma_rows<BF16, NV, CH>(oacc, Ps + 16 * ma * A_LD, A_LD, 1.0f, 1.0f, Vs + 8 * na, LD, g, t);
    store_o<NV>(p, oacc, cs, L, h, r0, jbase + 8 * na, t);
    const float decay = expf(g_last);
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) sacc[n][r] *= decay;
#pragma unroll 2
    for (int ks = 0; ks < CH / M::K; ++ks) {
      typename M::FragA fk;  // A[m = d][k = i] = K[i][d] e^{G_L - G_i}
      M::load_at(fk, Ks + M::K * ks * KS_LD + 16 * warp, KS_LD, g, t, ek + M::K * ks);
#pragma unroll
      for (int n = 0; n < NS; ++n) {
        typename M::FragB fv;
        M::load_b(fv, Vs + M::K * ks * LD + 8 * n, LD, g, t);
        M::mma(sacc[n], fk, fv);
      }
    }
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      float* s0 = Ss + (16 * warp + g) * LD + 8 * n + 2 * t;
      *reinterpret_cast<float2*>(s0) = make_float2(sacc[n][0], sacc[n][1]);
      *reinterpret_cast<float2*>(s0 + 8 * LD) = make_float2(sacc[n][2], sacc[n][3]);
    }
    __syncthreads();  // S, and the K/P/V' buffers free for the next chunk
  }
  store_tile<DMAX, SB>(S + jbase, p.dv, Ss, LD, p.dk, p.dv - jbase, tid);
}

// ---- bf16-tile path: gdn_chunk_local16_kernel, then gdn_chunk_state16_kernel<SB> ------------
// The operands as bf16 in the workspaces (local_chunk<true, true>) and in shared memory,
// fragments read with ldmatrix; every product the bf16 rounding of the same fp32 value, in the
// same accumulation order, as gdn_chunk_state_kernel<true> (so the outputs and state
// match it bit for bit, up to the sign of exact zeros in padded rows).
#define BLD 136  // bf16 row stride of [64][128] tiles: 272 B = 16 mod 128, conflict-free ldmatrix
#define PLD 72   // [64][64] P tile: 144 B

__device__ __forceinline__ void ldsm4(unsigned (&r)[4], const bf16raw* ptr) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldsm4t(unsigned (&r)[4], const bf16raw* ptr) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
// d += a b (m16n8k16 bf16, fp32 accumulation; fragments as Mma<true>)
__device__ __forceinline__ void mma16(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                      unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// ldmatrix lane addresses (lane l, r = l % 8, j = l / 8) of a 16 x 16 block at row k0, col c0:
//   A row-major [m][k]        ldsm4  row m0 + l % 16,             col k0 + 8 (l / 16)
//   A^T stored [k][m]         ldsm4t row k0 + r + 8 (j / 2),      col m0 + 8 (j % 2)
//   B pair stored [k][n]      ldsm4t row k0 + r + 8 (j % 2),      col n0 + 8 (j / 2)
//                             (b0, b1 of column tile n0 / 8, then b0, b1 of the next)
__device__ __forceinline__ const bf16raw* a_addr(const bf16raw* X, int ld, int lane) {
  return X + (lane & 15) * ld + 8 * (lane >> 4);
}
__device__ __forceinline__ const bf16raw* at_addr(const bf16raw* X, int ld, int lane) {
  return X + ((lane & 7) + 8 * (lane >> 4)) * ld + 8 * ((lane >> 3) & 1);
}
__device__ __forceinline__ const bf16raw* b_addr(const bf16raw* Y, int ld, int lane) {
  return Y + ((lane & 7) + 8 * ((lane >> 3) & 1)) * ld + 8 * (lane >> 4);
}

// ROWS rows of NB bytes (row i at src + i * rs bytes; all bytes valid when i < rows) into dst
// (row stride ld bytes), zeros in rows >= rows; 16-byte copies, 256 threads.
template <int ROWS, int NB>
__device__ __forceinline__ void async_rows(void* dst, int ld, const void* src, i64 rs, int rows,
                                           int tid) {
  constexpr int V = NB / 16;
  static_assert(ROWS * V % 256 == 0, "whole copies per thread");
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
#pragma unroll
  for (int r = 0; r < ROWS * V / 256; ++r) {
    const unsigned idx = tid + 256 * r;
    const int i = idx / V, c = 16 * (idx % V);
    const bool ok = i < rows;
    cp_async16(reinterpret_cast<float*>(d + i * ld + c),
               reinterpret_cast<const float*>(ok ? s + i * rs + c : s), ok ? 16 : 0);
  }
}

// Bytes of one pipeline stage of gdn_chunk_state16_kernel<SB>: -W, K e^{G_L - G}, Q e^G
// [64][BLD] bf16; P [64][PLD] bf16; U [64][SB + 4] fp32.
template <int SB>
__host__ __device__ constexpr int state16_stage_bytes() {
  return 3 * CH * BLD * 2 + CH * PLD * 2 + CH * (SB + 4) * 4;
}

// The state pass with the output inside it (as gdn_chunk_state_kernel<true>) on bf16
// tiles: grid (G, Hv, ceil(dv / SB)), 256 threads, one block per SM. Chunk c + 1's operands
// (-W, K e^{G_L - G}, Q e^G, P from local_chunk<true, true>, the SB-column U tile, G_L) load
// with cp.async into the other of two stages while chunk c computes; two barriers per chunk:
//   B1  chunk c's stage landed, S (bf16 copy) written, chunk c - 1 done with the other stage
//   phase A  V' = U - W S, O = (Q e^G) S (warp w: rows 16(w/2).., column tiles SB/16 (w%2)..);
//            V' to shared memory as bf16
//   B2  V' visible, S reads done
//   phase B  O += P V' (stored); S = e^{G_L} S + K'^T V' (warp w: rows 16w.., fp32 in registers)
//            and its bf16 copy for the next phase A.
// Shared memory: two stages, S [128][SB + 8] and V' [64][SB + 8] bf16 (80 / 144 B rows:
// conflict-free ldmatrix and bf16x2 writes), G_L [2].
template <int SB>
__global__ void __launch_bounds__(256, 1)
    gdn_chunk_state16_kernel(const ChunkParams p, const bf16raw* qg) {
  static_assert(SB == 32 || SB == 64, "state column tile");
  constexpr int ULD = SB + 4, SLD = SB + 8;
  constexpr int NV = SB / 16;  // V' and O column tiles per warp
  constexpr int NS = SB / 8;   // S column tiles per warp
  constexpr int STAGE = state16_stage_bytes<SB>();
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  bf16raw* Sb = reinterpret_cast<bf16raw*>(smem + 2 * STAGE);  // [128][SLD]
  bf16raw* Vb = Sb + DMAX * SLD;                                // [64][SLD]
  float* gl = reinterpret_cast<float*>(Vb + CH * SLD);          // [2] G_L per stage
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int seg = blockIdx.x, h = blockIdx.y, jbase = blockIdx.z * SB;
  const int t0 = p.seg_starts[seg], t1 = p.seg_starts[seg + 1];
  if (t1 <= t0) return;
  float* S = p.state + (i64)p.seg_slots[seg] * p.state_ss + (i64)h * p.dk * p.dv;
  const i64 hv = p.value_heads;
  const bf16raw* wk = reinterpret_cast<const bf16raw*>(p.w_ws);  // [N, Hv, 256]: -W | K'
  const bf16raw* pb = reinterpret_cast<const bf16raw*>(p.p_ws);  // [chunks, Hv, 64, 64]
  const int chunk0 = p.chunk_offsets[seg], nch = (t1 - t0 + CH - 1) / CH;

  auto load = [&](int c, int st) {  // chunk c's operands into stage st (one cp.async group)
    char* base = smem + st * STAGE;
    const int cs = t0 + c * CH, L = min(CH, t1 - cs);
    const bf16raw* w = wk + ((i64)cs * hv + h) * 2 * DMAX;
    async_rows<CH, 2 * DMAX>(base, 2 * BLD, w, hv * 4 * DMAX, L, tid);
    async_rows<CH, 2 * DMAX>(base + 2 * CH * BLD, 2 * BLD, w + DMAX, hv * 4 * DMAX, L, tid);
    async_rows<CH, 2 * DMAX>(base + 4 * CH * BLD, 2 * BLD, qg + ((i64)cs * hv + h) * DMAX,
                             hv * 2 * DMAX, L, tid);
    async_rows<CH, 2 * CH>(base + 6 * CH * BLD, 2 * PLD, pb + ((i64)(chunk0 + c) * hv + h) * CH * CH,
                           2 * CH, CH, tid);
    async_tile<CH, SB>(reinterpret_cast<float*>(base + 6 * CH * BLD + 2 * CH * PLD), ULD,
                       p.u_ws + ((i64)cs * hv + h) * DMAX + jbase, hv * DMAX, L, p.dv - jbase,
                       tid);
    if (tid == 0) cp_async4(gl + st, p.gam_ws + (i64)(cs + L - 1) * hv + h, 4);
    cp_async_commit();
  };
  load(0, 0);

  // S rows 16 warp + g (+8), columns 8n + 2t (+1): accumulator fragments of NS column tiles
  float sacc[NS][4];
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int d = 16 * warp + g + 8 * (r >> 1), col = jbase + 8 * n + 2 * t + (r & 1);
      sacc[n][r] = (d < p.dk && col < p.dv) ? S[(i64)d * p.dv + col] : 0.0f;
    }
  auto write_s = [&]() {
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      unsigned* s0 = reinterpret_cast<unsigned*>(Sb + (16 * warp + g) * SLD + 8 * n + 2 * t);
      s0[0] = Mma<true>::pack(sacc[n][0], sacc[n][1]);
      s0[4 * SLD] = Mma<true>::pack(sacc[n][2], sacc[n][3]);  // row + 8
    }
  };
  write_s();
  const int ma = warp >> 1, na = NV * (warp & 1);  // V' / O tile: rows 16 ma.., col tiles na..
  const int r0 = 16 * ma + g;

  for (int c = 0; c < nch; ++c) {
    const int st = c & 1, cs = t0 + c * CH, L = min(CH, t1 - cs);
    cp_async_wait<0>();
    __syncthreads();  // B1
    if (c + 1 < nch) load(c + 1, st ^ 1);
    const bf16raw* Wb = reinterpret_cast<const bf16raw*>(smem + st * STAGE);
    const bf16raw* Kb = Wb + CH * BLD;
    const bf16raw* Qb = Kb + CH * BLD;
    const bf16raw* Pb = Qb + CH * BLD;
    const float* Uf = reinterpret_cast<const float*>(Pb + CH * PLD);

    // ---- phase A: V' = U - W S, O = (Q e^G) S ----
    float vacc[NV][4], oacc[NV][4];
#pragma unroll
    for (int n = 0; n < NV; ++n) {
      const int col = 8 * (na + n) + 2 * t;
      const float2 u0 = *reinterpret_cast<const float2*>(Uf + r0 * ULD + col);
      const float2 u1 = *reinterpret_cast<const float2*>(Uf + (r0 + 8) * ULD + col);
      vacc[n][0] = u0.x; vacc[n][1] = u0.y; vacc[n][2] = u1.x; vacc[n][3] = u1.y;
#pragma unroll
      for (int r = 0; r < 4; ++r) oacc[n][r] = 0.0f;
    }
#pragma unroll 4
    for (int ks = 0; ks < DMAX / 16; ++ks) {
      unsigned aw[4], aq[4];
      ldsm4(aw, a_addr(Wb + 16 * ma * BLD + 16 * ks, BLD, lane));
      ldsm4(aq, a_addr(Qb + 16 * ma * BLD + 16 * ks, BLD, lane));
#pragma unroll
      for (int n = 0; n < NV; n += 2) {
        unsigned b[4];
        ldsm4t(b, b_addr(Sb + 16 * ks * SLD + 8 * (na + n), SLD, lane));
        mma16(vacc[n], aw, b[0], b[1]);
        mma16(oacc[n], aq, b[0], b[1]);
        mma16(vacc[n + 1], aw, b[2], b[3]);
        mma16(oacc[n + 1], aq, b[2], b[3]);
      }
    }
#pragma unroll
    for (int n = 0; n < NV; ++n) {
      unsigned* v0 = reinterpret_cast<unsigned*>(Vb + r0 * SLD + 8 * (na + n) + 2 * t);
      v0[0] = Mma<true>::pack(vacc[n][0], vacc[n][1]);
      v0[4 * SLD] = Mma<true>::pack(vacc[n][2], vacc[n][3]);  // row + 8
    }
    __syncthreads();  // B2

    // ---- phase B: O += P V' (stored), S = e^{G_L} S + (K e^{G_L - G})^T V' ----
#pragma unroll
    for (int ks = 0; ks < CH / 16; ++ks) {
      unsigned ap[4];
      ldsm4(ap, a_addr(Pb + 16 * ma * PLD + 16 * ks, PLD, lane));
#pragma unroll
      for (int n = 0; n < NV; n += 2) {
        unsigned b[4];
        ldsm4t(b, b_addr(Vb + 16 * ks * SLD + 8 * (na + n), SLD, lane));
        mma16(oacc[n], ap, b[0], b[1]);
        mma16(oacc[n + 1], ap, b[2], b[3]);
      }
    }
    store_o<NV>(p, oacc, cs, L, h, r0, jbase + 8 * na, t);
    const float decay = expf(gl[st]);
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) sacc[n][r] *= decay;
#pragma unroll
    for (int ks = 0; ks < CH / 16; ++ks) {
      unsigned ak[4];  // A[m = d][k = i] = K'[i][d]
      ldsm4t(ak, at_addr(Kb + 16 * ks * BLD + 16 * warp, BLD, lane));
#pragma unroll
      for (int n = 0; n < NS; n += 2) {
        unsigned b[4];
        ldsm4t(b, b_addr(Vb + 16 * ks * SLD + 8 * n, SLD, lane));
        mma16(sacc[n], ak, b[0], b[1]);
        mma16(sacc[n + 1], ak, b[2], b[3]);
      }
    }
    write_s();  // this warp's rows; every phase-A read of S was before B2
  }
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int d = 16 * warp + g + 8 * (r >> 1), col = jbase + 8 * n + 2 * t + (r & 1);
      if (d < p.dk && col < p.dv) S[(i64)d * p.dv + col] = sacc[n][r];
    }
}
