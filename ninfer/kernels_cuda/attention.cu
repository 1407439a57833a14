// attention.cu: paged KV cache writes and paged causal attention with GQA.
//
// KV pages: [num_pages, Hkv, page_size, D] f32 or bf16 (KT). Token at position p of the
// sequence in block-table row s lives in page block_tables[s, p / page_size], slot p % page_size.
//
// kv_write_kernel<KT>: one block per row; stores k/v (cast to KT) at (row_seq, row_pos).
//   A page id outside [0, num_pages) is skipped (never written).
//
// paged_attention_kernel<KT, GW, DPL, SPLIT>: causal attention of row n over keys
//   [0, len = row_pos[n] + 1) of its sequence. Decode moves a few MB per layer, so it is
//   latency-bound: the work is cut finely and every warp keeps its next tile's loads in flight.
//
//   Chunks. The context is cut into chunks of CS = max(64, roundup64(ceil(len / 64))) keys:
//   n_chunks = ceil(len / CS) <= ATTN_MAX_CHUNKS = 64 (CS = 64 up to len 4096, then it grows;
//   with ATTN_CHUNK_GRAIN_LONG = L, rows past 4096 keys take CS >= L).
//   CS depends only on the row's own length, so a row's chunk partials never depend on N.
//
//   One chunk (a block: KV head g and its G = A / Hkv query heads; HG head groups of GW heads x
//   KW key warps, at most 4 warps). The chunk's keys form tiles of KPW consecutive keys (KPW =
//   8 for bf16 D=256: a lane stages 128 bytes of K and 128 of V per tile); tile t goes to key
//   warp t % KW. Lane l owns dims [l*DPL, (l+1)*DPL) (D = 32*DPL) of every key.
//   Per warp, software-pipelined over its tiles (a ring of NST = 2..4 buffers of 8 KiB of
//   shared memory; attention.py builds NST = 2 only: 3 and 4 were slower on the H200):
//     - lane j < KPW looks up key j's page NST tiles ahead; the tile's K and V rows go global ->
//       shared with cp.async (a lane copies its own bytes; keys that are not valid read as zero)
//       while the previous tiles are computed, so every warp has NST - 1 tiles in flight;
//       NST changes no arithmetic (the same bits for every NST);
//     - scores (base 2: scale_log2 = scale * log2 e): K converted to f32, per (key, head) a
//       partial dot (fmaf over the lane's dims), all of them reduced over the 32 lanes by one
//       multi-value butterfly (halving-exchange steps, then xor steps; per value the lane-bit
//       tree 16, 8, .., 1, as one head's alone), which leaves key j = lane / (32 / KPW) of one
//       head in each lane; online softmax over the tile (xor max / sum over the key bits; acc
//       *= corr, skipped when the max did not move since x * 1 is exact);
//     - p_j to shared memory, then for j ascending: acc[h][d] = fmaf(p[h][j], v[j][d], acc).
//   At the chunk end the KW warp states are merged in warp order (factor
//   f_w = exp2(m_w - max_w m_w)) into the chunk partial (m_c, l_c, o_c).
//
//   Merge of chunks, in two levels (groups of ATTN_GROUP = 8 consecutive chunks; at most 8
//   groups) with identical arithmetic in both modes: a level folds its items (chunks of a group,
//   then the groups of the row) in order from the empty state: with M_i the running max
//   (M_-1 = -inf, M_i = fmaxf(M_i-1, m_i)), a_i = exp2f(M_i-1 - M_i), b_i = exp2f(m_i - M_i),
//   l = fmaf(l_i, b_i, l * a_i), o = fmaf(o_i, b_i, o * a_i) from l = o = 0; a group's result
//   (M, l, o) is an item of the row level; out = o / l. The running max is exact in any order,
//   so the split mode computes it with a max-scan.
//   SPLIT=1 (decode, few rows): grid (max chunks, Hkv, N), one chunk per block; blocks past the
//     row's chunks exit. A one-chunk row writes its output directly; otherwise the block stores
//     its partial in the workspace; the last block of its group to finish (atomic counter,
//     threadfence pattern) folds the group's <= 8 partials (a warp per head computes the
//     coefficients, a thread per 4 dims folds with all loads in flight) into a group partial,
//     and the last group to finish folds the <= 8 groups into the output (a row with one group
//     goes straight to the output). So no block reads more than 8 partials (32 KiB for G=4,
//     D=256). Each level's last block resets its counter: counters start at 0 and are 0 again
//     after every launch, so graph replays need no reset.
//   SPLIT=0 (many rows, e.g. prefill): grid (1, Hkv, N); the block loops over the row's chunks
//     and folds each partial into a group state and each finished group into the row state
//     (shared memory).
//   Output gate (optional, p.gate non-null: the gated attention of Qwen3.5): every final
//     output element is written as value * sigmoid(gate[n, h, d]) by one helper
//     (attn_store_out, used by the one-chunk write, the split mode's last fold and the SPLIT=0
//     write) with elementwise.cu SigmoidMul's expression (sigmoid_mul_f), so the result is
//     bitwise paged_attention followed by sigmoid_mul. gate f32 [N, A, D], rows and heads
//     strided, last axis contiguous; read after pdl_enter like the other inputs. A null gate
//     leaves the output arithmetic unchanged.
//   Both modes run the same per-chunk code and the same fold in the same order, so they give
//   bitwise identical rows (batch invariance across the switch). All per-chunk arithmetic uses
//   explicit fmaf / __fmul_rn / __fadd_rn so that no contraction choice differs between
//   instances. An invalid sequence row or page id makes the row's output NaN.
//
// paged_attention_tma_kernel<D> (NINFER_ATTN_TMA, sm_90, bf16 pages, split mode only): the same
//   chunks, partials, merges and gate with the K / V rows streamed by bulk copies into a
//   shared-memory ring; see its comment block at the end of this file.
//
// All kernels are launched with programmatic dependent launch (attention.py): `pdl_enter` comes
// before any early exit and before any read of memory an earlier kernel of the step may write.
// Only paged_attention_kernel with p.prewait (past_kv_ready) reads before it: the row, its page
// ids and K / V of keys before the row's own.
#include "bulk_copy.cuh"
#include "common.cuh"
#include "ldmatrix.cuh"
#include "mma_gemv.cuh"

#define ATTN_MAX_CHUNKS 64   // chunks per row at most (the workspace's chunk dimension)
#ifndef ATTN_CHUNK_GRAIN     // NINFER_ATTN_CHUNK_GRAIN (attention.py passes -D)
#define ATTN_CHUNK_GRAIN 64  // chunk sizes are multiples of this (and at least this)
#endif
// NINFER_ATTN_CHUNK_GRAIN_LONG (attention.py passes -D when it exceeds the grain): rows longer
// than ATTN_MAX_CHUNKS chunks of the grain take chunks of at least this many keys (a multiple of
// the grain); by default the grain itself, which changes nothing
#ifndef ATTN_CHUNK_GRAIN_LONG
#define ATTN_CHUNK_GRAIN_LONG ATTN_CHUNK_GRAIN
#endif
#define ATTN_GROUP 8         // chunks per merge group (ATTN_MAX_CHUNKS / ATTN_GROUP groups)
// NINFER_ATTN_MERGE_KERNEL (attention.py passes -D; a build of its own, split-mode instances
// only): the split mode's blocks store their chunk partials and exit without counting;
// attn_merge_kernel, launched right after, folds them with the same arithmetic in the same
// order (the same bits). 1: the attention blocks trigger their dependents by exiting (the merge
// kernel's blocks are not resident while the chunks run); 2: at their PDL wait, as by default;
// 3: once their keys are done (attn_keys_done), so the merge kernel's blocks are resident, past
// its launch and its row reads, while the chunks' partials are folded and stored.
#ifndef ATTN_MERGE_KERNEL
#define ATTN_MERGE_KERNEL 0
#endif
#define ATTN_FULL 0xffffffffu

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
  pdl_enter();
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
  float* part_o;   // [N, A, max_chunks, D] chunk partials (SPLIT=1 only)
  float* part_ml;  // [N, A, max_chunks, 2] (chunk max, chunk sum)
  float* grp_o;    // [N, A, ATTN_GROUP, D] group partials
  float* grp_ml;   // [N, A, ATTN_GROUP, 2]
  int* counters;   // [N, A, 1 + ATTN_GROUP]: [n, g, 0] groups done, [n, g, 1 + q] chunks done
                   // in group q of row n, KV head g; 0 between launches
  const float* gate;  // [N, A, D] output gate (rows / heads strided), or null: no gate
  i64 q_rs, q_hs, out_rs, out_hs;
  i64 gate_rs, gate_hs;
  i64 bt_rs;
  int num_pages, page_size, kv_heads, q_heads;
  int num_seqs, bt_cols, max_chunks, head_groups;  // head_groups = HG
  float scale_log2;  // scale * log2(e): scores are kept in base 2
  int hg_recip;      // ceil(65536 / head_groups): warp / HG = (warp * hg_recip) >> 16, warp < 32
  int page_shift;    // log2(page_size) when it is a power of two, else -1
  int stages;       // ring stages of paged_attention_tma_kernel (2..ATTN_TMA_MAX_STAGES)
  int prewait;      // 1: every row's keys before its own position were written before this
                    // launch (decode: one row per sequence); see paged_attention_kernel
  int out_bf16;     // 1: out holds bf16 bits (each final value rounded to nearest even)
};
static_assert(sizeof(AttnParams) == 216, "AttnParams layout is mirrored in attention.py");

struct AttnRow {
  bool ok;
  int seq, len, chunk_keys, n_chunks;
};

// Row n's context and chunking (an invalid row has one chunk of one key, flagged bad).
__device__ __forceinline__ AttnRow attn_row(const AttnParams& p, i64 n) {
  AttnRow r;
  r.seq = p.row_seq[n];
  const int pos = p.row_pos[n];
  r.ok = r.seq >= 0 && r.seq < p.num_seqs && pos >= 0 && pos / p.page_size < p.bt_cols;
  r.len = r.ok ? pos + 1 : 1;
  const int per = (r.len - 1) / ATTN_MAX_CHUNKS + 1;  // ceil(len / 64), no overflow
  r.chunk_keys = max(ATTN_CHUNK_GRAIN, ((per - 1) / ATTN_CHUNK_GRAIN + 1) * ATTN_CHUNK_GRAIN);
#if ATTN_CHUNK_GRAIN_LONG > ATTN_CHUNK_GRAIN
  if (r.len > ATTN_MAX_CHUNKS * ATTN_CHUNK_GRAIN)
    r.chunk_keys = max(r.chunk_keys, ATTN_CHUNK_GRAIN_LONG);
#endif
  r.n_chunks = (r.len - 1) / r.chunk_keys + 1;
  return r;
}

// Row n's block-table row (row 0's for an invalid row, whose keys are never looked up as valid).
__device__ __forceinline__ const int* attn_row_table(const AttnParams& p, const AttnRow& row) {
  return p.block_tables + (i64)(row.ok ? row.seq : 0) * p.bt_rs;
}

