// gdn_chunk.cu: chunkwise-parallel gated delta rule (WY/UT form) for prefill, fp32 throughout.
//
// Same inputs, outputs and state update as gdn_recurrence (gdn.cu), equal to it within fp32
// rounding. Chunks of CH = 64 tokens start at each segment's first token (so splitting a prompt
// at multiples of 64 tokens gives the same chunks as processing it whole). Within a chunk of
// L <= 64 tokens, with G_i = sum_{s<=i} g_s (spec 4.4):
//   A = strict_tril((beta K) K^T * exp(G_i - G_j))         P = tril((Q K^T) * exp(G_i - G_j))
//   [U | W] = (I + A)^-1 [beta V | beta e^G K]             (forward substitution)
//   V' = U - W S;  O = (Q e^G) S + P V';  S <- e^{G_L} S + (K e^{G_L - G})^T V'
//
// gdn_chunk_offsets_kernel   one thread: chunk_offsets[g] = first global chunk of segment g.
// gdn_chunk_local_kernel     grid (max_chunks, Hv), 256 threads: everything that depends on one
//                            chunk only (G, A, P, U, W), for all chunks in parallel. A and P:
//                            each thread a 4x4 tile of rows ti+16a, cols tj+16b (conflict-free
//                            float4 reads of the padded K/Q tiles); U, W: thread c solves column
//                            c of [beta V | beta e^G K] (64 registers, fully unrolled).
// gdn_chunk_state_kernel     grid (G, Hv, ceil(dv / 32)), 256 threads: walks a segment's chunks
//                            in order carrying a 128 x 32 column tile of S in shared memory
//                            (state columns are independent). Thread (warp w, lane j) computes
//                            rows w + 8a of column j for V' and O, rows w + 8e of S.
// dk, dv <= 128 (shorter head dims are zero-padded to 128 in shared memory).
#include "common.cuh"

#define CH 64
#define DMAX 128
#define QK_LD 132  // row stride of the [64][128] tiles: 16-byte rows, conflict-free columns
#define A_LD 68    // row stride of the [64][64] tiles
#define KT_LD 68   // row stride of the transposed [128][64] K tile

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
  i64 q_rs, q_hs, k_rs, k_hs, v_rs, v_hs, g_rs, beta_rs, out_rs, out_hs;
  i64 state_ss;
  int key_heads, value_heads, dk, dv;
  int num_segs, max_chunks;
};
static_assert(sizeof(ChunkParams) == 224, "ChunkParams layout is mirrored in gdn_chunk.py");

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

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

