// norm.cu: normalisations over the last axis of f32 rows.
//
// One kernel template `norm_kernel<WT, OT, MODE, NV, T, RB>` (WT = weight element type, OT =
// output element type: float, or bf16raw = the f32 result rounded to nearest even, the operand
// of a cuBLAS bf16 GEMM):
//   MODE 0  RMS        y = x / sqrt(mean(x^2) + eps) * w
//   MODE 1  RMS_ZC     y = x / sqrt(mean(x^2) + eps) * (1 + w)          (Qwen "1+w" RMSNorm)
//   MODE 2  GATED      y = w * (x / sqrt(mean(x^2) + eps)) * silu(z)    (GDN output norm)
//   MODE 3  L2         y = x / sqrt(sum(x^2) + eps) * scale             (no weight)
//   MODE 4  ADD_RMS_ZC r += x (in place); y = RMS_ZC(r)                 (add_rms_norm)
// Rows are (n, head) pairs: row r -> n = r / heads, h = r % heads, with independent n and head
// strides for x, z and out (so 3-D per-head views and strided column blocks work in place).
//
// The reduction order is that of a block of T threads (T and NV depend only on D, never on N):
// thread t sums x[i]^2 (fmaf, i = t + j*T, j ascending; NV elements held in registers, or a
// strided loop when NV = 0), each warp reduces by warp_sum, and the warp partials are added in
// warp order (block_sum; for T > 256 with NV > 0, by a butterfly: block_sum_tree). Two layouts
// give exactly that order:
//   RB = 1: one block of T threads per row;
//   RB > 1: one warp per row, RB rows per block (small D: (T/32)*NV <= 8 values per lane):
//           lane l plays thread l of each of the T/32 warps, so there are no barriers and many
//           more rows in flight.
// A float `out` may alias `x` (each element is read and written by the same thread, after the
// reduction); a bf16 `out` must not overlap any input.
// Launched with programmatic dependent launch (norm.py): `pdl_enter` follows only an L2 prefetch
// of the weight.
#include "common.cuh"

struct NormParams {
  const float* x;
  const float* z;
  float* residual;
  const void* w;
  void* out;
  i64 x_rs, x_hs;
  i64 z_rs, z_hs;
  i64 r_rs;
  i64 out_rs, out_hs;
  int heads;
  int dim;
  float eps;
  float scale;
  i64 rows;  // N * heads
};
static_assert(sizeof(NormParams) == 120, "NormParams layout is mirrored in norm.py");

// y for one element from the (residual-added) input v, the row's norm `denom`, the weight
// element wv (unused by L2) and the gate element zv (GATED only).
template <int MODE>
__device__ __forceinline__ float norm_value(const NormParams& p, float v, float denom, float wv,
                                            float zv) {
  float y = v / denom;
  if (MODE == 0) y = y * wv;
  if (MODE == 1 || MODE == 4) y = y * (1.0f + wv);
  if (MODE == 2) y = wv * y * silu_f(zv);
  if (MODE == 3) y = y * p.scale;
  return y;
}

// The weight (and GATED's gate) element of index i as f32 (0 where unused).
template <typename WT, int MODE>
__device__ __forceinline__ float weight_at(const WT* w, int i) {
  return MODE == 3 ? 0.0f : to_f32(w[i]);
}
template <int MODE>
__device__ __forceinline__ float gate_at(const NormParams& p, i64 n, i64 h, int i) {
  return MODE == 2 ? p.z[n * p.z_rs + h * p.z_hs + i] : 0.0f;
}