// Keys per warp tile: a lane stages KPW * DPL * sizeof(KT) <= 128 bytes of K (and of V) per
// tile, KPW <= 8 (8 for bf16 D <= 256; 4 for f32 D = 256).
template <typename KT, int DPL>
__host__ __device__ constexpr int attn_kpw() {
  return 128 / (DPL * (int)sizeof(KT)) < 8 ? 128 / (DPL * (int)sizeof(KT)) : 8;
}

// The DPL raw elements of one key that a lane holds (bf16 stays packed until used).
template <typename KT, int DPL>
struct KvLane {
  static constexpr int BYTES = DPL * (int)sizeof(KT);
  static constexpr int W = BYTES < 4 ? 1 : BYTES / 4;  // 32-bit words
  unsigned int w[W];

  // from shared memory; ptr is aligned to BYTES
  __device__ __forceinline__ void load_shared(const unsigned char* ptr) {
    if constexpr (BYTES == 32) {
      const uint4 a = reinterpret_cast<const uint4*>(ptr)[0];
      const uint4 b = reinterpret_cast<const uint4*>(ptr)[1];
      w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
      w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else if constexpr (BYTES == 16) {
      const uint4 a = *reinterpret_cast<const uint4*>(ptr);
      w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    } else if constexpr (BYTES == 8) {
      const uint2 a = *reinterpret_cast<const uint2*>(ptr);
      w[0] = a.x; w[1] = a.y;
    } else if constexpr (BYTES == 4) {
      w[0] = *reinterpret_cast<const unsigned int*>(ptr);
    } else {
      w[0] = *reinterpret_cast<const unsigned short*>(ptr);
    }
  }
  __device__ __forceinline__ float get(int d) const {  // d is a compile-time index after unroll
    if constexpr (sizeof(KT) == 4) {
      return __uint_as_float(w[d]);
    } else if constexpr (BYTES == 2) {
      return __uint_as_float(w[0] << 16);
    } else {
      return __uint_as_float((d & 1) ? (w[d >> 1] & 0xffff0000u) : (w[d >> 1] << 16));
    }
  }
};

// 32-bit shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned attn_smem_u32(const void* ptr) {
  return (unsigned)__cvta_generic_to_shared(ptr);
}
// Asynchronous global -> shared copy of BYTES (4, 8, 16 or 32); valid = false writes zeros
// without reading src.
template <int BYTES>
__device__ __forceinline__ void attn_cp_async(unsigned dst, const void* src, bool valid) {
  if constexpr (BYTES == 32) {
    attn_cp_async<16>(dst, src, valid);
    attn_cp_async<16>(dst + 16, static_cast<const char*>(src) + 16, valid);
  } else if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0) : "memory");
  } else {
    static_assert(BYTES == 8 || BYTES == 4, "cp.async copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                 "n"(BYTES), "r"(valid ? BYTES : 0) : "memory");
  }
}
__device__ __forceinline__ void attn_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's most recent copy groups are still in flight.
template <int N>
__device__ __forceinline__ void attn_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Multi-value butterfly: v[j] holds this lane's partial of key j (j < K). Returns the sum over
// the 32 lanes of key j = lane / (32 / K), identical in every lane holding that key. Halving
// steps (offsets 16, 8, ...): a lane keeps the half of its values selected by its lane bit and
// adds the partner's copy of that half; then xor steps finish the remaining lane bits.
template <int K, int N, int O>
__device__ __forceinline__ void attn_halve(float (&v)[K], int lane) {
  if constexpr (N > 1) {
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float send = upper ? v[i] : v[i + N / 2];
      const float keep = upper ? v[i + N / 2] : v[i];
      v[i] = __fadd_rn(keep, __shfl_xor_sync(ATTN_FULL, send, O));
    }
    attn_halve<K, N / 2, O / 2>(v, lane);
  }
}
template <int K>
__device__ __forceinline__ float attn_key_sum(float (&v)[K], int lane) {
  static_assert(K >= 2 && K <= 32 && (K & (K - 1)) == 0, "K must be a power of two <= 32");
  attn_halve<K, K, 16>(v, lane);
  float s = v[0];
#pragma unroll
  for (int o = 16 / K; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(ATTN_FULL, s, o));
  return s;
}

// Merge coefficients of a chunk with max m_c into a running state with max m_prev (base 2).
__device__ __forceinline__ float attn_coef(float m_prev, float m_c, float& a, float& b) {
  const float m_new = fmaxf(m_prev, m_c);
  a = exp2f(m_prev - m_new);  // 0 for the initial m_prev = -inf
  b = exp2f(m_c - m_new);
  return m_new;
}
__device__ __forceinline__ float attn_fold(float run, float a, float b, float x) {
  return fmaf(x, b, __fmul_rn(run, a));
}

// Writes the final output elements (n, head, d .. d + K - 1) = v, each times sigmoid(gate) when
// p.gate is set (sigmoid_mul_f: the bits of paged_attention then sigmoid_mul), as f32 or, when
// p.out_bf16, as bf16 bits (rounded to nearest even). The gate loads are all issued before the
// stores (out may alias gate as far as the compiler knows). Every site that writes a final
// output element goes through here.
template <int K>
__device__ __forceinline__ void attn_store_out(const AttnParams& p, i64 n, int head, int d,
                                               const float (&v)[K]) {
  const i64 at = n * p.out_rs + (i64)head * p.out_hs + d;
  float y[K];
  if (p.gate) {
    const float* gp = p.gate + n * p.gate_rs + (i64)head * p.gate_hs + d;
    float gv[K];
#pragma unroll
    for (int k = 0; k < K; ++k) gv[k] = gp[k];
#pragma unroll
    for (int k = 0; k < K; ++k) y[k] = sigmoid_mul_f(v[k], gv[k]);
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) y[k] = v[k];
  }
  if (p.out_bf16) {
    bf16raw* out = reinterpret_cast<bf16raw*>(p.out) + at;
#pragma unroll
    for (int k = 0; k < K; ++k) out[k] = f32_to_bf16(y[k]);
  } else {
    float* out = p.out + at;
#pragma unroll
    for (int k = 0; k < K; ++k) out[k] = y[k];
  }
}

// Element row (page * Hkv + g) * page_size + slot of `key`; -2: not a key of this tile
// (inactive lane or past key_end), -1: invalid row or page (the row becomes NaN).
__device__ __forceinline__ int attn_key_row(const AttnParams& p, const int* bt, bool row_ok, int g,
                                            int key, int key_end, bool active) {
  if (!active || key >= key_end) return -2;
  if (!row_ok) return -1;
  int idx, slot;
  if (p.page_shift >= 0) {
    idx = key >> p.page_shift;
    slot = key & (p.page_size - 1);
  } else {
    idx = key / p.page_size;
    slot = key - idx * p.page_size;
  }
  const int page = __ldg(bt + idx);
  if (page < 0 || page >= p.num_pages) return -1;
  return (page * p.kv_heads + g) * p.page_size + slot;
}

