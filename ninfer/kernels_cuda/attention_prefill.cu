// attention_prefill.cu: causal GQA prefill attention over the bf16 paged KV cache on bf16 tensor
// cores (flash attention, mma.sync.m16n8k16, fp32 accumulate).
//
// Contract: q f32[L, A, D] holds the queries at absolute positions pos0 .. pos0+L-1 of one
// sequence (block-table row `bt`); row i attends keys 0 .. pos0+i, which are already in the
// pages ([P, Hkv, page_size, D] bf16; key t in page bt[t / page_size], slot t % page_size).
// Query head h reads KV head h / G, G = A / Hkv. out f32[L, A, D] = softmax(scale q K^T) V.
//
// Rows: a block owns one KV head g and BM consecutive "rows" r = i * G + j (query i, head
// g*G + j), so the G query heads sharing a KV head are packed into the M dimension and every K/V
// tile staged in shared memory serves all of them (a short chunk of L rows still fills
// L*G rows of the tile). Warp w computes rows [16w, 16w+16) of the tile. Padding rows past L*G
// read q = 0 at the last row's position and are never stored.
//
// Keys are processed in blocks of BN at absolute positions (block j = keys [j*BN, (j+1)*BN)),
// j = 0 .. (last key of the tile) / BN, ascending. Per block:
//   S = Q K^T        Q = q * scale * log2(e) split as Q_hi + Q_lo (bf16 each, Q_lo = bf16(Q -
//                    Q_hi)), S = Q_hi K^T + Q_lo K^T: 2 mmas per fragment, fp32 accumulate. K is
//                    exact in bf16, so S carries ~2^-17 relative error instead of bf16's 2^-9.
//   causal mask      key > row position -> -inf (keys past the tile's last key are zero-filled,
//                    never read: their slots may hold anything).
//   online softmax   base 2 (scale*log2(e) folded into Q): m' = max(m, rowmax S),
//                    c = 2^(m - m'), P = 2^(S - m'), l = l*c + rowsum P (per-thread partial of
//                    its columns; the quad's partials are summed once at the end), O *= c (skipped
//                    when c == 1 for the whole warp: multiplying by 1 is exact).
//   O += P V         P split as P_hi + P_lo (bf16) the same way: 2 mmas per fragment.
// out = O / l. A row's result depends only on its position and the KV contents: the key blocks,
// their order and the per-row arithmetic are the same whichever tile (L, pos0, neighbours) the
// row is in; a block entirely past a row's position leaves that row's m, l and O unchanged
// (c = 1, P = 0), and a warp skips blocks past all its rows. So a prompt run whole or in chunks
// gives bitwise identical rows.
//
// Pipeline (FlashAttention-2 style, one K and one V buffer): the V tile of block j is fetched
// with cp.async while S_j is computed, the K tile of block j+1 while P_j V_j is computed.
// Shared memory: Q_hi, Q_lo [BM][D+8], K, V [BN][D+8] bf16 (rows padded by 16 bytes so that the
// 8 row addresses of each ldmatrix hit distinct bank groups). Fragments: ldmatrix.x4 for Q (A,
// row-major) and K (B = K^T, "col"), ldmatrix.x4.trans for V (B = V, row-major in memory).
// Page ids: one thread per key looks up block j+1's page rows into a small shared table (two
// buffers by block parity) while block j computes; the copy loops read that table.
// Grid: (num_tiles * Hkv), block b -> KV head b % Hkv, tile num_tiles-1 - b / Hkv (tiles with
// the most keys start first). Threads: 2*BM (BM/16 warps). Launcher tiles (attention_prefill.py
// TILES): D=256: BM=128, BN=64 (8 warps, 198 KiB shared, 1 block/SM); D<=128: BM=64, BN=64.
//
// Bitwise row invariance assumes what the tensor cores guarantee for exact products: an mma
// whose products are all zero returns its accumulator unchanged, and zero products (masked P
// times any finite V) do not change the rounding of the others.
//
// A page id outside [0, num_pages) among keys 0 .. last key of the tile is never read (zeros
// instead); rows whose position reaches the first such key are written as NaN.
#include "common.cuh"
#include "ldmatrix.cuh"

