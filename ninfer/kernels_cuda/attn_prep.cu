// attn_prep.cu: the gated-attention layer's inputs in one launch (decode and prefill).
//
// attn_prep_kernel<WT, KT, NV>: grid (N, A + Hkv), block T = block_threads(D) threads (norm.py).
// For query head h < A of row n:  q_hat[n, h] = rope(rms_zc(q_and_gate[n, h, :D], q_norm)),
//                                 gate[n, h]  = q_and_gate[n, h, D:2D];
// for KV head g = h - A:          page slot of (row_seq[n], row_pos[n]) <- rope(rms_zc(k[n, g],
//                                 k_norm)) and v[n, g], cast to KT (a page id outside
//                                 [0, num_pages) is skipped, as kv_write does).
// The arithmetic is that of norm_kernel<WT, float, RMS_ZC, NV, T, RB> (thread i holds
// elements i + j*T, j ascending; block_sum), then rope_kernel's rotation (fp32 sincosf), so the
// result equals rms_norm -> rope -> kv_write bit for bit. Launched with programmatic dependent
// launch (attn_prep.py): only L2 prefetches of constant inputs come before `pdl_enter`.
#include "common.cuh"

struct AttnPrepParams {
  const float* qg;      // [N, A, 2D] rows strided: per head [q_h | gate_h]
  const float* k;       // [N, Hkv, D]
  const float* v;       // [N, Hkv, D]
  const void* q_norm;   // [D] WT
  const void* k_norm;   // [D] WT
  float* q_out;         // [N, A, D]
  float* gate_out;      // [N, A, D]
  void* k_pages;        // [P, Hkv, page_size, D] KT
  void* v_pages;
  const int* block_tables;
  const int* row_seq;
  const int* row_pos;
  const int* positions;   // [3, N] rows strided
  const float* inv_freq;  // [half]
  const int* freq_axis;   // [half]
  i64 qg_rs, qg_hs, k_rs, k_hs, v_rs, v_hs, q_rs, q_hs, g_rs, g_hs, bt_rs, pos_rs;
  int num_pages, page_size, kv_heads, q_heads;
  int num_seqs, bt_cols, dim, half;
  float eps;
  int pad;
};
static_assert(sizeof(AttnPrepParams) == 256, "AttnPrepParams layout is mirrored in attn_prep.py");

// Row n's rope angle of frequency j (rope_kernel's expression).
__device__ __forceinline__ float rope_angle(const AttnPrepParams& p, i64 n, int j) {
  return (float)p.positions[p.freq_axis[j] * p.pos_rs + n] * p.inv_freq[j];
}

template <typename WT, typename KT, int NV>
__global__ void __launch_bounds__(256) attn_prep_kernel(const AttnPrepParams p) {
  extern __shared__ float row[];  // [D]
  __shared__ float scratch[32];
  const i64 n = blockIdx.x;
  const int h = blockIdx.y;
  const bool is_q = h < p.q_heads;
  const int g = h - p.q_heads;
  const int D = p.dim, T = blockDim.x;
  const float* x = is_q ? p.qg + n * p.qg_rs + (i64)h * p.qg_hs : p.k + n * p.k_rs + (i64)g * p.k_hs;
  const WT* w = static_cast<const WT*>(is_q ? p.q_norm : p.k_norm);
  // before pdl_wait: the lines of the inputs no kernel of the step writes (the norm weight, the
  // rope tables, this row's positions, sequence, position and page id) head for the L2
  // (hints: stale values only waste a prefetch)
  prefetch_l2_span(w, (i64)D * sizeof(WT), threadIdx.x, T);
  if (threadIdx.x == 0) {
    prefetch_l2_span(p.inv_freq, (i64)p.half * 4, 0, 1);
    prefetch_l2_span(p.freq_axis, (i64)p.half * 4, 0, 1);
    for (int a = 0; a < 3; ++a) prefetch_l2(p.positions + a * p.pos_rs + n);
    if (!is_q) {
      const int seq = p.row_seq[n], pos = p.row_pos[n];
      if (seq >= 0 && seq < p.num_seqs && pos >= 0 && pos / p.page_size < p.bt_cols)
        prefetch_l2(p.block_tables + seq * p.bt_rs + pos / p.page_size);
    }
  }
  pdl_enter();

  // every load is issued before the reduction: x, the weight, the gate (q heads) or v (KV
  // heads) elements of this thread, its first rope angle, and the KV head's page id
  const float* other = is_q ? x + D : p.v + n * p.v_rs + (i64)g * p.v_hs;
  float v[NV], wv[NV], ov[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = threadIdx.x + j * T;
    v[j] = i < D ? x[i] : 0.0f;
    wv[j] = i < D ? to_f32(w[i]) : 0.0f;
    ov[j] = i < D ? other[i] : 0.0f;
  }
  const float angle0 = threadIdx.x < p.half ? rope_angle(p, n, threadIdx.x) : 0.0f;
  int page = -1, pos = 0;
  if (!is_q) {
    const int seq = p.row_seq[n];
    pos = p.row_pos[n];
    if (seq >= 0 && seq < p.num_seqs && pos >= 0 && pos / p.page_size < p.bt_cols)
      page = p.block_tables[seq * p.bt_rs + pos / p.page_size];
  }

  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j)
    if (threadIdx.x + j * T < D) ss = fmaf(v[j], v[j], ss);
  ss = block_sum(ss, scratch);
  const float denom = sqrtf(ss / (float)D + p.eps);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = threadIdx.x + j * T;
    if (i < D) row[i] = v[j] / denom * (1.0f + wv[j]);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < p.half; j += T) {
    const float angle = j == threadIdx.x ? angle0 : rope_angle(p, n, j);
    float s, c;
    sincosf(angle, &s, &c);
    const float x1 = row[j], x2 = row[j + p.half];
    row[j] = x1 * c - x2 * s;
    row[j + p.half] = x2 * c + x1 * s;
  }
  __syncthreads();
  if (is_q) {
    float* q = p.q_out + n * p.q_rs + (i64)h * p.q_hs;
    float* gt = p.gate_out + n * p.g_rs + (i64)h * p.g_hs;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = threadIdx.x + j * T;
      if (i < D) {
        q[i] = row[i];
        gt[i] = ov[j];
      }
    }
    return;
  }
  if (page < 0 || page >= p.num_pages) return;
  const i64 dst = (((i64)page * p.kv_heads + g) * p.page_size + pos % p.page_size) * D;
  KT* kp = static_cast<KT*>(p.k_pages) + dst;
  KT* vp = static_cast<KT*>(p.v_pages) + dst;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = threadIdx.x + j * T;
    if (i < D) {
      kp[i] = from_f32<KT>(row[i]);
      vp[i] = from_f32<KT>(ov[j]);
    }
  }
}