// Split-mode merge, run by every thread of the last block of a group (level 1) or of a row's
// groups (level 2): folds `count` (1..8) partials of KV head g's G heads of row n, slots
// [first, first + count) of (o [N, A, stride, D], ml [N, A, stride, 2]), in slot order from the
// empty state (as SPLIT=0 folds them). Pass 1 (a warp per head, lane i = slot i): the running
// max by a max-scan (exact, so equal to the sequential fmaxf chain) and the coefficients;
// pass 2 (a thread per 4 dims, all loads in flight; a thread's first two items are loaded
// before pass 1): the fold. mode 0: the result (M, L, O) goes to group slot `dst`; mode 1:
// out = the result folded into an empty row state (a row with one group); mode 2: out = O / L. mg: shared a, b, l [G][ATTN_GROUP], M [G].
template <int D>
__device__ __forceinline__ void attn_merge(const AttnParams& p, i64 n, int g, int G,
                                           const float* src_o, const float* src_ml, int stride,
                                           int first, int count, float* mg, int mode,
                                           int dst = 0) {
  const int tid = threadIdx.x, nthreads = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const int nwarps = nthreads >> 5;
  float* ma = mg;
  float* mb = ma + G * ATTN_GROUP;
  float* ml = mb + G * ATTN_GROUP;
  float* mm = ml + G * ATTN_GROUP;
  constexpr int D4 = D / 4;
  const int items = G * D4;  // (head, 4 dims) items of pass 2
  // a thread's first two pass-2 items load their partials before pass 1 (they do not depend on
  // the coefficients), so the o loads overlap the ml loads and the max-scan
  auto load = [&](int e, float4 (&buf)[ATTN_GROUP]) {
    const int hl = e / D4, d4 = e % D4;
    const float4* po = reinterpret_cast<const float4*>(src_o) +
                       ((n * p.q_heads + g * G + hl) * (i64)stride + first) * D4 + d4;
#pragma unroll
    for (int i = 0; i < ATTN_GROUP; ++i)
      buf[i] = i < count ? __ldcg(po + (i64)i * D4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  };
  float4 pre0[ATTN_GROUP], pre1[ATTN_GROUP];
  if (tid < items) load(tid, pre0);
  if (tid + nthreads < items) load(tid + nthreads, pre1);
  for (int hl = warp; hl < G; hl += nwarps) {
    const i64 slot0 = (n * p.q_heads + g * G + hl) * (i64)stride + first;
    const float2 v = lane < count ? __ldcg(reinterpret_cast<const float2*>(src_ml) + slot0 + lane)
                                  : make_float2(-NINFER_INF, 0.0f);
    float s = v.x;  // inclusive prefix max over slots 0..lane
#pragma unroll
    for (int o = 1; o < ATTN_GROUP; o <<= 1) {
      const float u = __shfl_up_sync(ATTN_FULL, s, o);
      if (lane >= o) s = fmaxf(s, u);
    }
    const float up = __shfl_up_sync(ATTN_FULL, s, 1);
    const float m_all = __shfl_sync(ATTN_FULL, s, count - 1);
    if (lane < count) {
      float a, b;
      attn_coef(lane == 0 ? -NINFER_INF : up, v.x, a, b);
      ma[hl * ATTN_GROUP + lane] = a;
      mb[hl * ATTN_GROUP + lane] = b;
      ml[hl * ATTN_GROUP + lane] = v.y;
    }
    if (lane == 0) mm[hl] = m_all;
  }
  __syncthreads();
  if (mode == 2) timeline_mark(7);  // level 2: the partials' round trip and pass 1
  auto fold = [&](int e, const float4 (&buf)[ATTN_GROUP]) {
    const int hl = e / D4, d4 = e % D4;
    const int head = g * G + hl;
    float o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f, l = 0.0f;
#pragma unroll
    for (int i = 0; i < ATTN_GROUP; ++i) {
      if (i < count) {
        const float a = ma[hl * ATTN_GROUP + i], b = mb[hl * ATTN_GROUP + i];
        o0 = attn_fold(o0, a, b, buf[i].x);
        o1 = attn_fold(o1, a, b, buf[i].y);
        o2 = attn_fold(o2, a, b, buf[i].z);
        o3 = attn_fold(o3, a, b, buf[i].w);
        l = attn_fold(l, a, b, ml[hl * ATTN_GROUP + i]);
      }
    }
    if (mode == 0) {
      const i64 slot = (n * p.q_heads + head) * (i64)ATTN_GROUP + dst;
      reinterpret_cast<float4*>(p.grp_o)[slot * D4 + d4] = make_float4(o0, o1, o2, o3);
      if (d4 == 0) reinterpret_cast<float2*>(p.grp_ml)[slot] = make_float2(mm[hl], l);
    } else {
      if (mode == 1) {
        float a, b;
        attn_coef(-NINFER_INF, mm[hl], a, b);
        o0 = attn_fold(0.0f, a, b, o0);
        o1 = attn_fold(0.0f, a, b, o1);
        o2 = attn_fold(0.0f, a, b, o2);
        o3 = attn_fold(0.0f, a, b, o3);
        l = attn_fold(0.0f, a, b, l);
      }
      const float v[4] = {o0 / l, o1 / l, o2 / l, o3 / l};
      attn_store_out<4>(p, n, head, d4 * 4, v);
    }
  };
  if (tid < items) fold(tid, pre0);
  if (tid + nthreads < items) fold(tid + nthreads, pre1);
  for (int e = tid + 2 * nthreads; e < items; e += nthreads) {
    float4 buf[ATTN_GROUP];
    load(e, buf);
    fold(e, buf);
  }
}

// The MMA paths' q fragments of the mma's B for KV head g of row n, written to qf (shared
// memory, uint4 [D / 16][32]) by threads tid, tid + nthreads, ...: lane (gi, t) of k-step ks
// holds query head gi's dims 16 ks + 2t, +1 and +8, +9 (zeros for gi >= G), split into bf16 hi
// and lo terms.
template <int D>
__device__ __forceinline__ void attn_stage_q_fragments(const AttnParams& p, i64 n, int g, int G,
                                                       uint4* qf, int tid, int nthreads) {
  for (int e = tid; e < (D / 16) * 32; e += nthreads) {
    const int ks = e >> 5, gi = (e >> 2) & 7, t = e & 3;
    uint4 f = make_uint4(0u, 0u, 0u, 0u);
    if (gi < G) {
      const float* qp = p.q + n * p.q_rs + (i64)(g * G + gi) * p.q_hs + ks * 16 + 2 * t;
      split_bf16x2(qp[0], qp[1], f.x, f.z);
      split_bf16x2(qp[8], qp[9], f.y, f.w);
    }
    qf[e] = f;
  }
}

// One tile of the MMA paths' online softmax, for lane (gi, t): s = the tile's scores of
// accumulator rows gi (s[0], s[1]: query heads 2t, 2t + 1) and gi + 8 (s[2], s[3]); k0 / k1:
// whether those rows' keys are valid (-inf scores otherwise). Updates the running maxima m and
// sums l of heads 2t, 2t + 1, rescales o when a max moved (corr = 1, exact, when it did not),
// and returns this lane's P^T fragments for the P V mma, split into bf16 hi + lo: ph0 / pl0 the
// k rows 2t, 2t + 1, ph1 / pl1 the k rows 2t + 8, 2t + 9 (held by lanes src_a / src_b; odd:
// gi is odd). The caller guarantees at least one valid key in the tile (finite new maxima).
template <int MT>
__device__ __forceinline__ void attn_mma_softmax_step(const float (&s)[4], bool k0, bool k1,
                                                      float scale_log2, int src_a, int src_b,
                                                      bool odd, float& m0, float& m1, float& l0,
                                                      float& l1, float (&o)[MT][4],
                                                      unsigned& ph0, unsigned& pl0,
                                                      unsigned& ph1, unsigned& pl1) {
  const float x0 = k0 ? __fmul_rn(s[0], scale_log2) : -NINFER_INF;
  const float x1 = k0 ? __fmul_rn(s[1], scale_log2) : -NINFER_INF;
  const float x2 = k1 ? __fmul_rn(s[2], scale_log2) : -NINFER_INF;
  const float x3 = k1 ? __fmul_rn(s[3], scale_log2) : -NINFER_INF;
  float mx0 = fmaxf(x0, x2), mx1 = fmaxf(x1, x3);
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(ATTN_FULL, mx0, off));
    mx1 = fmaxf(mx1, __shfl_xor_sync(ATTN_FULL, mx1, off));
  }
  const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
  const bool moved0 = mn0 != m0, moved1 = mn1 != m1;
  const float c0 = moved0 ? exp2f(m0 - mn0) : 1.0f;  // 0 on the first tile
  const float c1 = moved1 ? exp2f(m1 - mn1) : 1.0f;
  const float p0 = exp2f(x0 - mn0), p1 = exp2f(x1 - mn1);
  const float p2 = exp2f(x2 - mn0), p3 = exp2f(x3 - mn1);
  float sum0 = __fadd_rn(p0, p2), sum1 = __fadd_rn(p1, p3);
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {  // symmetric butterfly: the same bits in every lane
    sum0 = __fadd_rn(sum0, __shfl_xor_sync(ATTN_FULL, sum0, off));
    sum1 = __fadd_rn(sum1, __shfl_xor_sync(ATTN_FULL, sum1, off));
  }
  l0 = fmaf(l0, c0, sum0);
  l1 = fmaf(l1, c1, sum1);
  m0 = mn0;
  m1 = mn1;
  const float a0 = __shfl_sync(ATTN_FULL, p0, src_a), a1 = __shfl_sync(ATTN_FULL, p1, src_a);
  const float a2 = __shfl_sync(ATTN_FULL, p2, src_a), a3 = __shfl_sync(ATTN_FULL, p3, src_a);
  const float b0 = __shfl_sync(ATTN_FULL, p0, src_b), b1 = __shfl_sync(ATTN_FULL, p1, src_b);
  const float b2 = __shfl_sync(ATTN_FULL, p2, src_b), b3 = __shfl_sync(ATTN_FULL, p3, src_b);
  split_bf16x2(odd ? a1 : a0, odd ? b1 : b0, ph0, pl0);
  split_bf16x2(odd ? a3 : a2, odd ? b3 : b2, ph1, pl1);
  if (moved0 || moved1) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      o[mt][0] = __fmul_rn(o[mt][0], c0);
      o[mt][1] = __fmul_rn(o[mt][1], c1);
      o[mt][2] = __fmul_rn(o[mt][2], c0);
      o[mt][3] = __fmul_rn(o[mt][3], c1);
    }
  }
}

// A warp's MMA-path state where the FMA path leaves it: acc of query head hl at wst[hl * D +
// dim] (o's m-tile mt rows d0 = 16 mt + gi, d0 + 8; columns = heads 2t, 2t + 1), max and sum at
// wm[hl] / wl[hl] (lanes gi == 0); heads >= G are padding and not stored.
template <int D>
__device__ __forceinline__ void attn_mma_store_state(const float (&o)[D / 16][4], float m0,
                                                     float m1, float l0, float l1, int gi, int t,
                                                     int G, float* wst, float* wm, float* wl) {
  const int n0 = 2 * t, n1 = n0 + 1;
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    const int d0 = mt * 16 + gi;
    if (n0 < G) {
      wst[n0 * D + d0] = o[mt][0];
      wst[n0 * D + d0 + 8] = o[mt][2];
    }
    if (n1 < G) {
      wst[n1 * D + d0] = o[mt][1];
      wst[n1 * D + d0 + 8] = o[mt][3];
    }
  }
  if (gi == 0) {
    if (n0 < G) {
      wm[n0] = m0;
      wl[n0] = l0;
    }
    if (n1 < G) {
      wm[n1] = m1;
      wl[n1] = l1;
    }
  }
}