struct PrefillParams {
  const float* q;
  float* out;
  const bf16raw* k_pages;
  const bf16raw* v_pages;
  const int* bt;  // the sequence's block-table row
  i64 q_rs, q_hs, out_rs, out_hs;
  int rows;       // L
  int group;      // G = A / Hkv
  int kv_heads;
  int num_pages;
  int page_size;  // a multiple of 16
  int pos0;
  int num_tiles;  // ceil(L * G / BM)
  float qscale;   // scale * log2(e)
  // non-null: {block-table row, pos0, live rows} read on the device (a graph-replayed prompt
  // chunk); `bt` is then the table's base, `pos0` is ignored and only the first min(rows, live
  // rows) rows are computed (the others are padding of the captured chunk size: not written)
  const int* segment;
  i64 bt_rs;
};
static_assert(sizeof(PrefillParams) == 120, "PrefillParams is mirrored in attention_prefill.py");

// 32-bit shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{\n .reg .u64 t;\n cvta.to.shared.u64 t, %1;\n cvt.u32.u64 %0, t;\n}\n"
      : "=r"(r) : "l"(p));
  return r;
}

// 16-byte global -> shared copy; valid = false writes 16 zero bytes without reading src.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// c[16x8] += a[16x16] b[16x8], bf16 inputs, fp32 accumulate. Fragments (g = lane/4, t = lane%4):
//   a: {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..2t+9), (g+8, 2t+8..)} (row, cols) per register
//   b: {(2t..2t+1, g), (2t+8..2t+9, g)} (k rows, n col)
//   c: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// bf16x2 of (x0 -> low half, x1 -> high half), round to nearest even.
__device__ __forceinline__ unsigned pack_bf16x2(float x0, float x1) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(x1), "f"(x0));
  return r;
}
// x ~ hi + lo for a pair: hi = bf16(x), lo = bf16(x - hi) (x - hi is exact in fp32).
__device__ __forceinline__ void split_bf16x2(float x0, float x1, unsigned& hi, unsigned& lo) {
  hi = pack_bf16x2(x0, x1);
  lo = pack_bf16x2(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xffff0000u));
}

