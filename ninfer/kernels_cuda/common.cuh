// common.cuh: helpers shared by every kernel module (inlined by the loader).
//
// - bf16 is handled as raw 16-bit patterns (`bf16raw` = unsigned short): widening is exact
//   (bits << 16), narrowing rounds to nearest even (NaN stays a quiet NaN), matching
//   ninfer.core.dtypes on the CPU.
// - `WT` template parameters are `float` or `bf16raw`; `to_f32` / `load8` hide the difference.
// - Reductions (`warp_sum`, `block_sum`) use a fixed order that depends only on the block size,
//   never on the data or on which rows share the launch (batch invariance).
// - No host headers: NVRTC compiles this without a host compiler.
#pragma once

typedef unsigned short bf16raw;
typedef long long i64;

#define NINFER_INF __int_as_float(0x7f800000)
#define NINFER_NAN __int_as_float(0x7fffffff)

// Programmatic dependent launch (PDL, sm_90; no-ops below): `pdl_launch_dependents` lets the
// next kernel in the stream (when launched with PDL allowed: _loader.launch(..., pdl=True)) start
// once every block of this grid has called it or exited; `pdl_wait` blocks until the previous
// kernel has completed and its writes are visible (at once when this launch had no programmatic
// dependency). A kernel launched with pdl=True must call `pdl_wait` before it reads anything an
// earlier kernel wrote or writes anything an earlier kernel reads; `pdl_enter` (wait, then let
// the next kernel launch) is the prologue of the small kernels. Waiting before triggering bounds
// the overlap: while such a kernel runs, at most its predecessor's tail and its successor's
// pre-wait part run beside it.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// NINFER_TIMELINE (envs.kernel_timeline; a diagnostic build, bench/timeline.py): thread 0 of
// every block that calls pdl_wait appends one record to its module's `ninfer_timeline` buffer:
// the global timer (ns) before and after the wait, then [module id (8 bits) | SM (8) | blocks
// (16) | threads per block (16) | block index (16)], then the dynamic shared memory bytes. The
// wait's return is when the previous kernel completed: consecutive kernels' wait returns
// measure each link of a captured step as it runs.
#if defined(NINFER_TIMELINE) && NINFER_TIMELINE
#define NINFER_TIMELINE_CAP 131072  // records per module and replay (4 MiB)
__device__ unsigned long long ninfer_timeline[4 * NINFER_TIMELINE_CAP];
__device__ unsigned int ninfer_timeline_count;
__device__ __forceinline__ unsigned long long timeline_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned timeline_smid() {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  return smid;
}
// the block's linear index in its grid
__device__ __forceinline__ unsigned long long timeline_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
__device__ __forceinline__ void timeline_record(unsigned long long before,
                                                unsigned long long after) {
  if (threadIdx.x | threadIdx.y | threadIdx.z) return;
  const unsigned smid = timeline_smid();
  unsigned smem;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem));
  const unsigned i = atomicAdd(&ninfer_timeline_count, 1u);
  if (i >= NINFER_TIMELINE_CAP) return;
  const unsigned long long blocks = gridDim.x * gridDim.y * gridDim.z;
  const unsigned long long block = timeline_block();
  ninfer_timeline[4 * i] = before;
  ninfer_timeline[4 * i + 1] = after;
  ninfer_timeline[4 * i + 2] = ((unsigned long long)(NINFER_MODULE_ID & 0xff) << 56) |
                               ((unsigned long long)(smid & 0xff) << 48) |
                               ((blocks & 0xffff) << 32) |
                               ((unsigned long long)(blockDim.x * blockDim.y * blockDim.z & 0xffff)
                                << 16) |
                               (block & 0xffff);
  ninfer_timeline[4 * i + 3] = smem;
}
// Phase marks (timeline build only; no code otherwise): thread 0 of a block keeps the global
// timer of up to 8 tagged points of its kernel in shared memory (`timeline_mark(tag)`, tags
// 0..7; `timeline_marks_begin()` first clears them) and `timeline_marks_flush()` appends the
// set ones to the module's `ninfer_marks` buffer (one atomic per block, after its last mark):
// [timer, module id (8 bits) | tag (8) | SM (8) | 0 (8) | block index (32)] (bench/timeline.py
// prints them per kernel relative to the release).
#define NINFER_MARK_CAP 65536
#define NINFER_MARK_TAGS 8
__device__ unsigned long long ninfer_marks[2 * NINFER_MARK_CAP];
__device__ unsigned int ninfer_marks_count;
__shared__ unsigned long long ninfer_mark_t[NINFER_MARK_TAGS];  // 0: not reached
__device__ __forceinline__ void timeline_marks_begin() {
  if (threadIdx.x | threadIdx.y | threadIdx.z) return;
  for (int i = 0; i < NINFER_MARK_TAGS; ++i) ninfer_mark_t[i] = 0ull;
}
__device__ __forceinline__ void timeline_mark(int tag) {
  if (threadIdx.x | threadIdx.y | threadIdx.z) return;
  ninfer_mark_t[tag % NINFER_MARK_TAGS] = timeline_now();
}
__device__ __forceinline__ void timeline_marks_flush() {
  if (threadIdx.x | threadIdx.y | threadIdx.z) return;
  int n = 0;
  for (int i = 0; i < NINFER_MARK_TAGS; ++i) n += ninfer_mark_t[i] != 0ull;
  if (n == 0) return;
  unsigned k = atomicAdd(&ninfer_marks_count, (unsigned)n);
  const unsigned long long meta = ((unsigned long long)(NINFER_MODULE_ID & 0xff) << 56) |
                                  ((unsigned long long)(timeline_smid() & 0xff) << 40) |
                                  (timeline_block() & 0xffffffffull);
  for (int i = 0; i < NINFER_MARK_TAGS; ++i) {
    if (ninfer_mark_t[i] == 0ull) continue;
    if (k < NINFER_MARK_CAP) {
      ninfer_marks[2 * k] = ninfer_mark_t[i];
      ninfer_marks[2 * k + 1] = meta | ((unsigned long long)i << 48);
    }
    ++k;
  }
}
#else
__device__ __forceinline__ void timeline_marks_begin() {}
__device__ __forceinline__ void timeline_mark(int) {}
__device__ __forceinline__ void timeline_marks_flush() {}
#endif
// A block's phase marks as a scope: begun where it is declared, flushed on every way out of
// the scope (the kernels' early returns included). No code outside the timeline build.
struct TimelineMarks {
  __device__ __forceinline__ TimelineMarks() { timeline_marks_begin(); }
  __device__ __forceinline__ ~TimelineMarks() { timeline_marks_flush(); }
};
__device__ __forceinline__ void pdl_wait() {
#if defined(NINFER_TIMELINE) && NINFER_TIMELINE
  const unsigned long long before = timeline_now();
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if defined(NINFER_TIMELINE) && NINFER_TIMELINE
  timeline_record(before, timeline_now());
#endif
}
// NINFER_PDL_TRIGGER_FIRST (envs.pdl_trigger_first): trigger, then wait. Still safe: a kernel's
// successor waits for this kernel's completion, which comes after this kernel's own wait.
__device__ __forceinline__ void pdl_enter() {
#if defined(NINFER_PDL_TRIGGER_FIRST) && NINFER_PDL_TRIGGER_FIRST
  pdl_launch_dependents();
  pdl_wait();
#else
  pdl_wait();
  pdl_launch_dependents();
#endif
}