// MMA chunk body (bf16 pages, G <= 8 query heads, D = 64..256): key warp kw computes its tiles
// of TK = 16 keys (t0 = key_begin + 16 kw, stride 16 KW) with mma.sync.m16n8k16 (bf16 inputs,
// f32 accumulate), keys as the M side and the G query heads as the 8 N columns:
//   S[16 keys][8] = K q^T  (D / 16 k-steps; q = q_hi + q_lo as two bf16 terms, 2 mmas a step);
//   online softmax per query column (max / sum over the 16 keys: 2 values a lane, then xor
//   4, 8, 16; base 2, scale_log2 applied after the mma);
//   P^T to the B layout by 8 shuffles, split p = p_hi + p_lo;
//   O^T[D][8] += V^T P^T  (D / 16 m-tiles, 2 mmas each).
// The warp's 16 KiB stage holds the K tile (8 KiB for D = 256) and the V tile; K and V of a tile
// are separate cp.async groups, so the next tile's K is in flight while this tile's P V runs
// and the next V while the next S runs; both of a chunk's first tile are issued together.
// Rows of the tiles are 16-byte-chunk swizzled (chunk c of key j at c ^ (j & 7)): the cp.async
// writes and the ldmatrix reads hit distinct bank groups. At the end the warp leaves its state
// where the FMA path does: acc of query head hl at wst[hl * D + dim], its max and sum at
// sm_m / sm_l[kw * G + hl] (-inf / 0 and zeros for a warp without keys). qf: q fragments
// [D / 16][32 lanes] = {hi b0, hi b1, lo b0, lo b1}. Returns whether a key's page was invalid.
template <int D>
__device__ __forceinline__ bool attn_mma_warp(const AttnParams& p, const int* bt, bool row_ok,
                                              int g, int key_begin, int key_end, int kw, int KW,
                                              int G, const uint4* qf, float* wst, float* sm_m,
                                              float* sm_l) {
  constexpr int TK = 16;              // keys of a warp tile (the mma's M)
  constexpr int ROW_B = 2 * D;        // bytes of one key row
  constexpr int CPR = ROW_B / 16;     // 16-byte chunks of a row
  constexpr int KPI = 32 / CPR;       // rows copied by one warp-wide cp.async
  constexpr int HALF_B = TK * ROW_B;  // the K (or V) tile
  constexpr int MT = D / 16;          // k-steps of S, m-tiles of O^T
  static_assert(CPR >= 8 && CPR <= 32, "D in 64..256");
  const int lane = threadIdx.x & 31;
  const int gi = lane >> 2, t = lane & 3;
  const bf16raw* kbase = static_cast<const bf16raw*>(p.k_pages);
  const bf16raw* vbase = static_cast<const bf16raw*>(p.v_pages);
  const unsigned kbuf = attn_smem_u32(wst), vbuf = kbuf + HALF_B;
  const int stride = KW * TK;
  const int cc = lane % CPR, jj = lane / CPR;  // this lane copies chunk cc of rows i * KPI + jj
  // copies one tile's K or V rows (lane j < 16's rid: the element row of key t0 + j)
  auto issue = [&](int rid, const bf16raw* base, unsigned buf) -> bool {
    bool bad_tile = false;
#pragma unroll
    for (int i = 0; i < TK / KPI; ++i) {
      const int j = i * KPI + jj;
      const int r = __shfl_sync(ATTN_FULL, rid, j);
      attn_cp_async<16>(buf + j * ROW_B + ((cc ^ (j & 7)) << 4),
                        base + (i64)max(r, 0) * D + cc * 8, r >= 0);
      bad_tile |= r == -1;
    }
    return bad_tile;
  };
  // ldmatrix rows: lanes 8i..8i+7 address matrix i. K (A = [key][dim]): keys r8 + 8 (i & 1),
  // chunk 2 ks + (i >> 1); V (A = V^T by .trans): keys r8 + 8 (i >> 1), chunk 2 mt + (i & 1).
  // The swizzled chunk (2 s + c) ^ r8 = 2 s ^ (c ^ r8).
  const int r8 = lane & 7, mi = lane >> 3;
  const unsigned ka = kbuf + (r8 + ((mi & 1) << 3)) * ROW_B;
  const unsigned va = vbuf + (r8 + ((mi >> 1) << 3)) * ROW_B;
  const int kx = (mi >> 1) ^ r8, vx = (mi & 1) ^ r8;
  // P^T exchange: lane (gi, t) needs p of keys 2t, 2t+1 (+8) for query gi, held by lanes
  // 8t + gi / 2 (key 2t) and 8t + 4 + gi / 2 (key 2t + 1), value 2 (key >> 3) + (gi & 1)
  const int src_a = t * 8 + (gi >> 1), src_b = src_a + 4;
  const bool odd = (gi & 1) != 0;

  float o[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
  float m0 = -NINFER_INF, m1 = -NINFER_INF, l0 = 0.0f, l1 = 0.0f;  // query heads 2t, 2t + 1
  bool bad = false;
  int t0 = key_begin + kw * TK;
  if (t0 < key_end) {  // the first tile: K and V issued together
    const int rid = attn_key_row(p, bt, row_ok, g, t0 + lane, key_end, lane < TK);
    bad |= issue(rid, kbase, kbuf);
    attn_cp_async_commit();
    issue(rid, vbase, vbuf);
    attn_cp_async_commit();
  }
  int rid_next = attn_key_row(p, bt, row_ok, g, t0 + stride + lane, key_end, lane < TK);
  for (; t0 < key_end; t0 += stride) {
    const bool more = t0 + stride < key_end;
    attn_cp_async_wait<1>();  // this tile's K has landed (its V may be in flight)
    __syncwarp();
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < MT; ++ks) {
      unsigned a[4];
      ldsm_x4(ka + (((2 * ks) ^ kx) << 4), a);
      const uint4 b = qf[ks * 32 + lane];
      mma_bf16_16816(s, a[0], a[1], a[2], a[3], b.x, b.y);
      mma_bf16_16816(s, a[0], a[1], a[2], a[3], b.z, b.w);
    }
    __syncwarp();  // the K tile is read: the next tile's K goes there
    if (more) bad |= issue(rid_next, kbase, kbuf);
    attn_cp_async_commit();
    const bool k0 = t0 + gi < key_end, k1 = t0 + gi + 8 < key_end;
    unsigned ph0, pl0, ph1, pl1;  // keys 2t, 2t + 1 | 2t + 8, 2t + 9
    attn_mma_softmax_step(s, k0, k1, p.scale_log2, src_a, src_b, odd, m0, m1, l0, l1, o, ph0,
                          pl0, ph1, pl1);
    attn_cp_async_wait<1>();  // this tile's V has landed (the next K may be in flight)
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      unsigned a[4];
      ldsm_x4_trans(va + (((2 * mt) ^ vx) << 4), a);
      mma_bf16_16816(o[mt], a[0], a[1], a[2], a[3], ph0, ph1);
      mma_bf16_16816(o[mt], a[0], a[1], a[2], a[3], pl0, pl1);
    }
    __syncwarp();  // the V tile is read: the next tile's V goes there
    if (more) issue(rid_next, vbase, vbuf);
    attn_cp_async_commit();
    rid_next = attn_key_row(p, bt, row_ok, g, t0 + 2 * stride + lane, key_end, lane < TK);
  }
  attn_cp_async_wait<0>();  // (only empty groups remain) the stage is free for acc
  __syncwarp();
  attn_mma_store_state<D>(o, m0, m1, l0, l1, gi, t, G, wst, sm_m + kw * G, sm_l + kw * G);
  return bad;
}

// SPLIT=1: one chunk's merged state (max *cm, weighted sum o, sum lsum) for (row n, head, dim
// d): a one-chunk row's output (the folds of SPLIT=0: chunk into an empty group, group into an
// empty row state; then attn_store_out), else the chunk's partial (part_o, and part_ml at
// d == 0). *bad (the block's shared flag, read where it is used): the output (or partial)
// is NaN.
template <int D>
__device__ __forceinline__ void attn_chunk_result(const AttnParams& p, i64 n, int head, int d,
                                                  int chunk, int n_chunks, const float* cm,
                                                  float o, float lsum, const int* bad) {
  if (n_chunks == 1) {
    float a, b, ra, rb;
    const float gm = attn_coef(-NINFER_INF, *cm, a, b);
    attn_coef(-NINFER_INF, gm, ra, rb);
    const float go = attn_fold(0.0f, a, b, o), gl = attn_fold(0.0f, a, b, lsum);
    const float ov = attn_fold(0.0f, ra, rb, go), lv = attn_fold(0.0f, ra, rb, gl);
    const float v[1] = {*bad ? NINFER_NAN : ov / lv};
    attn_store_out<1>(p, n, head, d, v);
  } else {
    const i64 part = (n * p.q_heads + head) * (i64)p.max_chunks + chunk;
    p.part_o[part * D + d] = *bad ? NINFER_NAN : o;
    if (d == 0) {
      p.part_ml[part * 2] = *cm;
      p.part_ml[part * 2 + 1] = *bad ? NINFER_NAN : lsum;
    }
  }
}

// The split mode's counting of finished partials (attn_split_finish), in two builds:
// ATTN_ACQ_REL (attention.py SOURCE_ACQ_REL, NINFER_ATTN_ACQ_REL, the default): after the
// block barrier that follows its threads' partial stores, thread 0 counts with one
// atom.add.acq_rel.gpu: its release orders the block's stores (ordered before it by the
// barrier: release is cumulative) before the count, its acquire orders the other blocks'
// counted partials before the reads that follow the next barrier (the CUTLASS semaphore
// pattern). Otherwise: every thread fences (__threadfence, fence.sc.gpu), then thread 0
// counts with a relaxed atomicAdd and every thread fences again before reading the partials.
// The same bits either way.
#ifndef ATTN_ACQ_REL
#define ATTN_ACQ_REL 0
#endif
__device__ __forceinline__ int attn_count_acq_rel(int* counter) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;"
               : "=r"(old) : "l"(counter) : "memory");
  return old;
}
// Called by every thread after its partial stores; returns (in every thread) whether this
// block is the last of `total` to count on `counter`; the partials of the blocks counted
// before it may then be read.
__device__ __forceinline__ bool attn_count_last(int* counter, int total, int& sm_last) {
#if ATTN_ACQ_REL
  __syncthreads();
  if (threadIdx.x == 0) sm_last = attn_count_acq_rel(counter) == total - 1;
  __syncthreads();
  return sm_last;
#else
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sm_last = atomicAdd(counter, 1) == total - 1;
  __syncthreads();
  if (!sm_last) return false;
  __threadfence();
  return true;
#endif
}

// SPLIT=1, a row of several chunks, after this block stored its chunk partial (every thread of
// the block calls this). Level 1: the last block of the chunk's group (<= 8 chunks) to finish
// folds the group's partials; level 2: the last group to finish folds the groups
// (attn_count_last: a block's partial is visible before it is counted). sm_last: a shared int.
// (The ATTN_MERGE_KERNEL build: nothing; attn_merge_kernel merges.)
template <int D>
__device__ __forceinline__ void attn_split_finish(const AttnParams& p, i64 n, int g, int G,
                                                  int nc, int c_begin, float* mg, int& sm_last) {
  if (ATTN_MERGE_KERNEL) return;
  const int tid = threadIdx.x;
  const int n_groups = (nc - 1) / ATTN_GROUP + 1;
  const int grp = c_begin / ATTN_GROUP;
  const int grp_size = min(ATTN_GROUP, nc - grp * ATTN_GROUP);
  int* counters = p.counters + (n * p.q_heads + g) * (ATTN_GROUP + 1);
  if (!attn_count_last(counters + 1 + grp, grp_size, sm_last)) return;
  timeline_mark(3);  // the last block of the group: the count returned (and its fence)
  if (tid == 0) counters[1 + grp] = 0;  // 0 again for the next launch (graph replay)
  if (n_groups == 1) {
    attn_merge<D>(p, n, g, G, p.part_o, p.part_ml, p.max_chunks, 0, nc, mg, 1);
    timeline_mark(6);
    return;
  }
  attn_merge<D>(p, n, g, G, p.part_o, p.part_ml, p.max_chunks, grp * ATTN_GROUP, grp_size, mg,
                0, grp);
  timeline_mark(4);  // level 1 folded
  if (!attn_count_last(counters, n_groups, sm_last)) return;
  timeline_mark(5);  // the last group: the count returned (and its fence)
  timeline_mark(0);  // level 2: after its fence
  if (tid == 0) counters[0] = 0;
  attn_merge<D>(p, n, g, G, p.grp_o, p.grp_ml, ATTN_GROUP, 0, n_groups, mg, 2);
  timeline_mark(6);  // level 2 folded: the output stored
}

// The attention kernels' PDL prologue: wait, then let the next kernel launch; in the
// ATTN_MERGE_KERNEL = 1 and 3 builds the split mode only waits, so its dependent
// (attn_merge_kernel, which waits for every partial anyway) launches as the blocks exit (1) or
// once every block has called attn_keys_done (3).
template <int SPLIT>
__device__ __forceinline__ void attn_pdl_enter() {
  if (SPLIT && (ATTN_MERGE_KERNEL == 1 || ATTN_MERGE_KERNEL == 3))
    pdl_wait();
  else
    pdl_enter();
}

// Called by every thread of a split-mode block once its chunk's keys are done (before the
// block folds its warps and stores the partial): the ATTN_MERGE_KERNEL = 3 trigger.
template <int SPLIT>
__device__ __forceinline__ void attn_keys_done() {
  if (SPLIT && ATTN_MERGE_KERNEL == 3) pdl_launch_dependents();
}

