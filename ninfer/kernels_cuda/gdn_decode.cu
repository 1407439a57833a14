// gdn_decode.cu: one fused kernel per GDN layer per decode step (one token per row).
//
// gdn_decode_fused_kernel: grid (Hv, N), 512 threads; block (h, n) does, for row n's token:
//   1. conv update + SiLU of the channels value head h needs: q and k of key head
//      kh = h / (Hv / Hk) and v of head h, from the slot's conv state and the new qkv row;
//   2. L2 norm of q (times dk^-1/2) and k; 3. g = -exp(a_log) softplus(a + dt_bias), beta;
//   4. the delta-rule step on S[slot, h] (thread: column j = t % 128, rows (t / 128) * 32 + r,
//      column sums over the 4 row quarters added in quarter order);
//   5. the gated RMSNorm w * (o / rms(o)) * silu(z) into out[n, h].
// Conv state ownership: the v channels of head h belong to block (h, n), which shifts them in
// place. The q/k channels of key head kh are read by all r = Hv/Hk blocks of the group, so the
// last of them to finish reading (counted on counters[n * Hk + kh], which it resets to 0 for
// the next launch) shifts them. counters must be zero before the first launch.
// Weights (conv, a_log, dt_bias, norm) may each be f32 or bf16 (runtime flags, bit i = bf16).
// dk, dv <= 128.
#include "common.cuh"

struct DecodeParams {
  const float* qkv;
  const void* conv_w;
  float* conv_state;
  const float* a;
  const float* b;
  const void* a_log;
  const void* dt_bias;
  float* state;
  const int* slots;
  const float* z;
  const void* norm_w;
  float* out;
  int* counters;
  i64 qkv_rs, conv_w_rs, conv_ss, a_rs, b_rs, state_ss, z_rs, z_hs, out_rs, out_hs;
  int key_heads, value_heads, dk, dv, kc, channels;
  float eps, l2_eps, q_scale;
  int bf16_flags;  // bit 0 conv_w, 1 a_log, 2 dt_bias, 3 norm_w
};
static_assert(sizeof(DecodeParams) == 224, "DecodeParams layout is mirrored in gdn_decode.py");

__device__ __forceinline__ float load_any(const void* p, bool bf16, i64 i) {
  return bf16 ? to_f32(static_cast<const bf16raw*>(p)[i]) : static_cast<const float*>(p)[i];
}

#define DEC_THREADS 512
#define DEC_RPT 32