template <int D, int BM, int BN>
__global__ void __launch_bounds__(2 * BM)
    paged_prefill_attention_kernel(const PrefillParams params) {
  PrefillParams p = params;
  if (p.segment != nullptr) {
    p.bt += (i64)__ldg(p.segment) * p.bt_rs;
    p.pos0 = __ldg(p.segment + 1);
    p.rows = max(0, min(p.rows, __ldg(p.segment + 2)));
  }
  constexpr int THREADS = 2 * BM;   // BM / 16 warps
  constexpr int LDS = D + 8;        // shared row stride in bf16 elements
  constexpr int CPR = D / 8;        // 16-byte chunks per row
  constexpr int NT_S = BN / 8;      // 8-key n-tiles of S per warp
  constexpr int NT_O = D / 8;       // 8-dim n-tiles of O per warp
  constexpr int LOADS = BN * CPR / THREADS;
  static_assert(D % 16 == 0 && BM % 16 == 0 && BN % 16 == 0, "tile sizes");
  static_assert(BN * CPR % THREADS == 0, "K/V tile chunks must split evenly over the threads");
  static_assert(BM * (D / 4) % THREADS == 0, "Q tile must split evenly over the threads");
  static_assert(BN <= THREADS, "one thread per key of a block looks up its page");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16raw* sQhi = reinterpret_cast<bf16raw*>(smem_raw);
  bf16raw* sQlo = sQhi + BM * LDS;
  // the same buffers as 32-bit shared-window byte addresses (cp.async, ldmatrix)
  const unsigned s_base = smem_u32(smem_raw);
  const unsigned sQhi_u = s_base, sQlo_u = s_base + BM * LDS * 2;
  const unsigned sK_u = s_base + 2 * BM * LDS * 2, sV_u = sK_u + BN * LDS * 2;
  __shared__ int sm_bad_key;  // first key whose page id is invalid (0x7fffffff: none)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int quad_row = lane >> 2, quad_col = lane & 3;
  const int g = blockIdx.x % p.kv_heads;
  const int tile = p.num_tiles - 1 - (int)(blockIdx.x / p.kv_heads);
  const int G = p.group;
  const int total = p.rows * G;
  const int r_base = tile * BM;
  if (r_base >= total) return;  // a tile of padding rows only (live rows from `segment`)
  const int kmax = p.pos0 + (min(r_base + BM, total) - 1) / G;  // last key the tile needs
  const int n_blocks = kmax / BN + 1;

  // Page-row index ((page * Hkv + g) * page_size + slot) of each key of a block, -1 for keys
  // past kmax or in an invalid page (zeros are loaded). Two buffers, by block parity: the table
  // of block j+1 is written at the top of iteration j (after its barrier) and read by the loads
  // of K_{j+1} (after the middle barrier of j) and V_{j+1} (after the top barrier of j+1).
  __shared__ int sm_rows[2][BN];
  auto page_rows = [&](int block) {
    if (tid < BN) {
      const int key = block * BN + tid;
      int row = -1;
      if (key <= kmax) {
        const int page = __ldg(p.bt + key / p.page_size);
        if (page >= 0 && page < p.num_pages) {
          row = (page * p.kv_heads + g) * p.page_size + key % p.page_size;
        } else {
          atomicMin(&sm_bad_key, key);
        }
      }
      sm_rows[block & 1][tid] = row;
    }
  };
  // Stage keys [block*BN, +BN) of KV head g (K or V pages) into dst.
  auto load_tile = [&](const bf16raw* pages, unsigned dst, int block) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      const int c = tid + i * THREADS;
      const int row = c / CPR, col = (c % CPR) * 8;
      const int prow = sm_rows[block & 1][row];
      const bf16raw* src = prow >= 0 ? pages + (i64)prow * D + col : pages;
      cp_async16(dst + (row * LDS + col) * 2, src, prow >= 0);
    }
    cp_async_commit();
  };

  if (tid == 0) sm_bad_key = 0x7fffffff;
  __syncthreads();
  page_rows(0);
  __syncthreads();
  load_tile(p.k_pages, sK_u, 0);

  // Q tile -> Q_hi, Q_lo (scaled by scale * log2 e); padding rows are zeros.
  {
    const bool vec = ((reinterpret_cast<unsigned long long>(p.q) |
                       (unsigned long long)((p.q_rs | p.q_hs) * 4)) & 15) == 0;
#pragma unroll 4
    for (int c = tid; c < BM * (D / 4); c += THREADS) {
      const int row = c / (D / 4), col = (c % (D / 4)) * 4;
      const int r = r_base + row;
      float x0 = 0.0f, x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
      if (r < total) {
        const float* src = p.q + (i64)(r / G) * p.q_rs + (i64)(g * G + r % G) * p.q_hs + col;
        if (vec) {
          const float4 v = *reinterpret_cast<const float4*>(src);
          x0 = v.x; x1 = v.y; x2 = v.z; x3 = v.w;
        } else {
          x0 = src[0]; x1 = src[1]; x2 = src[2]; x3 = src[3];
        }
      }
      unsigned h0, l0, h1, l1;
      split_bf16x2(x0 * p.qscale, x1 * p.qscale, h0, l0);
      split_bf16x2(x2 * p.qscale, x3 * p.qscale, h1, l1);
      *reinterpret_cast<uint2*>(sQhi + row * LDS + col) = make_uint2(h0, h1);
      *reinterpret_cast<uint2*>(sQlo + row * LDS + col) = make_uint2(l0, l1);
    }
  }

  // This thread's rows: ra = warp row quad_row, rb = quad_row + 8 (padding clamped to the last).
  const int wrow0 = r_base + warp * 16;
  const bool warp_active = wrow0 < total;
  const int pos_a = p.pos0 + min(wrow0 + quad_row, total - 1) / G;
  const int pos_b = p.pos0 + min(wrow0 + quad_row + 8, total - 1) / G;
  const int wpos_min = p.pos0 + min(wrow0, total - 1) / G;
  const int wpos_max = p.pos0 + min(wrow0 + 15, total - 1) / G;

  // ldmatrix lane addresses (bytes): Q as A (rows lane%16, col block lane/16); K as B = K^T
  // (keys (lane&7) + 8*(lane/16), dims 8*((lane/8)&1)); V as B via .trans (keys lane%16, dims
  // 8*(lane/16)). Matrix order x4: Q {rows 0-7|8-15} x {cols 0-7|8-15} column-major; K {n-tile
  // 0: k 0-7, k 8-15; n-tile 1: k 0-7, k 8-15}; V {n-tile 0: k 0-7, k 8-15; n-tile 1: ...}.
  const unsigned q_hi_addr = sQhi_u + ((warp * 16 + (lane & 15)) * LDS + (lane >> 4) * 8) * 2;
  const unsigned q_lo_addr = q_hi_addr + (sQlo_u - sQhi_u);
  const unsigned k_addr =
      sK_u + (((lane & 7) + ((lane >> 4) << 3)) * LDS + ((lane >> 3) & 1) * 8) * 2;
  const unsigned v_addr = sV_u + ((lane & 15) * LDS + (lane >> 4) * 8) * 2;

  float acc[NT_O][4];