// A merge level's running state for 4 dims of one head: items (max m_i, sum l_i, o_i) folded
// in order from the empty state with attn_merge's coefficients and folds.
struct AttnMergeState {
  float m = -NINFER_INF, l = 0.0f;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  __device__ __forceinline__ void fold(float m_i, float l_i, float4 o_i) {
    float a, b;
    m = attn_coef(m, m_i, a, b);
    o.x = attn_fold(o.x, a, b, o_i.x);
    o.y = attn_fold(o.y, a, b, o_i.y);
    o.z = attn_fold(o.z, a, b, o_i.z);
    o.w = attn_fold(o.w, a, b, o_i.w);
    l = attn_fold(l, a, b, l_i);
  }
};

// attn_merge_kernel<D> (the ATTN_MERGE_KERNEL build; attention.py launches it right after a
// split-mode paged_attention launch, same params): the merges of the rows of several chunks
// from the workspace's chunk partials. Grid (ceil(A * D / 4 * ATTN_GROUP / 128), N), 128
// threads; thread (column = (head, 4 dims), merge group q) folds group q's <= 8 chunk partials
// (level 1, as attn_merge mode 0 but kept in registers), then lane q = 0 of the column's 8
// lanes folds the groups taken from them by shuffles (level 2, mode 2; for a row of one group,
// mode 1, which is the same fold from the empty state) and writes the output. Every fold is
// attn_merge's (attn_coef / attn_fold in slot order from the empty state; the running max as a
// sequential fmaxf chain, which the max-scan equals), so the same bits as the in-kernel
// merges. Rows of one chunk, written by the attention kernel, are skipped. PDL: it triggers
// first, then reads the row (written before the attention launch, which waited for it before
// letting this one launch), then waits for the partials (its successor waits for its
// completion anyway).
template <int D>
__global__ void __launch_bounds__(128) attn_merge_kernel(const AttnParams p) {
  pdl_launch_dependents();
  const i64 n = blockIdx.y;
  const int nc = attn_row(p, n).n_chunks;
  pdl_wait();
  if (nc == 1) return;
  constexpr int D4 = D / 4;
  const int item = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x & 31, q = item % ATTN_GROUP, col = item / ATTN_GROUP;
  const int head = col / D4, d4 = col % D4;
  const bool on = head < p.q_heads;
  const int first = q * ATTN_GROUP;
  const int count = on ? max(0, min(ATTN_GROUP, nc - first)) : 0;
  const i64 slot0 = (n * p.q_heads + (on ? head : 0)) * (i64)p.max_chunks + first;
  const float4* po = reinterpret_cast<const float4*>(p.part_o) + slot0 * D4 + d4;
  const float2* pml = reinterpret_cast<const float2*>(p.part_ml) + slot0;
  float4 part[ATTN_GROUP];
  float2 ml[ATTN_GROUP];
#pragma unroll
  for (int i = 0; i < ATTN_GROUP; ++i) {
    if (i < count) {
      part[i] = __ldcg(po + (i64)i * D4);
      ml[i] = __ldcg(pml + i);
    }
  }
  AttnMergeState grp;
#pragma unroll
  for (int i = 0; i < ATTN_GROUP; ++i)
    if (i < count) grp.fold(ml[i].x, ml[i].y, part[i]);
  const int n_groups = (nc - 1) / ATTN_GROUP + 1;
  const int base = lane & ~(ATTN_GROUP - 1);
  AttnMergeState row;
#pragma unroll
  for (int j = 0; j < ATTN_GROUP; ++j) {
    const float mj = __shfl_sync(ATTN_FULL, grp.m, base + j);
    const float lj = __shfl_sync(ATTN_FULL, grp.l, base + j);
    const float x0 = __shfl_sync(ATTN_FULL, grp.o.x, base + j);
    const float x1 = __shfl_sync(ATTN_FULL, grp.o.y, base + j);
    const float x2 = __shfl_sync(ATTN_FULL, grp.o.z, base + j);
    const float x3 = __shfl_sync(ATTN_FULL, grp.o.w, base + j);
    if (j < n_groups) row.fold(mj, lj, make_float4(x0, x1, x2, x3));
  }
  if (on && q == 0) {
    const float v[4] = {row.o.x / row.l, row.o.y / row.l, row.o.z / row.l, row.o.w / row.l};
    attn_store_out<4>(p, n, head, d4 * 4, v);
  }
}

#define ATTN_BUF_FLOATS 2048  // one pipeline buffer of a warp (8 KiB): {K, V} x KPW keys x 32 lanes