// One row: this thread plays the VT threads t0 + 32k (k < VT) of the T-thread order, holding
// their elements (i = t0 + 32k + j*T) with the weight and gate elements, so every load is issued
// before the reduction and nothing is re-read. VT == T/32: this warp holds the whole row.
template <typename WT, typename OT, int MODE, int NV, int T, int VT>
__device__ __forceinline__ void norm_row(const NormParams& p, i64 n, i64 h, int t0,
                                         float* scratch) {
  const float* x = p.x + n * p.x_rs + h * p.x_hs;
  OT* out = static_cast<OT*>(p.out) + n * p.out_rs + h * p.out_hs;
  float* res = MODE == 4 ? p.residual + n * p.r_rs : nullptr;
  const WT* w = static_cast<const WT*>(p.w);
  float v[VT][NV], wv[VT][NV], zv[VT][NV], ss[VT];
#pragma unroll
  for (int k = 0; k < VT; ++k) {
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = t0 + 32 * k + j * T;
      v[k][j] = wv[k][j] = zv[k][j] = 0.0f;
      if (i < p.dim) {
        v[k][j] = MODE == 4 ? res[i] + x[i] : x[i];
        wv[k][j] = weight_at<WT, MODE>(w, i);
        zv[k][j] = gate_at<MODE>(p, n, h, i);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < VT; ++k) {
    ss[k] = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = t0 + 32 * k + j * T;
      if (i < p.dim) {
        if (MODE == 4) res[i] = v[k][j];
        ss[k] = fmaf(v[k][j], v[k][j], ss[k]);
      }
    }
  }
  timeline_mark(1);  // thread 0: its loads returned (phase marks: timeline build only)
  float total = 0.0f;
  if constexpr (VT * 32 == T) {
#pragma unroll
    for (int k = 0; k < VT; ++k) total += warp_sum(ss[k]);  // block_sum's order
  } else if constexpr (T > 256) {
    total = block_sum_tree(ss[0], scratch);  // no warp-per-row layout has T > 256
  } else {
    total = block_sum(ss[0], scratch);
  }
  const float denom = MODE == 3 ? sqrtf(total + p.eps) : sqrtf(total / (float)p.dim + p.eps);
  timeline_mark(2);  // the row's sum of squares
#pragma unroll
  for (int k = 0; k < VT; ++k) {
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = t0 + 32 * k + j * T;
      if (i < p.dim)
        out[i] = from_f32<OT>(norm_value<MODE>(p, v[k][j], denom, wv[k][j], zv[k][j]));
    }
  }
}

// NV = 0 (any D): the same per-thread order as a strided loop, re-reading x (and res) after the
// reduction; one block of T threads per row.
template <typename WT, typename OT, int MODE, int T>
__device__ __forceinline__ void norm_row_strided(const NormParams& p, i64 n, i64 h,
                                                 float* scratch) {
  const float* x = p.x + n * p.x_rs + h * p.x_hs;
  OT* out = static_cast<OT*>(p.out) + n * p.out_rs + h * p.out_hs;
  float* res = MODE == 4 ? p.residual + n * p.r_rs : nullptr;
  const WT* w = static_cast<const WT*>(p.w);
  float ss = 0.0f;
  for (int i = threadIdx.x; i < p.dim; i += T) {
    float v = x[i];
    if (MODE == 4) {
      v = res[i] + v;
      res[i] = v;
    }
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, scratch);
  const float denom = MODE == 3 ? sqrtf(ss + p.eps) : sqrtf(ss / (float)p.dim + p.eps);
  for (int i = threadIdx.x; i < p.dim; i += T) {
    const float v = MODE == 4 ? res[i] : x[i];
    const float y = norm_value<MODE>(p, v, denom, weight_at<WT, MODE>(w, i),
                                     gate_at<MODE>(p, n, h, i));
    out[i] = from_f32<OT>(y);
  }
}

// Block: T threads (RB = 1) or RB warps; at least 1024 threads per SM fit (<= 64 registers), so
// a 512-row prefill chunk of D = 4096 runs in one wave on 132 SMs.
#define NORM_THREADS (RB == 1 ? T : 32 * RB)
template <typename WT, typename OT, int MODE, int NV, int T, int RB>
__global__ void __launch_bounds__(NORM_THREADS, 1024 / NORM_THREADS)
    norm_kernel(const NormParams p) {
  static_assert(RB == 1 || (NV > 0 && T <= 1024), "one warp per row needs NV > 0");
  if (MODE != 3)  // the weight is constant: its lines come from HBM while the primary runs
    prefetch_l2_span(p.w, (i64)p.dim * sizeof(WT), threadIdx.x, NORM_THREADS);
  const TimelineMarks marks;  // (phase marks: timeline build only)
  pdl_enter();  // before the RB > 1 early return: every block waits and triggers
  timeline_mark(0);
  __shared__ float scratch[32];
  if constexpr (RB == 1) {
    const i64 n = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
    if constexpr (NV == 0) {
      norm_row_strided<WT, OT, MODE, T>(p, n, h, scratch);
    } else {
      norm_row<WT, OT, MODE, NV, T, 1>(p, n, h, threadIdx.x, scratch);
    }
  } else {
    const i64 row = (i64)blockIdx.x * RB + (threadIdx.x >> 5);
    if (row >= p.rows) return;  // no barriers on this path
    norm_row<WT, OT, MODE, NV, T, T / 32>(p, row / p.heads, row % p.heads, threadIdx.x & 31,
                                          scratch);
  }
  timeline_mark(3);  // thread 0: its stores issued
}
#undef NORM_THREADS
