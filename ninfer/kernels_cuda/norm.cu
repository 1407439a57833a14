// norm.cu: normalisations over the last axis of f32 rows, one block per row.
//
// One kernel template `norm_kernel<WT, OT, MODE, NV>` (WT = weight element type, OT = output
// element type: float, or bf16raw = the f32 result rounded to nearest even, the operand of a
// cuBLAS bf16 GEMM; NV = elements per thread held in registers, 0 = strided loop):
//   MODE 0  RMS        y = x / sqrt(mean(x^2) + eps) * w
//   MODE 1  RMS_ZC     y = x / sqrt(mean(x^2) + eps) * (1 + w)          (Qwen "1+w" RMSNorm)
//   MODE 2  GATED      y = w * (x / sqrt(mean(x^2) + eps)) * silu(z)    (GDN output norm)
//   MODE 3  L2         y = x / sqrt(sum(x^2) + eps) * scale             (no weight)
//   MODE 4  ADD_RMS_ZC r += x (in place); y = RMS_ZC(r)                 (add_rms_norm)
// Rows are (n, head) pairs: row r -> n = r / heads, h = r % heads, with independent n and head
// strides for x, z and out (so 3-D per-head views and strided column blocks work in place).
// The block size depends only on D (never on N), so every row reduces in the same fixed order.
// A float `out` may alias `x` (each element is read and written by the same thread, after the
// reduction's barrier); a bf16 `out` must not overlap any input.
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
};
static_assert(sizeof(NormParams) == 112, "NormParams layout is mirrored in norm.py");

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

// NV > 0: each thread keeps its NV elements (i = tid + j * blockDim, j ascending) in registers,
// so all loads are issued before the reduction and nothing is re-read (one memory round trip
// instead of one per element; NV = 16 only with <= 256 threads). NV = 0: the same arithmetic as
// a strided loop (any D). Both give the same bits: per-thread sums run over the same i order,
// and OT only changes how the final f32 value is stored.
template <typename WT, typename OT, int MODE, int NV>
__global__ void __launch_bounds__(NV >= 16 ? 256 : 1024) norm_kernel(const NormParams p) {
  __shared__ float scratch[32];
  const i64 n = blockIdx.x / p.heads;
  const i64 h = blockIdx.x % p.heads;
  const float* x = p.x + n * p.x_rs + h * p.x_hs;
  OT* out = static_cast<OT*>(p.out) + n * p.out_rs + h * p.out_hs;
  float* res = MODE == 4 ? p.residual + n * p.r_rs : nullptr;
  const WT* w = static_cast<const WT*>(p.w);

  float ss = 0.0f;
  if constexpr (NV > 0) {
    float v[NV];
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      v[j] = 0.0f;
      if (i < p.dim) v[j] = MODE == 4 ? res[i] + x[i] : x[i];
    }
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < p.dim) {
        if (MODE == 4) res[i] = v[j];
        ss = fmaf(v[j], v[j], ss);
      }
    }
    ss = block_sum(ss, scratch);
    const float denom = MODE == 3 ? sqrtf(ss + p.eps) : sqrtf(ss / (float)p.dim + p.eps);
#pragma unroll
    for (int j = 0; j < NV; ++j) {  // every load (w, z) before the first store
      const int i = threadIdx.x + j * blockDim.x;
      if (i < p.dim) {
        v[j] = norm_value<MODE>(p, v[j], denom, weight_at<WT, MODE>(w, i),
                                gate_at<MODE>(p, n, h, i));
      }
    }
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < p.dim) out[i] = from_f32<OT>(v[j]);
    }
  } else {
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) {
      float v = x[i];
      if (MODE == 4) {
        v = res[i] + v;
        res[i] = v;
      }
      ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, scratch);
    const float denom = MODE == 3 ? sqrtf(ss + p.eps) : sqrtf(ss / (float)p.dim + p.eps);
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) {
      const float v = MODE == 4 ? res[i] : x[i];
      const float y = norm_value<MODE>(p, v, denom, weight_at<WT, MODE>(w, i),
                                       gate_at<MODE>(p, n, h, i));
      out[i] = from_f32<OT>(y);
    }
  }
}