// L2 prefetch hints for the part of a kernel before its pdl_wait. They return no data, so they
// may name memory the primary kernel is still writing (the L2 is the point of coherence: such a
// line is simply updated there); they only move reads of constant or long-written data (norm
// weights, conv states, rope tables) out of the dependent chain that starts at pdl_wait.
__device__ __forceinline__ void prefetch_l2(const void* ptr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
#endif
}
// the 128-byte lines of [ptr, ptr + bytes): line t, t + n, ... for thread t of n
__device__ __forceinline__ void prefetch_l2_span(const void* ptr, i64 bytes, int t, int n) {
  const i64 first = (i64)reinterpret_cast<unsigned long long>(ptr) & ~(i64)127;
  const i64 end = (i64)reinterpret_cast<unsigned long long>(ptr) + bytes;
  for (i64 a = first + (i64)t * 128; a < end; a += (i64)n * 128)
    prefetch_l2(reinterpret_cast<const void*>(a));
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16raw v) {
  return __uint_as_float(((unsigned int)v) << 16);
}

__device__ __forceinline__ bf16raw f32_to_bf16(float f) {
  unsigned int bits = __float_as_uint(f);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0u) {
    return (bf16raw)((bits >> 16) | 0x0040u);  // quiet NaN
  }
  unsigned int rounding = ((bits >> 16) & 1u) + 0x7fffu;
  return (bf16raw)((bits + rounding) >> 16);
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16raw from_f32<bf16raw>(float v) { return f32_to_bf16(v); }

