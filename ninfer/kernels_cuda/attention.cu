// attention.cu: paged KV cache writes and paged causal attention with GQA.
//
// KV pages: [num_pages, Hkv, page_size, D] f32 or bf16 (KT). Token at position p of the
// sequence in block-table row s lives in page block_tables[s, p / page_size], slot p % page_size.
//
// kv_write_kernel<KT>: one block per row; stores k/v (cast to KT) at (row_seq, row_pos).
//   A page id outside [0, num_pages) is skipped (never written).
//
// paged_attention_kernel<KT, GW, DPL, SPLIT>: a row's context [0, row_pos[n]] is cut into
//   chunks of CHUNK consecutive keys (boundaries depend only on the row's own length). For one
//   chunk, a block computes the partial softmax state (m, l, unnormalised o) of all G = A/Hkv
//   query heads of one KV head g, so each K/V vector is read once: warps are (HG head groups of
//   GW heads) x (KW key lanes); a warp walks its tiles of TK keys (tile t goes to key lane
//   t % KW), lane l holding dims [l*DPL, (l+1)*DPL) (D = 32*DPL); online softmax per warp, then
//   the KW partials are merged in key-lane order. Partials of several chunks are merged in chunk
//   order by attn_merge (running max rescale, explicit fmaf):
//   SPLIT=1 (flash-decoding, few rows): grid (max_chunks, Hkv, N), one chunk per block; a row
//     with one chunk writes its output, others write partials that
//     paged_attention_combine_kernel merges (blocks past the row's chunks exit);
//   SPLIT=0 (many rows, e.g. prefill): grid (1, Hkv, N), the block loops over the row's chunks
//     and merges them itself. Both modes run the same per-chunk code and the same merge in the
//     same order, so they give bitwise identical rows (batch invariance across the switch).
//   An invalid sequence row or page id makes the row's output NaN.
//
// paged_attention_combine_kernel: grid (A, N), D threads; merges a row's chunk partials.
#include "common.cuh"

#define ATTN_CHUNK 256
#define ATTN_TK 4

struct KvWriteParams {
  const float* k;
  const float* v;
  void* k_pages;
  void* v_pages;
  const int* block_tables;
  const int* row_seq;
  const int* row_pos;
  i64 k_rs, k_hs, v_rs, v_hs;
  i64 bt_rs;
  int num_pages, page_size, kv_heads, head_dim;
  int num_seqs, bt_cols;
};
static_assert(sizeof(KvWriteParams) == 120, "KvWriteParams layout is mirrored in attention.py");

template <typename KT>
__global__ void __launch_bounds__(256) kv_write_kernel(const KvWriteParams p) {
  const i64 n = blockIdx.x;
  const int seq = p.row_seq[n];
  const int pos = p.row_pos[n];
  if (seq < 0 || seq >= p.num_seqs || pos < 0 || pos / p.page_size >= p.bt_cols) return;
  const int page = p.block_tables[seq * p.bt_rs + pos / p.page_size];
  if (page < 0 || page >= p.num_pages) return;
  const int slot = pos % p.page_size;
  KT* kp = static_cast<KT*>(p.k_pages);
  KT* vp = static_cast<KT*>(p.v_pages);
  const int total = p.kv_heads * p.head_dim;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int h = i / p.head_dim, d = i % p.head_dim;
    const i64 dst = (((i64)page * p.kv_heads + h) * p.page_size + slot) * p.head_dim + d;
    kp[dst] = from_f32<KT>(p.k[n * p.k_rs + h * p.k_hs + d]);
    vp[dst] = from_f32<KT>(p.v[n * p.v_rs + h * p.v_hs + d]);
  }
}

struct AttnParams {
  const float* q;
  float* out;
  const void* k_pages;
  const void* v_pages;
  const int* block_tables;
  const int* row_seq;
  const int* row_pos;
  float* part_o;   // [N, A, max_chunks, D]
  float* part_ml;  // [N, A, max_chunks, 2]
  i64 q_rs, q_hs, out_rs, out_hs;
  i64 bt_rs;
  int num_pages, page_size, kv_heads, q_heads;
  int num_seqs, bt_cols, max_chunks, head_groups;  // head_groups = HG
  float scale;
  int pad;
};
static_assert(sizeof(AttnParams) == 152, "AttnParams layout is mirrored in attention.py");

template <typename KT, int DPL>
__device__ __forceinline__ void load_lane(const KT* p, float (&out)[DPL]) {
  if constexpr (DPL == 8) {
    load8_cached(p, out);
  } else {
#pragma unroll
    for (int d = 0; d < DPL; ++d) out[d] = to_f32(p[d]);
  }
}