// Dynamic shared memory (floats; mirrored by attention.py `_smem_bytes`):
//   stage [nwarps][NST * 2048] (NST x 8 KiB per warp: the K/V ring of its tiles; MMA: the
//   K and the V tile; at the chunk end the warp's acc [GW][D] over its start) | MMA only: q
//   fragments uint4 [D / 16][32] | p [nwarps][64] ([KPW][4] used) | m, l, f [KW][G] |
//   chunk max [G] | then SPLIT=0: run_o, grp_o [G][D], run_m, run_l, grp_m, grp_l, a, b, ra,
//   rb [G];  SPLIT=1: merge a, b, l [G][ATTN_GROUP], M [G].
// Blocks of <= 4 warps (3 per SM: <= 168 registers), except GW=1 (G = 1, 5, 7: up to 7 warps)
// and WIDE=1 (attention.py NINFER_ATTN_WIDE: 8 warps, twice the key warps, one block per SM).
template <typename KT, int GW, int DPL, int SPLIT, int NST, int MMA, int WIDE = 0>
__global__ void __launch_bounds__(GW == 1 || WIDE ? 256 : 128, GW == 1 || WIDE ? 1 : 3)
    paged_attention_kernel(const AttnParams p) {
  constexpr int D = 32 * DPL;
  constexpr int KPW = attn_kpw<KT, DPL>();
  constexpr int LPK = 32 / KPW;  // lanes holding each key's score after the reduction
  using Lane = KvLane<KT, DPL>;
  constexpr int BYTES = Lane::BYTES;
  // a lane copies its own bytes of each key; bf16 D=32 (2 bytes) copies in lane pairs
  constexpr int CP = BYTES < 4 ? 4 : BYTES;
  constexpr int KEY_B = 32 * BYTES;         // one key row of one KV head
  constexpr int BUF_B = 2 * KPW * KEY_B;    // one buffer: K rows then V rows
  static_assert(NST >= 2 && NST <= 4, "2..4 pipeline buffers per warp");
  constexpr int STAGE_F = NST * ATTN_BUF_FLOATS;  // floats of a warp's stage
  static_assert(BUF_B <= ATTN_BUF_FLOATS * 4, "a tile fits one 8 KiB buffer");
  static_assert(GW * D <= STAGE_F, "acc fits the stage");
  static_assert(!MMA || (sizeof(KT) == 2 && GW == 8 && NST == 2 && D >= 64),
                "the MMA path: bf16 pages, D >= 64, one head group of up to 8 heads");
  constexpr int QF_F = MMA ? (D / 16) * 32 * 4 : 0;  // floats of the q fragments (MMA)
  extern __shared__ float4 attn_smem4[];
  float* smem = reinterpret_cast<float*>(attn_smem4);
  __shared__ int sm_bad, sm_last, sm_chunks;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int nwarps = nthreads >> 5;
  const int HG = p.head_groups;
  const int KW = (nwarps * p.hg_recip) >> 16;  // nwarps / HG
  const int G = MMA ? p.q_heads / p.kv_heads : HG * GW;
  const int kw = (warp * p.hg_recip) >> 16;  // warp / HG without a division
  const int hg = warp - kw * HG;
  const int g = blockIdx.y;
  const i64 n = blockIdx.z;
  const int c_begin = SPLIT ? (int)blockIdx.x : 0;
  // p.prewait (FMA path): the row, its page ids and the warp's first tiles of K / V (keys
  // before the row's own, written by earlier launches) are read before pdl_wait, so their
  // round trips overlap the previous kernel (attn_prep, which writes q and the row's own key)
  const bool prewait = !MMA && p.prewait;
  AttnRow row;
  if (prewait) row = attn_row(p, n);

  float* sm_stage = smem;
  float* sm_qf = sm_stage + nwarps * STAGE_F;  // MMA: uint4 [D / 16][32]
  float* sm_p = sm_qf + QF_F;
  float* sm_m = sm_p + nwarps * 64;
  float* sm_l = sm_m + KW * G;
  float* sm_f = sm_l + KW * G;
  float* sm_cm = sm_f + KW * G;
  float* sm_x = sm_cm + G;
  float* run_o = sm_x;  // SPLIT=0: row and group states, fold coefficients
  float* grp_o = run_o + G * D;
  float* run_m = grp_o + G * D;
  float* run_l = run_m + G;
  float* grp_m = run_l + G;
  float* grp_l = grp_m + G;
  float* co_a = grp_l + G;
  float* co_b = co_a + G;
  float* co_ra = co_b + G;
  float* co_rb = co_ra + G;
  float* mg = sm_x;  // SPLIT=1 merge

  const KT* kbase = static_cast<const KT*>(p.k_pages);
  const KT* vbase = static_cast<const KT*>(p.v_pages);
  float* sm_pw = sm_p + warp * 64;  // this warp's p [KPW][4]
  float* wst = sm_stage + warp * STAGE_F;
  const unsigned char* st = reinterpret_cast<const unsigned char*>(wst) + lane * BYTES;
  const unsigned st_u32 = attn_smem_u32(st);
  const bool copier = BYTES >= 4 || (lane & 1) == 0;
  const int jl = lane / LPK;  // the key whose score this lane holds
  const int stride = KW * KPW;

  // Issues the copies of the tile at t0 (lane j's rid is key t0 + j's element row) into
  // buffer b: the K rows, then the V rows; keys that are not valid read as zeros.
  auto issue = [&](int rid, int b) -> bool {
    bool bad_tile = false;
#pragma unroll
    for (int j = 0; j < KPW; ++j) {
      const int r = __shfl_sync(ATTN_FULL, rid, j);
      const i64 off = (i64)max(r, 0) * D + lane * DPL;
      if (copier) {
        attn_cp_async<CP>(st_u32 + b * BUF_B + j * KEY_B, kbase + off, r >= 0);
        attn_cp_async<CP>(st_u32 + b * BUF_B + (KPW + j) * KEY_B, vbase + off, r >= 0);
      }
      bad_tile |= r == -1;
    }
    return bad_tile;
  };

  // prewait: tiles s < pre of the warp's first chunk (tile s = keys t0 + s * stride .. + KPW,
  // buffer s, one commit group each, s < NST: the tiles the FMA path issues before its first
  // wait) whose keys all precede the row's own key are issued now
  int pre = 0;
  bool pre_bad = false;
  if (prewait && c_begin < row.n_chunks) {
    const int key_end = min(row.len, (c_begin + 1) * row.chunk_keys);
    const int t0 = c_begin * row.chunk_keys + kw * KPW;
    while (pre < NST && min(t0 + pre * stride + KPW, key_end) <= row.len - 1) ++pre;
    const int* bt = attn_row_table(p, row);
    int rid[NST];
#pragma unroll
    for (int s = 0; s < NST; ++s)  // all lookups first (independent loads)
      if (s < pre) rid[s] = attn_key_row(p, bt, row.ok, g, t0 + s * stride + lane, key_end,
                                         lane < KPW);
#pragma unroll
    for (int s = 0; s < NST; ++s) {
      if (s < pre) {
        if (t0 + s * stride < key_end) pre_bad |= issue(rid[s], s);
        attn_cp_async_commit();
      }
    }
  }
  attn_pdl_enter<SPLIT>();  // before the early exits: every block waits (and triggers)
  const TimelineMarks marks;  // (phase marks: timeline build only)
  if (!prewait) row = attn_row(p, n);
  const int c_end = SPLIT ? c_begin + 1 : row.n_chunks;
  if (c_begin >= row.n_chunks) return;

  if (tid == 0) {
    sm_bad = !row.ok;
    sm_chunks = row.n_chunks;  // re-read per chunk (SPLIT=0): one register less across the loop
  }
  if (!SPLIT) {
    for (int idx = tid; idx < G * D; idx += nthreads) run_o[idx] = grp_o[idx] = 0.0f;
    if (tid < G) {
      run_m[tid] = grp_m[tid] = -NINFER_INF;
      run_l[tid] = grp_l[tid] = 0.0f;
    }
  }
  if constexpr (MMA)
    attn_stage_q_fragments<D>(p, n, g, G, reinterpret_cast<uint4*>(sm_qf), tid, nthreads);
  __syncthreads();  // sm_bad, the running state and the q fragments are ready

  float q[MMA ? 1 : GW][DPL];
#pragma unroll
  for (int h = 0; h < (MMA ? 0 : GW); ++h) {
    const float* qp = p.q + n * p.q_rs + (i64)(g * G + hg * GW + h) * p.q_hs + lane * DPL;
#pragma unroll
    for (int d = 0; d < DPL; ++d) q[h][d] = qp[d];
  }
  const int* bt = attn_row_table(p, row);

  for (int c = c_begin; c < (SPLIT ? c_end : sm_chunks); ++c) {
    const int key_begin = c * row.chunk_keys;
    const int key_end = min(row.len, key_begin + row.chunk_keys);
    bool bad = false;
    if constexpr (MMA) {
      bad = attn_mma_warp<D>(p, bt, row.ok, g, key_begin, key_end, kw, KW, G,
                             reinterpret_cast<const uint4*>(sm_qf), wst, sm_m, sm_l);
    } else {
      // The scores of all GW heads go through one multi-value butterfly: value i = j * GWP + h
      // (key j, head h; GW = 3 padded to GWP = 4 with zero partials) ends in lanes
      // i * RL .. i * RL + RL - 1, so lane l holds key jl = l / LPK of head hh = (l / RL) % GWP.
      // Its lane-bit tree (16, 8, .., 1) is that of a per-head attn_key_sum<KPW>, and the max /
      // sum over keys are the same xor steps over the key bits, so every score, p, running max
      // and sum has the bits of one head at a time, with one chain instead of GW. The lanes keep
      // their head's running max and sum (warp-uniform per head) in registers; sm_m / sm_l get
      // them at the chunk end.
      constexpr int GWP = GW == 3 ? 4 : GW;
      constexpr int V = KPW * GWP;
      constexpr int RL = 32 / V;  // lanes per value
      static_assert(V <= 32 && (GWP & (GWP - 1)) == 0, "one butterfly holds every head's keys");
      const int hh = (lane / RL) % GWP;
      float m_run = -NINFER_INF, l_run = 0.0f;
      float acc[GW][DPL];
#pragma unroll
      for (int h = 0; h < GW; ++h)
#pragma unroll
        for (int d = 0; d < DPL; ++d) acc[h][d] = 0.0f;
      // software pipeline over a ring of NST buffers: tile i's copies land while tiles
      // i-NST+1 .. i-1 are computed (NST - 1 tiles in flight); page ids are looked up one tile
      // before their copies are issued. The order of the arithmetic does not depend on NST.
      // Tiles s < done were issued before pdl_wait (buffer s, their groups committed first).
      int t0 = key_begin + kw * KPW;
      const int done = c == c_begin ? pre : 0;
      if (c == c_begin) bad |= pre_bad;
      {
        int rid0[NST - 1];
#pragma unroll
        for (int s = 0; s < NST - 1; ++s)  // all lookups first (independent loads)
          if (s >= done)
            rid0[s] = attn_key_row(p, bt, row.ok, g, t0 + s * stride + lane, key_end, lane < KPW);
#pragma unroll
        for (int s = 0; s < NST - 1; ++s) {
          if (s >= done) {
            if (t0 + s * stride < key_end) bad |= issue(rid0[s], s);
            attn_cp_async_commit();
          }
        }
      }
      bool issued = done == NST;  // the first iteration's tile (NST - 1) is in flight already
      int rid_next = issued ? 0
          : attn_key_row(p, bt, row.ok, g, t0 + (NST - 1) * stride + lane, key_end, lane < KPW);
      for (int b = 0; t0 < key_end; t0 += stride, b = b + 1 == NST ? 0 : b + 1) {
        // buffer b - 1 (mod NST) was read by the previous tile (synced at the loop end)
        if (!issued) {
          if (t0 + (NST - 1) * stride < key_end) bad |= issue(rid_next, b == 0 ? NST - 1 : b - 1);
          attn_cp_async_commit();
        }
        issued = false;
        rid_next = attn_key_row(p, bt, row.ok, g, t0 + NST * stride + lane, key_end, lane < KPW);
        attn_cp_async_wait<NST - 1>();  // this lane's copies of buffer b have landed
        __syncwarp();             // ... and every lane's (bf16 D=32 copies in lane pairs)
        const unsigned char* kb = st + b * BUF_B;
        const unsigned char* vb = kb + KPW * KEY_B;
        // per (key, head): the lane's partial dot (K converted to f32, fmaf over its dims)
        float part[V];
#pragma unroll
        for (int j = 0; j < KPW; ++j) {
          Lane kj;
          kj.load_shared(kb + j * KEY_B);
          float kf[DPL];
#pragma unroll
          for (int d = 0; d < DPL; ++d) kf[d] = kj.get(d);
#pragma unroll
          for (int h = 0; h < GWP; ++h) {
            float dot = 0.0f;
            if (h < GW) {
#pragma unroll
              for (int d = 0; d < DPL; ++d) dot = fmaf(q[h][d], kf[d], dot);
            }
            part[j * GWP + h] = dot;
          }
        }
        // reduced over the lanes, online softmax over the tile per head, acc *= corr
        float s = attn_key_sum<V>(part, lane);
        s = t0 + jl < key_end ? __fmul_rn(s, p.scale_log2) : -NINFER_INF;
        float tmax = s;
#pragma unroll
        for (int o = LPK; o < 32; o <<= 1)
          tmax = fmaxf(tmax, __shfl_xor_sync(ATTN_FULL, tmax, o));
        const float m_new = fmaxf(m_run, tmax);
        // uniform per head; corr = 1 (exp2f(0)) when the max is unchanged, and x * 1 is exact
        const bool moved = m_new != m_run;
        const float corr = moved ? exp2f(m_run - m_new) : 1.0f;  // 0 on the first tile
        const float pj = exp2f(s - m_new);
        float psum = pj;
#pragma unroll
        for (int o = LPK; o < 32; o <<= 1)
          psum = __fadd_rn(psum, __shfl_xor_sync(ATTN_FULL, psum, o));
        l_run = fmaf(l_run, corr, psum);
        m_run = m_new;
        if ((lane & (RL - 1)) == 0 && hh < GW) sm_pw[jl * 4 + hh] = pj;
        const unsigned moved_mask = __ballot_sync(ATTN_FULL, moved);
#pragma unroll
        for (int h = 0; h < GW; ++h) {
          const float ch = __shfl_sync(ATTN_FULL, corr, h * RL);  // lane h * RL: key 0, head h
          if ((moved_mask >> (h * RL)) & 1u) {
#pragma unroll
            for (int d = 0; d < DPL; ++d) acc[h][d] = __fmul_rn(acc[h][d], ch);
          }
        }
        __syncwarp();  // p of every key is in sm_pw
        // acc += p_j v_j, j ascending
#pragma unroll
        for (int j = 0; j < KPW; ++j) {
          const float4 pp = *reinterpret_cast<const float4*>(sm_pw + j * 4);
          const float pjh[4] = {pp.x, pp.y, pp.z, pp.w};
          Lane vj;
          vj.load_shared(vb + j * KEY_B);
#pragma unroll
          for (int d = 0; d < DPL; ++d) {
            const float vd = vj.get(d);
#pragma unroll
            for (int h = 0; h < GW; ++h) acc[h][d] = fmaf(pjh[h], vd, acc[h][d]);
          }
        }
        __syncwarp();  // sm_pw and buffer b are rewritten by the next tiles
      }
      attn_cp_async_wait<0>();  // (only empty groups remain) the stage is free for acc
#pragma unroll
      for (int h = 0; h < GW; ++h) {
        float* dst = wst + h * D + lane * DPL;
#pragma unroll
        for (int d = 0; d < DPL; ++d) dst[d] = acc[h][d];
      }
      if (lane < GW * RL && (lane & (RL - 1)) == 0) {  // key 0 of head hh < GW
        sm_m[kw * G + hg * GW + hh] = m_run;
        sm_l[kw * G + hg * GW + hh] = l_run;
      }
    }  // FMA path

    // merge the KW key warps (warp order) into the chunk partial (m_c, l_c, o_c)
    if (bad) sm_bad = 1;
    __syncthreads();
    timeline_mark(1);  // the chunk's keys done by every warp
    attn_keys_done<SPLIT>();
    // SPLIT=0 folds the chunk into the group state, and at a group's last chunk the group into
    // the row state (the same two-level fold as the split mode's merge)
    const bool group_end = (c + 1) % ATTN_GROUP == 0 || c + 1 == sm_chunks;
    for (int t = tid; t < KW * G; t += nthreads) {
      const int hl = t % G;
      float mx = -NINFER_INF;
      for (int w = 0; w < KW; ++w) mx = fmaxf(mx, sm_m[w * G + hl]);
      sm_f[t] = sm_m[t] == -NINFER_INF ? 0.0f : exp2f(sm_m[t] - mx);  // a warp without keys: 0
      if (t < G) {
        sm_cm[hl] = mx;
        if (!SPLIT) {
          float a, b;
          grp_m[hl] = attn_coef(grp_m[hl], mx, a, b);
          co_a[hl] = a;
          co_b[hl] = b;
          if (group_end) {
            run_m[hl] = attn_coef(run_m[hl], grp_m[hl], a, b);
            co_ra[hl] = a;
            co_rb[hl] = b;
            grp_m[hl] = -NINFER_INF;
          }
        }
      }
    }
    __syncthreads();
    for (int idx = tid; idx < G * D; idx += nthreads) {
      const int hl = idx / D, d = idx % D;
      // warp (w, hl / GW) holds head hl's acc at row hl % GW of its stage
      const float* src = sm_stage + (hl / GW) * STAGE_F + (hl % GW) * D + d;
      float lsum = 0.0f, o = 0.0f;
      for (int w = 0; w < KW; ++w) {
        const float f = sm_f[w * G + hl];
        lsum = fmaf(sm_l[w * G + hl], f, lsum);
        o = fmaf(src[w * HG * STAGE_F], f, o);
      }
      const int head = g * G + hl;
      if (!SPLIT) {
        const float go = attn_fold(grp_o[idx], co_a[hl], co_b[hl], o);
        float gl = 0.0f;
        if (d == 0) gl = attn_fold(grp_l[hl], co_a[hl], co_b[hl], lsum);
        if (group_end) {
          run_o[idx] = attn_fold(run_o[idx], co_ra[hl], co_rb[hl], go);
          grp_o[idx] = 0.0f;
          if (d == 0) {
            run_l[hl] = attn_fold(run_l[hl], co_ra[hl], co_rb[hl], gl);
            grp_l[hl] = 0.0f;
          }
        } else {
          grp_o[idx] = go;
          if (d == 0) grp_l[hl] = gl;
        }
      } else {
        attn_chunk_result<D>(p, n, head, d, c, row.n_chunks, sm_cm + hl, o, lsum, &sm_bad);
      }
    }
    __syncthreads();  // the chunk's shared state is rewritten by the next chunk
  }

  if (!SPLIT) {
    for (int idx = tid; idx < G * D; idx += nthreads) {
      const int hl = idx / D, d = idx % D;
      const float v[1] = {sm_bad ? NINFER_NAN : run_o[idx] / run_l[hl]};
      attn_store_out<1>(p, n, g * G + hl, d, v);
    }
    return;
  }
  timeline_mark(2);  // thread 0: its part of the output or partial stored
  if (row.n_chunks == 1) return;

  attn_split_finish<D>(p, n, g, G, row.n_chunks, c_begin, mg, sm_last);
}