__global__ void __launch_bounds__(256) gdn_chunk_local_kernel(const ChunkParams p) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* Ks = smem;                    // [64][QK_LD]
  float* Qs = Ks + CH * QK_LD;         // [64][QK_LD]
  float* As = Qs + CH * QK_LD;         // [64][A_LD]
  float* gam = As + CH * A_LD;         // [64]
  float* bet = gam + CH;               // [64]
  const int tid = threadIdx.x;
  const int b = blockIdx.x, h = blockIdx.y;
  if (b >= p.chunk_offsets[p.num_segs]) return;
  int lo = 0, hi = p.num_segs - 1;  // segment: last g with chunk_offsets[g] <= b
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.chunk_offsets[mid] <= b) lo = mid; else hi = mid - 1;
  }
  const int seg = lo;
  const int t_start = p.seg_starts[seg] + (b - p.chunk_offsets[seg]) * CH;
  const int L = min(CH, p.seg_starts[seg + 1] - t_start);
  const int kh = h / (p.value_heads / p.key_heads);

  for (int idx = tid; idx < CH * DMAX; idx += 256) {
    const int i = idx / DMAX, d = idx % DMAX;
    const bool ok = i < L && d < p.dk;
    const i64 row = t_start + i;
    Ks[i * QK_LD + d] = ok ? p.k[row * p.k_rs + (i64)kh * p.k_hs + d] : 0.0f;
    Qs[i * QK_LD + d] = ok ? p.q[row * p.q_rs + (i64)kh * p.q_hs + d] : 0.0f;
  }
  if (tid < CH) {
    const i64 row = t_start + tid;
    gam[tid] = tid < L ? p.g[row * p.g_rs + h] : 0.0f;
    bet[tid] = tid < L ? p.beta[row * p.beta_rs + h] : 0.0f;
  }
  __syncthreads();
  if (tid == 0) {
    for (int i = 1; i < CH; ++i) gam[i] += gam[i - 1];
  }
  __syncthreads();

  {  // A (strict lower) into shared memory, P (lower incl. diagonal) to the workspace
    const int ti = tid >> 4, tj = tid & 15;
    float ak[4][4], aq[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) ak[a][c] = aq[a][c] = 0.0f;
    for (int d = 0; d < DMAX; d += 4) {
      float4 ki[4], qi[4], kj[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        ki[a] = *reinterpret_cast<const float4*>(Ks + (ti + 16 * a) * QK_LD + d);
        qi[a] = *reinterpret_cast<const float4*>(Qs + (ti + 16 * a) * QK_LD + d);
        kj[a] = *reinterpret_cast<const float4*>(Ks + (tj + 16 * a) * QK_LD + d);
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          ak[a][c] = dot4(ki[a], kj[c], ak[a][c]);
          aq[a][c] = dot4(qi[a], kj[c], aq[a][c]);
        }
    }
    float* pw = p.p_ws + ((i64)b * p.value_heads + h) * CH * CH;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = ti + 16 * a, j = tj + 16 * c;
        const float decay = j <= i ? expf(gam[i] - gam[j]) : 0.0f;
        As[i * A_LD + j] = j < i ? bet[i] * decay * ak[a][c] : 0.0f;
        pw[i * CH + j] = decay * aq[a][c];
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
      float acc = x[i];
      const float* arow = As + i * A_LD;
#pragma unroll
      for (int j4 = 0; j4 < CH; j4 += 4) {
        if (j4 < i) {
          const float4 a4 = *reinterpret_cast<const float4*>(arow + j4);
          acc = fmaf(-a4.x, x[j4], acc);
          if (j4 + 1 < i) acc = fmaf(-a4.y, x[j4 + 1], acc);
          if (j4 + 2 < i) acc = fmaf(-a4.z, x[j4 + 2], acc);
          if (j4 + 3 < i) acc = fmaf(-a4.w, x[j4 + 3], acc);
        }
      }
      x[i] = acc;
    }
    float* dst = c < DMAX ? p.u_ws : p.w_ws;
    const int col = c < DMAX ? c : c - DMAX;
    const int lim = c < DMAX ? p.dv : p.dk;
    if (col < lim) {
#pragma unroll
      for (int i = 0; i < CH; ++i)
        if (i < L) dst[((i64)(t_start + i) * p.value_heads + h) * DMAX + col] = x[i];
    }
    if (tid < L) p.gam_ws[(i64)(t_start + tid) * p.value_heads + h] = gam[tid];
  }
}