// Returns the number of chunks of a context of `len` keys.
__device__ __forceinline__ int attn_chunks(int len) { return (len + ATTN_CHUNK - 1) / ATTN_CHUNK; }

// Running merge of chunk partials, identical in the loop and the combine kernels.
__device__ __forceinline__ void attn_merge(float& m_run, float& l_run, float& o_run, float m_c,
                                           float l_c, float o_c) {
  const float m_new = fmaxf(m_run, m_c);
  const float a = expf(m_run - m_new);  // 0 for the initial m_run = -inf
  const float b = expf(m_c - m_new);
  l_run = fmaf(l_c, b, l_run * a);
  o_run = fmaf(o_c, b, o_run * a);
  m_run = m_new;
}

template <typename KT, int GW, int DPL, int SPLIT>
__global__ void __launch_bounds__(256) paged_attention_kernel(const AttnParams p) {
  // [KW][G] m, [KW][G] l, [KW][G][D] acc; SPLIT=0 adds running m, l, o: [G][D] each
  extern __shared__ float smem[];
  __shared__ int sm_bad;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int HG = p.head_groups;
  const int KW = nwarps / HG;
  const int G = HG * GW;
  const int D = 32 * DPL;
  const int hg = warp % HG, kw = warp / HG;
  const int g = blockIdx.y;
  const i64 n = blockIdx.z;

  const int seq = p.row_seq[n];
  const int pos = p.row_pos[n];
  const bool row_ok = seq >= 0 && seq < p.num_seqs && pos >= 0 && pos / p.page_size < p.bt_cols;
  const int len = row_ok ? pos + 1 : 1;
  const int n_chunks = attn_chunks(len);
  const int c_begin = SPLIT ? (int)blockIdx.x : 0;
  const int c_end = SPLIT ? c_begin + 1 : n_chunks;
  if (c_begin >= n_chunks) return;

  float* sm_m = smem;
  float* sm_l = smem + KW * G;
  float* sm_acc = smem + 2 * KW * G;
  float* run_m = sm_acc + KW * G * D;  // SPLIT=0 only
  float* run_l = run_m + G * D;
  float* run_o = run_l + G * D;
  if (threadIdx.x == 0) sm_bad = !row_ok;
  if (!SPLIT) {
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
      run_m[idx] = -NINFER_INF;
      run_l[idx] = 0.0f;
      run_o[idx] = 0.0f;
    }
  }
  __syncthreads();  // sm_bad is initialised before any warp can flag a bad page

  const int head0 = g * G + hg * GW;  // first query head of this warp
  float q[GW][DPL];