// Streaming 16-byte load that does not allocate in L1 (weights are read once per launch; this
// keeps L1 for the activations that are re-read).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ void unpack_bf16x8(uint4 v, float out[8]) {
  out[0] = __uint_as_float(v.x << 16); out[1] = __uint_as_float(v.x & 0xffff0000u);
  out[2] = __uint_as_float(v.y << 16); out[3] = __uint_as_float(v.y & 0xffff0000u);
  out[4] = __uint_as_float(v.z << 16); out[5] = __uint_as_float(v.z & 0xffff0000u);
  out[6] = __uint_as_float(v.w << 16); out[7] = __uint_as_float(v.w & 0xffff0000u);
}

// 8 consecutive elements starting at p (16-byte aligned for bf16, 32-byte span for float).
__device__ __forceinline__ void load8_stream(const bf16raw* p, float out[8]) {
  unpack_bf16x8(ld_stream16(p), out);
}
__device__ __forceinline__ void load8_stream(const float* p, float out[8]) {
  uint4 a = ld_stream16(p), b = ld_stream16(p + 4);
  out[0] = __uint_as_float(a.x); out[1] = __uint_as_float(a.y);
  out[2] = __uint_as_float(a.z); out[3] = __uint_as_float(a.w);
  out[4] = __uint_as_float(b.x); out[5] = __uint_as_float(b.y);
  out[6] = __uint_as_float(b.z); out[7] = __uint_as_float(b.w);
}
__device__ __forceinline__ void load8_cached(const bf16raw* p, float out[8]) {
  unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(p)), out);
}
__device__ __forceinline__ void load8_cached(const float* p, float out[8]) {
  float4 a = __ldg(reinterpret_cast<const float4*>(p));
  float4 b = __ldg(reinterpret_cast<const float4*>(p + 4));
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
// Bounds-checked scalar variant (elements at index >= n read as 0).
template <typename T>
__device__ __forceinline__ void load8_guard(const T* p, int n, float out[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = e < n ? to_f32(p[e]) : 0.0f;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// warp_sum of v, stored per warp in scratch[warp] and visible to the whole block; returns the
// block's warp count
__device__ __forceinline__ int block_warp_sums(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return nwarps;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `scratch` holds >= 32 floats. Order: warp butterfly, then warp partials in warp order.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int nwarps = block_warp_sums(v, scratch);
  float total = 0.0f;
  for (int w = 0; w < nwarps; ++w) total += scratch[w];
  return total;
}
// block_sum for wide blocks: the warp partials summed by the same butterfly as warp_sum (every
// lane ends with the same bits: each step adds the same two values in either order), 5 steps
// instead of a chain of nwarps adds. A different order from block_sum for > 1 warp.
__device__ __forceinline__ float block_sum_tree(float v, float* scratch) {
  const int nwarps = block_warp_sums(v, scratch);
  const int lane = threadIdx.x & 31;
  return warp_sum(lane < nwarps ? scratch[lane] : 0.0f);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = -NINFER_INF;
  for (int w = 0; w < nwarps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
// a * sigmoid(b): elementwise.cu SigmoidMul (sigmoid_mul) and the gated paged_attention output
// (attention.cu) share this expression, so fusing the gate keeps the bits.
__device__ __forceinline__ float sigmoid_mul_f(float a, float b) { return a * sigmoid_f(b); }
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
// PyTorch softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
