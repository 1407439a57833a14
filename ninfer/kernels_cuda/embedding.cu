// embedding.cu: out[n, :] = table[ids[n], :] widened to f32.
//
// Variants: embedding_kernel<float>, embedding_kernel<bf16raw> (table element type).
// Grid: (N), 256 threads striding over H. An id outside [0, V) writes a NaN row, so a bad id is
// visible downstream instead of reading out of bounds. Launched with programmatic dependent
// launch (embedding.py): `pdl_enter` is the first statement.
#include "common.cuh"

template <typename WT>
__global__ void __launch_bounds__(256) embedding_kernel(const int* __restrict__ ids,
                                                        const WT* __restrict__ table,
                                                        i64 table_rs, int vocab, int hidden,
                                                        float* __restrict__ out, i64 out_rs) {
  pdl_enter();
  const i64 n = blockIdx.x;
  const int id = ids[n];
  float* dst = out + n * out_rs;
  if (id < 0 || id >= vocab) {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = NINFER_NAN;
    return;
  }
  const WT* src = table + (i64)id * table_rs;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = to_f32(src[i]);
}