__global__ void __launch_bounds__(256) gdn_chunk_state_kernel(const ChunkParams p) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* Ss = smem;                          // [128][32]  state tile S[d][j]
  float* Vs = Ss + DMAX * 32;                // [64][32]   V'
  float* Ps = Vs + CH * 32;                  // [64][A_LD] P
  float* buf = Ps + CH * A_LD;               // [64][QK_LD] W or Q e^G, or [128][KT_LD] K^T
  float* gam = buf + DMAX * KT_LD;           // [64] G_i
  float* eg = gam + CH;                      // [64] e^{G_i}
  float* ek = eg + CH;                       // [64] e^{G_L - G_i}
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int seg = blockIdx.x, h = blockIdx.y;
  const int jcol = blockIdx.z * 32 + lane;
  const bool col_ok = jcol < p.dv;
  const int kh = h / (p.value_heads / p.key_heads);
  const int t0 = p.seg_starts[seg], t1 = p.seg_starts[seg + 1];
  float* S = p.state + (i64)p.seg_slots[seg] * p.state_ss + (i64)h * p.dk * p.dv;

  for (int d = warp; d < DMAX; d += 8)
    Ss[d * 32 + lane] = (d < p.dk && col_ok) ? S[(i64)d * p.dv + jcol] : 0.0f;

  for (int cs = t0; cs < t1; cs += CH) {
    const int L = min(CH, t1 - cs);
    const int chunk = p.chunk_offsets[seg] + (cs - t0) / CH;
    // (a) W rows and G
    for (int idx = tid; idx < CH * DMAX; idx += 256) {
      const int i = idx / DMAX, d = idx % DMAX;
      buf[i * QK_LD + d] = (i < L && d < p.dk)
          ? p.w_ws[((i64)(cs + i) * p.value_heads + h) * DMAX + d] : 0.0f;
    }
    if (tid < CH) gam[tid] = tid < L ? p.gam_ws[(i64)(cs + tid) * p.value_heads + h] : 0.0f;
    __syncthreads();
    const float g_last = gam[L - 1];
    if (tid < CH) {  // read in (c) and (e), after the barriers that follow (b)
      eg[tid] = expf(gam[tid]);
      ek[tid] = expf(g_last - gam[tid]);
    }
    // (b) V' = U - W S   (rows warp + 8a)
    {
      float acc[8];
#pragma unroll
      for (int a = 0; a < 8; ++a) {
        const int i = warp + 8 * a;
        acc[a] = (i < L && col_ok) ? p.u_ws[((i64)(cs + i) * p.value_heads + h) * DMAX + jcol]
                                   : 0.0f;
      }
      for (int d = 0; d < DMAX; d += 4) {
        const float4 s4 = make_float4(Ss[d * 32 + lane], Ss[(d + 1) * 32 + lane],
                                      Ss[(d + 2) * 32 + lane], Ss[(d + 3) * 32 + lane]);
#pragma unroll
        for (int a = 0; a < 8; ++a) {
          const float4 w4 = *reinterpret_cast<const float4*>(buf + (warp + 8 * a) * QK_LD + d);
          acc[a] -= dot4(w4, s4, 0.0f);
        }
      }
#pragma unroll
      for (int a = 0; a < 8; ++a) Vs[(warp + 8 * a) * 32 + lane] = acc[a];
    }
    __syncthreads();
    // (c) Q e^G rows and P
    for (int idx = tid; idx < CH * DMAX; idx += 256) {
      const int i = idx / DMAX, d = idx % DMAX;
      buf[i * QK_LD + d] = (i < L && d < p.dk)
          ? p.q[(i64)(cs + i) * p.q_rs + (i64)kh * p.q_hs + d] * eg[i] : 0.0f;
    }
    const float* pw = p.p_ws + ((i64)chunk * p.value_heads + h) * CH * CH;
    for (int idx = tid; idx < CH * CH; idx += 256) {
      const int i = idx / CH, m = idx % CH;
      Ps[i * A_LD + m] = pw[idx];
    }
    __syncthreads();
    // (d) O = (Q e^G) S + P V'
    {
      float acc[8];
#pragma unroll
      for (int a = 0; a < 8; ++a) acc[a] = 0.0f;
      for (int d = 0; d < DMAX; d += 4) {
        const float4 s4 = make_float4(Ss[d * 32 + lane], Ss[(d + 1) * 32 + lane],
                                      Ss[(d + 2) * 32 + lane], Ss[(d + 3) * 32 + lane]);
#pragma unroll
        for (int a = 0; a < 8; ++a) {
          const float4 q4 = *reinterpret_cast<const float4*>(buf + (warp + 8 * a) * QK_LD + d);
          acc[a] = dot4(q4, s4, acc[a]);
        }
      }
      for (int m = 0; m < CH; m += 4) {
        const float4 v4 = make_float4(Vs[m * 32 + lane], Vs[(m + 1) * 32 + lane],
                                      Vs[(m + 2) * 32 + lane], Vs[(m + 3) * 32 + lane]);
#pragma unroll
        for (int a = 0; a < 8; ++a) {
          const float4 p4 = *reinterpret_cast<const float4*>(Ps + (warp + 8 * a) * A_LD + m);
          acc[a] = dot4(p4, v4, acc[a]);
        }
      }
#pragma unroll
      for (int a = 0; a < 8; ++a) {
        const int i = warp + 8 * a;
        if (i < L && col_ok) p.out[(i64)(cs + i) * p.out_rs + (i64)h * p.out_hs + jcol] = acc[a];
      }
    }
    __syncthreads();
    // (e) K^T scaled by e^{G_L - G_i}
    for (int idx = tid; idx < CH * DMAX; idx += 256) {
      const int i = idx / DMAX, d = idx % DMAX;
      buf[d * KT_LD + i] = (i < L && d < p.dk)
          ? p.k[(i64)(cs + i) * p.k_rs + (i64)kh * p.k_hs + d] * ek[i] : 0.0f;
    }
    __syncthreads();
    // (f) S = e^{G_L} S + K'^T V'   (rows warp + 8e)
    {
      const float decay = expf(g_last);
      float acc[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[e] = Ss[(warp + 8 * e) * 32 + lane] * decay;
      for (int i = 0; i < CH; i += 4) {
        const float4 v4 = make_float4(Vs[i * 32 + lane], Vs[(i + 1) * 32 + lane],
                                      Vs[(i + 2) * 32 + lane], Vs[(i + 3) * 32 + lane]);
#pragma unroll
        for (int e = 0; e < 16; ++e) {
          const float4 k4 = *reinterpret_cast<const float4*>(buf + (warp + 8 * e) * KT_LD + i);
          acc[e] = dot4(k4, v4, acc[e]);
        }
      }
      __syncthreads();  // everyone has read Ss before it is overwritten
#pragma unroll
      for (int e = 0; e < 16; ++e) Ss[(warp + 8 * e) * 32 + lane] = acc[e];
    }
    __syncthreads();
  }
  for (int d = warp; d < DMAX; d += 8)
    if (d < p.dk && col_ok) S[(i64)d * p.dv + jcol] = Ss[d * 32 + lane];
}
