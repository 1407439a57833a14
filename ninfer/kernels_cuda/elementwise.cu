// elementwise.cu: row-wise elementwise ops on f32 [N, M] operands with independent row strides.
//
// One kernel template `ew_kernel<Op, OT, VEC>`, one functor per op (no copies); OT is the output
// element type: float, or bf16raw = the f32 result rounded to nearest even (the operand of a
// cuBLAS bf16 GEMM; instantiated for SigmoidMul and SiluMul):
//   ew_kernel<SigmoidMul>       out = a * sigmoid(b)                  (sigmoid_mul)
//   ew_kernel<SiluMul>          out = silu(a) * b                     (swiglu: a/b = the halves)
//   ew_kernel<SigmoidScaleAdd>  out = a + sigmoid(c) * b              (sigmoid_scale_add; c is
//                                                                      broadcast with col stride 0)
//   ew_kernel<Add>              out = a + b                           (add_inplace)
// Grid: (N, ceil(M / (256 * VEC))), 256 threads, VEC consecutive elements per thread: VEC = 4
// (16-byte loads, 16- or 8-byte stores) needs M, the row strides of a, b and out multiples of 4
// and a, b, out aligned to those access sizes (the launcher checks); VEC = 1 takes anything. The
// functor sees the same values either way. Memory-bound; a float `out` may alias `a` (each
// element is read and written by the same thread). Launched with programmatic dependent launch
// (elementwise.py): `pdl_enter` is the first statement.
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
  __device__ static float apply(float a, float b, float) { return sigmoid_mul_f(a, b); }
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

template <int VEC>
__device__ __forceinline__ void load_vec(const float* p, float v[VEC]) {
  if constexpr (VEC == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
  } else {
    v[0] = *p;
  }
}

template <typename OT, int VEC>
__device__ __forceinline__ void store_vec(OT* p, const float v[VEC]) {
  if constexpr (VEC == 1) {
    *p = from_f32<OT>(v[0]);
  } else if constexpr (sizeof(OT) == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    *reinterpret_cast<ushort4*>(p) = make_ushort4(f32_to_bf16(v[0]), f32_to_bf16(v[1]),
                                                  f32_to_bf16(v[2]), f32_to_bf16(v[3]));
  }
}

template <class Op, typename OT, int VEC>
__global__ void __launch_bounds__(256) ew_kernel(const EwParams p) {
  pdl_enter();
  const int col = (blockIdx.y * 256 + threadIdx.x) * VEC;
  const i64 row = blockIdx.x;
  if (col >= p.m) return;
  float a[VEC], b[VEC], y[VEC];
  load_vec<VEC>(p.a + row * p.a_rs + col, a);
  load_vec<VEC>(p.b + row * p.b_rs + col, b);
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const float c = p.c ? p.c[row * p.c_rs + (col + e) * p.c_cs] : 0.0f;
    y[e] = Op::apply(a[e], b[e], c);
  }
  store_vec<OT, VEC>(static_cast<OT*>(p.out) + row * p.out_rs + col, y);
}
