// gdn.cu: Gated DeltaNet building blocks over segments of consecutive tokens.
//
// Segments: rows seg_starts[g]..seg_starts[g+1]-1 are consecutive tokens of the sequence whose
// state is slot seg_slots[g]. Conv state: f32 [S, Kc-1, C] (slot stride given); recurrent
// state: f32 [S, Hv, dk, dv] (slot stride given, inner dims contiguous).
//
// gdn_conv_kernel<WT>        causal depthwise conv + SiLU, grid (N, ceil(C / 128)): each
//                            token reads its Kc-1 predecessors from x or, before the segment
//                            start, from the slot's conv state. Does not touch the state.
// gdn_conv_state_kernel      afterwards: the slot's conv state <- last Kc-1 rows of
//                            [state; segment rows] (one thread per (segment, channel)).
// gdn_conv_step_kernel<WT>   fused variant, one thread per (segment, channel) walking the
//                            segment's tokens in order and updating the state in registers
//                            (used for decode, where every segment has one token).
// gdn_gates_kernel<WA, WD>   g = -exp(a_log) * softplus(a + dt_bias), beta = sigmoid(b).
// gdn_recurrence_kernel<RPT> the delta rule token by token. Grid (G, Hv, ceil(dv / 32)); block
//                            128 threads: lane = state column j of the 32-column tile, warp w
//                            holds rows [w*RPT, (w+1)*RPT) of that column in registers (dk <=
//                            4*RPT; extra rows are zero). Column sums over dk are per-warp
//                            partials added in warp order (fixed).
#include "common.cuh"

#define GDN_MAX_KC 8