// ---------------------------------------------------------------------------------------------
// paged_attention_tma_kernel<D> (NINFER_ATTN_TMA, default off; attention.py `use_tma`): the
// split (decode) mode of paged_attention for bf16 pages with page_size % 16 == 0, D = 64, 128
// or 256 and G = A / Hkv in 1..8, on sm_90, with the K / V rows streamed by bulk copies
// (bulk_copy.cuh, cp.async.bulk) into a shared-memory ring instead of per-lane cp.async.
//
// Contract: that of paged_attention_kernel<bf16, *, *, SPLIT=1, *, *>: grid (max chunks, Hkv,
// N), one chunk of one KV head per block (blocks past the row's chunks exit), the same chunk
// plan (attn_row), partial format, workspace, last-block merges (attn_split_finish, counters 0
// again after every launch), output gate (attn_store_out) and NaN rows for an invalid row or
// page. Rows are batch invariant (a row's bits depend only on its q, length and KV), but not
// bitwise equal to the FMA / MMA kernels (another summation order) nor, therefore, to the
// loop mode (SPLIT=0, used for N > SPLIT_MAX_ROWS rows).
//
// Design. Block = ATTN_TMA_CONS (4) consumer warps + 1 producer warp (160 threads, 2 blocks per
// SM). Ring of p.stages stages (attention.py TMA_STAGES; a multiple of ATTN_TMA_CONS up to 16:
// tile i uses slot i % stages and is consumed by warp i % ATTN_TMA_CONS, so each slot has ONE
// consumer warp and its waits on `full` follow the slot's phases in order. With a slot shared by
// two warps, a warp running ahead could wait for the parity of a phase two ahead of the
// barrier's, which mbarrier.try_wait.parity reports complete at once: the first GPU run, with 6
// stages, read unlanded tiles and faulted); a stage is one tile of 16
// consecutive keys of KV head g (inside one page, since page_size % 16 == 0 and chunks start at
// multiples of 64): its 16 K rows, then its 16 V rows, each brought by ONE tensor copy
// (cp.async.bulk.tensor through the pages' tensor maps, `maps`; _tensor_map.py) in the
// 128-byte swizzled layout that puts the 8 rows of every ldmatrix phase (keys 2 r8 + h,
// r8 = 0..7) in distinct bank groups. One copy per 8 KiB: a producer warp's bulk copies cost
// ~35-70 ns each whatever their size (bench/bulk_copy_rate.py: one producer streams ~27 GB/s
// in 1 KiB copies, ~63 GB/s in 8 KiB ones); with the 16 copies of 2 rows per tile it issued
// before, a block of this kernel streamed ~19 GB/s (ncu, docs/performance.md). Stage = 16 KiB
// for D = 256 (the ring 1024-byte aligned): 4 stages x 2 blocks per SM (161 registers x 160
// threads) keep up to 128 KiB per SM in flight.
//  - Producer warp: looks up the pages of 32 tiles at a time (a lane per tile), then per tile
//    in order: lane 0 waits until the slot is free (`empty`) and announces the tile's bytes on
//    `full` and issues the K and the V copy (whole tiles: the rows of a partial last tile past
//    the length come from the same page and are masked). An invalid page (or row) copies
//    nothing (`full` completes without bytes) and flags the row NaN (sm_bad_pages,
//    folded into sm_bad after the tiles). It starts right after its PDL wait, without waiting
//    for the consumers' q fragments; with p.prewait (past_kv_ready) it reads the row and the
//    page ids and issues the tiles before the one holding the row's own key (at most one pass
//    of the ring) before its wait.
//  - Consumer warp w (after the consumers' q fragments, named barrier 1): tiles w, w + 4, ...:
//    waits for `full`, then the MMA path's math
//    (attn_mma_warp) on the stage: S = K q^T with q split into bf16 hi + lo (4 independent
//    accumulators: hi / lo x even / odd k-steps, summed at the end), online softmax in base 2
//    per query column, P^T split into hi + lo, O^T += V^T P^T; K and V through ldmatrix (V
//    transposed). mma row kappa holds key pi(kappa) = 2 kappa (kappa < 8) or 2 (kappa - 8) + 1
//    (both for S's rows and P V's k index, so the P^T exchange is attn_mma_warp's). Keys past
//    len: scores -inf (p = 0) and their V values (whatever the page holds there, possibly NaN)
//    masked to zero in the fragments. Then lane 0 releases the slot (`empty`).
//  - Chunk end: all warps sync (every copy has landed and been read), the consumers' states go
//    to the ring (acc [w][G][D] floats) and sm_m / sm_l, and are merged in warp order exactly as
//    paged_attention_kernel merges its key warps; then the one-chunk output or the partial, and
//    attn_split_finish.
// Dynamic shared memory (attention.py tma_smem_bytes): barriers full[stages], empty[stages]
// (256 B) | up to 1008 B to a 1024-byte boundary | ring stages x attn_tma_stage_bytes(D) |
// q fragments uint4 [D / 16][32] | m, l, f [ATTN_TMA_CONS][G] | chunk max [G] |
// merge a, b, l [G][ATTN_GROUP], M [G].
// Phase marks (timeline build, bench/attn_timeline.py): 1 the q fragments staged, 2 the chunk's
// first tile landed, 7 the tiles computed (a level-2 merge's attn_merge overwrites it), 3..6
// and 0 attn_split_finish's.
#define ATTN_TMA_CONS 4         // consumer warps (+ 1 producer warp)
#define ATTN_TMA_TILE 16        // keys per ring stage
#define ATTN_TMA_BAR_BYTES 256  // full[stages], empty[stages]
#define ATTN_TMA_MAX_STAGES 16
#define ATTN_TMA_ALIGN 1024       // the ring's alignment (the 128-byte swizzle's period)
#define ATTN_TMA_LINE 128         // a swizzled line: 64 dims of one key (_tensor_map.py)
__host__ __device__ constexpr int attn_tma_stage_bytes(int d) {
  return 2 * ATTN_TMA_TILE * 2 * d;  // K: 16 rows, then V: 16 rows (swizzled, _tensor_map.py)
}
extern __shared__ __align__(128) unsigned char attn_tma_smem[];
// The K and V pages' tensor maps (attention.py, _tensor_map.kv_tile_map: one copy brings a
// 16-key tile of one KV head, 128-byte swizzled), passed by value (__grid_constant__).
struct __align__(64) AttnKvMaps {
  unsigned long long k[16];
  unsigned long long v[16];
};