__global__ void __launch_bounds__(DEC_THREADS) gdn_decode_fused_kernel(const DecodeParams p) {
  __shared__ float qs[128], ks[128], vs[128];
  __shared__ float red[4][128];
  __shared__ float scratch[32];
  __shared__ int last_flag;
  const int t = threadIdx.x;
  const int h = blockIdx.x;
  const i64 n = blockIdx.y;
  const int group = p.value_heads / p.key_heads;
  const int kh = h / group;
  const int slot = p.slots[n];
  const int keep = p.kc - 1;
  const bool w_bf16 = p.bf16_flags & 1;
  const float* xrow = p.qkv + n * p.qkv_rs;
  float* cst = p.conv_state + (i64)slot * p.conv_ss;

  // 1. conv (reads the old state of all needed channels; writes only the v channels)
  {
    int c = -1;
    float* dst = nullptr;
    bool own = false;
    if (t < p.dk) {
      c = kh * p.dk + t;
      dst = qs + t;
    } else if (t < 2 * p.dk) {
      c = p.key_heads * p.dk + kh * p.dk + (t - p.dk);
      dst = ks + (t - p.dk);
    } else if (t < 2 * p.dk + p.dv) {
      c = 2 * p.key_heads * p.dk + h * p.dv + (t - 2 * p.dk);
      dst = vs + (t - 2 * p.dk);
      own = true;
    }
    if (c >= 0) {
      const float xv = xrow[c];
      float win[8];
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (j < keep) {
          win[j] = cst[(i64)j * p.channels + c];
          acc = fmaf(load_any(p.conv_w, w_bf16, (i64)c * p.conv_w_rs + j), win[j], acc);
        }
      }
      acc = fmaf(load_any(p.conv_w, w_bf16, (i64)c * p.conv_w_rs + keep), xv, acc);
      *dst = silu_f(acc);
      if (own) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (j + 1 < keep) cst[(i64)j * p.channels + c] = win[j + 1];
          else if (j + 1 == keep) cst[(i64)j * p.channels + c] = xv;
        }
      }
    }
  }
  __syncthreads();
  if (t == 0) {
    __threadfence();
    const int prev = atomicAdd(p.counters + n * p.key_heads + kh, 1);
    last_flag = prev == group - 1;
  }
  // 2. L2 norms of q and k
  const float qv = t < p.dk ? qs[t] : 0.0f;
  const float kv0 = t < p.dk ? ks[t] : 0.0f;
  const float ssq_q = block_sum(qv * qv, scratch);
  const float ssq_k = block_sum(kv0 * kv0, scratch);
  if (last_flag) {  // uniform: written before the barriers inside block_sum
    if (t == 0) p.counters[n * p.key_heads + kh] = 0;
    if (t < 2 * p.dk) {
      const int c = t < p.dk ? kh * p.dk + t : p.key_heads * p.dk + kh * p.dk + (t - p.dk);
      float nv[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j < keep) nv[j] = j + 1 < keep ? cst[(i64)(j + 1) * p.channels + c] : xrow[c];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j < keep) cst[(i64)j * p.channels + c] = nv[j];
    }
  }
  if (t < p.dk) {
    qs[t] = qv / sqrtf(ssq_q + p.l2_eps) * p.q_scale;
    ks[t] = kv0 / sqrtf(ssq_k + p.l2_eps);
  }
  // 3. gates
  const float av = p.a[n * p.a_rs + h] + load_any(p.dt_bias, p.bf16_flags & 4, h);
  const float g = -expf(load_any(p.a_log, p.bf16_flags & 2, h)) * softplus_f(av);
  const float beta = sigmoid_f(p.b[n * p.b_rs + h]);
  const float decay = expf(g);
  __syncthreads();
  // 4. state update
  const int j = t & 127, quarter = t >> 7;
  const bool col_ok = j < p.dv;
  float* S = p.state + (i64)slot * p.state_ss + (i64)h * p.dk * p.dv;
  float s[DEC_RPT];
  float kv = 0.0f;
#pragma unroll
  for (int r = 0; r < DEC_RPT; ++r) {
    const int i = quarter * DEC_RPT + r;
    s[r] = (i < p.dk && col_ok) ? S[(i64)i * p.dv + j] * decay : 0.0f;
    kv = fmaf(i < p.dk ? ks[i] : 0.0f, s[r], kv);
  }
  red[quarter][j] = kv;
  __syncthreads();
  kv = red[0][j] + red[1][j] + red[2][j] + red[3][j];
  const float delta = beta * ((col_ok ? vs[j] : 0.0f) - kv);
  float o = 0.0f;
#pragma unroll
  for (int r = 0; r < DEC_RPT; ++r) {
    const int i = quarter * DEC_RPT + r;
    if (i < p.dk) {
      s[r] = fmaf(ks[i], delta, s[r]);
      o = fmaf(qs[i], s[r], o);
      if (col_ok) S[(i64)i * p.dv + j] = s[r];
    }
  }
  __syncthreads();  // everyone has read red (kv) before it is reused
  red[quarter][j] = o;
  __syncthreads();
  o = red[0][j] + red[1][j] + red[2][j] + red[3][j];
  // 5. gated RMSNorm over the dv outputs of head h
  const bool mine = quarter == 0 && col_ok;
  const float ssq_o = block_sum(mine ? o * o : 0.0f, scratch);
  if (mine) {
    const float denom = sqrtf(ssq_o / (float)p.dv + p.eps);
    const float zv = p.z[n * p.z_rs + (i64)h * p.z_hs + j];
    const float w = load_any(p.norm_w, p.bf16_flags & 8, j);
    p.out[n * p.out_rs + (i64)h * p.out_hs + j] = w * (o / denom) * silu_f(zv);
  }
}
