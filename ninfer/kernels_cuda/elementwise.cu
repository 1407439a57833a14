// elementwise.cu: row-wise elementwise ops on f32 [N, M] operands with independent row strides.
//
// One kernel template `ew_kernel<Op, OT>`, one functor per op (no copies); OT is the output
// element type: float, or bf16raw = the f32 result rounded to nearest even (the operand of a
// cuBLAS bf16 GEMM; instantiated for SigmoidMul and SiluMul):
//   ew_kernel<SigmoidMul>       out = a * sigmoid(b)                  (sigmoid_mul)
//   ew_kernel<SiluMul>          out = silu(a) * b                     (swiglu: a/b = the halves)
//   ew_kernel<SigmoidScaleAdd>  out = a + sigmoid(c) * b              (sigmoid_scale_add; c is
//                                                                      broadcast with col stride 0)
//   ew_kernel<Add>              out = a + b                           (add_inplace)
// Grid: (N, ceil(M / 256)), 256 threads, one element per thread. Memory-bound; a float `out`
// may alias `a` (each element is read and written by the same thread).
#include "common.cuh"

struct EwParams {
  const float* a;
  const float* b;
  const float* c;
  void* out;
  i64 a_rs, b_rs, c_rs, out_rs;  // row strides (elements)
  i64 c_cs;                      // column stride of c (0 = one value per row)
  int m;                         // columns
  int pad;
};
static_assert(sizeof(EwParams) == 80, "EwParams layout is mirrored in elementwise.py");

struct SigmoidMul {
  __device__ static float apply(float a, float b, float) { return a * sigmoid_f(b); }
};
struct SiluMul {
  __device__ static float apply(float a, float b, float) { return silu_f(a) * b; }
};
struct SigmoidScaleAdd {
  __device__ static float apply(float a, float b, float c) { return a + sigmoid_f(c) * b; }
};
struct Add {
  __device__ static float apply(float a, float b, float) { return a + b; }
};

template <class Op, typename OT>
__global__ void __launch_bounds__(256) ew_kernel(const EwParams p) {
  const int col = blockIdx.y * 256 + threadIdx.x;
  const i64 row = blockIdx.x;
  if (col >= p.m) return;
  const float a = p.a[row * p.a_rs + col];
  const float b = p.b[row * p.b_rs + col];
  const float c = p.c ? p.c[row * p.c_rs + col * p.c_cs] : 0.0f;
  static_cast<OT*>(p.out)[row * p.out_rs + col] = from_f32<OT>(Op::apply(a, b, c));
}