#pragma unroll
  for (int n = 0; n < NT_O; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float m_a = -NINFER_INF, m_b = -NINFER_INF;  // running max (log2 units) of rows a, b
  float l_a = 0.0f, l_b = 0.0f;                // this thread's partial row sums

  for (int j = 0; j < n_blocks; ++j) {
    const int kb = j * BN;
    cp_async_wait_all();
    __syncthreads();  // K_j (and Q) visible; every warp is done with V_{j-1}
    load_tile(p.v_pages, sV_u, j);
    if (j + 1 < n_blocks) page_rows(j + 1);
    const bool compute = warp_active && kb <= wpos_max;
    float s[NT_S][4];
    if (compute) {
#pragma unroll
      for (int n = 0; n < NT_S; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        unsigned qh[4], ql[4];
        ldsm_x4(q_hi_addr + ks * 32, qh);
        ldsm_x4(q_lo_addr + ks * 32, ql);
#pragma unroll
        for (int n2 = 0; n2 < BN / 16; ++n2) {
          unsigned b[4];
          ldsm_x4(k_addr + (n2 * 16 * LDS + ks * 16) * 2, b);
          mma_bf16(s[2 * n2], qh, b[0], b[1]);
          mma_bf16(s[2 * n2], ql, b[0], b[1]);
          mma_bf16(s[2 * n2 + 1], qh, b[2], b[3]);
          mma_bf16(s[2 * n2 + 1], ql, b[2], b[3]);
        }
      }
      if (kb + BN - 1 > wpos_min) {  // causal mask (only blocks reaching past a row's position)
        // key kb + 8n + 2*quad_col + e is masked for row a iff 8n + e > lim_a
        const int lim_a = pos_a - kb - 2 * quad_col, lim_b = pos_b - kb - 2 * quad_col;
#pragma unroll
        for (int n = 0; n < NT_S; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (n * 8 + e > lim_a) s[n][e] = -NINFER_INF;
            if (n * 8 + e > lim_b) s[n][2 + e] = -NINFER_INF;
          }
        }
      }
      float mx_a = -NINFER_INF, mx_b = -NINFER_INF;
#pragma unroll
      for (int n = 0; n < NT_S; ++n) {
        mx_a = fmaxf(mx_a, fmaxf(s[n][0], s[n][1]));
        mx_b = fmaxf(mx_b, fmaxf(s[n][2], s[n][3]));
      }
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o));
      }
      // Block 0 holds key 0 <= every row's position, so m is finite from then on. c is exactly
      // 1 when the max is unchanged (a block entirely past the row's position is a no-op).
      const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
      const float c_a = m_a == mn_a ? 1.0f : exp2f(m_a - mn_a);  // 0 on block 0
      const float c_b = m_b == mn_b ? 1.0f : exp2f(m_b - mn_b);
      m_a = mn_a;
      m_b = mn_b;
      float ls_a = 0.0f, ls_b = 0.0f;