#pragma unroll
  for (int i = 0; i < GW; ++i) {
    const float* qp = p.q + n * p.q_rs + (i64)(head0 + i) * p.q_hs + lane * DPL;
#pragma unroll
    for (int d = 0; d < DPL; ++d) q[i][d] = qp[d];
  }
  const KT* kbase = static_cast<const KT*>(p.k_pages);
  const KT* vbase = static_cast<const KT*>(p.v_pages);
  const int* bt = p.block_tables + (i64)(row_ok ? seq : 0) * p.bt_rs;

  for (int c = c_begin; c < c_end; ++c) {
    const int key_begin = c * ATTN_CHUNK;
    const int key_end = min(len, key_begin + ATTN_CHUNK);
    float m[GW], l[GW], acc[GW][DPL];
#pragma unroll
    for (int i = 0; i < GW; ++i) {
      m[i] = -NINFER_INF;
      l[i] = 0.0f;
#pragma unroll
      for (int d = 0; d < DPL; ++d) acc[i][d] = 0.0f;
    }
    bool bad = false;
    for (int t0 = key_begin + kw * ATTN_TK; t0 < key_end; t0 += KW * ATTN_TK) {
      float kv[ATTN_TK][DPL], vv[ATTN_TK][DPL];
#pragma unroll
      for (int j = 0; j < ATTN_TK; ++j) {
        const int key = t0 + j;
        int page = -1;
        if (key < key_end && row_ok) page = bt[key / p.page_size];
        if (page >= 0 && page < p.num_pages) {
          const i64 off = (((i64)page * p.kv_heads + g) * p.page_size + key % p.page_size) * D +
                          lane * DPL;
          load_lane<KT, DPL>(kbase + off, kv[j]);
          load_lane<KT, DPL>(vbase + off, vv[j]);
        } else {
          if (key < key_end) bad = true;
#pragma unroll
          for (int d = 0; d < DPL; ++d) kv[j][d] = vv[j][d] = 0.0f;
        }
      }
#pragma unroll
      for (int i = 0; i < GW; ++i) {
        float s[ATTN_TK];
        float tile_max = -NINFER_INF;
#pragma unroll
        for (int j = 0; j < ATTN_TK; ++j) {
          float part = 0.0f;
#pragma unroll
          for (int d = 0; d < DPL; ++d) part = fmaf(q[i][d], kv[j][d], part);
          s[j] = t0 + j < key_end ? warp_sum(part) * p.scale : -NINFER_INF;
          tile_max = fmaxf(tile_max, s[j]);
        }
        const float m_new = fmaxf(m[i], tile_max);
        const float corr = expf(m[i] - m_new);
        float psum = 0.0f;
        float pj[ATTN_TK];
#pragma unroll
        for (int j = 0; j < ATTN_TK; ++j) {
          pj[j] = expf(s[j] - m_new);
          psum += pj[j];
        }
        l[i] = l[i] * corr + psum;
        m[i] = m_new;
#pragma unroll
        for (int d = 0; d < DPL; ++d) {
          float a = acc[i][d] * corr;
#pragma unroll
          for (int j = 0; j < ATTN_TK; ++j) a = fmaf(pj[j], vv[j][d], a);
          acc[i][d] = a;
        }
      }
    }
    // merge the KW key lanes of each head (key-lane order) into this chunk's partial
    if (bad) sm_bad = 1;
#pragma unroll
    for (int i = 0; i < GW; ++i) {
      const int hl = hg * GW + i;  // head index within the group
      if (lane == 0) {
        sm_m[kw * G + hl] = m[i];
        sm_l[kw * G + hl] = l[i];
      }
#pragma unroll
      for (int d = 0; d < DPL; ++d) sm_acc[((i64)kw * G + hl) * D + lane * DPL + d] = acc[i][d];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
      const int hl = idx / D, d = idx % D;
      float mx = -NINFER_INF;
      for (int w = 0; w < KW; ++w) mx = fmaxf(mx, sm_m[w * G + hl]);
      float lsum = 0.0f, o = 0.0f;
      for (int w = 0; w < KW; ++w) {
        const float f = sm_l[w * G + hl] > 0.0f ? expf(sm_m[w * G + hl] - mx) : 0.0f;
        lsum += sm_l[w * G + hl] * f;
        o += sm_acc[((i64)w * G + hl) * D + d] * f;
      }
      const int head = g * G + hl;
      if (!SPLIT) {
        attn_merge(run_m[idx], run_l[idx], run_o[idx], mx, lsum, o);
      } else if (n_chunks == 1) {
        p.out[n * p.out_rs + (i64)head * p.out_hs + d] = sm_bad ? NINFER_NAN : o / lsum;
      } else {
        const i64 part = (n * p.q_heads + head) * (i64)p.max_chunks + c;
        p.part_o[part * D + d] = sm_bad ? NINFER_NAN : o;
        if (d == 0) {
          p.part_ml[part * 2] = mx;
          p.part_ml[part * 2 + 1] = sm_bad ? NINFER_NAN : lsum;
        }
      }
    }
    __syncthreads();  // the chunk's shared partials are rewritten by the next chunk
  }
  if (!SPLIT) {
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
      const int hl = idx / D, d = idx % D;
      p.out[n * p.out_rs + (i64)(g * G + hl) * p.out_hs + d] =
          sm_bad ? NINFER_NAN : run_o[idx] / run_l[idx];
    }
  }
}

// grid (A, N), D threads: merges a row's chunk partials in chunk order (rows with one chunk
// were written by paged_attention_kernel).
__global__ void __launch_bounds__(256) paged_attention_combine_kernel(const AttnParams p,
                                                                      int head_dim) {
  const int head = blockIdx.x;
  const i64 n = blockIdx.y;
  const int seq = p.row_seq[n];
  const int pos = p.row_pos[n];
  const bool row_ok = seq >= 0 && seq < p.num_seqs && pos >= 0 && pos / p.page_size < p.bt_cols;
  const int n_chunks = attn_chunks(row_ok ? pos + 1 : 1);
  if (n_chunks <= 1) return;
  const float* ml = p.part_ml + (n * p.q_heads + head) * (i64)p.max_chunks * 2;
  const float* po = p.part_o + (n * p.q_heads + head) * (i64)p.max_chunks * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float m_run = -NINFER_INF, l_run = 0.0f, o_run = 0.0f;
    for (int c = 0; c < n_chunks; ++c)
      attn_merge(m_run, l_run, o_run, ml[2 * c], ml[2 * c + 1], po[(i64)c * head_dim + d]);
    p.out[n * p.out_rs + (i64)head * p.out_hs + d] = o_run / l_run;
  }
}