// MINB: blocks per SM the registers are capped for (launch bounds): 2 (161 registers at
// D = 256, no spill) or 3 (128 registers, a 24-byte spill), attention.py TMA_BLOCKS.
template <int D, int MINB>
__global__ void __launch_bounds__(32 * (ATTN_TMA_CONS + 1), MINB)
    paged_attention_tma_kernel(const AttnParams p, const __grid_constant__ AttnKvMaps maps) {
#if BULK_COPY_OK
  constexpr int STAGE_B = attn_tma_stage_bytes(D);
  constexpr int HALF_B = STAGE_B / 2;                   // the K (or V) half of a stage
  constexpr int MT = D / 16;                            // k-steps of S, m-tiles of O^T
  constexpr int CONS_THREADS = 32 * ATTN_TMA_CONS;
  static_assert(D == 64 || D == 128 || D == 256, "D = 64, 128 or 256");
  static_assert(2 * ATTN_TMA_MAX_STAGES * 8 <= ATTN_TMA_BAR_BYTES, "barriers");
  static_assert(2 * STAGE_B >= ATTN_TMA_CONS * 8 * D * 4, "2 stages hold the accumulators");
  __shared__ int sm_bad, sm_bad_pages, sm_last;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int g = blockIdx.y;
  const i64 n = blockIdx.z;
  const int G = p.q_heads / p.kv_heads;
  const int S = p.stages;
  const int chunk = blockIdx.x;

  mbar_t* full = reinterpret_cast<mbar_t*>(attn_tma_smem);
  mbar_t* empty = full + S;
  unsigned char* ring = attn_tma_smem + ATTN_TMA_BAR_BYTES;  // then up to a 1024-byte boundary
  ring += (ATTN_TMA_ALIGN - (smem_addr(ring) & (ATTN_TMA_ALIGN - 1))) & (ATTN_TMA_ALIGN - 1);
  uint4* qf = reinterpret_cast<uint4*>(ring + S * STAGE_B);  // [MT][32]
  float* sm_m = reinterpret_cast<float*>(qf + MT * 32);
  float* sm_l = sm_m + ATTN_TMA_CONS * G;
  float* sm_f = sm_l + ATTN_TMA_CONS * G;
  float* sm_cm = sm_f + ATTN_TMA_CONS * G;
  float* mg = sm_cm + G;

  if (tid == 0) {  // no global memory is read before the barriers are ready
    sm_bad_pages = 0;
    for (int i = 0; i < S; ++i) {
      mbar_init(full + i, 1);
      mbar_init(empty + i, 1);
    }
    mbar_init_fence();
  }
  __syncthreads();
  const bool producer = warp == ATTN_TMA_CONS;
  // p.prewait (past_kv_ready): the producer reads the row and its page ids, and issues the
  // copies of the chunk's first tiles whose keys all precede the row's own key, before its
  // PDL wait (those keys were written by earlier launches); the rest after it
  const bool early = producer && p.prewait;
  AttnRow row;
  // the producer's state: the page rows of tiles tb .. tb + 31 (lane j: tile tb + j), the next
  // tile to issue, its ring slot and phase
  int rid = -2, next = 0, slot = 0;
  unsigned phase = 0;
  bool bad = false;
  int key_begin = 0, key_end = 0, ntiles = 0;
  const unsigned long long policy = producer ? l2_evict_first_policy() : 0ull;
  auto plan = [&]() {
    key_begin = chunk * row.chunk_keys;
    key_end = min(row.len, key_begin + row.chunk_keys);
    ntiles = (key_end - key_begin + ATTN_TMA_TILE - 1) / ATTN_TMA_TILE;
  };
  // lane j: the element row of tile tb + j's first key (its 16 keys are rows rid .. + 15)
  auto lookup = [&](const int* bt, int tb) {
    const int key = key_begin + ATTN_TMA_TILE * (tb + lane);
    rid = tb + lane < ntiles ? attn_key_row(p, bt, row.ok, g, key, key_end, true) : -2;
    bad |= rid == -1;
  };
  // issues tile `next` (its page row in lane next % 32) into the next slot, once it is free:
  // one tensor copy of its 16 K rows and one of its 16 V rows (rows past the length come too,
  // from the same page: the consumers mask them)
  auto issue = [&]() {
    const int r = __shfl_sync(ATTN_FULL, rid, next & 31);
    if (lane == 0) {
      mbar_wait(empty + slot, phase ^ 1u);  // the slot's previous tile was read
      mbar_arrive_expect_tx(full + slot, r >= 0 ? (unsigned)STAGE_B : 0u);
      if (r >= 0) {
        bulk_tensor_g2s_4d(ring + slot * STAGE_B, maps.k, 0, r >> 1, 0, 0, full + slot, policy);
        bulk_tensor_g2s_4d(ring + slot * STAGE_B + HALF_B, maps.v, 0, r >> 1, 0, 0, full + slot,
                           policy);
      }
    }
    __syncwarp();
    if (++slot == S) {
      slot = 0;
      phase ^= 1u;
    }
    ++next;
  };
  if (early) {
    row = attn_row(p, n);
    if (chunk < row.n_chunks) {
      plan();
      lookup(attn_row_table(p, row), 0);
      // tiles before the one holding key len - 1, at most one pass of the ring and one lookup
      const int pre = min(min(S, 32), min(ntiles, (row.len - 1 - key_begin) / ATTN_TMA_TILE));
      while (next < pre) issue();
    }
  }
  attn_pdl_enter<1>();  // before the early exits: every block waits (and triggers)
  const TimelineMarks marks;  // (phase marks: timeline build only)
  if (!early) row = attn_row(p, n);
  if (chunk >= row.n_chunks) return;

  const int gi = lane >> 2, t = lane & 3;
  float o[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
  float m0 = -NINFER_INF, m1 = -NINFER_INF, l0 = 0.0f, l1 = 0.0f;  // query heads 2t, 2t + 1
  if (producer) {  // the copies do not wait for the consumers' q fragments
    const int* bt = attn_row_table(p, row);
    if (!early) {
      plan();
      lookup(bt, 0);
    }
    while (next < ntiles) {
      if (next > 0 && (next & 31) == 0) lookup(bt, next);
      issue();
    }
    if (__any_sync(ATTN_FULL, bad) && lane == 0) sm_bad_pages = 1;
  } else {  // consumer warp `warp`: tiles warp, warp + ATTN_TMA_CONS, ...
    plan();
    if (tid == 0) sm_bad = !row.ok;
    attn_stage_q_fragments<D>(p, n, g, G, qf, tid, CONS_THREADS);
    asm volatile("bar.sync 1, %0;" ::"n"(CONS_THREADS) : "memory");  // q fragments are ready
    timeline_mark(1);
    const unsigned ring_u = smem_addr(ring);
    // ldmatrix rows: lanes 8i..8i+7 address matrix i (mi). K (A = [key][dim]): mma rows
    // r8 + 8 (mi & 1), 16-byte dim unit w = 2 ks + (mi >> 1); V (A = V^T by .trans): k rows
    // r8 + 8 (mi >> 1), unit w = 2 mt + (mi & 1). mma row kappa = r8 + 8 h is key 2 r8 + h:
    // pair r8, parity h, so unit w of its row is at 128 (r8 + 8 h + 16 (w >> 3)) +
    // 16 ((w & 7) ^ r8) (the swizzled tile, _tensor_map.py); (w & 7) ^ r8 =
    // 2 (k & 3) ^ (r8 ^ x) for w = 2 k + x, x = 0 or 1.
    const int r8 = lane & 7, mi = lane >> 3;
    constexpr int CHUNK_B = ATTN_TMA_TILE * ATTN_TMA_LINE;  // the lines of 64 dims of a tile
    const unsigned ka = ATTN_TMA_LINE * (r8 + 8 * (mi & 1)), kx = r8 ^ (mi >> 1);
    const unsigned va = HALF_B + ATTN_TMA_LINE * (r8 + 8 * (mi >> 1)), vx = r8 ^ (mi & 1);
    // P^T exchange (attn_mma_warp): lane (gi, t) needs p of k rows 2t, 2t+1 (+8) for query gi
    const int src_a = t * 8 + (gi >> 1), src_b = src_a + 4;
    const bool odd = (gi & 1) != 0;
    int cslot = warp % S;
    unsigned cphase = (unsigned)(warp / S) & 1u;
    for (int i = warp; i < ntiles; i += ATTN_TMA_CONS) {
      const int t0 = key_begin + ATTN_TMA_TILE * i;
      const int nv = key_end - t0;  // valid keys of the tile (>= 1; may exceed 16)
      const unsigned st = ring_u + cslot * STAGE_B;
      mbar_wait(full + cslot, cphase);
      if (i == 0) timeline_mark(2);  // (thread 0) the chunk's first tile landed
      float sh0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sh1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      float sl0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sl1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int ks = 0; ks < MT; ++ks) {
        unsigned a[4];
        ldsm_x4(st + ka + CHUNK_B * (ks >> 2) + (((2 * (ks & 3)) ^ kx) << 4), a);
        const uint4 b = qf[ks * 32 + lane];
        mma_bf16_16816((ks & 1) ? sh1 : sh0, a[0], a[1], a[2], a[3], b.x, b.y);
        mma_bf16_16816((ks & 1) ? sl1 : sl0, a[0], a[1], a[2], a[3], b.z, b.w);
      }
      float s[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        s[k] = __fadd_rn(__fadd_rn(sh0[k], sh1[k]), __fadd_rn(sl0[k], sl1[k]));
      // accumulator rows: gi (key 2 gi) and gi + 8 (key 2 gi + 1)
      const bool k0 = 2 * gi < nv, k1 = 2 * gi + 1 < nv;
      unsigned ph0, pl0, ph1, pl1;  // k rows 2t, 2t + 1 | 2t + 8, 2t + 9
      attn_mma_softmax_step(s, k0, k1, p.scale_log2, src_a, src_b, odd, m0, m1, l0, l1, o, ph0,
                            pl0, ph1, pl1);
      // V^T fragments: registers 0, 1 hold k rows 2t (low half), 2t + 1 (high half) = keys 4t,
      // 4t + 2; registers 2, 3 k rows 2t + 8, 2t + 9 = keys 4t + 1, 4t + 3. Rows of keys past
      // len were not copied (stale bytes): zeroed, as p is 0 there but 0 * NaN is not 0.
      const unsigned vm_lo = (4 * t < nv ? 0x0000ffffu : 0u) | (4 * t + 2 < nv ? 0xffff0000u : 0u);
      const unsigned vm_hi =
          (4 * t + 1 < nv ? 0x0000ffffu : 0u) | (4 * t + 3 < nv ? 0xffff0000u : 0u);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        unsigned a[4];
        ldsm_x4_trans(st + va + CHUNK_B * (mt >> 2) + (((2 * (mt & 3)) ^ vx) << 4), a);
        a[0] &= vm_lo;
        a[1] &= vm_lo;
        a[2] &= vm_hi;
        a[3] &= vm_hi;
        mma_bf16_16816(o[mt], a[0], a[1], a[2], a[3], ph0, ph1);
        mma_bf16_16816(o[mt], a[0], a[1], a[2], a[3], pl0, pl1);
      }
      __syncwarp();  // every lane has read the stage
      if (lane == 0) mbar_arrive(empty + cslot);
      cslot += ATTN_TMA_CONS;
      while (cslot >= S) {
        cslot -= S;
        cphase ^= 1u;
      }
    }
  }
  __syncthreads();  // every copy has landed and been read: the ring is free for the states
  timeline_mark(7);  // the chunk's tiles are computed
  attn_keys_done<1>();
  if (tid == 0 && sm_bad_pages) sm_bad = 1;  // read after the next barrier
  float* acc = reinterpret_cast<float*>(ring);  // [ATTN_TMA_CONS][G][D]
  if (warp < ATTN_TMA_CONS) {
    attn_mma_store_state<D>(o, m0, m1, l0, l1, gi, t, G, acc + warp * G * D, sm_m + warp * G,
                            sm_l + warp * G);
  }
  __syncthreads();
  // merge the consumer warps (warp order) into the chunk partial, as paged_attention_kernel
  // merges its key warps (a warp without keys has m = -inf: factor 0)
  for (int k = tid; k < ATTN_TMA_CONS * G; k += nthreads) {
    const int hl = k % G;
    float mx = -NINFER_INF;
    for (int w = 0; w < ATTN_TMA_CONS; ++w) mx = fmaxf(mx, sm_m[w * G + hl]);
    sm_f[k] = sm_m[k] == -NINFER_INF ? 0.0f : exp2f(sm_m[k] - mx);
    if (k < G) sm_cm[hl] = mx;
  }
  __syncthreads();
  for (int idx = tid; idx < G * D; idx += nthreads) {
    const int hl = idx / D, d = idx % D;
    float lsum = 0.0f, ov = 0.0f;
    for (int w = 0; w < ATTN_TMA_CONS; ++w) {
      const float f = sm_f[w * G + hl];
      lsum = fmaf(sm_l[w * G + hl], f, lsum);
      ov = fmaf(acc[w * G * D + idx], f, ov);
    }
    const int head = g * G + hl;
    attn_chunk_result<D>(p, n, head, d, chunk, row.n_chunks, sm_cm + hl, ov, lsum, &sm_bad);
  }
  if (row.n_chunks == 1) return;
  attn_split_finish<D>(p, n, g, G, row.n_chunks, chunk, mg, sm_last);
#else
  __trap();
#endif
}