#pragma unroll
      for (int n = 0; n < NT_S; ++n) {
        s[n][0] = exp2f(s[n][0] - mn_a);
        s[n][1] = exp2f(s[n][1] - mn_a);
        s[n][2] = exp2f(s[n][2] - mn_b);
        s[n][3] = exp2f(s[n][3] - mn_b);
        ls_a += s[n][0] + s[n][1];
        ls_b += s[n][2] + s[n][3];
      }
      l_a = fmaf(l_a, c_a, ls_a);
      l_b = fmaf(l_b, c_b, ls_b);
      if (__any_sync(0xffffffffu, c_a != 1.0f || c_b != 1.0f)) {
#pragma unroll
        for (int n = 0; n < NT_O; ++n) {
          acc[n][0] *= c_a;
          acc[n][1] *= c_a;
          acc[n][2] *= c_b;
          acc[n][3] *= c_b;
        }
      }
    }
    cp_async_wait_all();
    __syncthreads();  // V_j visible; every warp is done with K_j
    if (j + 1 < n_blocks) load_tile(p.k_pages, sK_u, j + 1);
    if (compute) {
      unsigned ph[BN / 16][4], pl[BN / 16][4];
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        split_bf16x2(s[2 * kk][0], s[2 * kk][1], ph[kk][0], pl[kk][0]);
        split_bf16x2(s[2 * kk][2], s[2 * kk][3], ph[kk][1], pl[kk][1]);
        split_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[kk][2], pl[kk][2]);
        split_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[kk][3], pl[kk][3]);
      }
#pragma unroll
      for (int n2 = 0; n2 < D / 16; ++n2) {
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          unsigned b[4];
          ldsm_x4_trans(v_addr + (kk * 16 * LDS + n2 * 16) * 2, b);
          mma_bf16(acc[2 * n2], ph[kk], b[0], b[1]);
          mma_bf16(acc[2 * n2 + 1], ph[kk], b[2], b[3]);
          mma_bf16(acc[2 * n2], pl[kk], b[0], b[1]);
          mma_bf16(acc[2 * n2 + 1], pl[kk], b[2], b[3]);
        }
      }
    }
  }

  if (!warp_active) return;
  // Row sums: the 4 threads of a quad hold disjoint columns of the same rows.
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, o);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, o);
  }
  const int bad_key = sm_bad_key;  // final: the last atomicMin precedes the loop's last barrier
  const bool vec = ((reinterpret_cast<unsigned long long>(p.out) |
                     (unsigned long long)((p.out_rs | p.out_hs) * 4)) & 7) == 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = wrow0 + quad_row + 8 * half;
    if (r >= total) continue;
    const int i = r / G;
    const float inv_l = 1.0f / (half ? l_b : l_a);  // l >= 1: the row max contributes 2^0
    const bool bad = p.pos0 + i >= bad_key;
    float* dst = p.out + (i64)i * p.out_rs + (i64)(g * G + r % G) * p.out_hs + 2 * quad_col;
#pragma unroll
    for (int n = 0; n < NT_O; ++n) {
      const float o0 = bad ? NINFER_NAN : acc[n][2 * half] * inv_l;
      const float o1 = bad ? NINFER_NAN : acc[n][2 * half + 1] * inv_l;
      if (vec) {
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o0, o1);
      } else {
        dst[n * 8] = o0;
        dst[n * 8 + 1] = o1;
      }
    }
  }
}