// Segment containing token t (binary search over seg_starts[0..G]); -1 if none.
__device__ __forceinline__ int find_segment(const int* seg_starts, int num_segs, int t) {
  if (num_segs <= 0 || t < seg_starts[0] || t >= seg_starts[num_segs]) return -1;
  int lo = 0, hi = num_segs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (seg_starts[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

struct ConvParams {
  const float* x;
  const void* w;
  float* state;
  const int* seg_starts;
  const int* seg_slots;
  float* out;
  i64 x_rs, w_rs, state_ss, out_rs;  // state_ss: slot stride (elements); rows are C apart
  int n, channels, kc, num_segs;
};
static_assert(sizeof(ConvParams) == 96, "ConvParams layout is mirrored in gdn.py");

template <typename WT>
__global__ void __launch_bounds__(128) gdn_conv_kernel(const ConvParams p) {
  const int c = blockIdx.y * 128 + threadIdx.x;
  const int t = blockIdx.x;
  if (c >= p.channels) return;
  const int g = find_segment(p.seg_starts, p.num_segs, t);
  float* dst = p.out + (i64)t * p.out_rs + c;
  if (g < 0) {
    *dst = NINFER_NAN;
    return;
  }
  const int t0 = p.seg_starts[g];
  const float* st = p.state + (i64)p.seg_slots[g] * p.state_ss + c;
  const WT* w = static_cast<const WT*>(p.w) + (i64)c * p.w_rs;
  float acc = 0.0f;
  for (int j = 0; j < p.kc; ++j) {
    const int sp = t - (p.kc - 1) + j;
    const float v = sp >= t0 ? p.x[(i64)sp * p.x_rs + c]
                             : st[(i64)(p.kc - 1 + (sp - t0)) * p.channels];
    acc = fmaf(to_f32(w[j]), v, acc);
  }
  *dst = silu_f(acc);
}

__global__ void __launch_bounds__(128) gdn_conv_state_kernel(const ConvParams p) {
  const int c = blockIdx.x * 128 + threadIdx.x;
  const int g = blockIdx.y;
  if (c >= p.channels) return;
  const int t0 = p.seg_starts[g];
  const int len = p.seg_starts[g + 1] - t0;
  float* st = p.state + (i64)p.seg_slots[g] * p.state_ss + c;
  const int keep = p.kc - 1;
  float nv[GDN_MAX_KC];
#pragma unroll
  for (int r = 0; r < GDN_MAX_KC; ++r) {
    if (r < keep) {
      const int q = len + r;  // index into [state rows (keep); segment rows (len)]
      nv[r] = q < keep ? st[(i64)q * p.channels] : p.x[(i64)(t0 + q - keep) * p.x_rs + c];
    }
  }
#pragma unroll
  for (int r = 0; r < GDN_MAX_KC; ++r)
    if (r < keep) st[(i64)r * p.channels] = nv[r];
}

template <typename WT>
__global__ void __launch_bounds__(128) gdn_conv_step_kernel(const ConvParams p) {
  const int c = blockIdx.x * 128 + threadIdx.x;
  const int g = blockIdx.y;
  if (c >= p.channels) return;
  const int t0 = p.seg_starts[g];
  const int t1 = p.seg_starts[g + 1];
  float* st = p.state + (i64)p.seg_slots[g] * p.state_ss + c;
  const WT* w = static_cast<const WT*>(p.w) + (i64)c * p.w_rs;
  const int keep = p.kc - 1;
  float win[GDN_MAX_KC], wv[GDN_MAX_KC];
#pragma unroll
  for (int j = 0; j < GDN_MAX_KC; ++j) {
    wv[j] = j < p.kc ? to_f32(w[j]) : 0.0f;
    win[j] = j < keep ? st[(i64)j * p.channels] : 0.0f;
  }
  for (int t = t0; t < t1; ++t) {
    const float xv = p.x[(i64)t * p.x_rs + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < GDN_MAX_KC; ++j) {
      if (j < keep) acc = fmaf(wv[j], win[j], acc);
    }
    // the current token is multiplied by w[Kc-1]
#pragma unroll
    for (int j = 0; j < GDN_MAX_KC; ++j) {
      if (j == keep) acc = fmaf(wv[j], xv, acc);
    }
    p.out[(i64)t * p.out_rs + c] = silu_f(acc);
#pragma unroll
    for (int j = 0; j + 1 < GDN_MAX_KC; ++j) {
      if (j + 1 < keep) win[j] = win[j + 1];
      else if (j + 1 == keep) win[j] = xv;
    }
  }
#pragma unroll
  for (int j = 0; j < GDN_MAX_KC; ++j)
    if (j < keep) st[(i64)j * p.channels] = win[j];
}

template <typename WA, typename WD>
__global__ void __launch_bounds__(256) gdn_gates_kernel(const float* __restrict__ a, i64 a_rs,
                                                        const float* __restrict__ b, i64 b_rs,
                                                        const WA* __restrict__ a_log,
                                                        const WD* __restrict__ dt_bias, int n,
                                                        int heads, float* __restrict__ g_out,
                                                        i64 g_rs, float* __restrict__ beta_out,
                                                        i64 beta_rs) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (i64)n * heads) return;
  const i64 row = i / heads;
  const int h = (int)(i % heads);
  const float av = a[row * a_rs + h] + to_f32(dt_bias[h]);
  g_out[row * g_rs + h] = -expf(to_f32(a_log[h])) * softplus_f(av);
  beta_out[row * beta_rs + h] = sigmoid_f(b[row * b_rs + h]);
}

struct RecParams {
  const float* q;
  const float* k;
  const float* v;
  const float* g;
  const float* beta;
  float* state;
  const int* seg_starts;
  const int* seg_slots;
  float* out;
  i64 q_rs, q_hs, k_rs, k_hs, v_rs, v_hs, g_rs, beta_rs, out_rs, out_hs;
  i64 state_ss;  // slot stride; [Hv, dk, dv] contiguous inside a slot
  int key_heads, value_heads, dk, dv;
  int num_segs, pad;
};
static_assert(sizeof(RecParams) == 184, "RecParams layout is mirrored in gdn.py");

template <int RPT>
__global__ void __launch_bounds__(128) gdn_recurrence_kernel(const RecParams p) {
  __shared__ float qs[4 * RPT], ks[4 * RPT];
  __shared__ float red_kv[4][32], red_o[4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seg = blockIdx.x, h = blockIdx.y;
  const int j = blockIdx.z * 32 + lane;
  const bool col_ok = j < p.dv;
  const int kh = h / (p.value_heads / p.key_heads);
  const int t0 = p.seg_starts[seg], t1 = p.seg_starts[seg + 1];
  float* S = p.state + (i64)p.seg_slots[seg] * p.state_ss + (i64)h * p.dk * p.dv;

  float s[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r) {
    const int i = warp * RPT + r;
    s[r] = (i < p.dk && col_ok) ? S[(i64)i * p.dv + j] : 0.0f;
  }
  for (int t = t0; t < t1; ++t) {
    for (int i = threadIdx.x; i < 4 * RPT; i += 128) {
      qs[i] = i < p.dk ? p.q[(i64)t * p.q_rs + (i64)kh * p.q_hs + i] : 0.0f;
      ks[i] = i < p.dk ? p.k[(i64)t * p.k_rs + (i64)kh * p.k_hs + i] : 0.0f;
    }
    const float decay = expf(p.g[(i64)t * p.g_rs + h]);
    const float beta = p.beta[(i64)t * p.beta_rs + h];
    const float vj = col_ok ? p.v[(i64)t * p.v_rs + (i64)h * p.v_hs + j] : 0.0f;
    __syncthreads();
    float kv = 0.0f;
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      s[r] *= decay;
      kv = fmaf(ks[warp * RPT + r], s[r], kv);
    }
    red_kv[warp][lane] = kv;
    __syncthreads();
    kv = red_kv[0][lane] + red_kv[1][lane] + red_kv[2][lane] + red_kv[3][lane];
    const float delta = beta * (vj - kv);
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      s[r] = fmaf(ks[warp * RPT + r], delta, s[r]);
      o = fmaf(qs[warp * RPT + r], s[r], o);
    }
    red_o[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && col_ok) {
      p.out[(i64)t * p.out_rs + (i64)h * p.out_hs + j] =
          red_o[0][lane] + red_o[1][lane] + red_o[2][lane] + red_o[3][lane];
    }
    __syncthreads();  // qs/ks/red are rewritten by the next token
  }
#pragma unroll
  for (int r = 0; r < RPT; ++r) {
    const int i = warp * RPT + r;
    if (i < p.dk && col_ok) S[(i64)i * p.dv + j] = s[r];
  }
}
