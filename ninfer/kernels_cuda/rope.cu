// rope.cu: partial NeoX rotary embedding with per-frequency position axes (MRoPE), in place.
//
// rope_kernel: for row (n, h) and frequency j < R/2:
//   angle = float(positions[freq_axis[j], n]) * inv_freq[j]   (fp32, accurate cosf/sinf)
//   x1 = x[j], x2 = x[j + R/2];  x1' = x1*cos - x2*sin;  x2' = x2*cos + x1*sin
// Dims R..D-1 are untouched. Grid: (N * heads), threads: R/2 rounded up to a warp. Launched with
// programmatic dependent launch (rope.py): `pdl_enter` is the first statement.
#include "common.cuh"

__global__ void __launch_bounds__(256) rope_kernel(float* __restrict__ x, i64 x_rs, i64 x_hs,
                                                   int heads, const int* __restrict__ positions,
                                                   i64 pos_rs, const float* __restrict__ inv_freq,
                                                   const int* __restrict__ freq_axis, int half) {
  pdl_enter();
  const i64 n = blockIdx.x / heads;
  const i64 h = blockIdx.x % heads;
  float* row = x + n * x_rs + h * x_hs;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const int axis = freq_axis[j];
    const float pos = (float)positions[axis * pos_rs + n];
    const float angle = pos * inv_freq[j];
    float s, c;
    sincosf(angle, &s, &c);
    const float x1 = row[j], x2 = row[j + half];
    row[j] = x1 * c - x2 * s;
    row[j + half] = x2 * c + x1 * s;
  }
}
